"""The pilot report for a hospital's AI governance board: one document (HTML and PDF) over one
or more runs of a pilot: the intended use, the dataset, each model's passport, the results with
their intervals and by subgroup, the failure modes, reviewer agreement, cost, the versions that
produced the figures, and the limits of the evidence.

Built from the run log only: every figure is the run summary's own record (``build_summary``:
the leaderboard, the error taxonomy counts, the review statistics, the cost), never computed a
second time here; subgroups are the summary's subgroup table. What this module adds
is the statement of what the evidence does not show (``evidence_limits``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from evaluation.case import TaskFamily
from evaluation.log.catalog import CatalogEntry
from evaluation.log.passport import ModelPassport, PassportChange, passport_changes
from evaluation.log.rundata import RunData
from evaluation.reports.intended_use import LABELS, IntendedUse
from evaluation.reports.summary import SummaryReport, build_summary
from evaluation.review.review_log import CaseReview
from evaluation.scoring.stats import DEFAULT_BOOT, MIN_PATIENTS, Estimate
from evaluation.scoring.subgroups import ATTRIBUTE_TITLES, NOT_RECORDED, SubgroupTable

PILOT_VERSION = 1
MAX_RUNS = 8
WIDE_CI = 0.2  # an interval wider than this is named among the limits
GROUNDING_AUDIT = "not run"  # the grounding audit is a later issue's; until then it says so
# The modalities a neuro pilot is expected to cover; one missing is a limit of the evidence.
MODALITIES = {"MR": "MRI", "CT": "CT"}


class PilotError(ValueError):
    """The runs cannot make one pilot report (none given, too many)."""


class PassportChanges(BaseModel):
    """What differs in a model's passport from an earlier run of the report to this one."""

    model: str
    since_run: str
    changes: list[PassportChange] = Field(default_factory=list)


class DatasetFacts(BaseModel):
    name: str
    hash: str
    n_cases: int
    n_patients: int
    coverage: str  # "60 of 60 cases evaluated"
    sources: dict[str, int] = Field(default_factory=dict)  # provenance source -> cases
    modalities: dict[str, int] = Field(default_factory=dict)  # MR/CT -> cases showing one
    # subgroup attribute (vendor, scanner_model, field_strength, age_band, sex) -> subgroup ->
    # cases, from the summary's subgroup table (None: a summary without one)
    cohort: dict[str, dict[str, int]] | None = None
    groups: dict[str, int] = Field(default_factory=dict)  # disease group -> cases
    difficulties: dict[str, int] = Field(default_factory=dict)


class PilotRun(BaseModel):
    run_id: str
    created_at: str | None = None
    status: str = ""
    code_version: str | None = None
    dataset: DatasetFacts
    summary: SummaryReport  # the run summary's records: every figure of the report is one
    # each model's passport (its models, then its graders), as the run log has it
    passports: list[ModelPassport] = Field(default_factory=list)
    unrecorded: list[str] = Field(default_factory=list)  # models with no passport (no run store)
    # per model, what changed since the nearest earlier run of the report that has it
    passport_changes: list[PassportChanges] = Field(default_factory=list)
    cost_total_usd: float | None = None  # None: some model's price is unknown
    limits: list[str] = Field(default_factory=list)
    # the run as the runs catalog lists it (its figures over time beside the pilot's other runs)
    catalog: CatalogEntry | None = None

    def subgroup_attributes(self, recorded: bool = True) -> list[str]:
        """The subgroup attributes the run's cases record, or (``recorded=False``) none of."""
        return subgroup_attributes(self.summary.subgroups, recorded)


class PilotReport(BaseModel):
    kind: Literal["neurosandbox.pilot_report"] = "neurosandbox.pilot_report"
    version: int = PILOT_VERSION
    generated_at: str
    intended_use: IntendedUse
    runs: list[PilotRun]
    grounding_audit: str = GROUNDING_AUDIT

    @property
    def labels(self) -> dict[str, str]:
        return LABELS


def run_passports(rundir: Path, database_url: str | None = None) -> dict[str, ModelPassport]:
    """The passports of a run's models and graders, by name (``RunStore.passports``; {} for a
    folder without a run store: a report bundle's ``rundata.json``)."""
    from evaluation.log.store import open_store, store_exists

    if not store_exists(Path(rundir), database_url):
        return {}
    store = open_store(Path(rundir), database_url=database_url, read_only=True)
    try:
        return store.passports()
    finally:
        store.close()


def run_catalog_entry(rundir: Path, database_url: str | None = None) -> CatalogEntry | None:
    """The run's entry in the runs catalog (``evaluation.log.catalog``), None for a folder
    without a run store; an unreadable run is an entry whose ``error`` says why."""
    from evaluation.log.catalog import read_entry
    from evaluation.log.store import store_exists

    if not store_exists(Path(rundir), database_url):
        return None
    return read_entry(Path(rundir), database_url=database_url)


