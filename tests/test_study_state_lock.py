"""A study's state (what of it was uploaded, its revisions, its last run) is changed by the
gateway and by its workers, in several threads and processes on one data folder: each change
is a read, a change and a write of one file, and none may be lost to another made meanwhile.

On the old code the pipeline read the state, changed it and saved it whole: two processes
doing that at once kept only one of their changes (and there was no ``update_study_state``).
"""

from __future__ import annotations

import ast
import multiprocessing
from pathlib import Path
from typing import Any

from gateway.runs import StudyRunStore, StudyState
from gateway.study_key import StudyKey

ROOT = Path(__file__).resolve().parents[1]
KEY = StudyKey(study_uid="1.2.826.0.1.3680043.8.498.1", patient_id="NSBX-LOCK")
N = 100


def _add(root: str, tag: str, start: Any) -> None:
    runs = StudyRunStore(Path(root))
    start.wait()
    for k in range(N):

        def change(state: StudyState, sop: str = f"{tag}.{k}") -> None:
            state.uploaded = sorted({*state.uploaded, sop})
            state.revisions[sop] = state.revisions.get(sop, 0) + 1

        runs.update_study_state(KEY, change)


def test_changes_made_at_once_by_two_processes_are_all_kept(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    procs = [ctx.Process(target=_add, args=(str(tmp_path), tag, start)) for tag in "ab"]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    state = StudyRunStore(tmp_path).study_state(KEY)
    assert len(state.uploaded) == 2 * N
    assert sum(state.revisions.values()) == 2 * N


def test_update_returns_what_the_change_returns_and_writes_once() -> None:
    # the change sees the state as stored and its result comes back (the pipeline decides
    # what was revised from the state it changes, under the same lock)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        runs = StudyRunStore(Path(tmp))
        runs.update_study_state(KEY, lambda s: s.files.update({"1.2.3": "f1"}))

        def revise(state: StudyState) -> list[str]:
            revised = [s for s, f in {"1.2.3": "f2"}.items() if state.files.get(s, f) != f]
            state.files["1.2.3"] = "f2"
            return revised

        assert runs.update_study_state(KEY, revise) == ["1.2.3"]
        assert runs.study_state(KEY).files == {"1.2.3": "f2"}


def test_the_gateway_changes_a_study_s_state_only_through_update_study_state() -> None:
    # a read of the state, then a save of it whole, loses what another process wrote between
    offenders: list[str] = []
    for path in sorted((ROOT / "gateway").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            named = isinstance(node, ast.Attribute) and node.attr == "save_study_state"
            if named and path.name != "store.py":
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


def test_a_run_becomes_the_study_s_last_only_over_an_earlier_version(tmp_path: Path) -> None:
    # an interrupted run that wrote back version v is the study's last run, found by the
    # study's name alone (no PACS), unless a run of v or later already is
    from gateway.runs import RunRecord, RunStatus

    runs = StudyRunStore(tmp_path)

    def run(version: int) -> str:
        run_id = runs.new_id()
        runs.create(RunRecord(run_id=run_id, trigger="dicom", study_uid=KEY.study_uid,
                              study_key=KEY.name, status=RunStatus.RUNNING))  # fmt: skip
        runs.update(run_id, version=version)
        return run_id

    first = run(3)
    assert runs.make_last_run(KEY.name, first, 3)
    assert not runs.make_last_run(KEY.name, run(2), 2)  # an older version never takes over
    assert not runs.make_last_run(KEY.name, run(3), 3)
    assert runs.study_state(KEY).last_run_id == first
    later = run(4)
    assert runs.make_last_run(KEY.name, later, 4)
    assert runs.last_evaluation(KEY).version == 4
    assert not runs.make_last_run("not a study key", later, 9)


def test_a_purge_removes_a_study_s_state_under_the_lock(tmp_path: Path) -> None:
    # a change that read the state before the purge removed it would write it back: the
    # purge removes state files only while no change is under way
    import threading

    from gateway.purge import Places, Purger
    from gateway.purge_target import PurgeTarget

    runs = StudyRunStore(tmp_path)
    runs.update_study_state(KEY, lambda s: s.uploaded.append("1.2.3"))
    held, purged = threading.Event(), threading.Event()
    purged_while_held: list[bool] = []

    def change_under_way() -> None:
        with runs.study_state_lock():
            held.set()
            purged_while_held.append(purged.wait(0.5))
        runs.update_study_state(KEY, lambda s: None)  # what the change then writes

    t = threading.Thread(target=change_under_way)
    t.start()
    held.wait(5)
    report = Purger(Places(data_dir=tmp_path)).purge(PurgeTarget(study_uid=KEY.study_uid))
    purged.set()
    t.join(10)
    assert purged_while_held == [False]  # the purge waited for the change under way
    assert report.counts.study_states == 1
    assert runs.study_state(KEY).uploaded == []  # written after the purge: nothing of before
