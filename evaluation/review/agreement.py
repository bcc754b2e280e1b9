"""What signed-off reviews feed back: clinician overrides, reviewer agreement, and agreement of
the automatic scoring with the clinicians."""

from __future__ import annotations

from collections import defaultdict
from itertools import combinations

from pydantic import BaseModel, Field

from evaluation.log.rundata import RunData, SampleResult
from evaluation.review.review_log import CaseReview, Verdict, signed_off
from evaluation.review.sr_content import answer_key, reviewed_samples
from evaluation.scores import ErrorLabel, Score
from evaluation.scoring import grader_calibration
from evaluation.scoring.scored import ScoredSample
from evaluation.scoring.stats import Estimate, cohen_kappa, wilson

NO_ERROR = "none"
RUBRIC_SOURCE = "rubric grader"
CREDIT_SOURCE = "diagnosis credit (not a grader: no rated answer has a rubric score)"


class PairAgreement(BaseModel):
    reviewer_a: str
    reviewer_b: str
    n_cases: int
    n_items: int
    kappa_items: float | None  # accept / reject / correct on the items both judged
    n_errors: int
    kappa_errors: float | None  # error category both gave


class Agreement(BaseModel):
    n: int
    kappa: float | None
    percent: float | None


class ReviewStats(BaseModel):
    n_cases: int
    n_signed_off: int  # cases with at least one sign-off
    n_in_progress: int  # cases with review actions but no sign-off
    reviewers: list[str] = Field(default_factory=list)
    n_overrides: int = 0
    reviewer_agreement: list[PairAgreement] = Field(default_factory=list)
    diagnosis_vs_clinician: Agreement | None = (
        None  # diagnosis_match vs the final-diagnosis verdict
    )
    error_vs_clinician: Agreement | None = None  # automatic vs clinician error category
    # Pearson r of an automatic score with the clinicians' 0-5 ratings. grader_source says which
    # score: "rubric" (the rubric grader), or "diagnosis_credit" when no rated answer has a rubric
    # score (a fallback that says nothing about a grader); grader_label says it in words.
    grader_vs_clinician: Score | None = None
    grader_source: str = ""
    grader_label: str = ""
    clinician_accuracy: dict[str, Estimate] = Field(default_factory=dict)  # model -> accepted


def _reviewed(run: RunData) -> dict[tuple[str, str], SampleResult]:
    """(case id, answer key) -> the sample the checklist shows for review."""
    out = {}
    for case in run.cases:
        for s, _ in reviewed_samples(run.samples_of(case.case_id)):
            out[(case.case_id, answer_key(s))] = s
    return out


def apply_overrides(run: RunData, reviews: list[CaseReview]) -> list[ScoredSample]:
    """The run's scored samples with the signed-off clinicians' error labels as overrides (the
    latest wins, as ``effective_error`` decides)."""
    reviewed = _reviewed(run)
    labels: dict[tuple[str, str], list[ErrorLabel]] = defaultdict(list)
    for r in signed_off(reviews):
        for key, label in r.errors.items():
            labels[(r.case_id, key)].append(label)
    key_of = {id(v): k for k, v in reviewed.items()}
    out = []
    for s in run.samples:
        sc = s.scored
        hit = key_of.get(id(s))
        if hit is not None and hit in labels:
            latest = max(labels[hit], key=lambda lab: lab.assigned_at or "")
            sc = sc.model_copy(update={"override": latest})
        out.append(sc)
    return out


def _clinician_category(r: CaseReview, key: str, auto: str) -> str | None:
    if key in r.errors:
        return r.errors[key].category.value
    st = r.verdict(key, "error")
    return auto if st is not None and st.verdict is Verdict.ACCEPT else None


def _agreement(a: list[str], b: list[str]) -> Agreement | None:
    if not a:
        return None
    same = sum(x == y for x, y in zip(a, b, strict=True))
    return Agreement(n=len(a), kappa=cohen_kappa(a, b), percent=same / len(a))


