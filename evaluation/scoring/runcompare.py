"""Two runs of the same dataset compared, model by model (``neurosandbox runs compare A B``).

Run A is the earlier (the baseline), run B the later; every difference is B minus A. A unit is a
(case, question) of one model (``ScoredSample.task``, the family for samples scored before it was
recorded). Per model and per metric, on the units both runs scored:

- the paired difference of the unit means (mean over the unit's samples), with a percentile
  bootstrap interval that resamples whole patients (``stats.paired_bootstrap``);
- for a metric whose values are 0 or 1 (accuracy), McNemar's test on each unit's first sample
  (``stats.mcnemar``: b = right in A and wrong in B, c = wrong in A and right in B);
- for accuracy, the units that flipped (right -> wrong, wrong -> right, first sample), each with a
  link to its checklist in both runs when the caller gives a ``checklist`` function.

The units and samples only one run has are listed, never silently dropped. Scores of two scoring
versions are never compared (``ScoringVersionMismatch``), nor two datasets (``DatasetMismatch``):
a rescore or a dataset change must not read as drift.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import numpy as np
from pydantic import BaseModel, Field

from evaluation.case import Case, TaskFamily
from evaluation.scoring.compare import ScoringVersionMismatch
from evaluation.scoring.scored import ScoredSample
from evaluation.scoring.stats import (
    DEFAULT_BOOT,
    DEFAULT_SEED,
    MIN_PATIENTS,
    Estimate,
    McNemar,
    bootstrap_mean,
    mcnemar,
    paired_bootstrap,
)
from evaluation.scoring.subgroups import ATTRIBUTES, NOT_RECORDED, case_attributes, value_order
from evaluation.scoring.version import version_name, versions_of

ACCURACY = "accuracy"  # ScoredSample.correct: the diagnosis (or NeuroVLM class) right
STRICT_ACCURACY = "strict_accuracy"  # ScoredSample.outcome: an unusable answer counts wrong
# Scores that are not a per-answer metric to compare (accuracy is diagnosis_match already).
NOT_METRICS = frozenset({"diagnosis_match", "classification_correct", "grader_calibration"})
MAX_LISTED = 500  # units listed per list (flips, units of one run only); the counts stay whole

# (run id, case id) -> where the case's checklist is (a review-app URL, a report file)
ChecklistLink = Callable[[str, str], str]


class DatasetMismatch(ValueError):
    """The two runs evaluated different datasets (their content hashes differ)."""


class RunSide(BaseModel):
    """One of the two runs: what identifies it and what it was scored with."""

    run_id: str
    dataset_hash: str
    dataset_name: str | None = None
    created_at: str | None = None
    label: str = ""  # how the caller names it (a run folder, a run id)
    scoring_versions: dict[str, int] = Field(default_factory=dict)


class UnitRef(BaseModel):
    """One (case, question) of a model, with the sample indices meant."""

    case_id: str
    task: str
    patient_id: str = ""
    samples: list[int] = Field(default_factory=list)


class FlippedUnit(BaseModel):
    """A unit whose first sample was right in one run and wrong in the other."""

    case_id: str
    task: str
    patient_id: str
    checklist_a: str | None = None
    checklist_b: str | None = None


class MetricDelta(BaseModel):
    """One metric of one model in both runs, on the units both scored."""

    metric: str
    n_units: int
    a: Estimate  # mean of unit means in run A (bootstrap over patients)
    b: Estimate
    difference: Estimate  # B - A, paired, clustered by patient
    p_value: float  # two-sided, from the bootstrap distribution of the difference
    binary: bool  # every value 0 or 1: McNemar applies
    mcnemar: McNemar | None = None  # first sample of each unit; b: right->wrong, c: wrong->right
    both_right: int | None = None
    both_wrong: int | None = None


class SubgroupDelta(BaseModel):
    """Accuracy of one model on one subgroup of the shared cases (``scoring.subgroups``: vendor,
    scanner model, field strength, age band, sex), both runs, paired. A subgroup resting on fewer
    than ``min_patients`` patients is kept and marked ``too_small``, never hidden."""

    attribute: str
    value: str
    metric: str
    n_units: int
    n_patients: int
    a: Estimate
    b: Estimate
    difference: Estimate  # B - A on the subgroup's shared units, clustered by patient
    too_small: bool


class ModelDelta(BaseModel):
    """One model in both runs."""

    model: str
    n_shared_units: int  # units both runs answered right or wrong (strict: unusable is wrong)
    metrics: list[MetricDelta] = Field(default_factory=list)
    right_to_wrong: list[FlippedUnit] = Field(default_factory=list)
    wrong_to_right: list[FlippedUnit] = Field(default_factory=list)
    n_right_to_wrong: int = 0
    n_wrong_to_right: int = 0
    only_a: list[UnitRef] = Field(default_factory=list)  # units run B does not have
    only_b: list[UnitRef] = Field(default_factory=list)
    n_only_a: int = 0
    n_only_b: int = 0
    # shared units whose sample indices differ: the samples one run has and the other not
    samples_only_a: list[UnitRef] = Field(default_factory=list)
    samples_only_b: list[UnitRef] = Field(default_factory=list)
    subgroups: list[SubgroupDelta] = Field(default_factory=list)  # empty: no case snapshots

    def metric(self, name: str) -> MetricDelta | None:
        return next((m for m in self.metrics if m.metric == name), None)

    def unrecorded_attributes(self) -> list[str]:
        """Subgroup attributes no shared case records (their one subgroup: "not recorded")."""
        known = {r.attribute for r in self.subgroups if r.value != NOT_RECORDED}
        return list(dict.fromkeys(r.attribute for r in self.subgroups if r.attribute not in known))

    def recorded_subgroups(self) -> list[SubgroupDelta]:
        """The subgroup rows of the attributes some shared case records (shown as a table)."""
        unknown = set(self.unrecorded_attributes())
        return [r for r in self.subgroups if r.attribute not in unknown]

    @property
    def flip_share(self) -> float | None:
        """Units that flipped (either way) out of the shared units (None: none shared)."""
        if not self.n_shared_units:
            return None
        return (self.n_right_to_wrong + self.n_wrong_to_right) / self.n_shared_units


class RunComparison(BaseModel):
    """Two runs of one dataset, model by model; every difference is B minus A."""

    a: RunSide
    b: RunSide
    family: str | None = None  # the task family compared (None: all)
    scoring_version: str  # the one version both runs' scores carry
    models: list[ModelDelta] = Field(default_factory=list)
    models_only_a: list[str] = Field(default_factory=list)
    models_only_b: list[str] = Field(default_factory=list)
    n_boot: int = DEFAULT_BOOT
    min_patients: int = MIN_PATIENTS  # a subgroup on fewer patients is marked too small

    def model(self, name: str) -> ModelDelta | None:
        return next((m for m in self.models if m.model == name), None)


def _unit(s: ScoredSample) -> tuple[str, str]:
    return s.case_id, s.task or s.family.value


def _metric_value(s: ScoredSample, metric: str) -> float | None:
    if metric == ACCURACY:
        return s.correct
    if metric == STRICT_ACCURACY:
        return s.outcome
    return s.value(metric)


def _metric_names(samples: Iterable[ScoredSample]) -> list[str]:
    names = {
        sc.scorer
        for s in samples
        for sc in s.scores
        if sc.value is not None and sc.scorer not in NOT_METRICS
    }
    return [ACCURACY, STRICT_ACCURACY, *sorted(names)]


def _refuse_versions(side: RunSide, other: RunSide) -> str:
    """The one scoring version of both runs' scores, else ScoringVersionMismatch."""
    held = set(side.scoring_versions) | set(other.scoring_versions)
    if len(held) <= 1:
        return next(iter(held), "")
    said = "; ".join(
        f"{r.label or r.run_id}: "
        + ", ".join(f"{v} ({n} samples)" for v, n in r.scoring_versions.items())
        for r in (side, other)
    )
    raise ScoringVersionMismatch(
        f"the runs' scores carry different scoring versions ({said}); a scoring change is not "
        "drift: rescore both to the current version first"
    )


