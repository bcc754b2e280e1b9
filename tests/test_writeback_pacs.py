"""Write-back to the configured PACS (gateway/writeback.py, gateway/writeback_retry.py): with
the destination down, the run completes, its SR and PDF are kept and pending in the run log
(shown by `runs show`); a case signed off meanwhile has its VERIFIED SR and PDF kept and pending
too (the sign-off says so); a gateway restarted in between loses nothing; once the PACS is up the
retry stores them all, the review log records each VERIFIED object stored, they are found there
by C-FIND and the kept files are gone."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pydicom
import pytest
import yaml
from dcmqrscp_fixture import AE_TITLE, running_dcmqrscp
from fastapi.testclient import TestClient
from gateway_inproc import finished_runs, rules_file, start_gateway
from orthanc_fixture import OrthancServer
from review_server import bearer

from evaluation.review import Action
from gateway.api import create_app
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
        signed = _sign_off(gw.ctx, run.run_id)  # the archive still down
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
    assert "cannot associate" in said
    # the sign-off is recorded; its VERIFIED report is kept and waits with the rest
    assert signed["pacs"]["status"] == "kept", signed["pacs"]
    assert "kept" in signed["pacs"]["message"] and "tried again" in signed["pacs"]["message"]
    rec = gw.ctx.runs.get(run.run_id)
    verified = [w for w in rec.writebacks_pending if w.kind.startswith("verified")]
    assert sorted({w.kind for w in verified}) == ["verified-pdf", "verified-sr"], verified
    assert all(w.verified is not None and w.verified.person == "Pending^Pat" for w in verified)
    assert all(Path(w.kept or "").is_file() for w in verified)
    # sent again by hand, still down: the same kept objects are tried, no second copy is built
    again = signed["resend"]
    assert sorted(again["kept_sop_instance_uids"]) == sorted(w.sop_instance_uid for w in verified)
    assert not again["sr_sop_instance_uids"] and "kept" in " ".join(again["warnings"])
    rec = gw.ctx.runs.get(run.run_id)
    assert [w.sop_instance_uid for w in rec.writebacks_pending if w.verified] == [
        w.sop_instance_uid for w in verified
    ]
    n = len(rec.writebacks_pending)
    assert f"write-back to archive: 0 stored, {n} pending" in said
    assert not _reissued(gw.ctx, run.run_id)  # nothing stored: not in the PACS yet

    # the archive comes up; a new gateway on the same data (a restart) stores what is pending
    with running_dcmqrscp(tmp_path / "archive", port) as archive:
        gw2 = start_gateway(orthanc_server, data, routing, 1.0, **extra)
        try:
            retry = gw2.writeback_retry
            assert retry is not None
            assert retry.run_once() == 0  # not due yet: the delay after a failure holds
            retry.now = lambda: time.time() + 3600
            assert retry.run_once() == n
            rec = gw2.ctx.runs.get(run.run_id)
            # each VERIFIED object stored is in the review log, as a sign-off's send records it
            assert sorted(_reissued(gw2.ctx, run.run_id)) == sorted(
                w.sop_instance_uid for w in verified
            )
        finally:
            gw2.stop()
        assert not rec.writebacks_pending
        assert sorted(w.kind for w in rec.writebacks_done if not w.kind.startswith("verified")) == [
            "pdf", "sr",
        ]  # fmt: skip
        assert all(w.at and w.destination == "archive" for w in rec.writebacks_done)
        assert not any(p.exists() for p in kept) and not kept[0].parent.exists()
        client = DimseClient("archive", DimsePacs(kind="dimse", ae_title=AE_TITLE,
                                                  host="127.0.0.1", port=archive.port))  # fmt: skip
        (m,) = client.find_studies(StudyQuery(study_uids=[study.study_uid]))
        assert set(m.modalities) >= {"SR", "DOC"} and m.n_instances == n, m
        # the VERIFIED SR names the UNVERIFIED one the run wrote back there as predecessor
        got = client.retrieve(m, tmp_path / "got")
        docs = [pydicom.dcmread(f) for f in got.folder.rglob("*") if f.is_file()]
        ver = [d for d in docs if d.get("VerificationFlag") == "VERIFIED"]
        assert ver and all(
            {str(x.ReferencedSOPInstanceUID) for st in d.PredecessorDocumentsSequence
             for se in st.ReferencedSeriesSequence for x in se.ReferencedSOPSequence}
            == set(rec.sr_sop_uids.values())
            for d in ver
        ), [d.get("PredecessorDocumentsSequence") for d in ver]  # fmt: skip


def _sign_off(ctx, run_id: str) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """Sign the run's case off through the review API (every item accepted); the answer."""
    auth = bearer(ctx, "Dr Pending", "Pending^Pat")
    with TestClient(create_app(ctx)) as c:
        summary = c.get(f"/review/runs/{run_id}/summary.json", headers=auth).json()
        url = f"/review/api/runs/{run_id}/cases/{summary['cases'][0]['slug']}"
        for block in c.get(url, headers=auth).json()["blocks"]:
            r = c.post(f"{url}/accept-remaining", headers=auth, json={"model": block["model"]})
            assert r.status_code in (200, 409), r.text
        digest = c.get(f"{url}/signoff", headers=auth).json()["digest"]
        r = c.post(f"{url}/signoff", headers=auth, json={"digest": digest})
        assert r.status_code == 200, r.text
        again = c.post(f"{url}/reissue", headers=auth, json={})
        assert again.status_code == 200, again.text
        return {**r.json(), "resend": again.json()}


def _reissued(ctx, run_id: str) -> list[str]:  # type: ignore[no-untyped-def]
    """The SOP Instance UIDs the review log records as stored in the PACS for the run."""
    from gateway.review.service import ReviewService

    svc = ReviewService(ctx.settings, ctx.runs)
    return [e.text for e in svc.store.events() if e.action is Action.REISSUE]


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