def subgroup_attributes(table: SubgroupTable | None, recorded: bool = True) -> list[str]:
    """The attributes of ``table`` with a value other than "not recorded" for some case, or,
    ``recorded=False``, those recorded for no case (a board gets no table of the latter)."""
    if table is None:
        return []
    have = {r.attribute for r in table.rows if r.value != NOT_RECORDED}
    return [a for a in table.attributes() if (a in have) == recorded]


def _cohort(table: SubgroupTable | None) -> dict[str, dict[str, int]] | None:
    """The cases in each subgroup of each attribute (the most any model's figure counts)."""
    if table is None:
        return None
    out: dict[str, dict[str, int]] = {}
    for row in table.rows:
        values = out.setdefault(row.attribute, {})
        values[row.value] = max(values.get(row.value, 0), row.n_cases)
    return out


def _dataset(run: RunData, summary: SummaryReport) -> DatasetFacts:
    modalities: Counter[str] = Counter()
    for case in run.cases:
        seen = {(i.modality or "").upper() for i in case.images} - {""}
        if not seen and case.ground_truth and case.ground_truth.modality:
            seen = {"MR" if case.ground_truth.modality == "MRI" else case.ground_truth.modality}
        modalities.update(seen or {"not recorded"})
    truth = [c.ground_truth for c in run.cases if c.ground_truth]
    return DatasetFacts(
        name=run.dataset_name or run.title,
        hash=run.dataset_hash,
        n_cases=len(run.cases),
        n_patients=len({c.patient_id or c.case_id for c in run.cases}),
        coverage=summary.coverage.headline() if summary.coverage else f"{len(run.cases)} cases",
        sources=dict(Counter(c.provenance.source for c in run.cases).most_common()),
        modalities=dict(modalities.most_common()),
        cohort=_cohort(summary.subgroups),
        groups=dict(
            Counter(str(t.final_diagnosis.group or "not given") for t in truth).most_common()
        ),
        difficulties=dict(sorted(Counter(t.difficulty.value for t in truth).items())),
    )


def _cost_total(summary: SummaryReport) -> float | None:
    costs = [row.cost.cost_total_usd for row in summary.summary.leaderboard]
    return None if any(c is None for c in costs) else sum(c for c in costs if c is not None)


def _estimates(summary: SummaryReport) -> list[tuple[str, str, Estimate]]:
    out = []
    for row in summary.summary.leaderboard:
        named = {"accuracy": row.accuracy, "strict accuracy": row.strict_accuracy}
        named |= {f"ranked pass@{k}": e for k, e in row.ranked_pass_at.items()}
        out += [(row.model, name, e) for name, e in named.items() if e.value is not None]
    return out


def evidence_limits(run: RunData, summary: SummaryReport, status: str) -> list[str]:
    """What the run's evidence does not show, in sentences a board reads: the numbers behind
    the figures, wide or thin intervals, what was not tested, what no clinician confirmed."""
    limits: list[str] = []
    n_patients = len({c.patient_id or c.case_id for c in run.cases})
    limits.append(
        f"{len(run.cases)} cases from {n_patients} patients: every figure is an estimate on "
        "these cases only, with a 95% bootstrap interval over patients."
    )
    if status and status != "complete":
        limits.append(f"The run is {status}, not complete: its figures may change.")
    if summary.coverage and summary.coverage.skipped:
        limits.append(
            f"{len(summary.coverage.skipped)} cases of the dataset were not evaluated "
            f"({summary.coverage.headline()}); they are in none of the figures."
        )
    ests = _estimates(summary)
    wide = [(m, n, e) for m, n, e in ests if e.low is not None and e.high is not None]
    wide = [(m, n, e) for m, n, e in wide if (e.high or 0) - (e.low or 0) > WIDE_CI]
    if wide:
        m, n, e = max(wide, key=lambda t: (t[2].high or 0) - (t[2].low or 0))
        limits.append(
            f"{len(wide)} intervals are wider than {WIDE_CI:.2f} (the widest: {n} of {m}, "
            f"{e.low:.2f} to {e.high:.2f}): differences between models smaller than the "
            "intervals are not shown by this run."
        )
    thin = sorted({m for m, _, e in ests if e.thin})
    if thin:
        limits.append(
            f"Figures of {', '.join(thin)} rest on fewer than {MIN_PATIENTS} patients: "
            "their intervals say little."
        )
    for row in summary.summary.leaderboard:
        failed = row.call_errors + row.format_failures + row.refusals
        if failed:
            limits.append(
                f"{row.model}: {row.call_errors} failed calls, {row.format_failures} "
                f"unreadable answers and {row.refusals} refusals of {row.n_samples}."
            )
    missing = [t.value for t in TaskFamily if t.value not in summary.families]
    if missing:
        limits.append(f"Task families not tested: {', '.join(missing)}.")
    present = {(i.modality or "").upper() for c in run.cases for i in c.images} - {""}
    absent = [label for code, label in MODALITIES.items() if code not in present]
    if absent and present:
        limits.append(f"No {' or '.join(absent)} studies in the dataset: not tested on them.")
    if run.cases and all(c.provenance.source == "phantom" for c in run.cases):
        limits.append(
            "Every case is a synthetic phantom, not a patient's study: the figures say how the "
            "models read phantoms, not the hospital's patients."
        )
    if len(summary.ablations) <= 1:
        limits.append(
            "No ablation was run (images alone, text alone): whether the models' answers rest "
            "on the images was not tested."
        )
    table = summary.subgroups
    if table is None:
        limits.append("Results by subgroup were not computed (a summary from before them).")
    else:
        unrecorded = [ATTRIBUTE_TITLES[a].lower() for a in subgroup_attributes(table, False)]
        if unrecorded:
            limits.append(
                f"Not recorded for any case: {', '.join(unrecorded)}. Whether the results hold "
                "across these subgroups was not tested."
            )
        small = sorted(
            {(r.attribute, r.value) for r in table.rows if r.too_small and r.value != NOT_RECORDED}
        )
        if small:
            limits.append(
                f"{len(small)} subgroups rest on fewer than {table.min_patients} patients: "
                "shown as too small, their figures not given."
            )
    reviews = summary.reviews
    if reviews.n_signed_off == 0:
        limits.append(
            "No clinician reviews yet: every figure is the automatic scoring's, not confirmed "
            "by a clinician."
        )
    elif reviews.n_signed_off < reviews.n_cases:
        limits.append(
            f"Clinicians signed off {reviews.n_signed_off} of {reviews.n_cases} cases: the "
            "other cases are scored automatically only."
        )
    if summary.summary.mixed_versions:
        limits.append(
            "The figures mix scoring versions: rescore the run (neurosandbox runs rescore "
            "RUN_DIR) before reading them."
        )
    limits.append(
        f"The grounding audit (whether findings rest on the images shown) was {GROUNDING_AUDIT}."
    )
    warnings = run.config.get("warnings")
    if isinstance(warnings, list) and warnings:
        limits.append(
            f"The run recorded {len(warnings)} warnings, e.g. {str(warnings[0])[:200]!r}."
        )
    return limits


