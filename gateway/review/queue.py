"""The review queue: every case of every report folder, as the reviewer needs to pick one, and the
gateway runs that were not evaluated (failed, held, interrupted, received but selected by no
routing rule: with the reason and, for a held study, every patient identity involved), newest
first, filtered by status and model.

A row carries the hospital's identifiers of the study (patient, accession number, study date):
the queue is for reviewers only and these never go to a model.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum

from evaluation import Case, ParseStatus, format_reason
from evaluation.log import RunData
from evaluation.review import Superseded, missing_items
from gateway.review.actions import CaseUnderReview, open_cases
from gateway.review.auth import Reviewer
from gateway.review.service import ReportNotFoundError, ReviewService
from gateway.runs import RunNotFoundError, RunRecord, RunStatus, SkipKind, StudyRunStore

MAX_FAILED = 50  # failed gateway runs listed (the newest)
MAX_ERROR = 300  # characters of a failed run's error shown
MAX_UNUSABLE = 6  # models listed whose answers to a case were unusable
HASH_SHOWN = 8  # hex digits of a dataset's hash in a row (the full hash on hover)


class CaseStatus(StrEnum):
    TO_REVIEW = "to review"
    IN_PROGRESS = "in progress"
    SIGNED_OFF = "signed off"
    DISPUTED = "disputed"
    VERIFIED = "verified"  # signed off and re-issued to PACS as VERIFIED
    FAILED = "failed"  # the gateway could not evaluate the study
    HELD = "held"  # not evaluated on purpose: more than one patient, or not the case's patient
    INTERRUPTED = "interrupted"  # the gateway stopped during the run
    NOT_ROUTED = "not routed"  # received, but no routing rule selects it: never evaluated


@dataclass
class QueueRow:
    """One line of the queue: a case of a report, or a failed gateway run."""

    status: CaseStatus
    created_at: str  # ISO; the run's
    report: str = ""  # report folder name ("" for a failed gateway run)
    run_id: str = ""
    case_id: str = ""
    slug: str = ""
    patient: str = ""
    patient_id: str = ""
    accession: str = ""
    study_date: str = ""
    modalities: list[str] = field(default_factory=list)
    n_series: int | None = None
    models: list[str] = field(default_factory=list)
    reviewed: int = 0  # items with the reviewer's verdict
    total: int = 0  # items of the case's review blocks
    mine: str = "to do"  # to do | in progress | signed off (the signed-in reviewer)
    others: list[str] = field(default_factory=list)
    error: str = ""  # of a failed, held or interrupted gateway run
    identities: list[str] = field(default_factory=list)  # of a held run
    study_uid: str = ""
    superseded: Superseded | None = None  # a newer report version of the same study
    dataset: str = ""  # the dataset the run read ("" when the report does not say)
    dataset_hash: str = ""  # its content hash: runs of one dataset that changed differ here
    # per model whose answers to the case were unusable: how many, and why (the format's reason)
    unusable: list[str] = field(default_factory=list)
    # the run's SR/PDF the PACS has not stored yet (kept, tried again): what and why
    writeback: str = ""

    @property
    def dataset_short(self) -> str:
        return self.dataset_hash[:HASH_SHOWN]


def _status(cu: CaseUnderReview) -> CaseStatus:
    v = cu.verification
    if v.open_disputes:
        return CaseStatus.DISPUTED
    if v.complete:
        return CaseStatus.VERIFIED if any(r.reissued for r in cu.reviews) else CaseStatus.SIGNED_OFF
    if any(r.n_events for r in cu.reviews):
        return CaseStatus.IN_PROGRESS
    return CaseStatus.TO_REVIEW


def unusable_answers(run: RunData, case_id: str) -> list[str]:
    """Per model, the answers to ``case_id`` that give nothing to review and why: format
    failures with their commonest reason (``evaluation.format_reason``), refusals, failed calls."""
    by_model: dict[str, list[tuple[ParseStatus, str]]] = {}
    for s in run.samples_of(case_id):
        by_model.setdefault(s.scored.model, []).append((s.scored.status, s.parse_error or ""))
    out = []
    for model in sorted(by_model):
        answers = by_model[model]
        n = len(answers)
        parts = []
        failed = [
            format_reason(why) for status, why in answers if status is ParseStatus.FORMAT_FAILURE
        ]
        if failed:
            reason, _ = Counter(failed).most_common(1)[0]
            parts.append(
                f"{len(failed)} of {n} failed the answer format: {reason or 'no valid JSON answer'}"
            )
        refused = sum(status is ParseStatus.REFUSAL for status, _ in answers)
        if refused:
            parts.append(f"{refused} of {n} refused")
        errors = sum(status is ParseStatus.ERROR for status, _ in answers)
        if errors:
            parts.append(f"{errors} of {n} calls failed")
        if parts:
            out.append(f"{model}: " + "; ".join(parts))
    if len(out) > MAX_UNUSABLE:
        out = [*out[:MAX_UNUSABLE], f"and {len(out) - MAX_UNUSABLE} more models"]
    return out


def _case_row(cu: CaseUnderReview, case: Case, who: Reviewer) -> QueueRow:
    ident = case.provenance.identity
    mine = cu.mine(who)
    total = sum(len(b.items) for b in cu.blocks)
    state = "to do"
    if mine is not None:
        state = "signed off" if mine.signed_off_at else "in progress"
    return QueueRow(
        status=_status(cu),
        created_at=cu.run.created_at or "",
        report=cu.report,
        run_id=cu.run.run_id,
        case_id=cu.case_id,
        slug=cu.slug,
        patient=ident.patient_name if ident else "",
        patient_id=(ident.patient_id if ident else "") or (case.patient_id or ""),
        accession=ident.accession_number if ident else "",
        study_date=ident.study_date if ident else "",
        modalities=(ident.modalities if ident else [])
        or sorted({i.modality for i in case.images if i.modality}),
        n_series=ident.n_series if ident else None,
        models=[b.model for b in cu.blocks] or cu.run.models,
        reviewed=total - len(missing_items(cu.blocks, mine)),
        total=total,
        mine=state,
        others=[
            f"{r.reviewer} ({'signed off' if r.signed_off_at else 'in progress'})"
            for r in cu.reviews
            if r.reviewer != who.name
        ],
        study_uid=(case.provenance.study_uids or [""])[0],
        superseded=cu.superseded,
        dataset=cu.run.dataset_name or (case.provenance.dataset or ""),
        dataset_hash=cu.run.dataset_hash,
        unusable=unusable_answers(cu.run, cu.case_id),
    )


def case_rows(svc: ReviewService, who: Reviewer, report: str | None = None) -> list[QueueRow]:
    """The cases of one report (``report``) or of every report; unreadable ones are skipped."""
    names = [report] if report else [name for name, _ in svc.reports()]
    records = svc.versions.records() if svc.versions is not None else None  # read once for all
    rows = []
    for name in names:
        try:
            opened = zip(open_cases(svc, name, records), svc.run(name).cases, strict=True)
        except ReportNotFoundError:
            continue
        found = [_case_row(cu, case, who) for cu, case in opened]
        note = _writeback_note(svc, name)
        for r in found:
            r.writeback = note
        rows += found
    return rows


def _writeback_note(svc: ReviewService, report: str) -> str:
    """What of a gateway run's write-back is still pending, and why ("" when nothing is)."""
    runs = svc.runs
    if runs is None or not svc.is_gateway_run(report):
        return ""
    try:
        pending = runs.get(report).writebacks_pending
    except RunNotFoundError:
        return ""
    if not pending:
        return ""
    last = pending[-1]
    where = last.destination or "local"
    return (
        f"not yet in PACS {where}: {len(pending)} object(s) pending after {last.attempts} "
        f"attempt(s) ({(last.last_error or 'no reason recorded')[:MAX_ERROR]}); tried again "
        f"from {last.next_at or 'the next pass'}"
    )


