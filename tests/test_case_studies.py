"""A registered case that names several studies is evaluated once, on every study it names.

Real parts: storescu, the gateway's node and pipeline in process, a real Orthanc.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pydicom
import pytest
from gateway_inproc import finished_runs, rules_file, start_gateway
from gateway_process import send
from gateway_synth import make_study
from orthanc_fixture import OrthancServer

from evaluation.log import RunData
from gateway.runs import RunRecord, RunStatus
from gateway.serve import Gateway

pytestmark = pytest.mark.integration
QUIET = 1.0


def _gateway(orthanc_server: OrthancServer, tmp: Path, suite: Path, wait_s: float) -> Gateway:
    routing = rules_file(tmp / "rules.yaml", ["differential"], "r")
    return start_gateway(
        orthanc_server, tmp / "data", routing, QUIET, cases=suite, case_wait_s=wait_s
    )


def _register(suite: Path, case_id: str, study_uids: list[str], patient_id: str | None) -> Path:
    case = {
        "case_id": case_id,
        "patient_id": patient_id,
        "tasks": ["differential"],
        "note": "Sudden left-sided weakness; CT, then MR the next day.",
        "ground_truth": {"final_diagnosis": {"name": "ischaemic stroke"}},
        "provenance": {"source": "hospital", "study_uids": study_uids},
    }
    (suite / case_id).mkdir(parents=True)
    (suite / case_id / "case.json").write_text(json.dumps(case))
    return suite


def _finished(gw: Gateway, n: int) -> list[RunRecord]:
    return finished_runs(gw, n, timeout_s=60)


def test_a_case_of_two_studies_sent_together_is_one_run_on_both(
    orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    ct = make_study(tmp_path / "ct", classes=("FLAIR",), n_slices=4, patient_id="NSBX-CASE2")
    mr = make_study(tmp_path / "mr", classes=("T2",), n_slices=4, patient_id="NSBX-CASE2",
                    first_series_number=5)  # fmt: skip
    suite = _register(tmp_path / "suite", "stroke-2", [ct.study_uid, mr.study_uid], "NSBX-CASE2")
    gw = _gateway(orthanc_server, tmp_path, suite, wait_s=60)
    try:
        send(gw.scp.port, [*ct.files, *mr.files])  # one association, two studies
        [run] = _finished(gw, 1)
        time.sleep(QUIET + 1)  # the second study's completion adds no run
        assert gw.pipeline.wait_idle(10)
        assert [r.run_id for r in gw.ctx.runs.list()] == [run.run_id]
        assert run.status is RunStatus.DONE, run
        assert run.study_uid == ct.study_uid and run.n_instances == 8
        bundle = RunData.model_validate_json(
            gw.ctx.runs.report_path(run.run_id, "json").read_text()
        )
        [case] = bundle.cases
        assert case.case_id == "stroke-2"  # evaluated as the registered case
        shown = {i.series_uid for i in case.images}
        assert shown == {ct.series_uids["FLAIR"], mr.series_uids["T2"]}
        # the SR goes into the case's first study, citing that study's series
        client = gw.ctx.orthanc
        sid = client.find_study_of(ct.study_uid, "NSBX-CASE2")
        assert sid is not None
        srs = [s for s in client.list_series(sid, classify=False) if s.modality == "SR"]
        assert len(srs) == 1
        [key] = client.series_instances(srs[0].orthanc_id)
        r = client.api.get(f"{client.url}/instances/{key.instance_id}/file")
        sr = pydicom.dcmread(io.BytesIO(r.content))
        cited = {
            s.SeriesInstanceUID
            for e in sr.CurrentRequestedProcedureEvidenceSequence
            for s in e.ReferencedSeriesSequence
        }
        assert cited == {ct.series_uids["FLAIR"]}
    finally:
        gw.stop()


def test_a_case_whose_second_study_never_comes_is_evaluated_after_the_wait_saying_so(
    orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    ct = make_study(tmp_path / "ct", classes=("FLAIR",), n_slices=4, patient_id="NSBX-CASE3")
    missing = "1.2.826.0.1.3680043.8.498.1234567"
    suite = _register(tmp_path / "suite", "stroke-3", [ct.study_uid, missing], "NSBX-CASE3")
    gw = _gateway(orthanc_server, tmp_path, suite, wait_s=2.0)
    try:
        t0 = time.monotonic()
        send(gw.scp.port, ct.files)
        [run] = _finished(gw, 1)
        assert time.monotonic() - t0 >= QUIET + 2.0  # it waited for the other study
        assert run.status is RunStatus.DONE, run
        assert any(missing in w and "stroke-3" in w for w in run.warnings), run.warnings
    finally:
        gw.stop()


def test_a_case_whose_studies_name_two_patients_is_held(
    orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    ct = make_study(tmp_path / "ct", classes=("FLAIR",), n_slices=4, patient_id="NSBX-CASE4-A")
    mr = make_study(tmp_path / "mr", classes=("T2",), n_slices=4, patient_id="NSBX-CASE4-B",
                    first_series_number=5)  # fmt: skip
    suite = _register(tmp_path / "suite", "stroke-4", [ct.study_uid, mr.study_uid], None)
    gw = _gateway(orthanc_server, tmp_path, suite, wait_s=2.0)
    try:
        send(gw.scp.port, [*ct.files, *mr.files])
        runs = _finished(gw, 2)
        assert {r.status for r in runs} == {RunStatus.HELD}, runs
        assert all("NSBX-CASE4-A" in (r.error or "") or "NSBX-CASE4-B" in (r.error or "")
                   for r in runs)  # fmt: skip
        assert not any(r.sr_sop_uids for r in runs)
    finally:
        gw.stop()
