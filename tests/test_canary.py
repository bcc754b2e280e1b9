"""`neurosandbox canary FILE`: a replay model run again on pinned cases. The first run says
FIRST; an identical rerun is quiet; a rerun after the earlier run's scores were of an older
scoring version (and different) is quiet, the earlier run rescored first; answers changed on 30%
of the cases ring the ALARM (exit 4), the mark the index reads says so, and /metrics shows it."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from engine_helpers import write_nmb
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from review_server import build_context
from run_pairs import case_id, write_replay
from typer.testing import CliRunner

from evaluation.log import CANARY_NOTE, canary_mark_of_note, open_store
from gateway.api import create_app
from gateway.auth import Role
from gateway.cli import app

N = 10
CANARY = """\
name: weekly-ms
dataset:
  path: data/nmb.jsonl
  answers: data/answers.jsonl
  case_ids: [{ids}]
models: ["replay:model.jsonl"]
alarm:
  flip_share: 0.2
  metrics: [accuracy]
"""


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[CliRunner, Path, Path]:
    monkeypatch.setenv("NEUROSANDBOX_DATA_DIR", str(tmp_path / "var"))
    monkeypatch.setenv("NEUROSANDBOX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("NEUROSANDBOX_RUNS_DIR", str(tmp_path / "runs"))
    write_nmb(tmp_path / "data", N + 2)  # two cases more than the canary pins
    write_replay(tmp_path / "model.jsonl", N + 2, wrong={8})
    canary = tmp_path / "canary.yaml"
    canary.write_text(CANARY.format(ids=", ".join(case_id(i) for i in range(N))))
    return CliRunner(), canary, tmp_path / "runs"


def _newest(runs: Path) -> Path:
    return sorted(runs.glob("canary-weekly-ms-*"), key=lambda p: p.stat().st_mtime)[-1]


def _mark(run: Path):  # type: ignore[no-untyped-def]
    store = open_store(run, read_only=True)
    try:
        return canary_mark_of_note(store.note(CANARY_NOTE))
    finally:
        store.close()


def _flat(text: str) -> str:
    return " ".join(text.split())


def _as_if_scored_with_an_older_version(run: Path) -> None:
    """The run's scores as an older scoring version left them: unversioned, and every answer
    wrong (compared as they are, that would be a 90% flip)."""
    db = sqlite3.connect(run / "run.sqlite")
    db.execute("UPDATE scores SET scoring_version=NULL")
    db.execute("UPDATE scores SET value=0 WHERE scorer='diagnosis_match'")
    for sid, raw in db.execute("SELECT sample_id, scored_json FROM scored_samples").fetchall():
        data = json.loads(raw)
        data.pop("scoring_version", None)
        for s in data["scores"]:
            if s["scorer"] == "diagnosis_match":
                s["value"] = 0.0
        db.execute(
            "UPDATE scored_samples SET scored_json=? WHERE sample_id=?", (json.dumps(data), sid)
        )
    db.commit()
    db.close()


def test_the_canary_fires_on_changed_answers_only(
    setup: tuple[CliRunner, Path, Path], tmp_path: Path
) -> None:
    cli, canary, runs = setup
    first = cli.invoke(app, ["canary", str(canary), "--n-boot", "300"])
    assert first.exit_code == 0, first.output
    assert "FIRST run of this file" in _flat(first.output)
    run1 = _newest(runs)
    mark = _mark(run1)
    assert mark is not None and (mark.name, mark.verdict) == ("weekly-ms", "first")
    store = open_store(run1, read_only=True)
    assert {s.case_id for s in store.samples(calls=False, scores=False)} == {
        case_id(i) for i in range(N)
    }  # the pinned cases only
    store.close()

    same = cli.invoke(app, ["canary", str(canary), "--n-boot", "300"])
    assert same.exit_code == 0, same.output
    out = _flat(same.output)
    assert f"against run {open_store(run1, read_only=True).run_log().run_id}" in out
    assert "QUIET" in out and "0 of 10 case questions flipped (0%)" in out
    run2 = _newest(runs)
    assert _mark(run2).verdict == "quiet"  # type: ignore[union-attr]

    # the earlier run scored with an older version (and differently): rescored first, quiet
    _as_if_scored_with_an_older_version(run2)
    bumped = cli.invoke(app, ["canary", str(canary), "--n-boot", "300"])
    assert bumped.exit_code == 0, bumped.output
    out = _flat(bumped.output)
    assert "earlier run rescored first" in out and "1 (unrecorded)" in out
    assert "QUIET" in out and "0 of 10 case questions flipped" in out
    run3 = _newest(runs)

    # the provider changes the model behind the same name: 3 of the 10 cases answer otherwise
    # (cases 0 and 1 now wrong, case 8 now right): 30% of the cases flip, over the 20% set
    write_replay(tmp_path / "model.jsonl", N + 2, wrong={0, 1})
    changed = cli.invoke(app, ["canary", str(canary), "--n-boot", "300", "--json"])
    assert changed.exit_code == 4, changed.output
    outcome = json.loads(changed.stdout)
    assert outcome["verdict"] == "alarm"
    assert outcome["earlier"]["run_id"] == open_store(run3, read_only=True).run_log().run_id
    [m] = outcome["models"]
    assert (m["flipped"], m["n_shared_units"]) == (3, 10)
    assert any("3 of 10 case questions flipped (2 right->wrong, 1 wrong->right): 30% > 20%" in r
               for r in m["reasons"])  # fmt: skip
    # the model's passport says what changed behind the name (here: the replay file's content)
    [(model, fields)] = outcome["passport_changes"].items()
    assert model == m["model"] and [f["field"] for f in fields] == ["replay_sha256"]
    text = _flat(changed.stderr)
    assert "ALARM" in text and "canary weekly-ms: ALARM" in text
    assert f"passport replay_sha256: {fields[0]['before']} -> {fields[0]['after']}" in text
    run4 = _newest(runs)
    mark = _mark(run4)
    assert (
        mark is not None
        and mark.verdict == "alarm"
        and "3 of 10 case questions flipped" in mark.detail
    )
    assert "passport: replay_sha256" in mark.detail
    # the index shows the mark (the catalog reads the note)
    index = cli.invoke(app, ["runs", "index", "--json"])
    assert index.exit_code == 0, index.output
    marks = {e["run_id"]: e["canary"] for e in json.loads(index.stdout)["runs"]}
    assert marks[open_store(run4, read_only=True).run_log().run_id]["verdict"] == "alarm"

    # the service's /metrics reads the newest mark of each canary at scrape time
    ctx = build_context(tmp_path / "var", runs_dir=runs)
    _, token = ctx.tokens.create(Role.REVIEWER, "scraper")
    with TestClient(create_app(ctx)) as c:
        body = c.get("/metrics", headers={"Authorization": f"Bearer {token}"}).text
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(body)
        for s in f.samples
    }
    assert values[("neurosandbox_canary_alarm", (("canary", "weekly-ms"),))] == 1.0
    assert (
        values[("neurosandbox_canary_last_run_timestamp_seconds", (("canary", "weekly-ms"),))] > 0
    )


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("dataset: {path: x}\nmodels: [m]\n", "name: Field required"),
        ("name: 'bad name!'\ndataset: {path: x}\nmodels: [m]\n", "name: String should match"),
        ("name: c\ndataset: {path: x}\nmodels: []\n", "models: List should have at least 1"),
        ("name: c\ndataset: {path: x}\nmodels: [m]\nalarm: {flip_share: 2}\n", "alarm.flip_share"),
        ("name: c\ndataset: {path: x}\nmodels: [m]\nsampels: 3\n", "sampels: Extra inputs"),
        ("- a list\n", "not a mapping of fields"),
        ("name: [unclosed\n", "not YAML"),
    ],
)
def test_a_bad_canary_file_is_refused_naming_the_field(
    setup: tuple[CliRunner, Path, Path], tmp_path: Path, text: str, said: str
) -> None:
    cli, _, runs = setup
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    res = cli.invoke(app, ["canary", str(bad)])
    assert res.exit_code == 2, res.output
    assert said in _flat(res.output) and str(bad) in _flat(res.output)
    assert not runs.exists() or not list(runs.iterdir())  # nothing was run


def test_a_pinned_case_the_dataset_lacks_is_refused(
    setup: tuple[CliRunner, Path, Path], tmp_path: Path
) -> None:
    cli, canary, _ = setup
    canary.write_text(CANARY.format(ids="nmb-000, nmb-999"))
    res = cli.invoke(app, ["canary", str(canary)])
    assert res.exit_code == 2
    assert "no case 'nmb-999'" in _flat(res.output)


def test_the_canary_on_the_postgresql_run_log(
    setup: tuple[CliRunner, Path, Path],
    tmp_path: Path,
    pg_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One run log for the install: the runs' rows in PostgreSQL, their folders holding a marker;
    the earlier run is found through the catalog and compared there."""
    from pg_server import fresh_pg_database

    cli, canary, runs = setup
    monkeypatch.setenv("NEUROSANDBOX_DATABASE_URL", fresh_pg_database(pg_url))
    first = cli.invoke(app, ["canary", str(canary), "--n-boot", "300"])
    assert first.exit_code == 0, first.output
    run1 = _newest(runs)
    assert not (run1 / "run.sqlite").exists()  # the rows are in PostgreSQL
    write_replay(tmp_path / "model.jsonl", N + 2, wrong={0, 1})
    changed = cli.invoke(app, ["canary", str(canary), "--n-boot", "300", "--json"])
    assert changed.exit_code == 4, changed.output
    outcome = json.loads(changed.stdout)
    assert outcome["earlier"]["run_dir"] == str(run1)
    assert outcome["models"][0]["flipped"] == 3
    res = cli.invoke(app, ["runs", "compare", str(run1), str(_newest(runs)), "--json",
                           "--n-boot", "300"])  # fmt: skip
    assert res.exit_code == 0, res.output
    [m] = json.loads(res.stdout)["models"]
    assert (m["n_right_to_wrong"], m["n_wrong_to_right"]) == (2, 1)


