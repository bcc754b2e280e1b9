"""Write-back to the configured PACS (gateway/writeback.py, gateway/writeback_retry.py): with
the destination down, the run completes, its SR and PDF are kept and pending in the run log
(shown by `runs show`); a gateway restarted in between loses nothing; once the PACS is up the
retry stores them, they are found there by C-FIND and the kept files are gone."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from dcmqrscp_fixture import AE_TITLE, running_dcmqrscp
from gateway_inproc import finished_runs, rules_file, start_gateway
from orthanc_fixture import OrthancServer

from gateway.pacs import DimsePacs, StudyQuery
from gateway.pacs.dimse import DimseClient
from gateway.pacs_local import free_port
from gateway.runs import RunStatus
from tests.gateway_synth import make_study

pytestmark = pytest.mark.integration
SR_CLASS = "1.2.840.10008.5.1.4.1.1.88.34"
CLI = str(Path(sys.executable).with_name("neurosandbox"))


def _send(folder: Path, port: int) -> None:
    subprocess.run(["/usr/bin/storescu", "-aet", "MRI1", "-aec", "NEUROSANDBOX", "+sd", "+r",
                    "127.0.0.1", str(port), str(folder)], check=True, timeout=60,
                   capture_output=True)  # fmt: skip


def test_a_pacs_that_is_down_gets_its_sr_and_pdf_once_it_is_up(
    orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    port = free_port()  # the archive's port: nothing listens there yet
    pacs = tmp_path / "pacs.yaml"
    pacs.write_text(yaml.safe_dump({
        "pacs": {"archive": {"kind": "dimse", "ae_title": AE_TITLE, "host": "127.0.0.1",
                             "port": port, "timeout_s": 5}},
        "writeback": "archive",
    }))  # fmt: skip
    data = tmp_path / "data"
    routing = rules_file(tmp_path / "rules.yaml", ["differential"])
    extra = {"pacs_file": pacs, "writeback_retry_s": 3600.0}  # the test drives the retries
    gw = start_gateway(orthanc_server, data, routing, 1.0, **extra)
    study = make_study(tmp_path / "s", classes=("FLAIR", "T2"), n_slices=3, patient_id="WB-1")
    try:
        _send(tmp_path / "s", gw.ctx.settings.gateway_dicom_port or 0)
        (run,) = finished_runs(gw, 1, study.study_uid, timeout_s=120)
    finally:
        gw.stop()
    # the run completed; its SR and PDF wait, kept, with why
    assert run.status is RunStatus.DONE, run.error
    kinds = sorted(w.kind for w in run.writebacks_pending)
    assert kinds == ["pdf", "sr"] and not run.writebacks_done
    first = run.writebacks_pending[0]
    assert first.destination == "archive" and first.attempts == 1
    assert "ARCHIVE@127.0.0.1" in (first.last_error or "") and first.next_at
    kept = [Path(w.kept or "") for w in run.writebacks_pending]
    assert all(p.is_file() for p in kept)
    assert any("not yet stored in PACS 'archive'" in w for w in run.warnings)
    # `runs show` says so
    env = {**os.environ, "NEUROSANDBOX_DATA_DIR": str(data)}
    folder = gw.ctx.runs.run_dir(run.run_id)
    shown = subprocess.run([CLI, "runs", "show", str(folder)], env=env, capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    said = shown.stdout + shown.stderr
    assert "write-back to archive: 0 stored, 2 pending" in said and "cannot associate" in said

    # the archive comes up; a new gateway on the same data (a restart) stores what is pending
    with running_dcmqrscp(tmp_path / "archive", port) as archive:
        gw2 = start_gateway(orthanc_server, data, routing, 1.0, **extra)
        try:
            retry = gw2.writeback_retry
            assert retry is not None
            assert retry.run_once() == 0  # not due yet: the delay after a failure holds
            retry.now = lambda: time.time() + 3600
            assert retry.run_once() == 2
            rec = gw2.ctx.runs.get(run.run_id)
        finally:
            gw2.stop()
        assert not rec.writebacks_pending
        assert sorted(w.kind for w in rec.writebacks_done) == ["pdf", "sr"]
        assert all(w.at and w.destination == "archive" for w in rec.writebacks_done)
        assert not any(p.exists() for p in kept) and not kept[0].parent.exists()
        client = DimseClient("archive", DimsePacs(kind="dimse", ae_title=AE_TITLE,
                                                  host="127.0.0.1", port=archive.port))  # fmt: skip
        (m,) = client.find_studies(StudyQuery(study_uids=[study.study_uid]))
        assert set(m.modalities) >= {"SR", "DOC"} and m.n_instances == 2, m


def test_a_retry_keeps_the_write_back_order_and_waits_for_what_is_not_due(tmp_path: Path) -> None:
    """SRs before the PDF, whatever was retried: the order pending objects are stored in."""
    import datetime as dt

    import pydicom
    from pydicom.uid import generate_uid

    from evaluation.log import WriteBack
    from gateway.runs import RunRecord, StudyRunStore
    from gateway.writeback import keep
    from gateway.writeback_retry import WritebackRetrier

    runs = StudyRunStore(tmp_path / "data")
    run_id = runs.new_id()
    runs.create(RunRecord(run_id=run_id, trigger="dicom", study_uid="1.2.3"))
    kept_root = tmp_path / "data" / "writeback"
    study = make_study(tmp_path / "s", classes=("T1",), n_slices=2, patient_id="ORDER")
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat(timespec="seconds")
    pending = []
    for n, (kind, next_at) in enumerate((("sr", later), ("sr", None), ("pdf", later))):
        ds = pydicom.dcmread(study.files[n % 2])
        ds.SOPInstanceUID = generate_uid()
        pending.append(WriteBack(kind=kind, sop_instance_uid=str(ds.SOPInstanceUID),
                                 destination="archive", attempts=1, next_at=next_at,
                                 kept=str(keep(kept_root, run_id, ds))))  # fmt: skip
    runs.finish(run_id, RunStatus.DONE, writebacks_pending=pending)
    down = DimseClient("archive", DimsePacs(kind="dimse", ae_title=AE_TITLE, host="127.0.0.1",
                                            port=free_port(), timeout_s=2))  # fmt: skip
    retry = WritebackRetrier(runs, lambda: down, kept_root, base_delay_s=1.0)
    assert retry.run_once() == 0
    left = runs.get(run_id).writebacks_pending
    assert [w.sop_instance_uid for w in left] == [w.sop_instance_uid for w in pending]
    assert [w.attempts for w in left] == [1, 2, 1]  # only the due one was tried
    assert "cannot associate" in (left[1].last_error or "")
    assert all(Path(w.kept or "").is_file() for w in left)
