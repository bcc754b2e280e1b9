"""A study that trickles in over several quiet times gets several report versions (gateway runs of
the same study key). An older version says, on its case page and in its queue row, which newer
version supersedes it (and links to it); signing it off or re-issuing it needs the reviewer's
explicit confirmation naming that newer version, and the review log, the sign-off and the
VERIFIED SR record the version passed over. The newest version signs as before."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from html import unescape
from pathlib import Path

import pydicom
import pytest
from browser import CHROMIUM, launch, sign_in
from fastapi.testclient import TestClient
from orthanc_fixture import OrthancServer
from report_fixtures import BAD, GOOD, build_run
from review_server import bearer, build_context, instances, running

from evaluation.log.rundata import RunData
from evaluation.reports import write_report
from gateway.api import GatewayContext, create_app
from gateway.auth import Role, TokenStore
from gateway.runs import RunRecord, RunStatus, StudyRunStore
from gateway.study_key import StudyKey

pytestmark = pytest.mark.integration
CASE = "ms-1"


def _one_case(run: RunData, run_id: str, version: int) -> RunData:
    """The MS case alone as a gateway run's report of ``version`` (its bundle as the pipeline
    publishes it: the gateway's run id and version in the run's config)."""
    return run.model_copy(
        update={
            "run_id": run_id,
            "cases": [run.case(CASE)],
            "samples": run.samples_of(CASE),
            "config": {**run.config, "gateway": {"run_id": run_id, "version": version}},
        }
    )


def add_version(runs: StudyRunStore, reports: Path, run: RunData, key: StudyKey, version: int,
                status: RunStatus = RunStatus.DONE, keyed: bool = True) -> str:  # fmt: skip
    """A gateway run of ``key`` at ``version`` (``keyed``: False for a record written before
    runs had a study key), its report bundle published when it is done."""
    rec = runs.create(
        RunRecord(
            run_id=runs.new_id(),
            trigger="dicom",
            study_uid=key.study_uid,
            study_key=key.name if keyed else None,
        )
    )
    if status is RunStatus.DONE:
        write_report(_one_case(run, rec.run_id, version), reports / rec.run_id, pdf=False)
        runs.finish(rec.run_id, status, version=version)
    else:
        runs.finish(rec.run_id, status, error="the model endpoint did not answer")
    return rec.run_id


@dataclass
class Setup:
    ctx: GatewayContext
    client: TestClient
    run: RunData
    study_uid: str
    v1: str
    v2: str
    legacy: tuple[str, str]  # two versions recorded without a study key
    other_patient: str  # the same StudyInstanceUID, another patient, a higher version


@pytest.fixture(scope="module")
def setup(orthanc_server: OrthancServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:  # fmt: skip
    tmp = tmp_path_factory.mktemp("superseded")
    ep = orthanc_server.endpoints
    ctx = build_context(tmp / "data", ep.orthanc_url, (ep.username, orthanc_server.password),
                        verifying_organization="Test Hospital")  # fmt: skip
    run = build_run(tmp / "src")
    uid = pydicom.uid.generate_uid()
    series: dict[str, str] = {}
    for f in sorted((tmp / "src" / "dicom").glob("*.dcm")):  # the study, in the PACS
        ds = pydicom.dcmread(f)
        ds.StudyInstanceUID = uid
        series.setdefault(ds.SeriesInstanceUID, pydicom.uid.generate_uid())
        ds.SeriesInstanceUID = series[ds.SeriesInstanceUID]
        ds.SOPInstanceUID = pydicom.uid.generate_uid()
        ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
        buf = io.BytesIO()
        ds.save_as(buf, enforce_file_format=True)
        ctx.orthanc.upload(buf.getvalue())
    ms = run.case(CASE)
    ms.provenance.study_uids = [uid]
    key = StudyKey(study_uid=uid, patient_id="MRN-1")
    reports = ctx.settings.reports_root
    v1 = add_version(ctx.runs, reports, run, key, 1)
    v2 = add_version(ctx.runs, reports, run, key, 2)
    # neither a later run that failed nor another patient's study under the same UID is a
    # newer version of this one
    add_version(ctx.runs, reports, run, key, 3, RunStatus.FAILED)
    other = add_version(ctx.runs, reports, run, StudyKey(study_uid=uid, patient_id="MRN-2"), 3)
    old = StudyKey(study_uid=pydicom.uid.generate_uid())
    legacy = (add_version(ctx.runs, reports, run, old, 1, keyed=False),
              add_version(ctx.runs, reports, run, old, 2, keyed=False))  # fmt: skip
    with TestClient(create_app(ctx)) as client:
        yield Setup(ctx, client, run, uid, v1, v2, legacy, other)


def _text(html: str) -> str:
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


def _review_all(c: TestClient, auth: dict[str, str], report: str) -> str:
    """Accept every item of both blocks; the sign-off preview's digest."""
    url = f"/review/api/runs/{report}/cases/{CASE}"
    for model in (GOOD, BAD):
        r = c.post(f"{url}/accept-remaining", headers=auth, json={"model": model})
        assert r.status_code == 200, r.text
    preview = c.get(f"{url}/signoff", headers=auth).json()
    assert preview["missing"] == []
    return str(preview["digest"])


