"""A gateway run's one record: the run log's GatewayRun in the run's store (the run folder's
run.sqlite), from the moment the study is queued (before, and without, the engine's run)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evaluation.log import STORE_FILE, RunStore
from gateway.cli import app
from gateway.routing import Route
from gateway.runs import (
    GATEWAY_NOTE,
    RunNotFoundError,
    RunRecord,
    RunStatus,
    StudyRunStore,
    route_record,
)


def test_a_queued_run_is_recorded_in_its_run_store_and_listed_newest_first(
    tmp_path: Path,
) -> None:
    runs = StudyRunStore(tmp_path / "data")
    ids = [runs.new_id() for _ in range(3)]
    assert ids == sorted(ids) and all(len(i) == 32 for i in ids)  # time-ordered
    route = Route(rule="r", models=["reference/image-rules"], tasks=[], series_classes=["FLAIR"])
    for n, run_id in enumerate(ids):
        runs.create(
            RunRecord(
                run_id=run_id, trigger="dicom", study_uid=f"1.2.{n}", route=route_record(route)
            )
        )
    runs.update(ids[1], status=RunStatus.RUNNING, stage="evaluating", progress=0.4)
    runs.finish(ids[2], RunStatus.SKIPPED, error="no routing rule selects this study")
    # one file per run: the run store, its GatewayRun the record (no note)
    for run_id in ids:
        assert sorted(p.name for p in runs.run_dir(run_id).iterdir()) == [STORE_FILE]
    store = RunStore(runs.run_dir(ids[1]))
    try:
        assert not store.has_run()  # the engine has not started it
        assert store.note(GATEWAY_NOTE) is None
        rec = store.gateway_run()
        assert rec is not None
    finally:
        store.close()
    assert (
        rec.status is RunStatus.RUNNING
        and rec.stage == "evaluating"
        and rec.route == route_record(route)
    )
    assert [r.run_id for r in runs.list()] == ids[::-1]
    assert [r.run_id for r in runs.list(study_uid="1.2.0")] == [ids[0]]
    with pytest.raises(RunNotFoundError):
        runs.get("0" * 32)
    with pytest.raises(RunNotFoundError):
        runs.report_path(ids[2], "json")  # skipped: no report bundle


def test_reading_while_runs_are_created_never_fails(tmp_path: Path) -> None:
    """The pipeline creates run stores while the API (or the demo, another process) lists
    them: a half-made store is "not yet a run", never an error."""
    runs, reader = StudyRunStore(tmp_path / "data"), StudyRunStore(tmp_path / "data")
    errors: list[BaseException] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            try:
                reader.list(limit=1000)
            except BaseException as exc:
                errors.append(exc)
                return

    t = threading.Thread(target=read)
    t.start()
    try:
        for n in range(60):
            runs.create(RunRecord(run_id=runs.new_id(), trigger="api", study_uid=f"1.{n}"))
    finally:
        done.set()
        t.join(30)
    assert not errors, errors
    assert len(reader.list(limit=1000)) == 60


def test_runs_list_shows_a_gateway_run_the_engine_never_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    runs = StudyRunStore(data)
    skipped = runs.new_id()
    runs.create(RunRecord(run_id=skipped, trigger="orthanc", study_uid="1.2.3"))
    runs.finish(skipped, RunStatus.SKIPPED, error="no new instances since the last evaluation")
    broken = runs.new_id()
    runs.create(RunRecord(run_id=broken, trigger="dicom"))
    store = RunStore(runs.run_dir(broken))
    store.set_note(GATEWAY_NOTE, '{"run_id": 5}')  # a record that does not validate
    store.close()
    monkeypatch.setenv("NEUROSANDBOX_DATA_DIR", str(data))
    monkeypatch.setenv("NEUROSANDBOX_RUNS_DIR", str(data / "runs"))  # listed once, not twice
    monkeypatch.setenv("COLUMNS", "250")
    out = CliRunner().invoke(app, ["runs", "list"])
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    # (rich wraps the cells: the run id and the status, each once)
    assert text.count(skipped) == 1 and "skipped: no new instances" in text
    assert text.count(broken) == 1 and "unreadable gateway record" in text
