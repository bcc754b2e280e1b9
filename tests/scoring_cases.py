"""Phantom-like cases for the scoring tests: the diagnoses, regions and signals the phantom
suite uses (evaluation.datasets.phantoms), written by hand so each test states exactly what the truth is."""

from __future__ import annotations

from typing import Any

from evaluation.answers import Answer, DifferentialItem, Finding, SequenceIdentified
from evaluation.case import (
    Case,
    Diagnosis,
    Difficulty,
    DiseaseGroup,
    Enhancement,
    GroundTruth,
    Hemisphere,
    ImageRef,
    LesionTruth,
    Provenance,
    Signal,
)

H, L, ISO = Signal.HYPER, Signal.HYPO, Signal.ISO
HD = Signal.HYPERDENSE
MR_SERIES = ("T1", "T1C", "T2", "FLAIR", "DWI", "ADC", "SWI")


def images(classes: tuple[str, ...] = MR_SERIES) -> list[ImageRef]:
    return [
        ImageRef(
            path=f"img{i + 1}.png",
            sha256=f"{i:064x}",
            label=f"{c} axial, z=+{10 * i} mm",
            series_class=c,
            modality="CT" if c == "CT" else "MR",
            plane="axial",
        )
        for i, c in enumerate(classes)
    ]


def lesion(
    lid: str,
    type_: str,
    side: str,
    region: str,
    lobe: str | None = None,
    enhancement: Enhancement = Enhancement.NONE,
    **signal: Signal,
) -> LesionTruth:
    return LesionTruth(
        id=lid,
        type=type_,
        hemisphere=Hemisphere(side),
        region=region,
        lobe=lobe,
        signal=signal,
        enhancement=enhancement,
        diffusion_restriction=signal.get("DWI") is H and signal.get("ADC") is L,
    )


def case(
    cid: str,
    name: str,
    icd10: str,
    group: DiseaseGroup,
    lesions: list[LesionTruth],
    *,
    series: tuple[str, ...] = MR_SERIES,
    patient: str | None = None,
    difficulty: Difficulty = Difficulty.L1,
    **extra: Any,
) -> Case:
    return Case(
        case_id=cid,
        patient_id=patient or f"p-{cid}",
        images=images(series),
        ground_truth=GroundTruth(
            final_diagnosis=Diagnosis(name=name, icd10=icd10, group=group),
            lesions=lesions,
            rationale=extra.get("rationale", ""),
            difficulty=difficulty,
            modality="CT" if series == ("CT",) else "MRI",
            plane="axial",
        ),
        provenance=Provenance.model_validate(
            {"source": "phantom", "extra": extra.get("provenance", {})}
        ),
    )


def ms_case() -> Case:
    return case(
        "ms-1",
        "Multiple sclerosis",
        "G35",
        DiseaseGroup.DEMYELINATING,
        [
            lesion("L1", "demyelinating plaque", "left", "periventricular white matter", "frontal", FLAIR=H, T2=H, T1=L),
            lesion("L2", "demyelinating plaque", "right", "periventricular white matter", "parietal", FLAIR=H, T2=H),
            lesion("L3", "demyelinating plaque", "left", "juxtacortical", "frontal", FLAIR=H, T2=H),
            lesion("L4", "demyelinating plaque", "right", "brainstem", None, FLAIR=H, T2=H),
        ],
        rationale="Ovoid periventricular, juxtacortical and infratentorial T2/FLAIR lesions "
        "disseminated in space in a young woman with optic neuritis: multiple sclerosis.",
    )  # fmt: skip


def stroke_case() -> Case:
    return case(
        "stroke-1",
        "Acute ischaemic stroke, left MCA territory",
        "I63.5",
        DiseaseGroup.ISCHAEMIC_STROKE,
        [
            lesion(
                "L1", "acute infarct", "left", "insula", "temporal", DWI=H, ADC=L, FLAIR=ISO, T2=ISO
            )
        ],
    )


def ich_case() -> Case:
    return case(
        "ich-1",
        "Intracerebral haemorrhage",
        "I61.0",
        DiseaseGroup.HAEMORRHAGIC_STROKE,
        [lesion("L1", "haematoma", "right", "basal ganglia", None, CT=HD)],
        series=("CT",),
    )


def gbm_case() -> Case:
    return case(
        "gbm-1",
        "Glioblastoma",
        "C71.2",
        DiseaseGroup.TUMOUR,
        [lesion("L1", "ring-enhancing mass", "right", "temporal", "temporal", Enhancement.RING,
                T1C=H, FLAIR=H, T2=H, T1=L, DWI=ISO, ADC=H)],
    )  # fmt: skip


def abscess_case() -> Case:
    return case(
        "abscess-1",
        "Brain abscess",
        "G06.0",
        DiseaseGroup.INFECTION,
        [lesion("L1", "ring-enhancing lesion", "left", "parietal", "parietal", Enhancement.RING,
                T1C=H, FLAIR=H, DWI=H, ADC=L)],
        difficulty=Difficulty.L2,
    )  # fmt: skip


def meningioma_case() -> Case:
    return case(
        "men-1",
        "Meningioma",
        "D32.0",
        DiseaseGroup.TUMOUR,
        [lesion("L1", "extra-axial mass", "right", "extra-axial", "frontal", Enhancement.HOMOGENEOUS,
                T1C=H, T2=ISO, FLAIR=ISO)],
    )  # fmt: skip


def mets_case() -> Case:
    return case(
        "mets-1",
        "Brain metastases",
        "C79.3",
        DiseaseGroup.TUMOUR,
        [
            lesion("L1", "enhancing metastasis", "left", "juxtacortical", "occipital", Enhancement.NODULAR, T1C=H, FLAIR=H),
            lesion("L2", "enhancing metastasis", "right", "juxtacortical", "frontal", Enhancement.NODULAR, T1C=H, FLAIR=H),
            lesion("L3", "enhancing metastasis", "right", "cerebellum", None, Enhancement.RING, T1C=H, FLAIR=H),
        ],
    )  # fmt: skip


def normal_case() -> Case:
    return case("normal-1", "Normal study", "Z03.3", DiseaseGroup.NORMAL, [])


def answer(
    diagnosis: str | None,
    findings: list[Finding] | None = None,
    differential: list[str | tuple[str, str]] | None = None,
    sequences: list[tuple[str, str]] | None = None,
    rationale: str = "",
    confidence: float | None = 0.7,
) -> Answer:
    diff = []
    for d in differential or []:
        name, code = d if isinstance(d, tuple) else (d, None)
        diff.append(DifferentialItem(diagnosis=name, icd10=code))
    return Answer(
        final_diagnosis=diagnosis,
        findings=findings or [],
        differential=diff,
        sequences_identified=[SequenceIdentified(image=i, sequence=s) for i, s in sequences or []],
        rationale=rationale,
        confidence=confidence,
    )


def f(description: str = "", **kw: Any) -> Finding:
    return Finding(description=description, **kw)