def _sr_texts(ds: pydicom.Dataset) -> list[str]:
    out = []
    for item in ds.get("ContentSequence", []):
        if "TextValue" in item:
            out.append(str(item.TextValue))
        out += _sr_texts(item)
    return out


def test_the_older_version_says_which_version_supersedes_it_and_links_to_it(setup: Setup) -> None:
    c, auth = setup.client, bearer(setup.ctx, "Dr Look", "Look^Lou")
    old = c.get(f"/review/runs/{setup.v1}/cases/{CASE}", headers=auth)
    assert old.status_code == 200
    banner = re.search(r'<[^>]*id="superseded".*?</p>', old.text, re.S)
    assert banner is not None, old.text[:3000]
    said = _text(banner.group(0))
    assert "version 1" in said and "superseded by version 2" in said and setup.v2 in said
    assert f'href="/review/runs/{setup.v2}/cases/{CASE}"' in banner.group(0)
    # the sign-off step says it too, before anything is confirmed
    step1 = c.get(f"/review/runs/{setup.v1}/cases/{CASE}/signoff", headers=auth)
    assert "superseded by version 2" in _text(step1.text)
    # the newest version, another patient's study under the same UID, and the legacy newest
    # are superseded by nothing; a later failed run supersedes nothing
    for report in (setup.v2, setup.other_patient, setup.legacy[1]):
        page = c.get(f"/review/runs/{report}/cases/{CASE}", headers=auth).text
        assert 'id="superseded"' not in page, report
    # a record written before runs had a study key falls back to its StudyInstanceUID
    legacy = c.get(f"/review/runs/{setup.legacy[0]}/cases/{CASE}", headers=auth).text
    assert "superseded by version 2" in _text(legacy) and setup.legacy[1] in legacy
    # the queue row of the older version says so; the newer one's does not
    queue = c.get("/review", headers=auth).text
    rows = {
        m.group(1): _text(m.group(0))
        for m in re.finditer(r'<tr class="queue-row[^"]*" data-run="([^"]+)".*?</tr>', queue, re.S)
    }
    assert "superseded by version 2" in rows[setup.v1]
    assert "superseded" not in rows[setup.v2] and "superseded" not in rows[setup.other_patient]


def test_an_older_version_is_not_signed_off_without_the_confirmation(setup: Setup) -> None:
    c, ctx = setup.client, setup.ctx
    auth = bearer(ctx, "Dr Hasty", "Hasty^Hal")
    digest = _review_all(c, auth, setup.v1)
    api = f"/review/api/runs/{setup.v1}/cases/{CASE}/signoff"
    form = f"/review/runs/{setup.v1}/cases/{CASE}/signoff"
    # the form and the JSON API both refuse, saying which version supersedes it and how to go on
    page = c.post(form, headers=auth, data={"digest": digest}, follow_redirects=False)
    assert page.status_code == 409
    said = _text(page.text)
    assert f"version 2 (gateway run {setup.v2})" in said and "supersedes" in said
    assert "confirm" in said
    r = c.post(api, headers=auth, json={"digest": digest})
    assert r.status_code == 409 and "version 2" in r.json()["detail"], r.text
    # a confirmation that names another run than the newer version is no confirmation
    for wrong in (setup.v1, setup.other_patient, "0" * 32):
        r = c.post(api, headers=auth, json={"digest": digest, "passed_over": wrong})
        assert r.status_code == 409 and "version 2" in r.json()["detail"], wrong
    log = c.get(f"/review/runs/{setup.v1}/reviews.json", headers=auth).json()["events"]
    assert not [e for e in log if e["action"] == "signoff" and e["reviewer"] == "Dr Hasty"]
    assert not [e for e in log if e["action"] == "reissue"]  # nothing went to the PACS
    # refused, not signed: re-issue of the superseded version is refused as well
    r = c.post(f"/review/api/runs/{setup.v1}/cases/{CASE}/reissue", headers=auth)
    assert r.status_code == 409