def test_failed_calls_exit_1_when_quiet_and_4_when_the_alarm_rings(
    setup: tuple[CliRunner, Path, Path], tmp_path: Path
) -> None:
    cli, canary, _ = setup
    assert cli.invoke(app, ["canary", str(canary), "--n-boot", "300"]).exit_code == 0
    # case 9's call fails (no answer): not compared, listed; the rest unchanged: quiet, exit 1
    write_replay(tmp_path / "model.jsonl", N + 2, wrong={8}, missing={9})
    res = cli.invoke(app, ["canary", str(canary), "--n-boot", "300", "--json"])
    assert res.exit_code == 1, res.output
    outcome = json.loads(res.stdout)
    assert outcome["verdict"] == "quiet"
    [m] = outcome["comparison"]["models"]
    assert [u["case_id"] for u in m["only_a"]] == [case_id(9)]
    # failed calls and changed answers: the alarm is the news, exit 4
    write_replay(tmp_path / "model.jsonl", N + 2, wrong={0, 1, 2, 8}, missing={9})
    res = cli.invoke(app, ["canary", str(canary), "--n-boot", "300"])
    assert res.exit_code == 4, res.output


def test_the_documented_example_file_is_a_valid_canary() -> None:
    from gateway.canary import read_canary

    root = Path(__file__).resolve().parents[1]
    canary = read_canary(root / "docs" / "canary.example.yaml")
    assert canary.spec.name == "weekly-neuro"
    assert Path(canary.dataset().path) == root / "docs" / "manifest.example.yaml"
    assert canary.dataset().case_ids == ["pilot-001", "pilot-002"]
    assert canary.spec.alarm.flip_share == 0.1


