"""The run summary: the scoring package's ``RunSummary`` over the full-input samples (with the
signed-off clinicians' error labels), ablations, reviews, the case list, published context."""

from __future__ import annotations

import hashlib
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field

from evaluation.coverage import CaseCoverage
from evaluation.log.catalog import CatalogEntry
from evaluation.log.passport import ModelPassport
from evaluation.log.rundata import FULL_INPUT, RunData
from evaluation.reports.checklist import answer_label, run_checklists
from evaluation.reports.checklist_view import AnswerChecklist, CaseChecklist
from evaluation.reports.over_time import RunHistory, run_history, this_run_entry
from evaluation.reports.published import PublishedBenchmark, neural_medbench
from evaluation.review.agreement import ReviewStats, apply_overrides, review_stats
from evaluation.review.review_log import CaseReview
from evaluation.robustness import RobustnessMeasures, as_received, robustness_measures
from evaluation.scores import ParseStatus
from evaluation.scoring import RunSummary, SubgroupTable, subgroup_table, summarise
from evaluation.scoring.stats import DEFAULT_BOOT, Estimate, bootstrap_mean

SUMMARY_VERSION = 1
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def case_slug(case_id: str) -> str:
    """A file and URL name for a case id (ids come from datasets: never trusted as paths)."""
    safe = _UNSAFE.sub("_", case_id).strip("._")[:60]
    if safe != case_id or not safe:
        safe = f"{safe or 'case'}-{hashlib.sha256(case_id.encode()).hexdigest()[:8]}"
    return safe


class AblationRow(BaseModel):
    model: str
    ablation: str  # both | images | text
    n_samples: int
    accuracy: Estimate


class CaseOutcome(StrEnum):
    """What became of a model's answer to a case, as the case matrix colours it."""

    RIGHT = "right"
    WRONG = "wrong"
    FORMAT_FAILURE = "format_failure"  # no answer in the schema's form
    REFUSED = "refused"
    ERROR = "error"  # the call failed (a resume retries it)
    NOT_GRADED = "not_graded"  # an answer with no truth to grade it against
    NOT_RUN = "not_run"  # the model has no answer to the case
    MIXED = "mixed"  # a cell of several answers with different outcomes


# A symbol and a word beside every colour (colour is never the only cue), and what it means.
OUTCOME_LEGEND: dict[CaseOutcome, tuple[str, str, str]] = {
    CaseOutcome.RIGHT: ("✓", "right", "the final diagnosis matches the truth"),
    CaseOutcome.WRONG: ("✗", "wrong", "the final diagnosis does not match the truth"),
    CaseOutcome.FORMAT_FAILURE: ("⚠", "format failure", "no answer in the required form"),
    CaseOutcome.REFUSED: ("⊘", "refused", "the model declined to answer"),
    CaseOutcome.ERROR: ("!", "call failed", "the call failed; a resume retries it"),
    CaseOutcome.NOT_GRADED: ("?", "not graded", "an answer with no truth to grade it against"),
    CaseOutcome.NOT_RUN: ("–", "not run", "the model was not asked this case"),
    CaseOutcome.MIXED: ("±", "mixed", "several answers with different outcomes (counts shown)"),
}
_STATUS_OUTCOME = {
    ParseStatus.FORMAT_FAILURE: CaseOutcome.FORMAT_FAILURE,
    ParseStatus.REFUSAL: CaseOutcome.REFUSED,
    ParseStatus.ERROR: CaseOutcome.ERROR,
}


def answer_outcome(status: ParseStatus, correct: bool | None) -> CaseOutcome:
    """The outcome of one answer: its parse status first, then its diagnosis verdict."""
    if status in _STATUS_OUTCOME:
        return _STATUS_OUTCOME[status]
    if correct is None:
        return CaseOutcome.NOT_GRADED
    return CaseOutcome.RIGHT if correct else CaseOutcome.WRONG


class AnswerRow(BaseModel):
    key: str
    model: str
    family: str
    label: str
    correct: bool | None
    error: str | None
    ablation: str = FULL_INPUT
    outcome: CaseOutcome = CaseOutcome.NOT_GRADED  # of the reviewed answer (the first sample)
    n_samples: int = 1  # the samples of its model, family and ablation (pass@k draws)
    n_samples_right: int | None = None