def test_signed_knowingly_the_sign_off_the_log_and_the_verified_sr_name_the_newer_version(
    setup: Setup,
) -> None:
    c, ctx = setup.client, setup.ctx
    auth = bearer(ctx, "Dr Knows", "Knows^Kim")
    digest = _review_all(c, auth, setup.v1)
    form = f"/review/runs/{setup.v1}/cases/{CASE}/signoff"
    ok = c.post(form, headers=auth, data={"digest": digest, "passed_over": setup.v2},
                follow_redirects=False)  # fmt: skip
    assert ok.status_code == 303, _text(ok.text)[:500]
    assert "pacs=sent" in ok.headers["location"]  # the sign-off stored the VERIFIED report
    log = c.get(f"/review/runs/{setup.v1}/reviews.json", headers=auth).json()
    (signoff,) = [e for e in log["events"] if e["action"] == "signoff" and e["reviewer"] == "Dr Knows"]  # fmt: skip
    assert setup.v2 in signoff["passed_over"] and "version 2" in signoff["passed_over"]
    (review,) = [r for r in log["reviews"] if r["reviewer"] == "Dr Knows"]
    assert setup.v2 in review["passed_over"]
    csv = c.get(f"/review/runs/{setup.v1}/reviews.csv", headers=auth).text
    assert "passed_over" in csv.splitlines()[0] and setup.v2 in csv
    html = c.get(f"/review/runs/{setup.v1}/cases/{CASE}", headers=auth).text
    assert f"although version 2 (gateway run {setup.v2}) supersedes it" in _text(html)
    # what the sign-off stored names the version passed over, in the SRs and the log
    sent = [e for e in log["events"] if e["action"] == "reissue" and e["reviewer"] == "Dr Knows"]
    assert len(sent) == 3 and all(setup.v2 in e["passed_over"] for e in sent)  # 2 SRs, the PDF
    for sr in instances(ctx, setup.study_uid, [e["text"] for e in sent]):
        if sr.Modality == "SR":
            note = [t for t in _sr_texts(sr) if "supersedes" in t]
            assert note and setup.v2 in note[0] and "version 1" in note[0]
    assert 'id="reissue"' not in html  # in the PACS: nothing left to send
    # sending it again writes a VERIFIED SR into the PACS: knowingly too, form and API
    page = c.post(f"/review/runs/{setup.v1}/cases/{CASE}/reissue", headers=auth)
    assert page.status_code == 409 and "supersedes" in _text(page.text)
    url = f"/review/api/runs/{setup.v1}/cases/{CASE}/reissue"
    refused = c.post(url, headers=auth)
    assert refused.status_code == 409 and "version 2" in refused.json()["detail"]
    out = c.post(url, headers=auth, json={"passed_over": setup.v2})
    assert out.status_code == 200, out.text
    body = out.json()
    srs = instances(ctx, setup.study_uid, body["sr_sop_instance_uids"])
    assert len(srs) == 2
    for sr in srs:
        assert sr.VerificationFlag == "VERIFIED"
        note = [t for t in _sr_texts(sr) if "supersedes" in t]
        assert note and setup.v2 in note[0] and "version 2" in note[0] and "version 1" in note[0]
    events = c.get(f"/review/runs/{setup.v1}/reviews.json", headers=auth).json()["events"]
    reissued = [e for e in events if e["action"] == "reissue"]
    assert {e["text"] for e in reissued} >= set(body["sr_sop_instance_uids"])
    assert all(setup.v2 in e["passed_over"] for e in reissued)


