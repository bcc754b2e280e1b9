"""A small hand-made run for the report tests: real rendered DICOM images, hand-written
answers (one carrying script tags), scored by the real scorers. Independent of the engine."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from gateway_synth import make_study
from scoring_cases import ms_case, normal_case, stroke_case

from dicom.render import RenderOptions, render_path
from evaluation.answers import Answer, DifferentialItem, Finding, SequenceIdentified
from evaluation.case import Case, ImageRef, TaskFamily
from evaluation.log.rundata import RunData, SampleResult
from evaluation.modelio import ModelOutput
from evaluation.scores import ParseStatus
from evaluation.scoring import make_scored_sample

XSS_MODEL = '<script>alert("model")</script><img src=x onerror=alert(1)>'
XSS_SERIES = 'MySeries<script>alert("XSS inside DICOM file 3");</script>'
XSS_NOTE = "Seen in clinic <script>alert('note')</script> with weakness."
GOOD, BAD = "ref-good", "ref/bad-model"


def render_images(folder: Path) -> list[ImageRef]:
    """Render a synthetic FLAIR + T2 study (real DICOM, real renderer) into PNG slices."""
    study = make_study(folder / "dicom", classes=("FLAIR", "T2"), n_slices=6, size=64)
    manifest = render_path(
        folder / "dicom", folder / "png", RenderOptions(n_slices=2, singles=True, montage=False)
    )
    refs = [
        ImageRef(
            path=str(folder / "png" / img.file),
            sha256=img.sha256,
            label=img.label,
            series_class=img.series_class,
            modality="MR",
            plane="axial",
            kind=img.kind,
            window=img.window,
            series_uid=img.series_uid,
        )
        for img in manifest.images
    ]
    assert refs, "the synthetic study rendered no images"
    (folder / "study_uid.txt").write_text(study.study_uid)
    return refs


def _bundle(condition: str) -> dict[str, object]:
    note = base64.b64encode(b"Referral note").decode()
    return {
        "resourceType": "Bundle",
        "type": "collection",
        "entry": [
            {"resource": {"resourceType": "Patient", "gender": "female", "birthDate": "1990-03-04",
                          "name": [{"family": "Doe", "given": ["Jane"]}]}},
            {"resource": {"resourceType": "Encounter", "period": {"start": "2024-01-02"},
                          "class": {"code": "EMER"},
                          "reasonCode": [{"text": "optic neuritis"}]}},
            {"resource": {"resourceType": "Condition", "code": {"text": condition}}},
            {"resource": {"resourceType": "DocumentReference",
                          "content": [{"attachment": {"contentType": "text/plain", "data": note}}]}},
        ],
    }  # fmt: skip


def _with_images(case: Case, images: list[ImageRef], **update: object) -> Case:
    return case.model_copy(update={"images": images, **update})


def ms_answer(hostile: bool) -> Answer:
    fd = XSS_MODEL if hostile else "Multiple sclerosis"
    return Answer(
        sequences_identified=[
            SequenceIdentified(image="1", sequence="FLAIR"),
            SequenceIdentified(image="3", sequence="T1" if hostile else "T2"),
        ],
        findings=[
            Finding(description="periventricular FLAIR hyperintense plaque", sequence="FLAIR",
                    hemisphere="left", region="periventricular white matter", signal="hyperintense"),
            Finding(description="juxtacortical plaque", sequence="FLAIR", hemisphere="left",
                    region="juxtacortical frontal", signal="hyperintense"),
        ]
        + ([Finding(description=f"mass {XSS_MODEL}", sequence="FLAIR", hemisphere="right",
                    region="occipital", signal="hyperintense")] if hostile else []),
        differential=[
            DifferentialItem(diagnosis=fd, icd10=None if hostile else "G35", likelihood=0.6,
                             evidence_for=["ovoid periventricular lesions"],
                             evidence_against=[XSS_MODEL] if hostile else []),
            DifferentialItem(diagnosis="Multiple sclerosis" if hostile else "ADEM", likelihood=0.2),
        ],
        final_diagnosis=fd,
        rationale=("Dissemination in space. " + (XSS_MODEL if hostile else "")).strip(),
        confidence=0.3 if hostile else 0.8,
    )  # fmt: skip


def _sample(
    case: Case,
    family: TaskFamily,
    model: str,
    ans: Answer | None,
    status: ParseStatus,
    idx: int = 0,
) -> SampleResult:
    text = ans.model_dump_json() if ans is not None else "I think it is {not json"
    if model == BAD and ans is not None:
        text = f"<script>alert('raw')</script>{text}"
    out = ModelOutput(
        text=text, prompt_tokens=1200 + 10 * idx, completion_tokens=300, cost_usd=0.004,
        latency_s=2.5 if model == BAD else 1.2,
    )  # fmt: skip
    scored = make_scored_sample(
        case, family, model, status, ans, text, sample_index=idx, output=out, run_id="test-run",
        bertscore=False,
    )  # fmt: skip
    return SampleResult(
        scored=scored, answer=ans, text=text, images_sent=[i.sha256 for i in case.images]
    )


def build_run(folder: Path, hostile_series: str | None = XSS_SERIES) -> RunData:
    """Three cases (MS, normal control, stroke) answered by two models; hostile strings in the
    record, the note, an image label (a DICOM SeriesDescription) and one model's answer."""
    images = render_images(folder)
    hostile = [i.model_copy(update={"label": f"{hostile_series} | {i.label}"}) for i in images[:1]]
    ms = _with_images(
        ms_case(), hostile + images[1:], ehr=_bundle(f"Optic neuritis {XSS_MODEL}"), note=XSS_NOTE
    )
    normal = _with_images(normal_case(), images, ehr=_bundle("Headache"), note="Headache.")
    stroke = _with_images(stroke_case(), images, note="Sudden right-sided weakness.")
    samples = []
    for i in range(3):
        samples.append(
            _sample(ms, TaskFamily.DIFFERENTIAL, GOOD, ms_answer(False), ParseStatus.OK, i)
        )
    samples.append(_sample(ms, TaskFamily.DIFFERENTIAL, BAD, ms_answer(True), ParseStatus.OK))
    normal_ok = Answer(
        final_diagnosis="Normal study",
        confidence=0.9,
        differential=[DifferentialItem(diagnosis="Normal study")],
    )
    normal_bad = Answer(
        final_diagnosis="Glioblastoma", confidence=0.7,
        findings=[Finding(description="right temporal mass", hemisphere="right", region="temporal",
                          sequence="FLAIR", signal="hyperintense")],
        differential=[DifferentialItem(diagnosis="Glioblastoma")],
    )  # fmt: skip
    samples.append(_sample(normal, TaskFamily.DIFFERENTIAL, GOOD, normal_ok, ParseStatus.OK))
    samples.append(_sample(normal, TaskFamily.DIFFERENTIAL, BAD, normal_bad, ParseStatus.OK))
    stroke_ok = Answer(
        final_diagnosis="Acute ischaemic stroke", confidence=0.45,
        findings=[Finding(description="restricted diffusion left insula", hemisphere="left",
                          region="insula", sequence="DWI", signal="hyperintense")],
        differential=[DifferentialItem(diagnosis="Acute ischaemic stroke", icd10="I63.5")],
    )  # fmt: skip
    samples.append(_sample(stroke, TaskFamily.DIFFERENTIAL, GOOD, stroke_ok, ParseStatus.OK))
    samples.append(_sample(stroke, TaskFamily.DIFFERENTIAL, BAD, None, ParseStatus.FORMAT_FAILURE))
    # an ablation: the good model without the record (images only) on the MS case
    abl = _sample(ms, TaskFamily.DIFFERENTIAL, GOOD, normal_ok, ParseStatus.OK)
    samples.append(abl.model_copy(update={"ablation": "images"}))
    return RunData(
        run_id="test-run",
        title="Report test run",
        created_at="2025-01-01T00:00:00+00:00",
        config={"models": [GOOD, BAD], "tasks": ["differential"], "temperature": 0.7},
        cases=[ms, normal, stroke],
        samples=samples,
    )


def dump(run: RunData, path: Path) -> Path:
    path.write_text(json.dumps(run.model_dump(mode="json")))
    return path
