"""The UNVERIFIED SR does not wait for the checklist's print (issue 41): the pipeline stores the
SRs as soon as they are built, while Chromium prints the checklist, and the PDF follows. With
the gateway following Orthanc's /changes, a print slower than Orthanc's stable age lets Orthanc
call the study stable between our SR and our PDF: that event is held by the run writing back
and superseded by the PDF's store, so one StableStudy (one skipped run) follows the
write-back, as when SR and PDF were stored together, and SR and PDF are each stored once.

The print is made slow by wrapping the gateway's own printer (the product's path unchanged):
it waits until the SR is in Orthanc and Orthanc has called the study stable after it."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from gateway_inproc import finished_runs, rules_file, start_gateway
from gateway_synth import make_study
from orthanc_fixture import OrthancServer

from gateway.orthanc import OrthancClient
from gateway.runs import RunStatus, SkipKind
from gateway.sr import series_uid_for
from gateway.study_key import orthanc_id

pytestmark = pytest.mark.integration
SR_CLASS = "1.2.840.10008.5.1.4.1.1.88.34"
PDF_CLASS = "1.2.840.10008.5.1.4.1.1.104.1"


def _ours(client: OrthancClient, sid: str, study_uid: str) -> dict[str, int]:
    """How many SRs and PDFs of ours the study holds in Orthanc."""
    out = {"sr": 0, "pdf": 0}
    if client.find_study(study_uid) != sid:
        return out
    for s in client.list_series(sid, classify=False):
        for kind in out:
            if s.series_uid == series_uid_for(study_uid, kind):
                out[kind] += len(client.series_instances(s.orthanc_id))
    return out


def _stable_since(client: OrthancClient, sid: str, since: int) -> bool:
    changes, _, _ = client.changes(since, limit=1000)
    return any(c.get("ChangeType") == "StableStudy" and c.get("ID") == sid for c in changes)


def test_the_sr_is_stored_while_the_pdf_prints_and_one_stable_study_follows(
    orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    routing = rules_file(tmp_path / "rules.yaml", ["differential"])
    gw = start_gateway(orthanc_server, tmp_path / "data", routing, 1.0, follow_changes=True)
    assert gw.follower is not None and gw.pipeline.printer is not None
    gw.follower.poll_s = 0.2
    client = gw.ctx.orthanc
    study = make_study(tmp_path / "s", classes=("FLAIR",), n_slices=3, patient_id="WB41-ORDER")
    sid = orthanc_id("WB41-ORDER", study.study_uid)
    printer = gw.pipeline.printer
    real_print = printer.print
    seen: dict[str, Any] = {}

    def slow_print(jobs: list[tuple[Path, Path]]) -> Any:
        """The print, once the SR is in Orthanc (at most 15 s) and Orthanc has called the
        study stable after it (at most 10 s more): on the old code the SR waits for this.
        Another study's print (one an earlier test left in the session's Orthanc, called stable
        while this test runs) goes as it is."""
        ours = {r.run_id for r in gw.ctx.runs.list(study_uid=study.study_uid)}
        if not any(part in ours for _, pdf in jobs for part in pdf.parts):
            return real_print(jobs)
        seq = int(client.get_json("/changes", {"last": ""}).get("Last", 0))
        deadline = time.monotonic() + 15
        while _ours(client, sid, study.study_uid)["sr"] == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        seen["in orthanc before the print"] = _ours(client, sid, study.study_uid)
        seen["runs then"] = {r.run_id for r in gw.ctx.runs.list(study_uid=study.study_uid)}
        if seen["in orthanc before the print"]["sr"]:
            deadline = time.monotonic() + 10
            while not _stable_since(client, sid, seq) and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(0.6)  # the follower hands it to the pipeline (it polls every 0.2 s)
        seen["seq before the pdf"] = int(client.get_json("/changes", {"last": ""}).get("Last", 0))
        return real_print(jobs)

    printer.print = slow_print  # type: ignore[method-assign]
    try:
        _storescu(gw.scp.port, tmp_path / "s")
        finished = finished_runs(gw, 1, study.study_uid, timeout_s=90)
        # (the StableStudy of the study's own instances may have made a skipped run too)
        (run,) = [r for r in finished if r.trigger == "dicom"]
        assert run.status is RunStatus.DONE, run.error
        # the SR was in Orthanc while the PDF was still to be printed (no PDF yet)
        assert seen["in orthanc before the print"] == {"sr": 1, "pdf": 0}, seen
        # Orthanc calls the study stable after our PDF; once the follower handed that on, the
        # runs since the SR: one, skipped (nothing new), for the SR's event and the PDF's
        deadline = time.monotonic() + 15
        while not _stable_since(client, sid, seen["seq before the pdf"]):
            assert time.monotonic() < deadline, "Orthanc never called the study stable"
            time.sleep(0.1)
        time.sleep(0.6)
        assert gw.pipeline.wait_idle(30)
        later = [r for r in gw.ctx.runs.list(study_uid=study.study_uid)
                 if r.run_id not in seen["runs then"]]  # fmt: skip
        assert [(r.trigger, r.status, r.skip) for r in later] == [
            ("orthanc", RunStatus.SKIPPED, SkipKind.UNCHANGED)
        ], later
        # SR and PDF each stored once, recorded done, nothing pending
        assert _ours(client, sid, study.study_uid) == {"sr": 1, "pdf": 1}
        rec = gw.ctx.runs.get(run.run_id)
        assert [w.kind for w in rec.writebacks_done] == ["sr", "pdf"] and not rec.writebacks_pending
    finally:
        gw.stop()


def _storescu(port: int, folder: Path) -> None:
    subprocess.run(["/usr/bin/storescu", "-aec", "NEUROSANDBOX", "+sd", "+r", "127.0.0.1",
                    str(port), str(folder)], check=True, timeout=60, capture_output=True)  # fmt: skip