def pilot_run(
    run: RunData,
    reviews: list[CaseReview] | None = None,
    passports: Mapping[str, ModelPassport] | None = None,
    *,
    catalog: CatalogEntry | None = None,
    n_boot: int = DEFAULT_BOOT,
    now: datetime | None = None,
) -> PilotRun:
    """One run of the pilot: its summary (with signed-off reviews fed back), passports,
    subgroups, dataset facts and limits."""
    summary = build_summary(run, reviews or [], n_boot=n_boot, now=now)
    status = str(run.config.get("status", ""))
    passports = passports or {}
    return PilotRun(
        run_id=run.run_id,
        created_at=run.created_at,
        status=status,
        code_version=run.code_version,
        dataset=_dataset(run, summary),
        summary=summary,
        passports=list(passports.values()),
        unrecorded=[m for m in summary.models if m not in passports],
        cost_total_usd=_cost_total(summary),
        limits=evidence_limits(run, summary, status),
        catalog=catalog,
    )


def check_run_count(n: int) -> None:
    """Raise ``PilotError`` unless ``n`` runs can make one report (checked before any is read)."""
    if n < 1:
        raise PilotError("a pilot report needs at least one run")
    if n > MAX_RUNS:
        raise PilotError(
            f"{n} runs: a board report covers at most {MAX_RUNS}; pick the runs the board decides on"
        )


def build_pilot(
    runs: list[PilotRun], intended_use: IntendedUse, *, now: datetime | None = None
) -> PilotReport:
    """The report over the pilot's runs, in the order given."""
    check_run_count(len(runs))
    seen = Counter(r.run_id for r in runs)
    if twice := [run_id for run_id, n in seen.items() if n > 1]:
        raise PilotError(f"run {twice[0]} is given {seen[twice[0]]} times; give each run once")
    runs = [r.model_copy(deep=True) for r in runs]
    for i, run in enumerate(runs):
        for p in run.passports:
            earlier = next(
                (
                    (prev.run_id, q)
                    for prev in reversed(runs[:i])
                    for q in prev.passports
                    if q.model == p.model and q.role == p.role
                ),
                None,
            )
            if earlier is None:
                continue
            changed = passport_changes(earlier[1], p)
            run.passport_changes.append(
                PassportChanges(model=p.model, since_run=earlier[0], changes=changed)
            )
            if changed:
                fields = ", ".join(c.field for c in changed[:6])
                run.limits.append(
                    f"The passport of {p.model} changed since run {earlier[0]} ({fields}): the "
                    "two runs' figures may be of different models or settings."
                )
    return PilotReport(
        generated_at=(now or datetime.now(UTC)).isoformat(timespec="seconds"),
        intended_use=intended_use,
        runs=runs,
    )