def review_stats(run: RunData, reviews: list[CaseReview]) -> ReviewStats:
    """Counts, reviewer-pair kappas, and automatic-vs-clinician agreement (signed-off only)."""
    done = signed_off(reviews)
    reviewed = _reviewed(run)
    cases_done = {r.case_id for r in done}
    stats = ReviewStats(
        n_cases=len(run.cases),
        n_signed_off=len(cases_done),
        n_in_progress=len({r.case_id for r in reviews} - cases_done),
        reviewers=sorted({r.reviewer for r in done}),
        n_overrides=sum(len(r.errors) for r in done),
    )
    per: dict[str, dict[str, CaseReview]] = defaultdict(dict)  # reviewer -> case -> review
    for r in done:
        per[r.reviewer][r.case_id] = r
    for ra, rb in combinations(sorted(per), 2):
        common = sorted(set(per[ra]) & set(per[rb]))
        ia, ib, ea, eb = [], [], [], []
        for cid in common:
            a, b = per[ra][cid], per[rb][cid]
            for key, items in a.items.items():
                for item, st in items.items():
                    other = b.verdict(key, item)
                    if other is not None:
                        ia.append(st.verdict.value)
                        ib.append(other.verdict.value)
            for (c, key), s in reviewed.items():
                if c != cid:
                    continue
                auto = s.scored.effective_error
                auto_cat = auto.category.value if auto else NO_ERROR
                x, y = _clinician_category(a, key, auto_cat), _clinician_category(b, key, auto_cat)
                if x is not None and y is not None:
                    ea.append(x)
                    eb.append(y)
        stats.reviewer_agreement.append(
            PairAgreement(
                reviewer_a=ra,
                reviewer_b=rb,
                n_cases=len(common),
                n_items=len(ia),
                kappa_items=cohen_kappa(ia, ib) if ia else None,
                n_errors=len(ea),
                kappa_errors=cohen_kappa(ea, eb) if ea else None,
            )
        )
    dx_auto, dx_clin, err_auto, err_clin = [], [], [], []
    pairs: list[tuple[float, float]] = []
    rubric_pairs: list[tuple[float, float]] = []
    accepted: dict[str, list[bool]] = defaultdict(list)
    for r in done:
        for (cid, key), s in reviewed.items():
            if cid != r.case_id:
                continue
            sc = s.scored
            final = r.verdict(key, "final")
            if final is not None:
                ok = final.verdict is Verdict.ACCEPT
                accepted[sc.model].append(ok)
                if sc.correct is not None:
                    dx_auto.append("right" if sc.correct >= 1 else "wrong")
                    dx_clin.append("right" if ok else "wrong")
            auto = sc.effective_error
            auto_cat = auto.category.value if auto else NO_ERROR
            clin = _clinician_category(r, key, auto_cat)
            if clin is not None:
                err_auto.append(auto_cat)
                err_clin.append(clin)
            if key in r.ratings:
                if (rv := sc.value("rubric")) is not None:
                    rubric_pairs.append((rv, r.ratings[key]))
                if (cv := sc.value("diagnosis_credit")) is not None:
                    pairs.append((cv, r.ratings[key]))
    stats.diagnosis_vs_clinician = _agreement(dx_auto, dx_clin)
    stats.error_vs_clinician = _agreement(err_auto, err_clin)
    if rubric_pairs:
        stats.grader_source, what = "rubric", RUBRIC_SOURCE
        stats.grader_vs_clinician = grader_calibration(rubric_pairs, what)
    elif pairs:
        stats.grader_source, what = "diagnosis_credit", CREDIT_SOURCE
        stats.grader_vs_clinician = grader_calibration(pairs, what, bar=None)
    if stats.grader_source:
        stats.grader_label = f"{what} vs clinician ratings"
    stats.clinician_accuracy = {m: wilson(sum(v), len(v)) for m, v in sorted(accepted.items()) if v}
    return stats