class MatrixCell(BaseModel):
    """One model's answers to one case in the case matrix (full input only: ablations apart)."""

    outcome: CaseOutcome
    counts: dict[CaseOutcome, int] = Field(default_factory=dict)  # outcome -> answers
    errors: list[str] = Field(default_factory=list)  # error categories of the wrong answers
    n_samples: int = 0  # every sample behind the cell's answers (more than answers: pass@k draws)
    n_samples_right: int = 0

    @property
    def n(self) -> int:
        return sum(self.counts.values())

    def parts(self) -> list[tuple[CaseOutcome, int]]:
        """Each outcome with its answers, in the legend's order."""
        return [(o, self.counts[o]) for o in OUTCOME_LEGEND if self.counts.get(o)]


class CaseRow(BaseModel):
    case_id: str
    slug: str
    truth: str | None = None
    difficulty: str | None = None
    group: str | None = None
    flags: list[str] = Field(default_factory=list)
    answers: list[AnswerRow] = Field(default_factory=list)
    signed_off_by: list[str] = Field(default_factory=list)
    in_review_by: list[str] = Field(default_factory=list)

    def cell(self, model: str) -> MatrixCell:
        """The matrix cell of ``model``: one outcome when its full-input answers agree, else
        mixed with the counts; not run when it has none."""
        mine = [a for a in self.answers if a.model == model and a.ablation == FULL_INPUT]
        if not mine:
            return MatrixCell(outcome=CaseOutcome.NOT_RUN, counts={CaseOutcome.NOT_RUN: 1})
        counts = Counter(a.outcome for a in mine)
        outcome = next(iter(counts)) if len(counts) == 1 else CaseOutcome.MIXED
        errors = sorted({a.error for a in mine if a.error})
        return MatrixCell(
            outcome=outcome,
            counts=dict(counts),
            errors=errors,
            n_samples=sum(a.n_samples for a in mine),
            n_samples_right=sum(a.n_samples_right or 0 for a in mine),
        )


class SummaryReport(BaseModel):
    kind: Literal["neurosandbox.run_summary"] = "neurosandbox.run_summary"
    version: int = SUMMARY_VERSION
    run_id: str
    title: str = ""
    created_at: str | None = None
    generated_at: str
    config: dict[str, Any] = Field(default_factory=dict)
    code_version: str | None = None
    n_cases: int
    n_samples: int
    models: list[str]
    families: list[str]
    ablations: list[str]
    summary: RunSummary
    ablation_rows: list[AblationRow] = Field(default_factory=list)
    reviews: ReviewStats
    published: PublishedBenchmark
    cases: list[CaseRow] = Field(default_factory=list)
    # the cases evaluated out of the dataset's, and the skipped ones with why (None: not known)
    coverage: CaseCoverage | None = None
    # each model's passport: what answered, reached how, with which settings
    passports: dict[str, ModelPassport] = Field(default_factory=dict)
    # each figure by vendor, scanner model, field strength, age band and sex (None: a summary
    # written before subgroups were)
    subgroups: SubgroupTable | None = None
    # the earlier runs of this run's dataset in the runs catalog, this run last (over_time.py;
    # None: no catalog was handed in)
    history: RunHistory | None = None
    # "Does the model read the image?": the grounding audit's measures over the run's variants
    # (None: the run asked on none; its variants are never cases of the figures above)
    robustness: RobustnessMeasures | None = None


def _ablations(run: RunData, n_boot: int) -> list[AblationRow]:
    groups: dict[tuple[str, str], list[tuple[float, str]]] = defaultdict(list)
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for s in run.samples:
        key = (s.scored.model, s.ablation)
        counts[key] += 1
        if (c := s.scored.correct) is not None:
            groups[key].append((c, s.scored.patient_id))
    ablated = {m for m, a in counts if a != FULL_INPUT}
    rows = []
    for key in sorted(k for k in counts if k[0] in ablated):
        vals = groups.get(key, [])
        rows.append(
            AblationRow(
                model=key[0],
                ablation=key[1],
                n_samples=counts[key],
                accuracy=bootstrap_mean([v for v, _ in vals], [c for _, c in vals], n_boot=n_boot),
            )
        )
    return rows


