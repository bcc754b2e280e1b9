"""Match a model's findings to the ground-truth lesions of a case.

A finding is read from its structured fields, falling back to its description: side, atlas
regions (``anatomy.regions_in``), sequence, signal direction, size and enhancement. Each
(finding, lesion) pair is placed first:

- ``same``: a region in {lesion.region, lesion.lobe} and a compatible side;
- near (the right lesion, wrongly tied), only when every stated attribute fits the lesion:
  ``wrong_side`` (same region, other hemisphere), ``adjacent_region`` (same side, a
  neighbouring region), ``unlocalised`` (no location, but a sequence, signal or enhancement);
- otherwise the pair is impossible.

and costed over every stated attribute: location (exact region before lobe, stated side before
unstated), sequence (``wrong_sequence``: claimed on a sequence where the lesion is invisible, or
one the case lacks), signal (``wrong_signal``), enhancement and size (description errors).

Each lesion is judged against its best finding, chosen by a one-to-one assignment of minimum
total cost (Hungarian, ``scipy.optimize.linear_sum_assignment``), so the description errors of
two lesions in one lobe are never pooled: the ring-enhancing lesion is judged against the
ring-enhancing finding, the nodular one against the nodular finding. Matching stays
many-to-many where that is right: a lesion the assignment leaves without a finding is covered by
a finding already assigned elsewhere when that finding sits at its place and fits it ("bilateral
periventricular plaques" covering plaques on both sides).

- A lesion is ``detected`` when its best finding is at its place with a fitting sequence and
  signal; ``near`` when the best finding is at the wrong place (near kinds) or at its place on a
  wrong sequence / signal; ``missed`` when it has none. Enhancement and size errors of the best
  finding are the lesion's description errors.
- A finding that is no lesion's best finding is ``redundant`` when it sits at a lesion's place
  (another sequence, a restatement): it is not penalised, unless every lesion there contradicts
  it, which is a description error of the closest one. Otherwise it is ``hallucinated``: a
  finding at a place where no lesion is counts as invented even when a real lesion lies near
  it (mirrored to the other side, in the neighbouring lobe). A finding with neither location
  nor attributes ("mass effect"), or one without a location whose attributes fit a lesion, is
  ``unlocalised``: it counts against precision but is not a hallucination (on a normal control
  every positive finding is a hallucination). Findings that deny disease ("no acute lesion")
  are ignored.

Precision = findings matched or redundant / positive findings; recall = detected lesions /
lesions; ``recall_location`` also counts lesions found at their place on a wrong sequence or
signal.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

import numpy as np

from evaluation.answers import Finding
from evaluation.case import Case, Enhancement, Hemisphere, LesionTruth, TaskFamily
from evaluation.scores import FindingMatch, LesionMatchResult, LesionOutcome, ReadFinding
from evaluation.scoring import anatomy as A
from evaluation.scoring.truth import is_normal_control

NearKind = Literal["wrong_side", "adjacent_region", "wrong_sequence", "wrong_signal", "unlocalised"]
Place = Literal["same", "wrong_side", "adjacent_region", "unlocalised"]
_NEGATIVE = re.compile(
    r"^\s*(no|none|nil|normal|unremarkable|nothing|negative|without)\b"
    r"|\bno (acute |focal |significant |definite )*(abnormalit|lesion|finding|pathology)",
    re.IGNORECASE,
)
# Costs of a pair: any near place costs more than every attribute error at the same place, so
# a finding at the lesion's place is always its best one.
_NEAR_COST = {"wrong_side": 10.0, "adjacent_region": 10.0, "unlocalised": 12.0}
_LOBE_ONLY = 0.25  # the finding names the lesion's lobe, not its finer region
_SIDE_UNSTATED = 0.1  # no side, or "bilateral", for a one-sided lesion
_IMPOSSIBLE = 1e6
# a stated size is read off a few slices: a size error weighs less than a wrong signal,
# sequence or enhancement when two findings compete for one lesion
_ERROR_COST = {"enhancement": 1.0, "size": 0.5}


def read_finding(f: Finding) -> ReadFinding:
    desc = f.description or ""
    regions = A.regions_in(f.region) or A.regions_in(desc)
    side = A.side_in(f.hemisphere) or A.side_in(f.region) or A.side_in(desc)
    seq = A.sequence_class(f.sequence) or (None if f.sequence else A.sequence_class(desc))
    direction = A.signal_direction(f.signal, seq) or A.signal_direction(desc, seq)
    enh = A.enhancement_of(f.enhancement) or A.enhancement_of(desc)
    size = f.size_mm if f.size_mm is not None and 0 < f.size_mm < 1000 else A.size_mm_in(desc)
    return ReadFinding(
        side=side,
        regions=sorted(regions),
        sequence=seq,
        direction=direction,
        enhancement=str(enh) if enh is not None else None,
        size_mm=size,
    )


def _is_negative(f: Finding, r: ReadFinding) -> bool:
    if r.regions or r.side:
        return False
    text = " ".join(x for x in (f.description, f.signal or "") if x).strip()
    return not text or bool(_NEGATIVE.search(text))


def _attribute_kinds(r: ReadFinding, lesion: LesionTruth, shown: set[str]) -> list[str]:
    """wrong_sequence / wrong_signal of a finding against a lesion."""
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
    errors = []
    if r.enhancement is not None:
        stated: Enhancement | str = (
            r.enhancement if r.enhancement == "any" else Enhancement(r.enhancement)
        )
        if not A.enhancement_compatible(stated, lesion.enhancement):
            errors.append(f"enhancement stated {r.enhancement}, truth {lesion.enhancement.value}")
    if (
        r.size_mm is not None
        and lesion.size_mm
        and not A.sizes_compatible(r.size_mm, lesion.size_mm)
    ):
        errors.append(f"size stated {r.size_mm:.0f} mm, truth {lesion.size_mm:.0f} mm")
    return errors


@dataclass(frozen=True)
class _Pair:
    """One finding against one lesion: where it is, what is wrong, what it costs."""

    place: Place
    kinds: tuple[str, ...]  # wrong_sequence / wrong_signal
    errors: tuple[str, ...]  # enhancement / size description errors
    cost: float

    @property
    def fits(self) -> bool:
        return not self.kinds and not self.errors


def _pair(r: ReadFinding, lesion: LesionTruth, shown: set[str]) -> _Pair | None:
    """How ``r`` relates to ``lesion``; None when it cannot be that lesion."""
    where = {lesion.region, *([lesion.lobe] if lesion.lobe else [])}
    kinds = tuple(_attribute_kinds(r, lesion, shown))
    errors = tuple(_description_errors(r, lesion))
    fits = not kinds and not errors
    side_ok = A.sides_compatible(r.side, lesion.hemisphere.value)
    place: Place
    if not r.regions:
        if not (fits and r.has_attributes):
            return None
        place = "unlocalised"
    elif set(r.regions) & where:
        if side_ok:
            cost = 0.0 if lesion.region in r.regions else _LOBE_ONLY
            if r.side != lesion.hemisphere.value and lesion.hemisphere is not Hemisphere.MIDLINE:
                cost += _SIDE_UNSTATED
            cost += len(kinds) + sum(_ERROR_COST[e.split()[0]] for e in errors)
            cost += _size_cost(r, lesion)
            return _Pair("same", kinds, errors, cost)
        if not fits:
            return None
        place = "wrong_side"
    elif (
        side_ok and fits and any(frozenset((a, b)) in A.ADJACENT for a in r.regions for b in where)
    ):
        place = "adjacent_region"
    else:
        return None
    return _Pair(place, (), (), _NEAR_COST[place] + _size_cost(r, lesion))


def _size_cost(r: ReadFinding, lesion: LesionTruth) -> float:
    """A small cost for a size that differs (within tolerance): it tells two lesions of one
    region apart when nothing else does."""
    if r.size_mm is None or not lesion.size_mm:
        return 0.0
    return min(abs(math.log(r.size_mm / lesion.size_mm)), 1.0) * 0.2


def _assign(pairs: dict[tuple[int, int], _Pair], n_lesions: int, n_findings: int) -> dict[int, int]:
    """Lesion index -> finding index, one-to-one, of minimum total cost over possible pairs."""
    if not pairs:
        return {}
    cost = np.full((n_lesions, n_findings), _IMPOSSIBLE)
    for (li, fi), p in pairs.items():
        cost[li, fi] = p.cost
    from scipy.optimize import linear_sum_assignment  # here, not at every process's start

    rows, cols = linear_sum_assignment(cost)
    return {int(li): int(fi) for li, fi in zip(rows, cols, strict=True) if (li, fi) in pairs}


def _best_findings(
    pairs: dict[tuple[int, int], _Pair], n_lesions: int, n_findings: int
) -> dict[int, int]:
    """Each lesion's best finding (lesion index -> finding index), in three steps:

    1. findings at lesions' places, assigned one-to-one at minimum cost;
    2. a lesion left over is covered by a finding at its place that fits it, even one
       assigned to another lesion (one finding for several plaques);
    3. lesions still left take, one-to-one, a finding near them (other side, neighbouring
       region, no place) that is at no lesion's place: a finding that sits where a lesion is
       is about that lesion, never the misplaced report of another.
    """
    same = {k: p for k, p in pairs.items() if p.place == "same"}
    best = _assign(same, n_lesions, n_findings)
    for li in range(n_lesions):
        covering = [(p.cost, fi) for (lj, fi), p in same.items() if lj == li and p.fits]
        if li not in best and covering:
            best[li] = min(covering)[1]
    placed = {fi for (_, fi) in same}
    near = {
        (li, fi): p
        for (li, fi), p in pairs.items()
        if p.place != "same" and li not in best and fi not in placed
    }
    best.update(_assign(near, n_lesions, n_findings))
    return best


def match_lesions(case: Case, findings: list[Finding]) -> LesionMatchResult | None:
    """Match findings to the case's lesions; None when the case has no lesion ground truth
    (and is not a normal control)."""
    gt = case.ground_truth
    if gt is None:
        return None
    normal = is_normal_control(gt)
    if not gt.lesions and not normal:
        return None
    shown = {i.series_class for i in case.images if i.series_class}
    lesions = gt.lesions
    read = [read_finding(f) for f in findings]
    negative = [_is_negative(f, r) for f, r in zip(findings, read, strict=True)]
    pairs: dict[tuple[int, int], _Pair] = {}
    for fi, r in enumerate(read):
        if negative[fi]:
            continue
        for li, lesion in enumerate(lesions):
            p = _pair(r, lesion, shown)
            if p is not None:
                pairs[li, fi] = p
    best = _best_findings(pairs, len(lesions), len(findings))
    outcomes = [LesionOutcome(lesion_id=les.id, status="missed") for les in lesions]
    matches = [
        FindingMatch(index=fi, status="negative" if negative[fi] else "hallucinated", read=r)
        for fi, r in enumerate(read)
    ]
    for li, fi in sorted(best.items()):
        p, o, fm = pairs[li, fi], outcomes[li], matches[fi]
        o.finding, o.findings = fi, [fi]
        o.description_errors = list(p.errors)
        if p.place == "same" and not p.kinds:
            o.status = "detected"
            fm.lesions.append(o.lesion_id)
            fm.description_errors += [f"{o.lesion_id}: {e}" for e in p.errors]
        else:
            o.status = "near"
            o.near_kinds = sorted(p.kinds if p.place == "same" else (p.place,))
            fm.near[o.lesion_id] = o.near_kinds
    chosen = set(best.values())
    for fm in matches:
        if fm.status == "negative":
            continue
        if fm.lesions:
            fm.status = "matched"
        elif fm.index in chosen:
            fm.status = "near"
        else:
            _unchosen(fm, pairs, outcomes, normal)
    return _summarise(matches, outcomes, normal)


def _unchosen(
    fm: FindingMatch,
    pairs: dict[tuple[int, int], _Pair],
    outcomes: list[LesionOutcome],
    normal: bool,
) -> None:
    """Status of a finding that is no lesion's best: a restatement or an invention."""
    here = {li: p for (li, fi), p in pairs.items() if fi == fm.index and p.place == "same"}
    if here:
        fm.status = "redundant"
        fm.lesions = [outcomes[li].lesion_id for li in sorted(here)]
        for li in here:
            outcomes[li].findings.append(fm.index)
        if not any(p.fits for p in here.values()):
            li, p = min(here.items(), key=lambda kv: (kv[1].cost, kv[0]))
            o = outcomes[li]
            said = [f"restatement (finding {fm.index + 1}): " + x for x in (*p.kinds, *p.errors)]
            fm.description_errors += [f"{o.lesion_id}: {x}" for x in (*p.kinds, *p.errors)]
            o.description_errors += said
        return
    fits_somewhere = any(fi == fm.index for (_, fi) in pairs)
    if not fm.read.regions and not normal and (not fm.read.has_attributes or fits_somewhere):
        fm.status = "unlocalised"  # nothing to place it by: counts against precision only
    else:
        fm.status = "hallucinated"


