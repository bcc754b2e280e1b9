"""The worst realistic case for the printed checklist: three models on one MS case, each with
three task families and pass@k draws, a dozen findings an answer (long descriptions, some
invented), a long differential with long evidence, a long rationale, low confidence, misnamed
sequences, a format failure; real rendered DICOM montages and single slices (15 images)."""

from __future__ import annotations

from pathlib import Path

from gateway_synth import make_study
from report_fixtures import _sample
from scoring_cases import ms_case

from dicom.render import RenderOptions, render_path
from evaluation.answers import Answer, DifferentialItem, Finding, SequenceIdentified
from evaluation.case import Case, ImageRef, TaskFamily
from evaluation.log.rundata import RunData, SampleResult
from evaluation.scores import ParseStatus

MODELS = ("vendor-a/vision-large-2025-06", "vendor-b/open-vlm-72b-instruct", "ward-vlm")
FAMILIES = (TaskFamily.DIFFERENTIAL, TaskFamily.LESION, TaskFamily.RATIONALE)
PLACES = [
    ("left", "periventricular white matter", "FLAIR"),
    ("right", "periventricular white matter", "FLAIR"),
    ("left", "juxtacortical", "T2"),
    ("right", "brainstem", "T2"),
    ("left", "corpus callosum", "FLAIR"),
    ("right", "occipital", "T1"),
    ("left", "cerebellum", "T2"),
    ("right", "thalamus", "FLAIR"),
    ("left", "temporal", "T1"),
    ("right", "frontal", "FLAIR"),
    ("left", "parietal", "T2"),
    ("right", "insula", "T1"),
]
# long enough to be cut on paper: the HTML keeps all of it
LONG = (
    "ovoid lesion oriented perpendicular to the lateral ventricle (Dawson finger), "
    "hyperintense on FLAIR and T2, hypointense on T1 with a faint rim, no mass effect, "
    "no restricted diffusion, no enhancement on the images provided; compared with the "
    "contralateral side the signal is clearly abnormal and the margins are well defined"
)


def render_study(folder: Path) -> list[ImageRef]:
    make_study(folder / "dicom", classes=("FLAIR", "T2", "T1"), n_slices=8, size=64)
    manifest = render_path(
        folder / "dicom", folder / "png", RenderOptions(n_slices=4, singles=True, montage=True)
    )
    return [
        ImageRef(
            path=str(folder / "png" / img.file), sha256=img.sha256, label=img.label,
            series_class=img.series_class, modality="MR", plane="axial", kind=img.kind,
            window=img.window, series_uid=img.series_uid,
        )
        for img in manifest.images
    ]  # fmt: skip


def worst_answer(model_no: int, family_no: int) -> Answer:
    findings = [
        Finding(
            description=f"{'lesion' if i % 3 else 'plaque'} {i + 1} ({family_no}): {LONG}",
            sequence=seq, hemisphere=side, region=region, signal="hyperintense",
            size_mm=4.0 + i,
        )
        for i, (side, region, seq) in enumerate(PLACES)
    ]  # fmt: skip
    findings.append(  # one finding of this answer alone: blocks do not merge it away
        Finding(description=f"extra focus seen by task {family_no}: {LONG}", sequence="FLAIR",
                hemisphere="right", region=f"region {family_no}", signal="hyperintense")
    )  # fmt: skip
    differential = [
        DifferentialItem(
            diagnosis=name, likelihood=round(0.5 / (k + 1), 2),
            evidence_for=[LONG, "young adult with optic neuritis"],
            evidence_against=["no CSF result in the record", LONG[:120]],
        )
        for k, name in enumerate([
            "Multiple sclerosis", "Acute disseminated encephalomyelitis",
            "Neuromyelitis optica spectrum disorder", "Small vessel disease",
            "CNS vasculitis", "Susac syndrome",
        ])
    ]  # fmt: skip
    final = (
        "Relapsing-remitting multiple sclerosis with dissemination in space and time, "
        "active demyelination cannot be excluded without contrast"
        if model_no != 2
        else "Neuromyelitis optica spectrum disorder"
    )
    return Answer(
        sequences_identified=[
            SequenceIdentified(image="1", sequence="T1"),
            SequenceIdentified(image="2", sequence="FLAIR"),
        ],
        findings=findings,
        differential=differential,
        final_diagnosis=final,
        rationale=" ".join([LONG] * 25),
        confidence=0.2 + 0.1 * model_no,
        next_steps=["contrast-enhanced MRI", "spinal cord MRI", "CSF oligoclonal bands"],
    )


def worst_run(folder: Path) -> RunData:
    """One MS case answered by three models (the worst realistic paper copy)."""
    images = render_study(folder)
    case: Case = ms_case().model_copy(update={"case_id": "ms-worst", "images": images})
    samples: list[SampleResult] = []
    for m, model in enumerate(MODELS):
        for f, family in enumerate(FAMILIES):
            if model == MODELS[2] and family is TaskFamily.RATIONALE:
                samples.append(_sample(case, family, model, None, ParseStatus.FORMAT_FAILURE))
                continue
            draws = 3 if family is TaskFamily.DIFFERENTIAL else 1
            for k in range(draws):
                samples.append(_sample(case, family, model, worst_answer(m, f), ParseStatus.OK, k))
    return RunData(
        run_id="worst-run",
        title="The worst paper copy",
        created_at="2026-01-01T00:00:00+00:00",
        config={"models": list(MODELS), "tasks": [f.value for f in FAMILIES]},
        cases=[case],
        samples=samples,
    )
