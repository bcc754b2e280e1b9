"""End to end with real peers: dcmtk storescu -> `neurosandbox serve` -> real Orthanc, and the API.

One gateway process (started by this module, stopped by PID) serves every test here; the
Orthanc is the session one from ``orthanc_fixture``.
"""

from __future__ import annotations

import io
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pydicom
import pytest
from dciodvfy import assert_dciodvfy_clean
from gateway_process import BIN, Gateway, running_gateway, send
from gateway_synth import SynthStudy, in_lesion, make_study
from highdicom.sr import Comprehensive3DSR
from orthanc_fixture import STABLE_AGE, OrthancServer

from gateway.auth import Role, TokenStore

pytestmark = pytest.mark.integration
QUIET = 1.5
SR_CLASS = "1.2.840.10008.5.1.4.1.1.88.34"
PDF_CLASS = "1.2.840.10008.5.1.4.1.1.104.1"


def _cli(env: dict[str, str], *args: str) -> str:
    r = subprocess.run([str(BIN), *args], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.fixture(scope="module")
def gateway(
    orthanc_server: OrthancServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    tokens = TokenStore(orthanc_server.settings.data_dir / "secret" / "tokens.json")
    reviewer = tokens.create(Role.REVIEWER, "test-reviewer", "Reviewer^Test")[1]
    admin = tokens.create(Role.ADMIN, "test-admin")[1]
    log = tmp_path_factory.mktemp("gateway-log") / "serve.log"
    with running_gateway(
        orthanc_server, log, reviewer, admin,
        NEUROSANDBOX_STUDY_QUIET_S=str(QUIET), NEUROSANDBOX_FOLLOW_CHANGES="true",
    ) as gw:  # fmt: skip
        yield gw


def reports(gw: Gateway, study_uid: str) -> dict[str, list[pydicom.Dataset]]:
    study_id = gw.orthanc.find_study(study_uid)
    out: dict[str, list[pydicom.Dataset]] = {"sr": [], "pdf": []}
    if study_id is None:
        return out
    for inst in gw.orthanc.study_instances(study_id):
        meta = gw.orthanc.instance_metadata(inst["ID"])
        kind = {SR_CLASS: "sr", PDF_CLASS: "pdf"}.get(meta.get("SopClassUid", ""))
        if kind:
            raw = gw.orthanc.api.get(f"{gw.orthanc.url}/instances/{inst['ID']}/file").content
            out[kind].append(pydicom.dcmread(io.BytesIO(raw)))
    return out


def pdf_text(pdf: bytes, tmp: Path) -> str:
    """The text of a PDF, by poppler's pdftotext (layout kept, so table cells stay on a line)."""
    src = tmp / "doc.pdf"
    src.write_bytes(pdf)
    r = subprocess.run(
        ["/usr/bin/pdftotext", "-layout", str(src), "-"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    return " ".join(r.stdout.split())


def assert_points_at_the_lesion(sr: pydicom.Dataset, files: list[Path], n_slices: int) -> None:
    """The SR's SCOORD POINT (TID 1410's region) is on a slice of the lesion, inside it."""
    items = [it for e in sr.iterall() if e.VR == "SQ" for it in e.value]
    (scoord,) = [it for it in items if it.get("ValueType") == "SCOORD"]
    (image,) = [it for it in scoord.ContentSequence if it.ValueType == "IMAGE"]
    uid = image.ReferencedSOPSequence[0].ReferencedSOPInstanceUID
    headers = [pydicom.dcmread(p, stop_before_pixels=True) for p in files]
    (target,) = [h for h in headers if h.SOPInstanceUID == uid]
    col, row = (float(v) - 0.5 for v in scoord.GraphicData)  # a pixel's centre is +0.5
    assert in_lesion(target, n_slices, col, row, "left"), (target.InstanceNumber, col, row)


def wait_reports(
    gw: Gateway, study_uid: str, n_sr: int, timeout: float
) -> dict[str, list[pydicom.Dataset]]:
    """Wait for ``n_sr`` SRs and as many checklist PDFs (the pipeline stores the SRs first)."""
    deadline = time.monotonic() + timeout
    got = reports(gw, study_uid)
    while (len(got["sr"]) < n_sr or len(got["pdf"]) < n_sr) and time.monotonic() < deadline:
        time.sleep(0.5)
        got = reports(gw, study_uid)
    return got


def test_a_sent_study_gets_an_unverified_sr_and_pdf_then_a_new_version_for_a_late_series(
    gateway: Gateway, tmp_path: Path
) -> None:
    study = make_study(tmp_path / "s", lesion="left", n_slices=12, patient_id="NSBX-E2E-1")
    t0 = time.monotonic()
    send(gateway, study.files)
    got = wait_reports(gateway, study.study_uid, 1, timeout=QUIET + STABLE_AGE + 45)
    elapsed = time.monotonic() - t0
    assert len(got["sr"]) == 1 and len(got["pdf"]) == 1, gateway.log.read_text()[-3000:]
    sr, pdf = got["sr"][0], got["pdf"][0]
    assert sr.VerificationFlag == "UNVERIFIED" and sr.StudyInstanceUID == study.study_uid
    assert sr.PatientID == "NSBX-E2E-1" and pdf.PatientID == "NSBX-E2E-1"
    Comprehensive3DSR.from_dataset(sr)
    codes = {
        (c.CodeValue, c.CodeMeaning)
        for item in sr.iterall()
        if item.keyword == "ConceptCodeSequence"
        for c in item.value
    }
    assert ("7771000", "Left") in codes and ("121053", "Present") in codes  # laterality, presence
    assert_points_at_the_lesion(sr, study.files, 12)  # the model's point (issue 39)
    runs = gateway.get("/runs", gateway.reviewer).json()
    mine = [r for r in runs if r["study_uid"] == study.study_uid and r["trigger"] == "dicom"]
    run = gateway.wait_run(mine[0]["run_id"])
    assert run["status"] == "done", run
    # the report is the run's RunData (the bundle's rundata.json), read from its run store
    report = gateway.get(f"/runs/{run['run_id']}/report.json", gateway.reviewer).json()
    diagnosis = report["samples"][0]["answer"]["final_diagnosis"]
    assert diagnosis and any(m == diagnosis[:64] for _, m in codes)  # the diagnosis, coded
    document = pdf.EncapsulatedDocument[: pdf.EncapsulatedDocumentLength]
    assert document.startswith(b"%PDF") and pdf.StudyInstanceUID == study.study_uid
    # The checklist of the report bundle (Chromium's print), with the model's answer in it.
    text = pdf_text(document, tmp_path)
    case_id = report["cases"][0]["case_id"]
    assert "UNVERIFIED" in text and case_id in text and "reference/image-rules" in text
    # the answer's line (the paper copy's answers table) and the case's want of a reference
    assert "Final diagnosis" in text and diagnosis in text and "Not assessed" in text
    print(f"storescu start -> SR+PDF in Orthanc: {elapsed:.1f} s")
    assert elapsed < QUIET + STABLE_AGE + 20  # seconds, on a busy 2-core machine

    # A series arriving later: re-evaluated, version 2 names version 1 as its predecessor.
    late = make_study(
        tmp_path / "late",
        classes=("T1",),
        study_uid=study.study_uid,
        first_series_number=3,
        patient_id="NSBX-E2E-1",
    )
    send(gateway, late.files)
    got = wait_reports(gateway, study.study_uid, 2, timeout=QUIET + 45)
    assert len(got["sr"]) == 2 and len(got["pdf"]) == 2
    v2 = max(got["sr"], key=lambda d: int(d.InstanceNumber))
    assert int(v2.InstanceNumber) == 2 and v2.SeriesInstanceUID == sr.SeriesInstanceUID
    pred = v2.PredecessorDocumentsSequence[0].ReferencedSeriesSequence[0].ReferencedSOPSequence[0]
    assert pred.ReferencedSOPInstanceUID == sr.SOPInstanceUID
    # Our own SR/PDF make Orthanc call the study stable again: that must not loop.
    time.sleep(STABLE_AGE + 4)
    assert len(reports(gateway, study.study_uid)["sr"]) == 2
    runs = gateway.get("/runs", gateway.reviewer).json()
    mine = [r for r in runs if r["study_uid"] == study.study_uid]
    assert sorted(r["status"] for r in mine if r["status"] == "done") == ["done", "done"]
    assert not [r for r in mine if r["status"] == "failed"]

    # Both versions are in the review queue; the reviewer signs version 1 off and re-issues it:
    # VERIFIED SRs that replace version 1's UNVERIFIED one and carry the corrected diagnosis.
    listing = gateway.get("/review", gateway.reviewer)
    done = [r["run_id"] for r in mine if r["status"] == "done"]
    assert listing.status_code == 200 and all(run_id in listing.text for run_id in done)
    summary = gateway.get(f"/review/runs/{run['run_id']}/summary.json", gateway.reviewer).json()
    assert [c["case_id"] for c in summary["cases"]] == [case_id]
    page = f"/review/runs/{run['run_id']}/cases/{summary['cases'][0]['slug']}"
    assert diagnosis in gateway.get(page, gateway.reviewer).text
    api = f"/review/api/runs/{run['run_id']}/cases/{summary['cases'][0]['slug']}"
    state = gateway.get(api, gateway.reviewer).json()
    for block in state["blocks"]:
        if any(i["item_id"] == "final" for i in block["items"]):
            fix = {"model": block["model"], "item_id": "final", "verdict": "correct",
                   "text": "Multiple sclerosis"}  # fmt: skip
            r = gateway.post(f"{api}/verdicts", gateway.reviewer, json={"verdicts": [fix]})
            assert r.status_code == 200, r.text
        r = gateway.post(
            f"{api}/accept-remaining", gateway.reviewer, json={"model": block["model"]}
        )
        assert r.status_code == 200, r.text
    digest = gateway.get(f"{api}/signoff", gateway.reviewer).json()["digest"]
    # version 2 supersedes version 1: signed off knowingly (issue 34), naming version 2's run
    newer = next(r["run_id"] for r in mine if r["status"] == "done" and r["run_id"] != run["run_id"])  # fmt: skip
    r = gateway.post(f"{api}/signoff", gateway.reviewer, json={"digest": digest, "passed_over": newer})  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["pacs"]["status"] == "sent", r.json()["pacs"]  # signing off stored it
    got = reports(gateway, study.study_uid)
    verified = [d for d in got["sr"] if d.VerificationFlag == "VERIFIED"]
    # One per model, as the UNVERIFIED one: its review block, in the VERIFIED series.
    assert [int(d.InstanceNumber) for d in verified] == [1]
    assert verified[0].SeriesDescription == "NeuroSandbox AI findings (VERIFIED)"
    for doc in [*got["sr"], *got["pdf"]]:  # every SR and PDF written, UNVERIFIED and VERIFIED
        assert_dciodvfy_clean(doc)
    assert {p.SeriesDescription for p in got["pdf"]} == {
        "NeuroSandbox AI checklist (UNVERIFIED)",
        "NeuroSandbox AI checklist (VERIFIED)",
    }

    def findings(doc: pydicom.Dataset) -> list[str]:  # tracking identifiers "finding N"
        texts = (str(e.value) for e in doc.iterall() if e.keyword == "TextValue")
        return [t for t in texts if t.startswith("finding ")]

    # The findings as in the UNVERIFIED SR (the reviewer accepted them and changed the dx),
    # each with the same tracking UID.
    assert findings(verified[0]) == findings(sr) != []
    uids = [[str(e.value) for e in d.iterall() if e.keyword == "UID"] for d in (sr, verified[0])]
    assert uids[0] == uids[1] != []
    for v in verified:
        Comprehensive3DSR.from_dataset(v)
        assert_points_at_the_lesion(v, study.files, 12)  # the accepted finding keeps its point
        assert v.VerifyingObserverSequence[0].VerifyingObserverName == "Reviewer^Test"
        pred = v.PredecessorDocumentsSequence[0].ReferencedSeriesSequence[0]
        assert pred.ReferencedSOPSequence[0].ReferencedSOPInstanceUID == sr.SOPInstanceUID
        assert "Multiple sclerosis" in {  # the clinician's correction, not the model's
            c.CodeMeaning
            for item in v.iterall()
            if item.keyword == "ConceptCodeSequence"
            for c in item.value
        }


@pytest.fixture(scope="module", autouse=True)
def aborted(gateway: Gateway, tmp_path_factory: pytest.TempPathFactory) -> tuple[SynthStudy, float]:
    """A study sent with its association aborted as soon as the gateway is up (autouse: before
    the module's first test), and when: its test looks QUIET + 4 s after, by then spent by the
    tests before it rather than asleep."""
    study = make_study(tmp_path_factory.mktemp("aborted"), patient_id="NSBX-E2E-ABORT")
    send(gateway, study.files, "--abort")
    return study, time.monotonic()


def test_an_aborted_association_leads_to_no_evaluation(
    gateway: Gateway, aborted: tuple[SynthStudy, float]
) -> None:
    study, at = aborted
    time.sleep(max(0.0, at + QUIET + 4 - time.monotonic()))
    assert gateway.orthanc.find_study(study.study_uid) is None
    runs = gateway.get("/runs", gateway.reviewer).json()
    assert not [r for r in runs if r["study_uid"] == study.study_uid]


def test_orthanc_driven_mode_evaluates_a_study_stored_directly(
    gateway: Gateway, tmp_path: Path
) -> None:
    study = make_study(tmp_path / "s", lesion="right", patient_id="NSBX-E2E-ORTHANC")
    gateway.orthanc.upload_many(study.files)
    got = wait_reports(gateway, study.study_uid, 1, timeout=STABLE_AGE + 45)
    assert len(got["sr"]) == 1, gateway.log.read_text()[-3000:]
    runs = gateway.get("/runs", gateway.reviewer).json()
    (run,) = [r for r in runs if r["study_uid"] == study.study_uid]
    run = gateway.wait_run(run["run_id"])
    assert run["status"] == "done" and run["trigger"] == "orthanc", run
    assert gateway.get(f"/review/runs/{run['run_id']}", gateway.reviewer).status_code == 200


def test_the_api_refuses_requests_without_a_valid_token(gateway: Gateway) -> None:
    assert gateway.get("/health").status_code == 200
    for path in ("/studies", "/runs", "/metrics", "/audit", "/openapi.json", "/docs"):
        r = gateway.get(path)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", path
        assert gateway.get(path, "nsbx_0000_wrong").status_code == 401, path
        tampered = gateway.reviewer[:-2] + ("xx" if not gateway.reviewer.endswith("xx") else "yy")
        assert gateway.get(path, tampered).status_code == 401, path
    assert gateway.get("/studies", gateway.reviewer).status_code == 200
    spec = gateway.get("/openapi.json", gateway.reviewer).json()
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert "/studies/{study_id}/evaluations" in gateway.get("/docs", gateway.reviewer).text
    assert gateway.get("/audit", gateway.reviewer).status_code == 403
    assert gateway.get("/audit", gateway.admin).status_code == 200
    big = httpx.post(
        f"{gateway.api}/studies/00000000-00000000-00000000-00000000-00000000/evaluations",
        content=b"{" + b" " * 2_000_000 + b"}",
        headers={"Authorization": f"Bearer {gateway.reviewer}", "Content-Type": "application/json"},
        timeout=30,
    )
    assert big.status_code == 413


def test_a_revoked_token_stops_working_at_once(
    gateway: Gateway, orthanc_server: OrthancServer
) -> None:
    env = dict(os.environ, **orthanc_server.env)
    # A reviewer token names the clinician (family^given): the Verifying Observer of a sign-off.
    for person in ([], ["--person", "Dr Short"]):
        r = subprocess.run([str(BIN), "tokens", "create", "--name", "x", *person], env=env,
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)  # fmt: skip
        assert r.returncode == 2, r.stderr
        assert "family^given" in " ".join(r.stderr.split()).lower()
    token = _cli(env, "tokens", "create", "--role", "reviewer", "--name", "short-lived",
                 "--person", "Lived^Short")  # fmt: skip
    assert gateway.get("/runs", token).status_code == 200
    TokenStore(orthanc_server.settings.data_dir / "secret" / "tokens.json").revoke(
        token.split("_")[1]
    )
    assert gateway.get("/runs", token).status_code == 401


def test_api_evaluation_run_serves_reports_images_metrics_and_audit(
    gateway: Gateway, tmp_path: Path
) -> None:
    study = make_study(tmp_path / "s", patient_id="NSBX-E2E-API", patient_name="Secret^Patient")
    gateway.orthanc.upload_many(study.files)
    study_id = gateway.orthanc.find_study(study.study_uid)
    detail = gateway.get(f"/studies/{study_id}", gateway.reviewer).json()
    assert sorted(s["series_class"] for s in detail["series"]) == ["FLAIR", "T2"]
    r = httpx.post(
        f"{gateway.api}/studies/{study_id}/evaluations",
        json={"models": ["reference/image-rules"], "tasks": ["lesion"]},
        headers={"Authorization": f"Bearer {gateway.reviewer}"},
        timeout=30,
    )
    assert r.status_code == 403, r.text  # starting an evaluation is an admin action (issue 22)
    r = httpx.post(
        f"{gateway.api}/studies/{study_id}/evaluations",
        json={"models": ["reference/image-rules"], "tasks": ["lesion"]},
        headers={"Authorization": f"Bearer {gateway.admin}"},
        timeout=30,
    )
    assert r.status_code == 202, r.text
    run_id = r.json()["run_id"]
    run = gateway.wait_run(run_id)
    assert run["status"] == "done" and run["progress"] == 1.0 and run["trigger"] == "api", run
    report = gateway.get(f"/runs/{run_id}/report.json", gateway.reviewer).json()
    assert [s["scored"]["family"] for s in report["samples"]] == ["lesion"]
    html = gateway.get(f"/runs/{run_id}/report.html", gateway.reviewer)
    assert (
        "default-src 'none'" in html.headers["content-security-policy"]
        and "UNVERIFIED" in html.text
    )
    pdf = gateway.get(f"/runs/{run_id}/report.pdf", gateway.reviewer)
    assert pdf.headers["content-type"] == "application/pdf" and pdf.content.startswith(b"%PDF")
    diagnosis = report["samples"][0]["answer"]["final_diagnosis"]
    printed = pdf_text(pdf.content, tmp_path)
    assert "Final diagnosis" in printed and diagnosis in printed
    assert diagnosis in html.text and report["cases"][0]["case_id"] in html.text
    review = gateway.get(f"/review/runs/{run_id}/summary.json", gateway.reviewer).json()
    assert review["run_id"] == run_id and len(review["cases"]) == 1
    images = gateway.get(f"/runs/{run_id}/images", gateway.reviewer).json()
    assert images and all(i["sha256"] for i in images)
    png = gateway.get(f"/runs/{run_id}/{images[0]['path']}", gateway.reviewer)
    assert png.content.startswith(b"\x89PNG")
    assert gateway.get(f"/runs/{run_id}/images/..%2Frun.json", gateway.reviewer).status_code == 404
    metrics = gateway.get("/metrics", gateway.reviewer).text
    assert (
        "neurosandbox_evaluations_total" in metrics
        and "neurosandbox_dicom_instances_received_total" in metrics
    )
    audit = gateway.get("/audit", gateway.admin, params={"limit": 500}).json()
    actors = {e["actor"] for e in audit}
    reviewer_id = gateway.reviewer.split("_")[1]
    assert reviewer_id in actors and "anonymous" in actors
    assert any(
        e["action"] == "POST /studies/{study_id}/evaluations" and e["outcome"] == "202"
        for e in audit
    )
    # No PHI and no secrets in the service log or the audit log.
    for text in (gateway.log.read_text(), str(audit)):
        assert "Secret^Patient" not in text and "NSBX-E2E" not in text
        assert study.study_uid not in text
        assert gateway.reviewer not in text and gateway.admin not in text