def _case_rows(checklists: list[CaseChecklist], reviews: list[CaseReview]) -> list[CaseRow]:
    rows = []
    for cl in checklists:
        mine = [r for r in reviews if r.case_id == cl.case_id]
        clinician = {
            key: max(labels, key=lambda lab: lab.assigned_at or "").category.value
            for key in {k for r in mine if r.signed_off_at for k in r.errors}
            if (labels := [r.errors[key] for r in mine if r.signed_off_at and key in r.errors])
        }
        rows.append(
            CaseRow(
                case_id=cl.case_id,
                slug=case_slug(cl.case_id),
                truth=cl.truth.diagnosis if cl.truth else None,
                difficulty=cl.truth.difficulty if cl.truth else None,
                group=cl.truth.group if cl.truth else None,
                flags=[f.kind.value for f in cl.flags],
                answers=[_answer_row(a, clinician) for a in cl.answers],
                signed_off_by=sorted(r.reviewer for r in mine if r.signed_off_at),
                in_review_by=sorted(r.reviewer for r in mine if not r.signed_off_at),
            )
        )
    return rows


def _answer_row(a: AnswerChecklist, clinician: dict[str, str]) -> AnswerRow:
    correct = (
        None
        if a.final_diagnosis is None or a.final_diagnosis.mark.value == "not_checked"
        else a.final_diagnosis.mark.value == "correct"
    )
    return AnswerRow(
        key=a.key,
        model=a.model,
        family=a.family,
        label=answer_label(a),
        correct=correct,
        error=clinician.get(a.key, a.error.category.value if a.error else None),
        ablation=a.ablation,
        outcome=answer_outcome(a.status, correct),
        n_samples=a.samples.n if a.samples else 1,
        n_samples_right=a.samples.n_correct if a.samples else None,
    )


def build_summary(
    run: RunData,
    reviews: list[CaseReview] | None = None,
    checklists: list[CaseChecklist] | None = None,
    *,
    n_boot: int = DEFAULT_BOOT,
    now: datetime | None = None,
    catalog: Sequence[CatalogEntry] | None = None,
) -> SummaryReport:
    """The run summary; signed-off reviews replace error labels and add agreement figures.
    ``catalog``: the install's runs (``evaluation.log.list_runs``), for each model's figures
    over the earlier runs of this dataset (None: that section says no catalog was read).

    The grounding audit's variants (``<case>~<kind>``) are not cases: every figure, the case
    matrix and the subgroups are over the cases as received; the variants' samples are read
    by the audit's measures (``SummaryReport.robustness``)."""
    reviews = reviews or []
    audit = _audit(run, n_boot)
    run = as_received(run)
    if checklists is not None:
        received = {c.case_id for c in run.cases}
        checklists = [c for c in checklists if c.case_id in received]
    if checklists is None:
        checklists = run_checklists(run, audit.pairs if audit is not None else ())
    scored = apply_overrides(run, reviews)
    full = [sc for s, sc in zip(run.samples, scored, strict=True) if s.ablation == FULL_INPUT]
    figures = summarise(full, n_boot=n_boot)
    for p in audit.pairs if audit is not None else []:
        subs = figures.errors.setdefault(p.model, {}).setdefault("sub_labels", {})
        for sub in p.sub_labels:  # the audit's sub-labels of the variants' answers
            subs[sub] = subs.get(sub, 0) + 1
    history = None
    if catalog is not None:
        this = this_run_entry(
            run.run_id, run.created_at, run.dataset_name, run.dataset_hash, figures.leaderboard
        )
        history = run_history(this, catalog)
    return SummaryReport(
        run_id=run.run_id,
        title=run.title,
        created_at=run.created_at,
        generated_at=(now or datetime.now(UTC)).isoformat(timespec="seconds"),
        config=run.config,
        code_version=run.code_version,
        n_cases=len(run.cases),
        n_samples=len(run.samples),
        models=run.models,
        families=sorted({s.scored.family.value for s in run.samples}),
        ablations=run.ablations,
        summary=figures,
        ablation_rows=_ablations(run, n_boot) if len(run.ablations) > 1 else [],
        reviews=review_stats(run, reviews),
        published=neural_medbench(),
        cases=_case_rows(checklists, reviews),
        coverage=run.coverage,
        passports=run.passports,
        subgroups=subgroup_table(run.cases, full, n_boot=n_boot),
        history=history,
        robustness=audit,
    )


def _audit(run: RunData, n_boot: int) -> RobustnessMeasures | None:
    """The audit's measures over the run's full-input samples (None: no variant was asked)."""
    full = [s for s in run.samples if s.ablation == FULL_INPUT]
    measures = robustness_measures(full, {v.case_id: v for v in run.variants}, n_boot=n_boot)
    return None if measures.empty and not measures.unpaired else measures