def _by_unit(
    samples: list[ScoredSample], model: str, family: TaskFamily | None
) -> dict[tuple[str, str], list[ScoredSample]]:
    out: dict[tuple[str, str], list[ScoredSample]] = {}
    for s in samples:
        if s.model == model and (family is None or s.family is family):
            out.setdefault(_unit(s), []).append(s)
    for unit in out.values():
        unit.sort(key=lambda s: s.sample_index)
    return out


def _delta(
    metric: str,
    ua: dict[tuple[str, str], list[ScoredSample]],
    ub: dict[tuple[str, str], list[ScoredSample]],
    n_boot: int,
    seed: int,
) -> MetricDelta | None:
    """One metric on the units where both runs have a value for it (None: no such unit)."""
    mean_a, mean_b, first_a, first_b, clusters = [], [], [], [], []
    for key in sorted(set(ua) & set(ub)):
        va = [(s, v) for s in ua[key] if (v := _metric_value(s, metric)) is not None]
        vb = [(s, v) for s in ub[key] if (v := _metric_value(s, metric)) is not None]
        if not va or not vb:
            continue
        mean_a.append(float(np.mean([v for _, v in va])))
        mean_b.append(float(np.mean([v for _, v in vb])))
        first_a.append(va[0][1])
        first_b.append(vb[0][1])
        clusters.append(va[0][0].patient_id)
    if not clusters:
        return None
    binary = all(v in (0.0, 1.0) for v in (*first_a, *first_b))
    boot = paired_bootstrap(mean_b, mean_a, clusters, n_boot=n_boot, seed=seed)
    delta = MetricDelta(
        metric=metric,
        n_units=len(clusters),
        a=bootstrap_mean(mean_a, clusters, n_boot=n_boot, seed=seed),
        b=bootstrap_mean(mean_b, clusters, n_boot=n_boot, seed=seed),
        difference=boot.difference,
        p_value=boot.p_value,
        binary=binary,
    )
    if binary:
        pairs = list(zip(first_a, first_b, strict=True))
        right_wrong = sum(1 for x, y in pairs if x == 1.0 and y == 0.0)
        wrong_right = sum(1 for x, y in pairs if x == 0.0 and y == 1.0)
        delta.mcnemar = mcnemar(right_wrong, wrong_right)
        delta.both_right = sum(1 for x, y in pairs if x == 1.0 and y == 1.0)
        delta.both_wrong = sum(1 for x, y in pairs if x == 0.0 and y == 0.0)
    return delta


