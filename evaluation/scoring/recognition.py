"""Sequence, modality and plane recognition: what the answer says each image is, against the
classes the imaging core read from the DICOM headers (``ImageRef.series_class``)."""

from __future__ import annotations

import re

from evaluation.answers import Answer
from evaluation.case import Case, ImageRef
from evaluation.scores import Misidentified, Score, SequenceDetails
from evaluation.scoring import anatomy as A
from evaluation.scoring.text import normalise

_INDEX = re.compile(r"^\s*(?:image|img|figure|#|no\.?)?\s*#?\s*(\d+)\s*$", re.IGNORECASE)


def _modality(image: ImageRef) -> str | None:
    m = (image.modality or "").upper()
    if m in ("MR", "MRI"):
        return "MRI"
    if m == "CT":
        return "CT"
    return A.modality_of(image.series_class) if image.series_class else None


def resolve_image(ref: str | None, images: list[ImageRef], zero_based: bool) -> ImageRef | None:
    """The image an answer refers to: by label, file name, or number (1-based unless the
    answer used 0 anywhere)."""
    if not ref or not images:
        return None
    key = normalise(ref)
    for img in images:
        if key and key in (normalise(img.label), normalise(img.path.rsplit("/", 1)[-1])):
            return img
    m = _INDEX.match(ref)
    if m:
        i = int(m.group(1)) - (0 if zero_based else 1)
        if 0 <= i < len(images):
            return images[i]
    return None


def _pairs(case: Case, answer: Answer) -> list[tuple[str, ImageRef | None]]:
    refs = [s.image for s in answer.sequences_identified]
    zero = any(r is not None and (m := _INDEX.match(r)) and int(m.group(1)) == 0 for r in refs)
    return [
        (s.sequence, resolve_image(s.image, case.images, zero)) for s in answer.sequences_identified
    ]


def recognition_scores(case: Case, answer: Answer) -> list[Score]:
    """sequence_recognition, modality_accuracy and plane_accuracy for one answer."""
    shown = [i for i in case.images if i.series_class]
    if not answer.sequences_identified or not shown:
        why = "the answer names no sequences" if shown else "no header classes for the images"
        return [
            Score(scorer=n, value=None, explanation=why)
            for n in ("sequence_recognition", "modality_accuracy", "plane_accuracy")
        ]
    pairs = _pairs(case, answer)
    return [_sequences(pairs, shown), _modality_score(pairs, case), _plane(pairs)]


def _sequences(pairs: list[tuple[str, ImageRef | None]], shown: list[ImageRef]) -> Score:
    per_image = [(text, img) for text, img in pairs if img is not None and img.series_class]
    if per_image:
        wrong = [
            Misidentified(image=img.label, stated=text, header=img.series_class)
            for text, img in per_image
            if not A.same_sequence(A.sequence_class(text), img.series_class)
        ]
        value = 1 - len(wrong) / len(per_image)
        return Score(
            scorer="sequence_recognition",
            value=value,
            explanation=f"{len(per_image) - len(wrong)}/{len(per_image)} images named correctly",
            details=SequenceDetails(mode="per_image", misidentified=wrong),
        )
    truth = {A.EQUIVALENT_SEQUENCES.get(c, c) for i in shown if (c := i.series_class)}
    stated_raw = {A.sequence_class(t) for t, _ in pairs}
    stated = {A.EQUIVALENT_SEQUENCES.get(c, c) for c in stated_raw if c}
    union = truth | stated
    value = len(truth & stated) / len(union) if union else 0.0
    return Score(
        scorer="sequence_recognition",
        value=value,
        explanation=f"named {sorted(stated)}; header classes {sorted(truth)} (Jaccard)",
        details=SequenceDetails(
            mode="set",
            misidentified=[Misidentified(stated=s) for s in sorted(stated - truth)],
            not_named=sorted(truth - stated),
        ),
    )


def _modality_score(pairs: list[tuple[str, ImageRef | None]], case: Case) -> Score:
    checks = [
        (A.modality_of(A.sequence_class(t)), _modality(img)) for t, img in pairs if img is not None
    ]
    checks = [(s, h) for s, h in checks if s and h]
    if not checks:
        truth = {m for i in case.images if (m := _modality(i))}
        stated = {m for t, _ in pairs if (m := A.modality_of(A.sequence_class(t)))}
        if not truth or not stated:
            return Score(scorer="modality_accuracy", value=None, explanation="nothing to compare")
        ok = stated == truth
        return Score(
            scorer="modality_accuracy",
            value=float(ok),
            explanation=f"stated {sorted(stated)}, images {sorted(truth)}",
        )
    right = sum(s == h for s, h in checks)
    return Score(
        scorer="modality_accuracy",
        value=right / len(checks),
        explanation=f"{right}/{len(checks)} images of the right modality",
    )


def _plane(pairs: list[tuple[str, ImageRef | None]]) -> Score:
    checks = [(A.plane_in(t), img.plane) for t, img in pairs if img is not None and img.plane]
    checks = [(s, h) for s, h in checks if s]
    if not checks:
        return Score(scorer="plane_accuracy", value=None, explanation="no plane stated per image")
    right = sum(s == h for s, h in checks)
    return Score(
        scorer="plane_accuracy",
        value=right / len(checks),
        explanation=f"{right}/{len(checks)} planes right",
    )
