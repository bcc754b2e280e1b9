"""Signing a case off puts its VERIFIED report into the PACS in the same action, through the one
write-back (gateway/writeback.py), with the sign-off preview as the confirmation; a case whose
study is in no PACS (a CLI evaluation reviewed on a gateway, with or without an Orthanc) still
signs off and says that nothing was sent. What the VERIFIED SR says is coded as the UNVERIFIED
one was: a corrected finding keeps its coded site unless the correction names another (then it
is re-coded through the vocabulary the answers are read with), a corrected diagnosis is coded
through the lexicon (ICD-10, or ICD-10-CM where WHO has no code), and every finding keeps its
number and tracking UID between the UNVERIFIED and the VERIFIED SR. Real Orthanc, dciodvfy."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from dataclasses import dataclass
from html import unescape
from pathlib import Path

import pydicom
import pytest
from dciodvfy import assert_dciodvfy_clean
from fastapi.testclient import TestClient
from orthanc_fixture import OrthancServer
from report_fixtures import BAD, GOOD, build_run
from review_server import bearer, build_context, instances

from evaluation.log.rundata import RunData
from evaluation.reports import write_report
from gateway.api import GatewayContext, create_app
from gateway.review.reissue import stored_srs
from gateway.writeback import build_unverified, save_evidence, store

pytestmark = pytest.mark.integration
SITE, LATERALITY = "363698007", "272741003"  # SCT concept names of TID 1501's site rows
TRACKING_ID, TRACKING_UID = "112039", "112040"


@dataclass
class GatewayCase:
    report: str  # the gateway run id (its report folder)
    study_uid: str
    unverified: dict[str, pydicom.Dataset]  # model -> its UNVERIFIED SR as stored


@dataclass
class Setup:
    ctx: GatewayContext
    client: TestClient
    run: RunData
    src: Path


@pytest.fixture(scope="module")
def setup(orthanc_server: OrthancServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:  # fmt: skip
    tmp = tmp_path_factory.mktemp("signoff-pacs")
    ep = orthanc_server.endpoints
    ctx = build_context(tmp / "data", ep.orthanc_url, (ep.username, orthanc_server.password),
                        verifying_organization="Test Hospital")  # fmt: skip
    run = build_run(tmp / "src")
    with TestClient(create_app(ctx)) as client:
        yield Setup(ctx, client, run, tmp / "src")


def _upload_study(ctx: GatewayContext, src: Path) -> tuple[str, list[pydicom.Dataset]]:
    """The synthetic study as a new study in the PACS (its own UIDs); its headers."""
    uid = pydicom.uid.generate_uid()
    headers, series = [], {}
    for f in sorted((src / "dicom").glob("*.dcm")):
        ds = pydicom.dcmread(f)
        ds.StudyInstanceUID = uid
        series.setdefault(ds.SeriesInstanceUID, pydicom.uid.generate_uid())
        ds.SeriesInstanceUID = series[ds.SeriesInstanceUID]
        ds.SOPInstanceUID = pydicom.uid.generate_uid()
        ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
        buf = io.BytesIO()
        ds.save_as(buf, enforce_file_format=True)
        ctx.orthanc.upload(buf.getvalue())
        headers.append(ds)
    return uid, headers


def _one_case(run: RunData, case_id: str, run_id: str, study_uids: list[str],
              gateway: dict[str, object] | None) -> RunData:  # fmt: skip
    case = run.case(case_id)
    case = case.model_copy(
        update={"provenance": case.provenance.model_copy(update={"study_uids": study_uids})}
    )
    config = {**run.config, **({"gateway": gateway} if gateway is not None else {})}
    return run.model_copy(update={"run_id": run_id, "cases": [case],
                                  "samples": run.samples_of(case_id), "config": config})  # fmt: skip


def gateway_case(s: Setup, case_id: str) -> GatewayCase:
    """A case as the gateway's pipeline leaves it: the study in the PACS, the UNVERIFIED SRs
    written back through the write-back, the evidence and the report bundle published."""
    uid, headers = _upload_study(s.ctx, s.src)
    run_id = s.ctx.runs.new_id()
    one = _one_case(s.run, case_id, run_id, [uid], None)
    back = build_unverified(one, [GOOD, BAD], headers, 1, "test")
    store(s.ctx.orthanc, back.srs.values())
    info = {"run_id": run_id, "trigger": "dicom", "version": 1,
            "unverified_sr": {m: str(sr.SOPInstanceUID) for m, sr in back.srs.items()}}  # fmt: skip
    one = one.model_copy(update={"config": {**one.config, "gateway": info}})
    folder = s.ctx.settings.reports_root / run_id
    write_report(one, folder, pdf=False)
    save_evidence(headers, folder)
    return GatewayCase(run_id, uid, dict(back.srs))


def _text(html: str) -> str:
    html = re.sub(r"<(style|script)\b.*?</\1>", " ", html, flags=re.S)
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


def _accept_rest(c: TestClient, auth: dict[str, str], url: str) -> str:
    for model in (GOOD, BAD):
        r = c.post(f"{url}/accept-remaining", headers=auth, json={"model": model})
        assert r.status_code in (200, 409), r.text  # 409: nothing left in that block
    preview = c.get(f"{url}/signoff", headers=auth).json()
    assert preview["missing"] == [], preview["missing"]
    return str(preview["digest"])


def _code(item: pydicom.Dataset, kw: str = "ConceptCodeSequence") -> tuple[str, str]:
    c = item[kw][0]
    return str(c.CodeValue), str(c.CodingSchemeDesignator)


def groups(sr: pydicom.Dataset) -> dict[str, dict[str, object]]:
    """The SR's measurement groups by tracking identifier: tracking UID, finding sites (code,
    laterality code) and every coded value in the group."""
    out: dict[str, dict[str, object]] = {}

    def walk(items: pydicom.Sequence) -> None:
        for item in items:
            name = _code(item, "ConceptNameCodeSequence")[0] if "ConceptNameCodeSequence" in item else ""  # fmt: skip
            if name == "125007":  # Measurement Group
                g: dict[str, object] = {"sites": [], "codes": []}
                for x in item.ContentSequence:
                    n = _code(x, "ConceptNameCodeSequence")[0]
                    if n == TRACKING_ID:
                        g["id"] = str(x.TextValue)
                    elif n == TRACKING_UID:
                        g["uid"] = str(x.UID)
                    elif n == SITE:
                        lat = [_code(y) for y in x.get("ContentSequence", [])
                               if _code(y, "ConceptNameCodeSequence")[0] == LATERALITY]  # fmt: skip
                        g["sites"].append((_code(x), lat[0] if lat else None))  # type: ignore[attr-defined]
                    if "ConceptCodeSequence" in x:
                        g["codes"].append(_code(x))  # type: ignore[attr-defined]
                    for y in x.get("ContentSequence", []):
                        if "ConceptCodeSequence" in y:
                            g["codes"].append(_code(y))  # type: ignore[attr-defined]
                out[str(g["id"])] = g
            else:
                walk(item.get("ContentSequence", []))

    walk(sr.ContentSequence)
    return out


def _verified(s: Setup, study_uid: str) -> list[pydicom.Dataset]:
    heads = stored_srs(s.ctx.orthanc, study_uid, "sr-verified")
    return instances(s.ctx, study_uid, [str(h.SOPInstanceUID) for h in heads])


def _of_model(srs: list[pydicom.Dataset], model: str) -> pydicom.Dataset:
    from gateway.sr import model_of

    (sr,) = [d for d in srs if model_of(d) == model]
    return sr


# ------------------------------------------------------------------------------ the tests


def test_the_preview_names_the_step_and_signing_off_puts_the_verified_report_in_the_pacs(
    setup: Setup,
) -> None:
    s, c = setup, setup.client
    g = gateway_case(s, "ms-1")
    auth = bearer(s.ctx, "Dr Final", "Final^Fay")
    _accept_rest(c, auth, f"/review/api/runs/{g.report}/cases/ms-1")
    assert _verified(s, g.study_uid) == []
    # step 1 is the confirmation: it says where the report goes before anything is sent
    page = c.get(f"/review/runs/{g.report}/cases/ms-1/signoff", headers=auth)
    said = _text(page.text)
    assert "Signing sends" in said and "to the PACS" in said and g.study_uid in said, said
    button = re.search(r'<form[^>]*id="signoff-confirm".*?</form>', page.text, re.S)
    assert button is not None and "send to the PACS" in _text(button.group(0))
    digest = re.search(r'name="digest" value="([0-9a-f]+)"', page.text)
    assert digest is not None
    # step 2: one POST signs off and stores the VERIFIED SR of each model and the PDF
    r = c.post(f"/review/runs/{g.report}/cases/ms-1/signoff", headers=auth,
               data={"digest": digest.group(1)}, follow_redirects=False)  # fmt: skip
    assert r.status_code == 303, _text(r.text)[:500]
    assert "pacs=sent" in r.headers["location"] and r.headers["location"].endswith("done=signoff")
    srs = _verified(s, g.study_uid)
    assert len(srs) == 2
    for sr in srs:
        assert sr.VerificationFlag == "VERIFIED" and sr.PreliminaryFlag == "FINAL"
        assert str(sr.VerifyingObserverSequence[0].VerifyingObserverName) == "Final^Fay"
        assert_dciodvfy_clean(sr)
    study = s.ctx.orthanc.find_study(g.study_uid)
    assert study is not None
    tags = [s.ctx.orthanc.api.get(f"{s.ctx.orthanc.url}/instances/{i['ID']}/simplified-tags").json()
            for i in s.ctx.orthanc.study_instances(study)]  # fmt: skip
    docs = [t for t in tags if t.get("SeriesDescription", "").endswith("(VERIFIED)")]
    assert len(docs) == 3  # two VERIFIED SRs and the VERIFIED checklist PDF
    after = _text(c.get(r.headers["location"], headers=auth).text)
    assert "in the PACS" in after and "NOT" not in after
    # stored once: nothing left to send, so no button to send it again
    assert 'id="reissue"' not in c.get(r.headers["location"], headers=auth).text


def test_a_corrected_finding_keeps_its_site_unless_the_correction_names_another(
    setup: Setup,
) -> None:
    s, c = setup, setup.client
    g = gateway_case(s, "ms-1")
    url = f"/review/api/runs/{g.report}/cases/ms-1"
    auth = bearer(s.ctx, "Dr Site", "Site^Sam")
    verdicts = [
        {"model": GOOD, "item_id": "finding.1", "verdict": "reject"},
        # no place named: the model's coded site (left juxtacortical frontal) stays
        {"model": GOOD, "item_id": "finding.2", "verdict": "correct",
         "text": "small ovoid demyelinating plaque, 4 mm"},
        # another place named: re-coded (BAD's right occipital mass -> left cerebellum)
        {"model": BAD, "item_id": "finding.3", "verdict": "correct",
         "text": "Left cerebellar hemisphere nodule, likely haemangioblastoma"},
    ]  # fmt: skip
    r = c.post(f"{url}/verdicts", headers=auth, json={"verdicts": verdicts})
    assert r.status_code == 200, r.text
    r = c.post(f"{url}/signoff", headers=auth, json={"digest": _accept_rest(c, auth, url)})
    assert r.status_code == 200, r.text
    assert r.json()["pacs"]["status"] == "sent", r.json()["pacs"]
    verified = _verified(s, g.study_uid)
    good_v, bad_v = _of_model(verified, GOOD), _of_model(verified, BAD)
    for sr in (good_v, bad_v):
        assert_dciodvfy_clean(sr)
    good_u = groups(g.unverified[GOOD])
    good = groups(good_v)
    # finding numbers and tracking UIDs survive: finding 1 rejected, finding 2 stays "finding 2"
    assert "finding 1" not in good and "finding 2" in good
    assert good["finding 2"]["uid"] == good_u["finding 2"]["uid"]
    left = ("7771000", "SCT")
    assert good["finding 2"]["sites"] == good_u["finding 2"]["sites"]
    assert {site for site, _ in good["finding 2"]["sites"]} >= {("83251001", "SCT")}  # frontal
    assert all(lat == left for _, lat in good["finding 2"]["sites"])
    bad_u, bad = groups(g.unverified[BAD]), groups(bad_v)
    assert bad_u["finding 3"]["sites"] == [
        (("31065004", "SCT"), ("24028007", "SCT"))
    ]  # R occipital
    assert bad["finding 3"]["sites"] == [(("113305005", "SCT"), left)]  # left cerebellum
    assert bad["finding 3"]["uid"] == bad_u["finding 3"]["uid"]
    for n in ("finding 1", "finding 2"):  # the accepted ones: as they were
        assert bad[n]["uid"] == bad_u[n]["uid"] and bad[n]["sites"] == bad_u[n]["sites"]


def test_a_corrected_diagnosis_is_coded_through_the_lexicon(setup: Setup) -> None:
    s, c = setup, setup.client
    g = gateway_case(s, "ms-1")
    url = f"/review/api/runs/{g.report}/cases/ms-1"
    auth = bearer(s.ctx, "Dr Code", "Code^Cleo")
    state = c.get(url, headers=auth).json()
    block = next(b for b in state["blocks"] if b["model"] == GOOD)
    dx = [i["item_id"] for i in block["items"] if i["kind"] == "differential"]
    assert len(dx) >= 2
    verdicts = [
        {
            "model": GOOD,
            "item_id": dx[0],
            "verdict": "correct",
            "text": "Cerebral venous sinus thrombosis",
        },
        # WHO ICD-10 has no code for a lacunar infarct: the lexicon's ICD-10-CM one
        {"model": GOOD, "item_id": dx[1], "verdict": "correct", "text": "lacunar infarct"},
        {"model": GOOD, "item_id": "final", "verdict": "correct", "text": "MS"},
    ]
    assert c.post(f"{url}/verdicts", headers=auth, json={"verdicts": verdicts}).status_code == 200
    r = c.post(f"{url}/signoff", headers=auth, json={"digest": _accept_rest(c, auth, url)})
    assert r.status_code == 200 and r.json()["pacs"]["status"] == "sent", r.text
    sr = _of_model(_verified(s, g.study_uid), GOOD)
    assert_dciodvfy_clean(sr)
    got = groups(sr)
    assert ("I67.6", "I10") in got["differential 1"]["codes"]
    assert ("I63.81", "I10C") in got["differential 2"]["codes"]
    assert ("G35", "I10") in got["diagnosis"]["codes"]  # "MS": a synonym
    dx_codes = [x for k, g_ in got.items() if not k.startswith("finding") for x in g_["codes"]]  # type: ignore[attr-defined]
    assert not [x for x in dx_codes if x[1] == "99NEUROSANDBOX" and x[0].startswith("N")]
    # the clinician's own words stay in the SR beside the code
    texts = [str(e.value) for e in sr.iterall() if e.keyword == "TextValue"]
    assert "Cerebral venous sinus thrombosis" in " ".join(texts) or any(
        str(e.value) == "Cerebral venous sinus thrombosis"
        for e in sr.iterall()
        if e.keyword == "CodeMeaning"
    )


def test_a_model_diagnosis_without_a_code_is_coded_through_the_lexicon_too(setup: Setup) -> None:
    """The same rule for what a model wrote: BAD names "Multiple sclerosis" without ICD-10."""
    g = gateway_case(setup, "ms-1")
    got = groups(g.unverified[BAD])
    dx = [v for k, v in got.items() if k.startswith("differential")]
    assert any(("G35", "I10") in v["codes"] for v in dx)  # type: ignore[operator]


def test_a_case_whose_study_is_in_no_pacs_signs_off_and_says_nothing_was_sent(
    setup: Setup, tmp_path: Path
) -> None:
    s, c = setup, setup.client
    # a CLI evaluation's report: no gateway run, a study the PACS never received
    absent = pydicom.uid.generate_uid()
    one = _one_case(s.run, "stroke-1", "cli-run-1", [absent], None)
    write_report(one, s.ctx.settings.reports_root / "cli-run-1", pdf=False)
    auth = bearer(s.ctx, "Dr Local", "Local^Lee")
    url = "/review/runs/cli-run-1/cases/stroke-1"
    digest = _accept_rest(c, auth, "/review/api/runs/cli-run-1/cases/stroke-1")
    step1 = _text(c.get(f"{url}/signoff", headers=auth).text)
    assert "nothing is sent" in step1 and absent in step1, step1
    r = c.post(f"{url}/signoff", headers=auth, data={"digest": digest}, follow_redirects=False)
    assert r.status_code == 303, _text(r.text)[:500]
    page = _text(c.get(r.headers["location"], headers=auth).text)
    assert "Case signed off" in page and "Nothing was sent to a PACS" in page, page
    assert s.ctx.orthanc.find_study(absent) is None
    # the same on a gateway without any Orthanc, through the JSON API
    ctx = build_context(tmp_path / "data")  # Orthanc at a closed port
    write_report(_one_case(s.run, "normal-1", "cli-run-2", [], None),
                 ctx.settings.reports_root / "cli-run-2", pdf=False)  # fmt: skip
    with TestClient(create_app(ctx)) as bare:
        auth = bearer(ctx, "Dr Bare", "Bare^Bo")
        api = "/review/api/runs/cli-run-2/cases/normal-1"
        r = bare.post(
            f"{api}/signoff", headers=auth, json={"digest": _accept_rest(bare, auth, api)}
        )
        assert r.status_code == 200, r.text
        pacs = r.json()["pacs"]
        assert pacs["status"] == "not_in_pacs" and "Nothing was sent" in pacs["message"]
        assert r.json()["signed_off_at"]


def test_a_pacs_that_fails_leaves_the_sign_off_recorded_and_says_so_until_it_is_sent(
    setup: Setup,
) -> None:
    s = setup
    g = gateway_case(s, "normal-1")
    # the same gateway data, its Orthanc gone (a closed port)
    down = build_context(s.ctx.settings.data_dir, "http://127.0.0.1:9")
    down.orthanc.retries = 0  # refused at once: no backoff to wait through in a test
    auth = bearer(s.ctx, "Dr Down", "Down^Dee")
    page = f"/review/runs/{g.report}/cases/normal-1"
    with TestClient(create_app(down)) as c:
        digest = _accept_rest(c, auth, f"/review/api/runs/{g.report}/cases/normal-1")
        r = c.post(f"{page}/signoff", headers=auth, data={"digest": digest}, follow_redirects=False)
        assert r.status_code == 502, r.text[:300]
        said = _text(r.text)
        assert "Case signed off" in said and "NOT stored in the PACS" in said, said
        assert 'id="reissue"' in r.text  # the way to send it, on the page that says why
    assert _verified(s, g.study_uid) == []
    # the PACS is back: sending it once stores it, and the button goes
    html = s.client.get(page, headers=auth).text
    csrf = re.search(r'<form[^>]*id="reissue".*?name="csrf" value="([^"]*)"', html, re.S)
    assert csrf is not None
    r = s.client.post(f"{page}/reissue", headers=auth, data={"csrf": csrf.group(1)},
                      follow_redirects=False)  # fmt: skip
    assert r.status_code == 303, _text(r.text)[:500]
    assert len(_verified(s, g.study_uid)) == 2
    assert 'id="reissue"' not in s.client.get(page, headers=auth).text