def count_missed(
    res: LesionMatchResult, family: TaskFamily, called_normal: bool, images_shown: int
) -> LesionMatchResult:
    """Whether the lesions an answer did not name count against it (the one rule the scores,
    the error label and the checklist read): not when no image was shown (a text-only
    request), nor when the answer reports no finding to a task that does not ask for lesions
    (a differential that only ranks diagnoses), unless it called an abnormal study normal or
    the case is a normal control. When they do not count, recall, F1 and the missed rate are
    None."""
    why = ""
    if images_shown == 0:
        why = "no image was shown (text only): missed lesions do not count"
    elif not (res.n_positive or family is TaskFamily.LESION or called_normal or res.normal_control):
        why = "the answer reports no finding and the task does not ask for lesions"
    update: dict[str, object] = {"images_shown": images_shown, "missed_not_counted": why}
    if why:
        update |= {"recall": None, "f1": None, "missed_rate": None, "recall_location": None}
    return res.model_copy(update=update)


def _ratio(a: int, b: int) -> float | None:
    return a / b if b else None


def _summarise(
    matches: list[FindingMatch], lesions: list[LesionOutcome], normal: bool
) -> LesionMatchResult:
    positive = [m for m in matches if m.status != "negative"]
    n_matched = sum(m.status in ("matched", "redundant") for m in positive)
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
        n_redundant=sum(m.status == "redundant" for m in positive),
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
