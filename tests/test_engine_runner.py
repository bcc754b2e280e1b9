"""The runner end to end, through litellm to the loopback server: samples, failures, format
failures, multi-turn memory, the PHI gate and its audit, re-scoring without calls, export."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import sqlite3
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from engine_helpers import phantom_subset, server_spec, write_nmb
from grader_helpers import fixed_verdict
from openai_server import Fault, OpenAIServer, Script

from evaluation.case import TaskFamily
from evaluation.datasets import DatasetSpec
from evaluation.engine import open_dataset, rescore, resume_run, start_run
from evaluation.errors import StoreError
from evaluation.export import export_run
from evaluation.log.store import RunStore, sample_id
from evaluation.modelio import GenerateConfig
from evaluation.models import resolve_specs
from evaluation.phi import PHIPolicy
from evaluation.runconfig import RunConfig

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
GEN = GenerateConfig(temperature=0.7, top_p=0.95, max_tokens=500, timeout_s=10)


def _config(dataset: DatasetSpec, models: list, tmp: Path, **kw: object) -> RunConfig:
    return RunConfig(
        dataset=dataset,
        models=models,
        generate=GEN,
        bertscore=False,
        cache_dir=str(tmp / "cache"),
        **kw,  # type: ignore[arg-type]
    )


def _store(run: Path) -> RunStore:
    return RunStore(run)


def test_run_samples_failures_format_failures_then_resume(tmp_path: Path) -> None:
    data, answers = write_nmb(tmp_path / "data", 5, marker={1: "FMTFAIL", 2: "ALWAYS500"})
    script = Script(
        latency_s=0.01,
        replies=[("FMTFAIL", "I think it is multiple sclerosis, no JSON today.")],
        faults=[Fault("500", match="ALWAYS500", times=1000)],
    )
    run = tmp_path / "run"
    with OpenAIServer(script) as server:
        spec = server_spec(server.url, max_retries=1, concurrency=4)
        config = _config(
            DatasetSpec(path=str(data), answers=str(answers)), [spec], tmp_path, samples=3
        )
        stats = asyncio.run(start_run(config, run))
        assert stats.units_total == 15 and stats.units_done == 15
        assert stats.errors == 3 and stats.format_failures == 3
        # Samples are independent calls: 3 per task; the failing case used 2 attempts each.
        assert server.stats.calls == 4 * 3 + 3 * 2
        store = _store(run)
        rows = {(r.case_id, r.sample): r for r in store.samples()}
        assert (
            rows[("nmb-002", 0)].status == "error"
            and "InternalServerError" in rows[("nmb-002", 0)].parse_error
        )
        assert rows[("nmb-001", 0)].status == "format_failure"
        scores = store.scores()
        fmt = scores[sample_id("nmb-001", "differential#q1", "test-model", 0)]
        assert fmt and all(s.value is None for s in fmt)  # unscored, never a wrong answer
        ok = scores[sample_id("nmb-000", "differential#q1", "test-model", 0)]
        assert any(s.scorer == "diagnosis_match" and s.value == 1.0 for s in ok)
        assert store.run_log().status == "incomplete" and store.counts().failures == 3
        store.close()
        # Resume once the endpoint recovers: only the failed calls are made.
        server.script.faults.clear()
        before = server.stats.calls
        stats = asyncio.run(resume_run(run))
        assert server.stats.calls - before == 3 and stats.cached == 0
        store = _store(run)
        assert store.run_log().status == "complete" and store.counts().of_status("error") == 0
        store.close()


def test_multiturn_conversation_keeps_the_models_earlier_answers(
    phantom_suite, tmp_path: Path
) -> None:
    suite = phantom_subset(phantom_suite, ("l3",), tmp_path / "suite")
    replies = [
        (
            "(turn 3 of 3)",
            '{"differential": [{"diagnosis": "normal study"}], "final_diagnosis": "normal study", "findings": []}',
        )
    ]
    with OpenAIServer(Script(replies=replies)) as server:
        config = _config(
            DatasetSpec(path=str(suite)),
            [server_spec(server.url)],
            tmp_path,
            tasks=[TaskFamily.MULTITURN],
        )
        asyncio.run(start_run(config, tmp_path / "run"))
        bodies = server.stats.bodies
    assert len(bodies) == 3
    roles = [[m["role"] for m in b["messages"]] for b in bodies]
    assert roles == [
        ["system", "user"],
        ["system", "user", "assistant", "user"],
        ["system", "user", "assistant", "user", "assistant", "user"],
    ]
    # The server's turn-1 and turn-2 replies are carried forward, as they were given.
    assert "multiple sclerosis" in bodies[1]["messages"][2]["content"]
    assert bodies[2]["messages"][2]["content"] == bodies[1]["messages"][2]["content"]
    assert "multiple sclerosis" in bodies[2]["messages"][4]["content"]
    n_images = [
        sum(
            1
            for m in b["messages"][-1:]
            for p in m["content"]
            if isinstance(p, dict) and p.get("type") == "image_url"
        )
        for b in bodies
    ]
    assert n_images[0] >= 1 and n_images[2] == 0  # series revealed in turns, none on the last
    store = _store(tmp_path / "run")
    (row,) = store.samples()
    assert [t.turn for t in row.turns] == [1, 2, 3] and row.status == "ok"
    assert row.parsed is not None and row.parsed.final_diagnosis == "normal study"
    # each turn carries what it sent (the conversation so far) and what came back
    assert all(t.output is not None and t.output.text for t in row.turns)
    assert [len(t.request.messages) for t in row.turns if t.request] == [2, 4, 6]
    store.close()


def _planted(case_dir: Path) -> list[str]:
    truth = json.loads((case_dir / "case.json").read_text())["ground_truth"]
    return [p["value"] for p in truth["phi"] if not p["where"].startswith("dicom:")]


@pytest.mark.parametrize("trusted", [[], ["loopback"]])
def test_phi_gate_sends_only_deidentified_content_to_an_untrusted_endpoint(
    phantom_suite, tmp_path: Path, trusted: list[str]
) -> None:
    suite = phantom_subset(phantom_suite, ("stroke",), tmp_path / "suite")
    planted = _planted(phantom_suite.case_dir("stroke"))
    with OpenAIServer() as server:
        config = _config(
            DatasetSpec(path=str(suite)),
            [server_spec(server.url)],
            tmp_path,
            tasks=[TaskFamily.DIFFERENTIAL, TaskFamily.CLASSIFICATION],
            phi=PHIPolicy(trusted=trusted),
        )
        asyncio.run(start_run(config, tmp_path / "run"))
        sent = json.dumps(server.stats.bodies, ensure_ascii=False)
        n_calls = server.stats.calls
    leaked = [v for v in planted if v.lower() in sent.lower()]
    if trusted:
        assert leaked, "control: a trusted endpoint gets the note as it is"
    else:
        assert leaked == []
    store = _store(tmp_path / "run")
    audit = list(store.audit())
    assert len(audit) == n_calls == 2
    assert all(a.remote == (not trusted) and a.deidentified == (not trusted) for a in audit)
    assert all(a.image_sha256 and len(a.image_bytes) == len(a.image_sha256) for a in audit)
    if not trusted:
        assert sum(sum(a.redactions.values()) for a in audit) > 0
    store.close()


def test_rescore_never_calls_a_model_and_export_writes_every_sample(tmp_path: Path) -> None:
    data, answers = write_nmb(tmp_path / "data", 3)
    run = tmp_path / "run"
    with OpenAIServer() as server:
        config = _config(
            DatasetSpec(path=str(data), answers=str(answers)),
            [server_spec(server.url)],
            tmp_path,
            samples=2,
        )
        asyncio.run(start_run(config, run))
        calls = server.stats.calls
    # The server is gone: any model call would now fail.
    counts = rescore(run)
    assert counts["rescored"] == 6 and calls == 6
    store = _store(run)
    assert store.counts().responses == 6 and len(store.scored_samples()) == 6
    n = export_run(store, tmp_path / "out.jsonl")
    recs = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert n == 6 and {(r["case_id"], r["sample"]) for r in recs} == {
        (f"nmb-00{i}", s) for i in range(3) for s in range(2)
    }
    assert all(r["scores"]["diagnosis_match"] == 1.0 and r["response_text"] for r in recs)
    assert export_run(store, tmp_path / "out.parquet") == 6
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.num_rows == 6 and "score.diagnosis_match" in table.column_names
    store.close()


def _scored(run: Path) -> list[str]:
    store = _store(run)
    try:
        return store.scored_samples()
    finally:
        store.close()


def test_rescore_needs_only_the_run_folder_and_keeps_the_runs_truth(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data, answers = write_nmb(tmp_path / "data", 3, marker={2: "WRONGDX"})
    wrong = json.dumps({"findings": [], "differential": [{"diagnosis": "ADEM"}],
                        "final_diagnosis": "ADEM", "rationale": "monophasic", "confidence": 0.5})  # fmt: skip
    run = tmp_path / "run"
    with OpenAIServer(Script(replies=[("WRONGDX", wrong)])) as server:
        config = _config(
            DatasetSpec(path=str(data), answers=str(answers)), [server_spec(server.url)], tmp_path
        )
        asyncio.run(start_run(config, run))
    dataset = open_dataset(config)
    before = _scored(run)
    assert len(before) == 3
    # The store holds each case as the scorers see it: truth and image hashes, no note.
    store = _store(run)
    snap = store.cases()
    store.close()
    assert sorted(snap) == ["nmb-000", "nmb-001", "nmb-002"]
    for case in dataset.cases:
        kept = snap[case.case_id]
        assert kept.ground_truth == case.ground_truth
        assert [i.sha256 for i in kept.images] == [i.sha256 for i in case.images]
        assert case.note and kept.note == "" and kept.ehr is None

    # The dataset and the image cache are gone: rescoring gives the same scores.
    shutil.rmtree(tmp_path / "data")
    shutil.rmtree(tmp_path / "cache")
    assert rescore(run) == {"rescored": 3, "unscored": 0, "missing_case": 0, "errors": 0}
    assert _scored(run) == before

    # A dataset on disk whose truth changed since the run: a warning, and the run's truth wins.
    (tmp_path / "data").mkdir()
    data, answers = write_nmb(tmp_path / "data", 3, marker={2: "WRONGDX"})
    answers.write_text(answers.read_text().replace("multiple sclerosis", "ADEM"))
    with caplog.at_level(logging.WARNING, logger="evaluation.engine"):
        assert rescore(run)["rescored"] == 3
    assert "dataset on disk changed since the run" in caplog.text
    assert "the run's own copy" in caplog.text
    assert _scored(run) == before
    # ... and resume refuses to mix two datasets in one run.
    with pytest.raises(StoreError, match="the dataset changed since the run started"):
        asyncio.run(resume_run(run))

    # A run recorded before snapshots, with its dataset gone: an error that says why.
    con = sqlite3.connect(run / "run.sqlite")
    con.execute("DELETE FROM cases")
    con.commit()
    con.close()
    shutil.rmtree(tmp_path / "data")
    with pytest.raises(StoreError, match="no case snapshots"):
        rescore(run)


def test_reference_models_run_the_phantoms_offline(phantom_suite, tmp_path: Path) -> None:
    suite = phantom_subset(phantom_suite, ("stroke", "ich"), tmp_path / "suite")
    config = _config(
        DatasetSpec(path=str(suite)),
        resolve_specs(["reference/text-prior", "reference/image-rules"]),
        tmp_path,
    )
    stats = asyncio.run(start_run(config, tmp_path / "run"))
    assert (
        stats.errors == 0 and stats.format_failures == 0 and stats.units_done == stats.units_total
    )
    store = _store(tmp_path / "run")
    assert len(store.scored_samples()) == stats.units_total
    answers = {
        (r.case_id.split("-", 2)[-1], r.model): r.parsed.model_dump(mode="json")
        for r in store.samples()
        if r.task == "differential"
    }
    store.close()
    # The image baseline puts the infarct on the side it is (radiological images: image left =
    # patient right) and sees the haemorrhage; the text baseline cannot see any finding.
    truth = json.loads((phantom_suite.case_dir("stroke") / "case.json").read_text())["ground_truth"]
    stroke = answers[("stroke-mca", "reference/image-rules")]
    assert stroke["final_diagnosis"] == "acute ischaemic stroke"
    dwi = [f for f in stroke["findings"] if f["sequence"] == "DWI"]
    assert dwi and dwi[0]["hemisphere"] == truth["lesions"][0]["hemisphere"]
    assert (
        answers[("ich", "reference/image-rules")]["final_diagnosis"] == "intracerebral haemorrhage"
    )
    assert answers[("ich", "reference/text-prior")]["findings"] == []


def test_cli_eval_then_runs_list_show_rescore_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from gateway.cli import app

    monkeypatch.setenv("NEUROSANDBOX_CACHE_DIR", str(tmp_path / "cache"))
    data, answers = write_nmb(tmp_path / "data", 2)
    runs = tmp_path / "runs"
    cli = CliRunner()
    args = ["eval", "--suite", str(data), "--answers", str(answers), "--model", "reference/text-prior",
            "--samples", "2", "--seed", "3", "--no-bertscore", "--out", str(runs / "r1")]  # fmt: skip
    res = cli.invoke(app, args)
    assert res.exit_code == 0, res.output
    again = cli.invoke(app, args)
    assert again.exit_code == 2  # usage
    assert "already holds a run" in " ".join(again.output.split())  # however rich wraps it
    res = cli.invoke(app, ["runs", "show", str(runs / "r1"), "--json"])
    shown = json.loads(res.stdout)
    assert shown["run"]["status"] == "complete" and shown["counts"]["samples_ok"] == 4
    assert shown["run"]["config"]["seed"] == 3 and shown["run"]["dataset_hash"]
    # what produced the run: the code (git commit, or the package version) and the packages
    import importlib.metadata

    assert shown["run"]["code_version"]
    packages = shown["run"]["packages"]
    assert packages["litellm"] == importlib.metadata.version("litellm")
    assert packages["pydicom"] == importlib.metadata.version("pydicom")
    assert shown["summary"]["leaderboard"][0]["model"] == "reference/text-prior"
    assert cli.invoke(app, ["runs", "list", str(runs)]).exit_code == 0
    assert cli.invoke(app, ["runs", "rescore", str(runs / "r1"), "--no-bertscore"]).exit_code == 0
    res = cli.invoke(app, ["runs", "export", str(runs / "r1"), "--out", str(tmp_path / "x.jsonl")])
    assert res.exit_code == 0 and len((tmp_path / "x.jsonl").read_text().splitlines()) == 4
    bad = cli.invoke(app, ["runs", "export", str(runs / "r1"), "--out", str(tmp_path / "x.csv")])
    assert bad.exit_code == 1
    missing = cli.invoke(app, ["runs", "show", str(tmp_path / "nowhere")])
    assert missing.exit_code == 1 and "no run store" in missing.output


def test_rubric_grader_replies_are_stored_and_reused_by_rescore(tmp_path: Path) -> None:
    verdict = {
        "findings_accuracy": 4,
        "evidence_integration": 3,
        "differential_reasoning": 4,
        "conclusion": 5,
        "safety_uncertainty": 4,
        "comments": "sound",
    }
    data, answers = write_nmb(tmp_path / "data", 2)
    run = tmp_path / "run"
    with OpenAIServer(Script(responder=fixed_verdict(verdict))) as server:
        config = _config(
            DatasetSpec(path=str(data), answers=str(answers)),
            [server_spec(server.url)],
            tmp_path,
            graders=[server_spec(server.url, name="judge")],
        )
        asyncio.run(start_run(config, run))
        calls = server.stats.calls
    # Two answers, one grading, one canary: both answers and both references are identical, so
    # the two grader prompts are the same call, made once even when both are in flight together;
    # the canary is asked once per grader per run.
    assert calls == 4
    store = _store(run)
    rubric = [s for ss in store.scores().values() for s in ss if s.scorer == "rubric"]
    assert len(rubric) == 2 and all(s.value == pytest.approx(4.0) for s in rubric)
    store.close()
    assert rescore(run)["rescored"] == 2  # the server is gone: the stored verdicts are reused
    store = _store(run)
    rubric = [s for ss in store.scores().values() for s in ss if s.scorer == "rubric"]
    assert len(rubric) == 2 and all(s.value == pytest.approx(4.0) for s in rubric)
    export_run(store, tmp_path / "x.jsonl")
    rec = json.loads((tmp_path / "x.jsonl").read_text().splitlines()[0])
    assert json.loads(rec["grader_replies"]["judge"])["conclusion"] == 5 and len(rec["turns"]) == 1
    assert json.loads(rec["grader_canary_replies"]["judge"])["conclusion"] == 0
    store.close()


def test_scoring_runs_in_a_process_only_beside_worker_processes_with_bertscore(
    tmp_path: Path,
) -> None:
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

    from evaluation.runner import _score_executor

    data, answers = write_nmb(tmp_path / "data", 1)
    dataset = DatasetSpec(path=str(data), answers=str(answers))
    for processes, bertscore, kind in [
        (0, True, ThreadPoolExecutor),
        (1, False, ThreadPoolExecutor),
        (1, True, ProcessPoolExecutor),
    ]:
        spec = server_spec("http://127.0.0.1:9/v1", processes=processes)
        config = _config(dataset, [spec], tmp_path).model_copy(update={"bertscore": bertscore})
        executor = _score_executor(config)
        try:
            assert type(executor) is kind, (processes, bertscore)
        finally:
            executor.shutdown()


def test_run_with_litellm_worker_processes(tmp_path: Path) -> None:
    data, answers = write_nmb(tmp_path / "data", 3)
    script = Script(latency_s=0.02, system_fingerprint="fp_w", headers={"openai-version": "v2"})
    with OpenAIServer(script) as server:
        spec = server_spec(server.url, processes=1, concurrency=4)
        config = _config(
            DatasetSpec(path=str(data), answers=str(answers)), [spec], tmp_path, samples=2
        )
        stats = asyncio.run(start_run(config, tmp_path / "run"))
        assert server.stats.calls == 6
    assert stats.errors == 0 and stats.scored == 6 and stats.cost_usd > 0
    store = _store(tmp_path / "run")
    assert store.run_log().status == "complete" and len(store.scored_samples()) == 6
    # what the provider said answered crosses from the worker process too (the passport's part)
    outputs = store.responses().values()
    assert {(o.system_fingerprint, o.version_headers["openai-version"]) for o in outputs} == {
        ("fp_w", "v2")
    }
    store.close()


def test_the_run_store_hands_back_typed_rows(tmp_path: Path) -> None:
    """Rows of the run store are records (RunLog, SampleRecord, StoreCounts), never dicts."""
    from evaluation.log.records import RunLog, SampleRecord, StoreCounts

    data, answers = write_nmb(tmp_path / "data", 2)
    config = _config(
        DatasetSpec(path=str(data), answers=str(answers)),
        resolve_specs(["reference/text-prior"]),
        tmp_path,
    )
    run = tmp_path / "run"
    asyncio.run(start_run(config, run))
    store = _store(run)
    row = store.run_log()
    assert (
        isinstance(row, RunLog) and row.status == "complete" and row.config["run_id"] == row.run_id
    )
    samples = store.samples()
    assert samples and all(isinstance(s, SampleRecord) for s in samples)
    assert all(isinstance(s.sample, int) and isinstance(s.image_hashes, list) for s in samples)
    counts = store.counts()
    assert isinstance(counts, StoreCounts) and counts.samples == len(samples)
    assert sum(counts.by_status.values()) == counts.samples
    assert counts.of_status("error") == 0 and counts.flat()["samples"] == counts.samples


def test_run_config_from_settings_fills_what_the_caller_left_out(tmp_path: Path) -> None:
    """Settings give the defaults (models, endpoint, concurrency, trusted hosts, cache); what the
    command line names wins. The gateway's Settings satisfies evaluation's EngineSettings."""
    from gateway.settings import Settings

    settings = Settings(
        models=["reference/text-prior", "openai/gpt-4o"],
        api_base="http://127.0.0.1:9/v1",
        concurrency=3,
        phi_trusted_hosts=["loopback", "10.0.0.0/8"],
        cache_dir=tmp_path / "cache",
    )
    spec = DatasetSpec(path="suite")
    by_settings = RunConfig.from_settings(settings, spec, samples=2)
    assert [m.name for m in by_settings.models] == ["reference/text-prior", "openai/gpt-4o"]
    gpt = by_settings.models[1]
    assert gpt.api_base == "http://127.0.0.1:9/v1" and gpt.concurrency == 3
    assert by_settings.phi.trusted == ["loopback", "10.0.0.0/8"] and by_settings.samples == 2
    assert by_settings.cache_dir == str((tmp_path / "cache").resolve())
    named = RunConfig.from_settings(
        settings,
        spec,
        models=["openai/gpt-4o-mini"],
        api_base="http://127.0.0.1:8/v1",
        concurrency=5,
        trusted_hosts=["loopback"],
        graders=["openai/gpt-4o"],
    )
    (mini,) = named.models
    assert mini.name == "openai/gpt-4o-mini" and mini.api_base == "http://127.0.0.1:8/v1"
    assert mini.concurrency == 5 and named.phi.trusted == ["loopback"]
    assert [g.api_base for g in named.graders] == ["http://127.0.0.1:8/v1"]
