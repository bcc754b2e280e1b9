"""A signed-off case re-issued to a real Orthanc: a VERIFIED SR with the reviewer as verifying
observer, carrying the clinician's corrected diagnosis, next to the source study."""

from __future__ import annotations

import io
from pathlib import Path

import pydicom
import pytest
from fastapi.testclient import TestClient
from orthanc_fixture import OrthancServer
from report_fixtures import BAD, build_run
from review_server import build_context

from evaluation.reports import write_report
from gateway.api import create_app
from gateway.auth import Role
from gateway.sr import load_sr

pytestmark = pytest.mark.integration


def _content_meanings(ds: pydicom.Dataset) -> list[str]:
    """Coded values and text values anywhere in the SR content tree."""
    out = []
    for item in ds.get("ContentSequence", []):
        out += [str(code.CodeMeaning) for code in item.get("ConceptCodeSequence", [])]
        if "TextValue" in item:
            out.append(str(item.TextValue))
        out += _content_meanings(item)
    return out


def test_signed_off_case_is_reissued_verified(
    orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    run = build_run(tmp_path / "src")
    study_uid = (tmp_path / "src" / "study_uid.txt").read_text()
    case = run.case("normal-1")
    run.cases[run.cases.index(case)] = case.model_copy(
        update={"provenance": case.provenance.model_copy(update={"study_uids": [study_uid]})}
    )
    write_report(run, tmp_path / "data" / "reports" / "test-run", pdf=False)
    ep = orthanc_server.endpoints
    ctx = build_context(tmp_path / "data", ep.orthanc_url, (ep.username, orthanc_server.password),
                        verifying_organization="Test Hospital")  # fmt: skip
    for f in sorted((tmp_path / "src" / "dicom").glob("*.dcm")):
        ctx.orthanc.upload(f)
    _, token = ctx.tokens.create(Role.REVIEWER, "Dr Verify")
    auth = {"Authorization": f"Bearer {token}"}
    url = "/review/runs/test-run/cases/normal-1"
    with TestClient(create_app(ctx)) as c:
        early = c.post(f"{url}/reissue", headers=auth)
        assert early.status_code == 409 and "Sign the case off" in early.text
        for path, form in (
            (
                "items",
                {
                    "answer_key": f"{BAD}::differential::0",
                    "item_id": "finding.1",
                    "verdict": "reject",
                },
            ),
            ("diagnosis", {"text": "Normal brain MRI"}),
            ("signoff", {}),
            ("reissue", {}),
        ):
            r = c.post(f"{url}/{path}", data=form, headers=auth, follow_redirects=False)
            assert r.status_code == 303, (path, r.text[:300])
        page = c.get(url, headers=auth).text
    study_id = ctx.orthanc.find_study(study_uid)
    assert study_id is not None
    srs = [
        pydicom.dcmread(
            io.BytesIO(ctx.orthanc.api.get(f"{ctx.orthanc.url}/instances/{i['ID']}/file").content)
        )
        for i in ctx.orthanc.study_instances(study_id)
        if i.get("MainDicomTags", {}).get("SOPInstanceUID", "") in page
    ]
    assert len(srs) == 2  # one per reviewed model answer
    for sr in srs:
        assert sr.VerificationFlag == "VERIFIED" and sr.PreliminaryFlag == "FINAL"
        observer = sr.VerifyingObserverSequence[0]
        assert str(observer.VerifyingObserverName) == "Dr Verify"
        assert observer.VerifyingOrganization == "Test Hospital"
        assert "Normal brain MRI" in _content_meanings(sr)
        load_sr(sr)  # a valid Comprehensive 3D SR
    bad = next(s for s in srs if BAD in _content_meanings(s))
    # The clinician rejected the bad model's only finding: the verified SR reports none.
    assert "Absent" in _content_meanings(bad) and "Present" not in _content_meanings(bad)