_NOT_EVALUATED = {
    RunStatus.FAILED: CaseStatus.FAILED,
    RunStatus.HELD: CaseStatus.HELD,
    RunStatus.INTERRUPTED: CaseStatus.INTERRUPTED,
}


def _not_evaluated(rec: RunRecord) -> CaseStatus | None:
    """The queue status of a gateway run that was not evaluated; None for the others (and for
    a run skipped as it should be: the study unchanged since its evaluation, or evaluated
    before a restart)."""
    if rec.status is RunStatus.SKIPPED:
        return CaseStatus.NOT_ROUTED if rec.skip is SkipKind.NOT_ROUTED else None
    return _NOT_EVALUATED.get(rec.status)


def failed_rows(runs: StudyRunStore, limit: int = MAX_FAILED) -> list[QueueRow]:
    """The newest gateway runs that were not evaluated (failed, held, interrupted, received
    but selected by no routing rule), with their reason (and a held run's identities)."""
    out = []
    for rec in runs.list(limit=1000):
        status = _not_evaluated(rec)
        if status is None:
            continue
        out.append(
            QueueRow(
                status=status,
                created_at=rec.finished_at or rec.created_at,
                run_id=rec.run_id,
                models=list(rec.route.models) if rec.route else [],
                error=(rec.error or f"{status.value} without a recorded reason")[:MAX_ERROR],
                identities=list(rec.identities),
                study_uid=rec.study_uid or "",
            )
        )
        if len(out) >= limit:
            break
    return out


def queue(
    svc: ReviewService,
    runs: StudyRunStore | None,
    who: Reviewer,
    *,
    report: str | None = None,
    status: str = "",
    model: str = "",
) -> tuple[list[QueueRow], list[str]]:
    """The rows to show (newest first, filtered) and every model seen (for the filter)."""
    rows = case_rows(svc, who, report)
    if runs is not None and report is None:
        rows += failed_rows(runs)
    models = sorted({m for r in rows for m in r.models})
    if status:
        rows = [r for r in rows if r.status.value == status]
    if model:
        rows = [r for r in rows if model in r.models]
    # newest first; within a run, cases to do first, then by case id
    rows.sort(key=lambda r: r.case_id)
    rows.sort(key=lambda r: (r.mine == "signed off", r.status is CaseStatus.VERIFIED))
    rows.sort(key=lambda r: r.created_at, reverse=True)
    return rows, models
