"""A restart re-offers the spool: a study evaluated before is not evaluated again because the
routing rules changed meanwhile; the same study sent again under the new rule is (a real
Orthanc, storescu, the gateway as `serve` wires it with its evaluator in this process)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from gateway_inproc import finished_runs, rules_file, start_gateway
from gateway_process import send
from gateway_synth import SynthStudy, make_study
from orthanc_fixture import OrthancServer

from gateway.runs import RunRecord, RunStatus
from gateway.serve import Gateway
from gateway.study_key import StudyKey

pytestmark = pytest.mark.integration
QUIET = 1.5


def _rules(path: Path, tasks: list[str]) -> Path:
    return rules_file(path, tasks)


def _gateway(orthanc_server: OrthancServer, data: Path, routing: Path) -> Gateway:
    return start_gateway(orthanc_server, data, routing, QUIET)


def _key(study: SynthStudy) -> StudyKey:
    return StudyKey(study_uid=study.study_uid, patient_id=study.patient_id)


def _evaluated_once(
    orthanc_server: OrthancServer, tmp_path: Path, patient_id: str
) -> tuple[SynthStudy, Path, Gateway]:
    """A one-series study sent to a gateway under a differential-only rule and evaluated
    (the gateway is returned running: the caller stops it)."""
    study = make_study(tmp_path / "s", classes=("FLAIR",), n_slices=6, patient_id=patient_id)
    data = tmp_path / "data"
    gw = _gateway(orthanc_server, data, _rules(tmp_path / "a.yaml", ["differential"]))
    try:
        send(gw.scp.port, study.files)
        [first] = _finished(gw, study.study_uid, 1)
        assert first.status is RunStatus.DONE
    except BaseException:
        gw.stop()
        raise
    return study, data, gw


def _finished(gw: Gateway, study_uid: str, n: int, timeout_s: float = 90) -> list[RunRecord]:
    """The study's runs once ``n`` of them have finished (newest first)."""
    return finished_runs(gw, n, study_uid, timeout_s)


def _offered_again(gw: Gateway, study: SynthStudy, timeout_s: float = 60) -> None:
    """Wait until the restarted node has offered the spooled study to the pipeline again
    and the pipeline is idle."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = gw.scp._studies.get(_key(study))
        if st is not None and st.n_new == 0 and gw.pipeline.wait_idle(5):
            return
        time.sleep(0.1)
    raise AssertionError("the spooled study was not offered again after the restart")


def test_a_restart_with_other_rules_does_not_evaluate_the_spool_again(
    orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    study, data, gw = _evaluated_once(orthanc_server, tmp_path, "NSBX-RESTART")
    gw.stop()
    # Restarted with another rule: the spooled study is offered again and skipped without a
    # run record (a restart leaves nothing per spooled study: no 108 KB run store each).
    runs_before = sorted(p.name for p in (data / "runs").iterdir())
    gw = _gateway(orthanc_server, data, _rules(tmp_path / "b.yaml", ["differential", "lesion"]))
    try:
        _offered_again(gw, study)
        assert sorted(p.name for p in (data / "runs").iterdir()) == runs_before
        assert len(gw.ctx.runs.list(study_uid=study.study_uid)) == 1
        # Sent again under the new rule: evaluated by it.
        send(gw.scp.port, study.files)
        again, *_ = _finished(gw, study.study_uid, 2)
        assert again.status is RunStatus.DONE, again
        assert again.route is not None and again.route.rule == "rule-differential-lesion"
    finally:
        gw.stop()


def test_the_first_restart_after_an_upgrade_does_not_evaluate_the_spool_again(
    orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    """A run recorded before the route entered the digest (its evaluated_digest was the
    instances' digest alone, no evaluated_instances): still known as evaluated on a restart."""
    study, data, gw = _evaluated_once(orthanc_server, tmp_path, "NSBX-UPGRADE")
    try:
        last = gw.ctx.runs.last_evaluation(_key(study))
        assert last.run_id is not None and last.evaluated_instances
        # as the version before wrote it
        gw.ctx.runs.update(
            last.run_id, evaluated_digest=last.evaluated_instances, evaluated_instances=None
        )
    finally:
        gw.stop()
    gw = _gateway(orthanc_server, data, _rules(tmp_path / "a.yaml", ["differential"]))
    try:
        _offered_again(gw, study)
        assert [r.status for r in gw.ctx.runs.list(study_uid=study.study_uid)] == [RunStatus.DONE]
    finally:
        gw.stop()