def _flips(
    ua: dict[tuple[str, str], list[ScoredSample]],
    ub: dict[tuple[str, str], list[ScoredSample]],
    a: RunSide,
    b: RunSide,
    checklist: ChecklistLink | None,
) -> tuple[list[FlippedUnit], list[FlippedUnit]]:
    """Units whose first scored sample went right -> wrong, and wrong -> right, as pass@k
    counts right and wrong (``ScoredSample.outcome``): an answer that turned unusable (a
    format failure, a refusal) on a gradable question is wrong, never left out; a failed
    call is left out (listed as a sample one run lacks)."""
    worse: list[FlippedUnit] = []
    better: list[FlippedUnit] = []
    for key in sorted(set(ua) & set(ub)):
        sa = next((s for s in ua[key] if s.outcome is not None), None)
        sb = next((s for s in ub[key] if s.outcome is not None), None)
        if sa is None or sb is None or sa.outcome == sb.outcome:
            continue
        flip = FlippedUnit(
            case_id=key[0],
            task=key[1],
            patient_id=sa.patient_id,
            checklist_a=checklist(a.run_id, key[0]) if checklist else None,
            checklist_b=checklist(b.run_id, key[0]) if checklist else None,
        )
        (worse if sa.outcome == 1.0 else better).append(flip)
    return worse, better


def _only(
    mine: dict[tuple[str, str], list[ScoredSample]],
    theirs: dict[tuple[str, str], list[ScoredSample]],
) -> tuple[list[UnitRef], list[UnitRef]]:
    """The units only ``mine`` has, and the shared units' samples only ``mine`` has."""
    units, samples = [], []
    for key in sorted(mine):
        idx = sorted({s.sample_index for s in mine[key]})
        ref = UnitRef(case_id=key[0], task=key[1], patient_id=mine[key][0].patient_id)
        if key not in theirs:
            units.append(ref.model_copy(update={"samples": idx}))
            continue
        extra = sorted(set(idx) - {s.sample_index for s in theirs[key]})
        if extra:
            samples.append(ref.model_copy(update={"samples": extra}))
    return units, samples