def test_a_changed_dataset_starts_a_new_series_never_compared_across(
    setup: tuple[CliRunner, Path, Path], tmp_path: Path
) -> None:
    cli, canary, runs = setup
    assert cli.invoke(app, ["canary", str(canary), "--n-boot", "300"]).exit_code == 0
    run1 = _newest(runs)
    write_nmb(tmp_path / "data", N + 2, marker={0: "New line in the record."})  # cases edited
    res = cli.invoke(app, ["canary", str(canary), "--n-boot", "300"])
    assert res.exit_code == 0, res.output
    out = _flat(res.output)
    run1_id = open_store(run1, read_only=True).run_log().run_id
    assert f"the dataset's content changed since run {run1_id}" in out and "FIRST" in out
    assert _mark(_newest(runs)).verdict == "first"  # type: ignore[union-attr]
    run2_id = open_store(_newest(runs), read_only=True).run_log().run_id
    res = cli.invoke(app, ["canary", str(canary), "--n-boot", "300"])
    assert res.exit_code == 0, res.output
    assert f"against run {run2_id}" in _flat(res.output) and "QUIET" in _flat(res.output)


def test_answers_that_turn_unusable_are_flips_and_ring_the_alarm(
    setup: tuple[CliRunner, Path, Path], tmp_path: Path
) -> None:
    """A model that starts failing the answer format on cases it answered right has changed:
    such answers are wrong (as pass@k counts them), never left out of the comparison (a
    fresh-clone trial: 4 of 12 cases turned to format failures, and the canary said QUIET,
    '0 of 32 case questions flipped')."""
    cli, canary, _ = setup
    assert cli.invoke(app, ["canary", str(canary), "--n-boot", "300"]).exit_code == 0
    write_replay(tmp_path / "model.jsonl", N + 2, wrong={8}, unusable={0, 1, 2})
    res = cli.invoke(app, ["canary", str(canary), "--n-boot", "300", "--json"])
    assert res.exit_code == 4, res.output
    outcome = json.loads(res.stdout)
    [m] = outcome["models"]
    assert (m["flipped"], m["n_shared_units"]) == (3, 10)
    [cmp] = outcome["comparison"]["models"]
    assert sorted(u["case_id"] for u in cmp["right_to_wrong"]) == [case_id(i) for i in (0, 1, 2)]


def test_answers_that_turn_into_refusals_are_flips_too(
    setup: tuple[CliRunner, Path, Path], tmp_path: Path
) -> None:
    """Another member of the class: a model that starts declining cases it answered right."""
    cli, canary, runs = setup
    assert cli.invoke(app, ["canary", str(canary), "--n-boot", "300"]).exit_code == 0
    write_replay(tmp_path / "model.jsonl", N + 2, wrong={8}, refused={3, 4, 5})
    res = cli.invoke(app, ["canary", str(canary), "--n-boot", "300", "--json"])
    assert res.exit_code == 4, res.output
    store = open_store(_newest(runs), read_only=True)
    statuses = {s.case_id: s.status for s in store.samples(calls=False, scores=False)}
    store.close()
    assert {statuses[case_id(i)] for i in (3, 4, 5)} == {"refusal"}
    [cmp] = json.loads(res.stdout)["comparison"]["models"]
    assert sorted(u["case_id"] for u in cmp["right_to_wrong"]) == [case_id(i) for i in (3, 4, 5)]
