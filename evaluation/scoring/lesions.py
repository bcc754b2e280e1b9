"""Match a model's findings to the ground-truth lesions of a case.

A finding is read from its structured fields, falling back to its description: side, atlas
regions (``anatomy.regions_in``), sequence, signal direction and enhancement. Against each lesion:

- strict match: a region in {lesion.region, lesion.lobe}, a compatible side, and, where the
  finding states them, a sequence on which the lesion is visible and a signal that fits it;
- near match (the right lesion, wrongly tied): ``wrong_side`` (same region, other hemisphere),
  ``adjacent_region`` (same side, a neighbouring region), both only when the stated sequence,
  signal and enhancement fit the lesion; ``wrong_sequence`` (claimed on a
  sequence where the lesion is invisible, or one the case does not have), ``wrong_signal`` (a
  visible sequence with the opposite signal), ``unlocalised`` (no location, attributes fit);
- otherwise the finding is hallucinated, except a finding with neither location nor attributes
  ("mass effect"), which counts against precision but not as a hallucination (on a normal
  control every positive finding is a hallucination). Findings that deny disease ("no acute lesion") are
  ignored. An enhancement pattern that contradicts the lesion is kept as a description error.

Matching is many-to-many: one finding may cover several lesions ("bilateral periventricular
plaques") and several findings may describe one lesion. Precision = strictly matched findings /
positive findings; recall = strictly detected lesions / lesions; ``missed`` lesions have no strict
or near match at all.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field

from evaluation.answers import Finding
from evaluation.case import Case, DiseaseGroup, Enhancement, LesionTruth
from evaluation.scoring import anatomy as A

NearKind = Literal["wrong_side", "adjacent_region", "wrong_sequence", "wrong_signal", "unlocalised"]
_NEGATIVE = re.compile(
    r"^\s*(no|none|nil|normal|unremarkable|nothing|negative|without)\b"
    r"|\bno (acute |focal |significant |definite )*(abnormalit|lesion|finding|pathology)",
    re.IGNORECASE,
)


class ReadFinding(BaseModel):
    """What scoring understood of one finding."""

    side: str | None = None
    regions: list[str] = Field(default_factory=list)
    sequence: str | None = None
    direction: str | None = None
    enhancement: str | None = None


class FindingMatch(BaseModel):
    index: int
    status: Literal["matched", "near", "hallucinated", "unlocalised", "negative"]
    read: ReadFinding
    lesions: list[str] = Field(default_factory=list)  # strictly matched lesion ids
    near: dict[str, list[str]] = Field(default_factory=dict)  # lesion id -> near kinds
    description_errors: list[str] = Field(default_factory=list)


class LesionOutcome(BaseModel):
    lesion_id: str
    status: Literal["detected", "near", "missed"]
    near_kinds: list[str] = Field(default_factory=list)
    findings: list[int] = Field(default_factory=list)
    description_errors: list[str] = Field(default_factory=list)


class LesionMatchResult(BaseModel):
    findings: list[FindingMatch]
    lesions: list[LesionOutcome]
    normal_control: bool
    n_positive: int
    n_matched: int
    n_hallucinated: int
    n_detected: int
    n_near: int
    n_missed: int
    precision: float | None
    recall: float | None
    f1: float | None
    recall_location: float | None  # lesions found in the right place, signal/sequence aside
    hallucination_rate: float | None
    missed_rate: float | None
    normal_false_positive: bool | None


def read_finding(f: Finding) -> ReadFinding:
    desc = f.description or ""
    regions = A.regions_in(f.region) or A.regions_in(desc)
    side = A.side_in(f.hemisphere) or A.side_in(f.region) or A.side_in(desc)
    seq = A.sequence_class(f.sequence) or (None if f.sequence else A.sequence_class(desc))
    direction = A.signal_direction(f.signal, seq) or A.signal_direction(desc, seq)
    enh = A.enhancement_of(f.enhancement) or A.enhancement_of(desc)
    return ReadFinding(
        side=side,
        regions=sorted(regions),
        sequence=seq,
        direction=direction,
        enhancement=str(enh) if enh is not None else None,
    )


def _is_negative(f: Finding, r: ReadFinding) -> bool:
    if r.regions or r.side:
        return False
    text = " ".join(x for x in (f.description, f.signal or "") if x).strip()
    return not text or bool(_NEGATIVE.search(text))


def _attribute_kinds(r: ReadFinding, lesion: LesionTruth, shown: set[str]) -> list[str]:
    """wrong_sequence / wrong_signal for a finding located on the lesion."""
    truth = {A.EQUIVALENT_SEQUENCES.get(k, k): A.direction_of(v) for k, v in lesion.signal.items()}
    kinds: list[str] = []
    if r.sequence is not None:
        seq = A.EQUIVALENT_SEQUENCES.get(r.sequence, r.sequence)
        if shown and not any(A.same_sequence(seq, s) for s in shown):
            kinds.append("wrong_sequence")  # a sequence the case does not have
        elif seq in truth:
            if truth[seq] == "iso" and r.direction != "iso":
                kinds.append("wrong_sequence")  # the lesion is invisible there
            elif r.direction and not A.directions_compatible(r.direction, truth[seq]):
                kinds.append("wrong_signal")
    elif r.direction and truth:
        visible = [d for d in truth.values() if d != "iso"]
        if visible and not any(A.directions_compatible(r.direction, d) for d in visible):
            kinds.append("wrong_signal")
    return kinds


def _description_errors(r: ReadFinding, lesion: LesionTruth) -> list[str]:
    if r.enhancement is None:
        return []
    stated: Enhancement | str = (
        r.enhancement if r.enhancement == "any" else Enhancement(r.enhancement)
    )
    if A.enhancement_compatible(stated, lesion.enhancement):
        return []
    return [f"enhancement stated {r.enhancement}, truth {lesion.enhancement.value}"]


def _attributes_fit(r: ReadFinding, lesion: LesionTruth, shown: set[str]) -> bool:
    return not _attribute_kinds(r, lesion, shown) and not _description_errors(r, lesion)


def match_lesions(case: Case, findings: list[Finding]) -> LesionMatchResult | None:
    """Match findings to the case's lesions; None when the case has no lesion ground truth
    (and is not a normal control)."""
    gt = case.ground_truth
    if gt is None:
        return None
    normal = gt.final_diagnosis.group is DiseaseGroup.NORMAL and not gt.lesions
    if not gt.lesions and not normal:
        return None
    shown = {i.series_class for i in case.images if i.series_class}
    outcomes = {L.id: LesionOutcome(lesion_id=L.id, status="missed") for L in gt.lesions}
    matches: list[FindingMatch] = []
    for idx, f in enumerate(findings):
        r = read_finding(f)
        fm = FindingMatch(index=idx, status="hallucinated", read=r)
        if _is_negative(f, r):
            fm.status = "negative"
            matches.append(fm)
            continue
        for L in gt.lesions:
            where = {L.region, *([L.lobe] if L.lobe else [])}
            side_ok = A.sides_compatible(r.side, L.hemisphere.value)
            kinds: list[str] = []
            if not r.regions:
                if _attributes_fit(r, L, shown) and (r.sequence or r.direction or r.enhancement):
                    kinds = ["unlocalised"]
            elif set(r.regions) & where:
                if side_ok:
                    kinds = _attribute_kinds(r, L, shown)
                    if not kinds:
                        fm.lesions.append(L.id)
                        fm.description_errors += _description_errors(r, L)
                        continue
                elif _attributes_fit(r, L, shown):
                    kinds = ["wrong_side"]
            elif (
                side_ok
                and any(frozenset((a, b)) in A.ADJACENT for a in r.regions for b in where)
                and _attributes_fit(r, L, shown)
            ):
                kinds = ["adjacent_region"]
            if kinds:
                fm.near[L.id] = kinds
        if fm.lesions:
            fm.status = "matched"
        elif fm.near:
            fm.status = "near"
        elif not r.regions and not normal and not (r.sequence or r.direction or r.enhancement):
            fm.status = "unlocalised"  # "mass effect": nothing to check it against
        else:
            fm.status = "hallucinated"
        matches.append(fm)
        for lid in fm.lesions:
            outcomes[lid].findings.append(idx)
            outcomes[lid].description_errors += fm.description_errors
    for fm in matches:
        if fm.status != "near":
            continue  # a finding that matched one lesion is explained; it ties no other
        for lid, kinds in fm.near.items():
            o = outcomes[lid]
            if not o.findings or o.status == "near":
                o.near_kinds = sorted({*o.near_kinds, *kinds})
    for o in outcomes.values():
        o.status = "detected" if o.findings else ("near" if o.near_kinds else "missed")
        if o.status == "detected":
            o.near_kinds = []
    return _summarise(matches, list(outcomes.values()), normal)


def _ratio(a: int, b: int) -> float | None:
    return a / b if b else None


def _summarise(
    matches: list[FindingMatch], lesions: list[LesionOutcome], normal: bool
) -> LesionMatchResult:
    positive = [m for m in matches if m.status != "negative"]
    n_matched = sum(m.status == "matched" for m in positive)
    n_hall = sum(m.status == "hallucinated" for m in positive)
    detected = sum(o.status == "detected" for o in lesions)
    near = sum(o.status == "near" for o in lesions)
    located = sum(
        o.status == "detected"
        or (o.status == "near" and set(o.near_kinds) <= {"wrong_sequence", "wrong_signal"})
        for o in lesions
    )
    precision = _ratio(n_matched, len(positive))
    recall = _ratio(detected, len(lesions))
    if precision is not None and recall is not None:
        f1: float | None = (
            2 * precision * recall / (precision + recall) if precision + recall else 0.0
        )
    elif recall is not None:
        f1 = 0.0  # lesions present and no positive finding at all
    else:
        f1 = None
    return LesionMatchResult(
        findings=matches,
        lesions=lesions,
        normal_control=normal,
        n_positive=len(positive),
        n_matched=n_matched,
        n_hallucinated=n_hall,
        n_detected=detected,
        n_near=near,
        n_missed=len(lesions) - detected - near,
        precision=precision,
        recall=recall,
        f1=f1,
        recall_location=_ratio(located, len(lesions)),
        hallucination_rate=_ratio(n_hall, len(positive)),
        missed_rate=_ratio(len(lesions) - detected - near, len(lesions)),
        normal_false_positive=bool(positive) if normal else None,
    )