def test_the_newest_version_signs_and_reissues_as_before(setup: Setup) -> None:
    c, ctx = setup.client, setup.ctx
    auth = bearer(ctx, "Dr Newest", "Newest^Nia")
    digest = _review_all(c, auth, setup.v2)
    form = f"/review/runs/{setup.v2}/cases/{CASE}/signoff"
    step1 = c.get(form, headers=auth).text
    assert 'name="passed_over"' not in step1
    ok = c.post(form, headers=auth, data={"digest": digest}, follow_redirects=False)
    assert ok.status_code == 303, _text(ok.text)[:500]
    out = c.post(f"/review/api/runs/{setup.v2}/cases/{CASE}/reissue", headers=auth)
    assert out.status_code == 200, out.text
    for sr in instances(ctx, setup.study_uid, out.json()["sr_sop_instance_uids"]):
        assert not [t for t in _sr_texts(sr) if "supersedes" in t]
    events = c.get(f"/review/runs/{setup.v2}/reviews.json", headers=auth).json()["events"]
    assert all(e["passed_over"] == "" for e in events)


def test_a_confirmation_goes_stale_when_a_still_newer_version_arrives(setup: Setup) -> None:
    """The reviewer confirmed passing over version 2; version 3 is done before they post."""
    c, ctx = setup.client, setup.ctx
    auth = bearer(ctx, "Dr Slow", "Slow^Sam")
    v1, v2 = setup.legacy
    digest = _review_all(c, auth, v1)
    uid = ctx.runs.get(v1).study_uid
    assert uid is not None
    v3 = add_version(ctx.runs, ctx.settings.reports_root, setup.run, StudyKey(study_uid=uid), 3, keyed=False)  # fmt: skip
    r = c.post(f"/review/api/runs/{v1}/cases/{CASE}/signoff", headers=auth,
               json={"digest": digest, "passed_over": v2})  # fmt: skip
    assert r.status_code == 409 and f"version 3 (gateway run {v3})" in r.json()["detail"]
    r = c.post(f"/review/api/runs/{v1}/cases/{CASE}/signoff", headers=auth,
               json={"digest": digest, "passed_over": v3})  # fmt: skip
    assert r.status_code == 200, r.text
    assert "version 3" in json.dumps(c.get(f"/review/runs/{v1}/reviews.json", headers=auth).json())


# ------------------------------------------------------------------------------ in a browser


@pytest.mark.browser
@pytest.mark.timeout(120)
def test_in_the_browser_the_sign_off_control_says_why_and_needs_the_tick(
    tmp_path: Path,
) -> None:
    playwright = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    data = tmp_path / "data"
    run = build_run(tmp_path / "src")
    runs = StudyRunStore(data, data / "reports")
    key = StudyKey(study_uid=pydicom.uid.generate_uid(), patient_id="MRN-7")
    v1 = add_version(runs, data / "reports", run, key, 1)
    v2 = add_version(runs, data / "reports", run, key, 2)
    token = TokenStore(data / "secret" / "tokens.json").create(Role.REVIEWER, "Dr Ada", "Lovelace^Ada")[1]  # fmt: skip
    with running(data) as (base, _), playwright.sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            sign_in(page, base, token)
            row = page.locator(f'tr.queue-row[data-run="{v1}"]')
            assert "superseded by version 2" in row.inner_text()
            row.locator("a.case-link").click()
            banner = page.locator("#superseded")
            assert "superseded by version 2" in banner.inner_text()
            for model in (GOOD, BAD):
                page.locator(f'section.block[data-model="{model}"] button.accept-rest').click()
                page.wait_for_url("**done=block*")
            page.click("#signoff a")
            page.wait_for_url("**/signoff")
            tick = page.locator("#signoff-confirm input[name=passed_over]")
            label = page.locator("#signoff-confirm label").inner_text()
            assert "although version 2" in label and v2 in label
            page.click("#signoff-confirm button")  # not ticked: the browser does not send it
            assert page.url.endswith("/signoff")
            assert tick.evaluate("e => e.validationMessage")
            tick.check()
            page.click("#signoff-confirm button")
            page.wait_for_url("**done=signoff")
            assert "although version 2" in page.inner_text("#case-review")
            page.screenshot(path=str(tmp_path / "superseded.png"), full_page=True)
        finally:
            browser.close()
