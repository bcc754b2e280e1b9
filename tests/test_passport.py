"""Each model in a run carries a passport: what was asked for, what the provider says answered
(response ``model``, ``system_fingerprint``, version headers), with which decoding, prompts,
renderer and scoring; recorded once per run, read back on both engines, compared across runs."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from engine_helpers import server_spec, write_nmb
from openai_server import OpenAIServer, Script
from pg_server import fresh_pg_database
from typer.testing import CliRunner

from evaluation.datasets import DatasetSpec
from evaluation.engine import rescore, resume_run, start_run
from evaluation.log import ModelPassport, PassportChange, open_store, passport_changes
from evaluation.log.passport import api_host
from evaluation.modelio import MAX_REPORTED, GenerateConfig, ModelOutput
from evaluation.models.spec import resolve_specs
from evaluation.reports import load_run, write_report
from evaluation.runconfig import RunConfig
from gateway.cli import app

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
N_CASES = 3


def _run(
    tmp: Path,
    name: str,
    script: Script,
    *,
    database_url: str | None = None,
    api_key_env: str | None = None,
    grader: bool = False,
) -> Path:
    data, answers = write_nmb(tmp / "data", N_CASES)
    run_dir = tmp / name
    with OpenAIServer(script) as server:
        spec = server_spec(server.url, api_key_env=api_key_env)
        config = RunConfig(
            dataset=DatasetSpec(path=str(data), answers=str(answers)),
            models=[spec],
            generate=GenerateConfig(temperature=0.7, top_p=0.95, max_tokens=300, timeout_s=10),
            seed=11,
            graders=[server_spec(server.url, name="judge")] if grader else [],
            bertscore=False,
            cache_dir=str(tmp / "cache"),
            run_id=name,
        )
        asyncio.run(start_run(config, run_dir, database_url=database_url))
    return run_dir


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest) -> str | None:
    if request.param == "sqlite":
        return None
    return fresh_pg_database(request.getfixturevalue("pg_url"))


def test_a_provider_update_between_two_runs_shows_in_their_passports(
    tmp_path: Path, database_url: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PASSPORT_TEST_KEY", "sk-very-secret")
    before = Script(
        served_model="gpt-4o-2024-05-13",
        system_fingerprint="fp_aaa",
        headers={"openai-version": "2020-10-01", "x-request-id": "r1"},
    )
    after = Script(
        served_model="gpt-4o-2024-08-06",
        system_fingerprint="fp_bbb",
        headers={"openai-version": "2024-06-01"},
    )
    a = _run(tmp_path, "run-a", before, database_url=database_url, api_key_env="PASSPORT_TEST_KEY")
    b = _run(tmp_path, "run-b", after, database_url=database_url, api_key_env="PASSPORT_TEST_KEY")
    with open_store(a, database_url=database_url) as store:
        pa = store.passports()
        notes = [store.note(f"passport:{m}") for m in pa]
    with open_store(b, database_url=database_url) as store:
        pb = store.passports()
    assert list(pa) == ["test-model"]
    p = pa["test-model"]
    assert isinstance(p, ModelPassport)
    assert p.litellm_model == "openai/gpt-4o" and p.provider == "openai"
    assert p.api_host == "127.0.0.1:" + p.api_host.rsplit(":", 1)[1]  # host and port only
    assert p.decoding == {
        "max_tokens": 300,
        "seed": 11,
        "temperature": 0.7,
        "top_p": 0.95,
    }
    assert [(o.value, o.calls) for o in p.served_models] == [("gpt-4o-2024-05-13", N_CASES)]
    assert [(o.value, o.calls) for o in p.system_fingerprints] == [("fp_aaa", N_CASES)]
    assert list(p.version_headers) == ["openai-version"]  # a request id is not a version
    assert p.responses == N_CASES and p.prompts == N_CASES and p.prompt_digest
    assert p.prompt_version and p.renderer_version and p.litellm_version
    assert p.scoring_versions and p.recorded_at
    # the key is nowhere in what was recorded
    for text in [*notes, p.model_dump_json()]:
        assert text is not None and "secret" not in text
    changes = passport_changes(pa["test-model"], pb["test-model"])
    assert all(isinstance(c, PassportChange) for c in changes)
    assert {c.field: (c.before, c.after) for c in changes} == {
        "served_models": ("gpt-4o-2024-05-13", "gpt-4o-2024-08-06"),
        "system_fingerprints": ("fp_aaa", "fp_bbb"),
        "version_headers.openai-version": ("2020-10-01", "2024-06-01"),
        "api_host": (pa["test-model"].api_host, pb["test-model"].api_host),
    }
    assert passport_changes(p, p) == []
    # what `runs show` prints of each run (text and --json), from either engine
    if database_url:
        monkeypatch.setenv("NEUROSANDBOX_DATABASE_URL", database_url)
    monkeypatch.setenv("NEUROSANDBOX_DATA_DIR", str(tmp_path / "var"))
    cli = CliRunner()
    shown = {}
    for run in (a, b):
        res = cli.invoke(app, ["runs", "show", str(run)])
        assert res.exit_code == 0, res.output
        shown[run.name] = " ".join(res.output.split())
        res = cli.invoke(app, ["runs", "show", str(run), "--json"])
        assert res.exit_code == 0, res.output
        as_json = json.loads(res.stdout)["passports"]["test-model"]
        assert ModelPassport.model_validate(as_json) == (pa if run == a else pb)["test-model"]
    assert "passport test-model: openai/gpt-4o via openai at 127.0.0.1:" in shown["run-a"]
    assert (
        "answered by: gpt-4o-2024-05-13 (3 calls); fingerprint: fp_aaa (3 calls)" in shown["run-a"]
    )
    assert "openai-version: 2024-06-01 (3 calls)" in shown["run-b"]
    assert "gpt-4o-2024-05-13" not in shown["run-b"]
    assert "decoding sent: max_tokens=300 seed=11 temperature=0.7 top_p=0.95" in shown["run-b"]


def test_the_passport_is_recorded_once_and_survives_resume_and_rescore(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = _run(tmp_path, "run-r", Script(system_fingerprint="fp_1"))
    with open_store(run) as store:
        first = store.passports()
        note = store.note("passport:test-model")
    # resumed against another endpoint (every answer is stored: nothing is called)
    with caplog.at_level("WARNING"):
        asyncio.run(resume_run(run, cache_dir=tmp_path / "cache", api_base="http://127.0.0.1:9/v1"))
    assert "keeps the passport of its start; now api_host differ" in caplog.text
    rescore(run, cache_dir=tmp_path / "cache")
    with open_store(run) as store:
        assert store.note("passport:test-model") == note  # recorded once
        assert store.passports() == first


def test_a_run_stored_before_passports_has_one_from_its_responses_and_config(
    tmp_path: Path,
) -> None:
    run = _run(
        tmp_path, "run-old", Script(served_model="gpt-4o-2024-05-13", system_fingerprint="fp_o")
    )
    with open_store(run) as store:
        recorded = store.passports()["test-model"]
        con = store.connection
        con.execute("DELETE FROM notes WHERE key LIKE 'passport:%'")
        for key, output in con.execute("SELECT cache_key, output_json FROM responses").fetchall():
            old = {k: v for k, v in json.loads(output).items() if k not in ModelOutput.REPORTED}
            con.execute(
                "UPDATE responses SET output_json = ? WHERE cache_key = ?", (json.dumps(old), key)
            )
        con.commit()
        p = store.passports()["test-model"]
    assert p.recorded_at is None and p.provider is None  # nothing recorded: from the config
    assert p.litellm_model == "openai/gpt-4o" and p.api_host == recorded.api_host
    assert p.decoding == recorded.decoding
    # what answered, from the raw responses as stored
    assert p.served_models == recorded.served_models and p.system_fingerprints
    assert p.system_fingerprints == recorded.system_fingerprints


def test_a_mid_run_model_change_is_counted_per_value(tmp_path: Path) -> None:
    served = iter(["m-1", "m-1", "m-2"])
    script = Script(latency_s=0.0)
    script.responder = lambda body: (setattr(script, "served_model", next(served)), None)[1]
    run = _run(tmp_path, "run-m", script)
    with open_store(run) as store:
        p = store.passports()["test-model"]
    assert [(o.value, o.calls) for o in p.served_models] == [("m-1", 2), ("m-2", 1)]


def test_hostile_reports_are_bounded(tmp_path: Path) -> None:
    script = Script(
        served_model=12345,  # not a string
        system_fingerprint="fp\x1b[31m\u202e" + "x" * 10_000,  # 10 kB, escape and direction marks
        headers={"openai-version": "v\x071"},
    )
    run = _run(tmp_path, "run-h", script)
    with open_store(run) as store:
        p = store.passports()["test-model"]
        outputs = list(store.responses().values())
    fp = p.system_fingerprints[0].value
    assert len(fp) <= MAX_REPORTED and fp.startswith("fp[31mx") and fp.endswith("...")
    assert p.served_models[0].value == "12345"
    assert p.version_headers["openai-version"][0].value == "v1"
    assert all(len(o.system_fingerprint or "") <= MAX_REPORTED for o in outputs)
    # an object where a string belongs, headers that are not a mapping: dropped, not stored
    out = ModelOutput(served_model={"a": 1}, system_fingerprint=["x"], version_headers="nope")
    assert out.served_model is None and out.system_fingerprint is None
    assert out.version_headers == {}
    many = {f"x-{i}-version": "1" for i in range(100)}
    assert len(ModelOutput(version_headers=many).version_headers) == 16


def test_the_run_summary_shows_each_models_passport_escaped(tmp_path: Path) -> None:
    script = Script(served_model="<script>alert(1)</script>", system_fingerprint="fp_s")
    run = _run(tmp_path, "run-s", script)
    index = write_report(load_run(run), tmp_path / "report", pdf=False)
    html = Path(index.summary_html).read_text()
    block = html[html.index('id="passports"') :]
    assert 'data-model="test-model"' in block and "fp_s" in block
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in block and "<script>alert" not in html
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["passports"]["test-model"]["system_fingerprints"] == [
        {"value": "fp_s", "calls": N_CASES}
    ]


def test_a_hand_written_passport_note_is_not_trusted(tmp_path: Path) -> None:
    run = _run(tmp_path, "run-n", Script())
    with open_store(run) as store:
        store.set_note("passport:test-model", '{"model": "other", "provider": "x"}')
        store.set_note("passport:ghost", "not json")
        p = store.passports()
    # a note of another model (or not JSON) is ignored: the passport is rebuilt from the config
    assert list(p) == ["test-model"]
    assert p["test-model"].recorded_at is None and p["test-model"].provider is None
    assert p["test-model"].litellm_model == "openai/gpt-4o"


def test_a_replay_models_passport_says_what_the_recorded_responses_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEUROSANDBOX_DATA_DIR", str(tmp_path / "var"))
    data, answers = write_nmb(tmp_path / "data", N_CASES)
    reply = json.dumps({"final_diagnosis": "multiple sclerosis", "confidence": 0.7})

    def replay_file(name: str, served: str) -> Path:
        path = tmp_path / name
        rows = [
            {
                "case_id": f"nmb-{i:03d}",
                "task": "differential#q1",
                "text": reply,
                "served_model": served,
                "system_fingerprint": "fp_r",
            }
            for i in range(N_CASES)
        ]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path

    passports = []
    for name, served in (("one", "vendor-model-v1"), ("two", "vendor-model-v2")):
        path = replay_file(f"{name}.jsonl", served)
        config = RunConfig(
            dataset=DatasetSpec(path=str(data), answers=str(answers)),
            models=resolve_specs([f"replay:{path}", "reference/text-prior"]),
            bertscore=False,
            cache_dir=str(tmp_path / "cache"),
        )
        asyncio.run(start_run(config, tmp_path / name))
        with open_store(tmp_path / name) as store:
            p, reference = store.passports().values()
        passports.append(p)
    # a reference model has one too: what it is, the prompts and renderer of the run
    assert reference.kind == "reference/text-prior" and reference.prompt_version
    assert reference.renderer_version and reference.prompts == N_CASES
    assert reference.litellm_model is None and reference.recorded_at
    one, two = passports
    assert one.kind == "replay" and one.replay_file == "one.jsonl" and one.replay_sha256
    assert one.litellm_model is None and one.provider is None
    assert [o.value for o in one.served_models] == ["vendor-model-v1"]
    fields = {c.field: (c.before, c.after) for c in passport_changes(one, two)}
    assert fields["served_models"] == ("vendor-model-v1", "vendor-model-v2")
    assert "replay_sha256" in fields and "system_fingerprints" not in fields
    res = CliRunner().invoke(app, ["runs", "show", str(tmp_path / "two")])
    assert res.exit_code == 0, res.output
    printed = " ".join(res.output.split())
    assert "answered by: vendor-model-v2 (3 calls); fingerprint: fp_r (3 calls)" in printed
    assert f"replay file two.jsonl sha256 {two.replay_sha256}" in printed


def test_the_api_host_is_the_host_and_port_alone() -> None:
    assert api_host("https://u:p@api.example.org/v1?key=k#f") == "api.example.org"
    assert api_host("http://10.0.0.5:8000/v1") == "10.0.0.5:8000"
    assert api_host("gpu-box:8000") == "gpu-box:8000"
    assert api_host("http://[::1]:99999/") is None  # a port out of range: not a host
    assert api_host(None) is None and api_host("") is None


def test_a_rubric_grader_has_its_own_passport(tmp_path: Path) -> None:
    grading = json.dumps({"score": 4, "nonce": "x"})
    script = Script(replies=[("grader", grading)], system_fingerprint="fp_g")
    run = _run(tmp_path, "run-g", script, grader=True)
    with open_store(run) as store:
        passports = store.passports()
    assert list(passports) == ["test-model", "judge"]
    judge = passports["judge"]
    assert judge.role == "grader" and judge.recorded_at and judge.responses > 0
    # graders are sent the run's grader decoding as it is (no sample seed)
    assert judge.decoding == {
        "max_tokens": 800,
        "response_format": '{"type": "json_object"}',
        "temperature": 0.0,
    }
    assert judge.prompt_digest is None and judge.scoring_versions == []


def test_a_legacy_run_sqlite_read_as_it_is_has_passports(tmp_path: Path) -> None:
    """A run.sqlite of the layout before Alembic, opened read-only (never migrated): its
    passports come from its configuration and its raw responses."""
    from store_legacy import make_legacy

    run = _run(tmp_path, "run-l", Script(served_model="gpt-4o-2024-05-13"))
    make_legacy(run / "run.sqlite", drop=("notes",), no_scoring_version=True)
    with open_store(run, read_only=True) as store:
        p = store.passports()["test-model"]
    assert p.recorded_at is None and p.litellm_model == "openai/gpt-4o"
    assert [o.value for o in p.served_models] == ["gpt-4o-2024-05-13"]
    assert p.scoring_versions == ["1 (unrecorded)"]
