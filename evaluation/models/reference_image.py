"""``reference/image-rules``: a baseline of classical image analysis, NOT a vision-language model.

It reads the PNGs it is sent (and their labels, for the sequence), finds signal asymmetric to
the mirror hemisphere (:mod:`evaluation.models.image_analysis`), reports findings with side and
rough region, and names a diagnosis from the pattern: CT hyperdensity -> haemorrhage; DWI bright
with ADC dark -> acute infarct; ring enhancement -> glioblastoma, or abscess when its centre
restricts diffusion, or metastases when several; a peripheral homogeneously enhancing lesion ->
meningioma; several small FLAIR/T2 lesions -> multiple sclerosis; nothing -> normal study.
It ignores the record. Each finding points at the blob it reports (``place``: the image's
number and a pixel of the blob). It answers in the same JSON as a model, so the pipeline runs
offline.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import replace

from evaluation.answers import Answer, Finding, ImagePlace, SequenceIdentified
from evaluation.case import TaskFamily
from evaluation.modelio import GenerateConfig, Message, ModelOutput
from evaluation.models.image_analysis import Blob, analyse_image, plane_of, sequence_of
from evaluation.models.reference_common import (
    DX,
    Hypothesis,
    classification,
    differential,
    images_of,
    ranked,
    reply,
    task_of,
)

SIGNAL_WORD = {
    ("CT", "hyper"): "hyperdense",
    ("CT", "hypo"): "hypodense",
}


def _signal(b: Blob) -> str:
    return SIGNAL_WORD.get(
        (b.sequence, b.kind), "hyperintense" if b.kind == "hyper" else "hypointense"
    )


def findings_of(blobs: list[Blob]) -> list[Finding]:
    """One finding per (sequence, side, region, signal), largest size kept."""
    groups: dict[tuple[str, str, str, str], list[Blob]] = defaultdict(list)
    for b in blobs:
        groups[(b.sequence, b.side, b.region, b.kind)].append(b)
    out = []

    def weight(group: list[Blob]) -> float:
        return sum(b.area_frac * b.contrast for b in group)

    for (seq, side, region, _kind), group in sorted(groups.items(), key=lambda kv: -weight(kv[1])):
        big = max(group, key=lambda b: b.diameter_mm)
        enh = None
        if seq == "T1C":
            enh = "ring" if any(b.ring for b in group) else "homogeneous"
        out.append(
            Finding(
                description=f"{_signal(big)} focus on {seq}"
                + (" with ring pattern" if big.ring else ""),
                sequence=seq if seq != "UNKNOWN" else None,
                hemisphere=side,
                region=region,
                signal=_signal(big),
                size_mm=big.diameter_mm,
                enhancement=enh,
                place=_place(big),
            )
        )
    return out[:12]


def _place(b: Blob) -> ImagePlace | None:
    """Where the baseline found the blob: it points at what it reports."""
    if b.image is None or b.point is None:
        return None
    return ImagePlace(image=b.image, point=b.point)


def diagnose(blobs: list[Blob]) -> list[Hypothesis]:
    by_seq: dict[str, list[Blob]] = defaultdict(list)
    for b in blobs:
        by_seq[f"{b.sequence}:{b.kind}"].append(b)
    hyps: dict[str, Hypothesis] = {}

    def add(name: str, weight: float, why: str) -> None:
        h = hyps.setdefault(name, Hypothesis(DX[name], 0.0, []))
        h.weight += weight
        h.evidence.append(why)

    ct_hyper, ct_hypo = by_seq.get("CT:hyper", []), by_seq.get("CT:hypo", [])
    dwi, adc = by_seq.get("DWI:hyper", []), by_seq.get("ADC:hypo", [])
    t1c = by_seq.get("T1C:hyper", [])
    t2like = by_seq.get("FLAIR:hyper", []) + by_seq.get("T2:hyper", [])
    if ct_hyper:
        add("intracerebral haemorrhage", 3.0, "focal hyperdensity on CT")
    if ct_hypo:
        add("acute ischaemic stroke", 2.0, "focal hypodensity on CT")
    if dwi and adc:
        sides = {b.side for b in dwi} & {b.side for b in adc}
        if sides:
            weight = 1.5 if t1c and any(b.ring for b in t1c) else 3.0
            add("acute ischaemic stroke", weight, "DWI bright with low ADC (restricted diffusion)")
    elif dwi:
        add("acute ischaemic stroke", 1.0, "DWI hyperintensity")
    if t1c:
        rings = [b for b in t1c if b.ring]
        regions = {(b.side, b.region) for b in t1c}
        if len(regions) >= 3:
            add("brain metastases", 2.5, "enhancing lesions in several regions")
        if rings and dwi:
            add("cerebral abscess", 2.0, "ring enhancement with restricted diffusion")
        if rings:
            add("glioblastoma", 2.5, "ring-enhancing mass")
        elif all(b.peripheral for b in t1c):
            add("meningioma", 2.5, "peripheral homogeneously enhancing lesion")
        else:
            add("glioblastoma", 1.0, "enhancing lesion")
    if t2like:
        small = [b for b in t2like if b.diameter_mm < 15]
        big = [b for b in t2like if b.diameter_mm >= 25]
        regions = {(b.side, b.region) for b in small}
        if not big and (len(regions) >= 2 or len(small) >= 3):
            add("multiple sclerosis", 2.0 + 0.2 * len(small), "several small FLAIR/T2 lesions")
        if big and not dwi:
            add("glioblastoma", 2.0, "large FLAIR/T2 abnormality")
    if not hyps:
        add("normal study", 2.0, "no asymmetric signal against the mirror hemisphere")
    return list(hyps.values())


def answer_for(messages: list[Message]) -> str:
    family = task_of(messages)
    parts = images_of(messages)
    blobs: list[Blob] = []
    sequences: list[SequenceIdentified] = []
    for n, part in enumerate(parts, start=1):
        seq, found = analyse_image(
            part.png, part.label, "montage" if "montage" in part.label else "slice"
        )
        blobs.extend(replace(b, image=n) for b in found)
        if seq:
            sequences.append(SequenceIdentified(image=str(n), sequence=seq))
    if any(s.sequence == "FLAIR" for s in sequences):
        # T2 shows CSF bright too; with FLAIR at hand, its asymmetries add only noise.
        blobs = [b for b in blobs if b.sequence != "T2"]
    blobs.sort(key=lambda b: -b.area_frac * b.contrast)
    hyps = ranked(diagnose(blobs))
    best = hyps[0]
    if family is TaskFamily.CLASSIFICATION:
        label = parts[0].label if parts else ""
        seq = sequence_of(label)
        modality = "CT" if seq == "CT" else "MRI"
        nv_seq = {"T1C": "T1C+", "FLAIR": "FLAIR", "T1": "T1", "T2": "T2"}.get(seq or "")
        return reply(
            classification(
                best, modality=modality, sequence=nv_seq, plane=plane_of(label) or "axial"
            )
        )
    if not parts:
        rationale = "Image-rules baseline: no images were given, so nothing could be analysed."
    else:
        rationale = (
            f"Image-rules baseline (classical analysis, not a language model): {best.dx.name}, because "
            + "; ".join(best.evidence)
            + "."
        )
    return reply(
        Answer(
            sequences_identified=sequences,
            findings=findings_of(blobs),
            differential=differential(hyps),
            final_diagnosis=best.dx.name,
            rationale=rationale,
            confidence=round(min(0.9, 0.25 + 0.1 * best.weight), 2),
            next_steps=[],
        )
    )


class ImageRulesModel:
    """Mirror-asymmetry rules on the images it is sent; ignores the record."""

    name = "reference/image-rules"

    def __init__(self, name: str | None = None) -> None:
        self.name = name or ImageRulesModel.name

    async def generate(self, messages: list[Message], config: GenerateConfig) -> ModelOutput:
        # Image analysis is CPU work: keep the event loop (other models' calls) responsive.
        text = await asyncio.to_thread(answer_for, messages)
        return ModelOutput(text=text, finish_reason="stop", cost_usd=0.0, latency_s=0.0)