def _subgroups(
    ua: dict[tuple[str, str], list[ScoredSample]],
    ub: dict[tuple[str, str], list[ScoredSample]],
    cases: Mapping[str, Case],
    n_boot: int,
    seed: int,
    min_patients: int,
) -> list[SubgroupDelta]:
    """Accuracy B - A by each subgroup attribute of the shared units' cases (a case the runs hold
    no snapshot of is in "not recorded")."""
    attrs = {cid: case_attributes(c) for cid, c in cases.items()}
    out = []
    for attribute in ATTRIBUTES:
        groups: dict[str, set[tuple[str, str]]] = {}
        for key in set(ua) & set(ub):
            known = attrs.get(key[0])
            value = str(getattr(known, attribute)) if known else NOT_RECORDED
            groups.setdefault(value, set()).add(key)
        for value in sorted(groups, key=value_order):
            keys = groups[value]
            d = _delta(
                ACCURACY,
                {k: v for k, v in ua.items() if k in keys},
                {k: v for k, v in ub.items() if k in keys},
                n_boot,
                seed,
            )
            if d is None:
                continue
            patients = d.difference.patients
            out.append(
                SubgroupDelta(
                    attribute=attribute,
                    value=value,
                    metric=ACCURACY,
                    n_units=d.n_units,
                    n_patients=patients,
                    a=d.a,
                    b=d.b,
                    difference=d.difference,
                    too_small=patients < min_patients,
                )
            )
    return out


def compare_runs(
    a: RunSide,
    samples_a: list[ScoredSample],
    b: RunSide,
    samples_b: list[ScoredSample],
    *,
    models: list[str] | None = None,
    family: TaskFamily | None = None,
    checklist: ChecklistLink | None = None,
    cases: Mapping[str, Case] | None = None,
    n_boot: int = DEFAULT_BOOT,
    seed: int = DEFAULT_SEED,
    min_patients: int = MIN_PATIENTS,
) -> RunComparison:
    """Run B against run A (the earlier), per model both ran (or ``models``) and per metric;
    with ``cases`` (the runs' case snapshots, by id), accuracy by subgroup too.

    Raises DatasetMismatch (different dataset hashes), ScoringVersionMismatch (scores of more
    than one scoring version), ValueError (a model asked for that neither run has)."""
    if a.dataset_hash != b.dataset_hash:
        raise DatasetMismatch(
            f"the runs evaluated different datasets: {a.label or a.run_id} has dataset hash "
            f"{a.dataset_hash}, {b.label or b.run_id} has {b.dataset_hash}; compare two runs "
            "of the same cases"
        )
    a = a.model_copy(update={"scoring_versions": versions_of(samples_a)})
    b = b.model_copy(update={"scoring_versions": versions_of(samples_b)})
    version = _refuse_versions(a, b)
    in_a = sorted({s.model for s in samples_a})
    in_b = sorted({s.model for s in samples_b})
    both = [m for m in in_a if m in in_b]
    if models:
        unknown = [m for m in models if m not in in_a and m not in in_b]
        if unknown:
            raise ValueError(
                f"model {unknown[0]!r} is in neither run (A: {', '.join(in_a) or 'none'}; "
                f"B: {', '.join(in_b) or 'none'})"
            )
        both = [m for m in models if m in both]
    out = RunComparison(
        a=a,
        b=b,
        family=family.value if family else None,
        scoring_version=version_name(version) if version else "",
        models_only_a=[m for m in in_a if m not in in_b and (not models or m in models)],
        models_only_b=[m for m in in_b if m not in in_a and (not models or m in models)],
        n_boot=n_boot,
        min_patients=min_patients,
    )
    for model in both:
        ua, ub = _by_unit(samples_a, model, family), _by_unit(samples_b, model, family)
        metrics = [
            d
            for name in _metric_names(s for u in (*ua.values(), *ub.values()) for s in u)
            if (d := _delta(name, ua, ub, n_boot, seed)) is not None
        ]
        worse, better = _flips(ua, ub, a, b, checklist)
        only_a, more_a = _only(ua, ub)
        only_b, more_b = _only(ub, ua)
        # the units the flips are counted on: both runs right or wrong there, as pass@k counts
        acc = next((m for m in metrics if m.metric == STRICT_ACCURACY), None)
        out.models.append(
            ModelDelta(
                model=model,
                n_shared_units=acc.n_units if acc else 0,
                metrics=metrics,
                right_to_wrong=worse[:MAX_LISTED],
                wrong_to_right=better[:MAX_LISTED],
                n_right_to_wrong=len(worse),
                n_wrong_to_right=len(better),
                only_a=only_a[:MAX_LISTED],
                only_b=only_b[:MAX_LISTED],
                n_only_a=len(only_a),
                n_only_b=len(only_b),
                samples_only_a=more_a[:MAX_LISTED],
                samples_only_b=more_b[:MAX_LISTED],
                subgroups=_subgroups(ua, ub, cases, n_boot, seed, min_patients) if cases else [],
            )
        )
    return out
