"""The clinical-safety path end to end, with real parts only: dcmtk's storescu sends a phantom
study (the glioblastoma case of the phantom suite) to
`neurosandbox serve`; a VLM on a loopback OpenAI-compatible server (through litellm) answers the
lesion and differential tasks with findings and diagnoses that partly agree; in headless
Chromium a reviewer rejects one finding, corrects another and signs off in two steps, which
stores the VERIFIED report; the VERIFIED SR read back from Orthanc says exactly that."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pydicom
import pytest
from browser import CHROMIUM, launch, sign_in
from dciodvfy import assert_dciodvfy_clean
from gateway_process import Gateway, running_gateway, send
from openai_server import OpenAIServer, Script
from orthanc_fixture import OrthancServer
from phantom_fixture import PhantomSuite
from viewer_fixture import centre_std, needs_viewer

from gateway.auth import Role, TokenStore

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.timeout(300)]
playwright = pytest.importorskip("playwright.sync_api")
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
SCREENSHOTS = Path(__file__).resolve().parents[1] / "docs" / "screenshots"
MODEL = "ward-vlm"
ORG = "St Elsewhere Neurology"
SR_CLASS = "1.2.840.10008.5.1.4.1.1.88.34"
PDF_CLASS = "1.2.840.10008.5.1.4.1.1.104.1"


def _finding(desc: str, side: str, region: str, seq: str, signal: str) -> dict[str, str]:
    return {"description": desc, "hemisphere": side, "region": region, "sequence": seq,
            "signal": signal}  # fmt: skip


LESION = {
    "sequences_identified": [{"image": "1", "sequence": "FLAIR"}],
    "findings": [
        _finding("ring-enhancing mass", "left", "frontal", "FLAIR", "hyperintense"),
        _finding("vasogenic oedema", "left", "parietal", "FLAIR", "hyperintense"),
        _finding("small cortical nodule", "right", "occipital", "T2", "hyperintense"),
        _finding("cerebellar nodule", "right", "cerebellum", "T2", "hyperintense"),
        _finding("tiny focus", "left", "temporal", "FLAIR", "hyperintense"),
    ],
    "differential": [{"diagnosis": "Brain metastases", "icd10": "C79.3"}],
    "final_diagnosis": "Brain metastases",
    "rationale": "several lesions",
    "confidence": 0.6,
}
DIFFERENTIAL = {
    "sequences_identified": [{"image": "1", "sequence": "FLAIR"}],
    "findings": [
        # the lesion answer's oedema, described otherwise: the same finding
        _finding("surrounding T2 bright oedema", "left", "parietal", "flair", "high signal"),
        _finding(
            "periventricular cap",
            "bilateral",
            "periventricular white matter",
            "FLAIR",
            "hyperintense",
        ),
    ],
    "differential": [
        {"diagnosis": "Glioblastoma", "icd10": "C71.9"},
        {"diagnosis": "brain metastases"},
        {"diagnosis": "Cerebral abscess"},
    ],
    "final_diagnosis": "Glioblastoma",  # disagrees with the lesion answer
    "rationale": "a solitary enhancing mass",
    "confidence": 0.5,
}


@dataclass
class Setup:
    gw: Gateway
    base: str
    token: str
    study_uid: str
    run_id: str
    first_file: Path


@pytest.fixture(scope="module")
def setup(orthanc_server: OrthancServer, phantom_suite: PhantomSuite,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:  # fmt: skip
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    needs_viewer()
    tmp = tmp_path_factory.mktemp("verified-e2e")
    routing = tmp / "routing.yaml"
    routing.write_text(
        "rules:\n  - name: ward\n    match:\n      modality: [MR]\n    evaluate:\n"
        f"      models: [{MODEL}]\n      tasks: [lesion, differential]\n"
        "      series_classes: [FLAIR, T2, T1, T1C]\n"
    )
    models = tmp / "models.yaml"
    models.write_text(f"models:\n  - name: {MODEL}\n    model: openai/gpt-4o\n    max_retries: 1\n")
    tokens = TokenStore(orthanc_server.settings.data_dir / "secret" / "tokens.json")
    token = tokens.create(Role.REVIEWER, "Dr Neuro", "Neuro^Nina")[1]
    admin = tokens.create(Role.ADMIN, "ops")[1]
    script = Script(
        replies=[
            ("Task: lesion recognition.", json.dumps(LESION)),
            ("Task: differential diagnosis.", json.dumps(DIFFERENTIAL)),
        ]
    )
    files = sorted(p for p in (phantom_suite.case_dir("gbm") / "dicom").rglob("*") if p.is_file())
    study_uid = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
    with (
        OpenAIServer(script) as server,
        running_gateway(
            orthanc_server, tmp / "serve.log", token, admin,
            NEUROSANDBOX_STUDY_QUIET_S="1.5", NEUROSANDBOX_ROUTING_FILE=str(routing),
            NEUROSANDBOX_MODELS_FILE=str(models), NEUROSANDBOX_API_BASE=server.url,
            NEUROSANDBOX_VERIFYING_ORGANIZATION=ORG, OPENAI_API_KEY="sk-loopback",
        ) as gw,
    ):  # fmt: skip
        send(gw, files)
        runs: list[dict[str, object]] = []
        for _ in range(200):
            runs = [r for r in gw.get("/runs", token).json() if r["study_uid"] == study_uid]
            if runs:
                break
            subprocess.run(["sleep", "0.3"], check=True)
        assert runs, gw.log.read_text()[-3000:]
        run = gw.wait_run(str(runs[0]["run_id"]), timeout=120)
        assert run["status"] == "done", (run, gw.log.read_text()[-3000:])
        yield Setup(gw, gw.api, token, study_uid, str(run["run_id"]), files[0])


def _shot(page, name: str, full_page: bool = True, at=None) -> None:  # type: ignore[no-untyped-def]
    """A screenshot of the phantom run for the README (docs/screenshots) and tests/artifacts."""
    ARTIFACTS.mkdir(exist_ok=True)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    if at is not None:
        at.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / name), full_page=full_page)
    shutil.copyfile(ARTIFACTS / name, SCREENSHOTS / name)


def _documents(gw: Gateway, study_uid: str) -> list[pydicom.Dataset]:
    study_id = gw.orthanc.find_study(study_uid)
    assert study_id is not None
    out = []
    for inst in gw.orthanc.study_instances(study_id):
        meta = gw.orthanc.instance_metadata(inst["ID"])
        if meta.get("SopClassUid") in (SR_CLASS, PDF_CLASS):
            raw = gw.orthanc.api.get(f"{gw.orthanc.url}/instances/{inst['ID']}/file").content
            out.append(pydicom.dcmread(io.BytesIO(raw)))
    return out


def _texts(ds: pydicom.Dataset) -> str:
    return " | ".join(
        str(e.value) if e.keyword == "TextValue" else " ".join(str(c.CodeMeaning) for c in e.value)
        for e in ds.iterall()
        if e.keyword in ("TextValue", "ConceptCodeSequence")
    )


def test_rejected_and_corrected_findings_reach_the_verified_sr(setup: Setup) -> None:
    with playwright.sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        sign_in(page, setup.base, setup.token)
        # The queue: the patient as the hospital knows them, from the study's own headers.
        head = pydicom.dcmread(setup.first_file, stop_before_pixels=True)
        row = page.locator(f'tr.queue-row[data-run="{setup.run_id}"]')
        assert str(head.AccessionNumber) in row.inner_text()
        assert str(head.PatientID) in row.inner_text()
        assert re.search(r"\b0 of \d+ items", row.inner_text()) and "to review" in row.inner_text()
        _shot(page, "review-queue.png")
        row.locator("a.case-link").click()
        block = page.locator(f'section.block[data-model="{MODEL}"]')
        rows = block.locator("tr[data-item]")
        # 5 lesion findings + 1 more from the differential answer (its oedema is finding 2);
        # 3 differential entries (metastases once), 2 final diagnoses (the answers disagree).
        ids = [rows.nth(i).get_attribute("data-item") for i in range(rows.count())]
        assert [i for i in ids if i.startswith("finding")] == [f"finding.{n}" for n in range(1, 7)]
        assert [i for i in ids if i.startswith("final")] == ["final", "final.2"]
        assert "lesion finding 2; differential finding 1" in block.locator('tr[data-item="finding.2"]').inner_text()  # fmt: skip
        # the identifiers are in their own labelled panel, not above the record
        assert str(head.AccessionNumber) in page.inner_text("#hospital")
        assert str(head.AccessionNumber) not in page.inner_text("#model-saw ~ div")

        # The review page's own links open the real viewer at the tile's slice: pixels render.
        assert block.locator('tr[data-item="finding.1"] a.viewer-link').count() == 1
        with page.expect_popup() as popup:
            page.locator(".thumb a.viewer-link").first.click()
        viewer = popup.value
        viewer.wait_for_url(re.compile(r"/review/viewer/viewer\?"), timeout=60_000)
        viewer.locator("canvas.cornerstone-canvas").first.wait_for(timeout=60_000)
        deadline, spread = time.monotonic() + 30, 0.0
        while spread < 20 and time.monotonic() < deadline:
            spread = centre_std(viewer)
            time.sleep(0.25)
        assert spread >= 20, f"the viewer's centre is uniform (std {spread:.1f})"
        viewer.close()

        # The whole block in one go: one radio click per changed item, then one save that
        # accepts the rest (4 clicks and the correction typed; 2 more to sign off).
        def choose(item: str, verdict: str, text: str = "") -> None:
            box = block.locator(f'fieldset[data-block-item="{MODEL}/{item}"]')
            box.locator(f'input[type=radio][value="{verdict}"]').check()
            if text:
                box.locator("input[type=text]").fill(text)

        choose("finding.4", "reject")
        choose("finding.5", "correct", "tiny left temporal cavernoma, incidental")
        _shot(page, "review-case.png", full_page=False, at=block)
        block.locator("button.accept-rest").click()
        page.wait_for_url("**done=block*")
        assert page.url.endswith("-save")  # back where the reader was, not at the top
        assert page.evaluate("window.scrollY") > 0
        page.fill("#case-review form[action$='/comment'] input[name=text]", "Discussed at MDT")
        page.click("#case-review form[action$='/comment'] button")
        page.wait_for_url("**done=comment")
        page.click("#signoff a")
        page.wait_for_url("**/signoff")
        preview = page.locator(f'section.verified-block[data-model="{MODEL}"]')
        assert "dropped" in preview.locator('tr[data-item="finding.4"]').inner_text()
        assert "tiny left temporal cavernoma" in preview.locator('tr[data-item="finding.5"]').inner_text()  # fmt: skip
        assert "Signing sends this to the PACS" in page.inner_text("#signoff-pacs")
        _shot(page, "signoff-preview.png")
        page.click("#signoff-confirm button")  # signs off and sends: no third button
        page.wait_for_url("**pacs=sent&done=signoff")
        assert "is in the PACS" in page.inner_text("body")
        assert page.locator("#reissue").count() == 0
        browser.close()

    docs = _documents(setup.gw, setup.study_uid)
    for d in docs:  # every SR and PDF the project wrote, UNVERIFIED and VERIFIED
        assert_dciodvfy_clean(d)
    srs = [d for d in docs if d.SOPClassUID == SR_CLASS]
    (unverified,) = [d for d in srs if d.VerificationFlag == "UNVERIFIED"]
    (verified,) = [d for d in srs if d.VerificationFlag == "VERIFIED"]
    assert verified.SeriesDescription == "NeuroSandbox AI findings (VERIFIED)"
    assert verified.SeriesInstanceUID != unverified.SeriesInstanceUID
    before, after = _texts(unverified), _texts(verified)
    assert "cerebellar nodule" in before and "cerebellar nodule" not in after  # rejected
    assert "tiny left temporal cavernoma, incidental" in after and "tiny focus" not in after
    assert "vasogenic oedema" in after and "Comment by Nina Neuro: Discussed at MDT" in after
    assert "Glioblastoma" in after and "Brain metastases" in after  # both final diagnoses
    (observer,) = verified.VerifyingObserverSequence
    assert str(observer.VerifyingObserverName) == "Neuro^Nina"
    assert observer.VerifyingOrganization == ORG
    pred = verified.PredecessorDocumentsSequence[0].ReferencedSeriesSequence[0]
    assert pred.ReferencedSOPSequence[0].ReferencedSOPInstanceUID == unverified.SOPInstanceUID
    pdfs = {d.SeriesDescription: d for d in docs if d.SOPClassUID == PDF_CLASS}
    assert set(pdfs) == {"NeuroSandbox AI checklist (UNVERIFIED)", "NeuroSandbox AI checklist (VERIFIED)"}  # fmt: skip
    assert "VERIFIED by Nina Neuro" in pdfs["NeuroSandbox AI checklist (VERIFIED)"].DocumentTitle
    assert all("VerificationFlag" not in d for d in pdfs.values())
    # dcmtk reads the VERIFIED SR back: the verifying observer and the content tree
    path = ARTIFACTS / "verified-sr.dcm"
    verified.save_as(path, enforce_file_format=True)
    dump = subprocess.run(["/usr/bin/dsrdump", str(path)], capture_output=True, encoding="latin-1")
    assert dump.returncode == 0 and "Neuro^Nina" in dump.stdout and "VERIFIED" in dump.stdout
