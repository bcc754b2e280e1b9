"""Run summaries: the leaderboard, breakdowns, error distribution, lesion and NeuroVLM metrics,
cost (the paired comparison of two models lives in ``compare``).

Units: a (model, case, question) with its n samples (the question key ``ScoredSample.task``;
the family alone for samples scored before it was recorded). Sampled pass@k averages the
unbiased estimator over units with at least k counted samples; ranked pass@k averages, over
counted samples, whether the truth is in the top k of the differential. An unusable answer
(format failure, refusal) is a wrong sample there (``ScoredSample.outcome``); a failed call,
which is not the model's doing, is left out (a resume retries it), and a unit it leaves short of
k samples is counted apart. Accuracy is over the scored answers, strict accuracy counts unusable
answers wrong. Every figure carries the number of samples it could not count
(``Estimate.unscored``) and says when it rests on fewer than ``stats.MIN_PATIENTS`` patients
(``Estimate.thin``). Every interval is a bootstrap over patients (``stats.bootstrap_mean``),
seeded.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np
from pydantic import BaseModel, Field

from evaluation.case import TaskFamily
from evaluation.scores import (
    BenchLabels,
    DiagnosisDetails,
    FieldDetails,
    FlagsDetails,
    LesionDetails,
    ParseStatus,
    RankDetails,
    RubricDetails,
)
from evaluation.scoring.neurovlm import (
    ClassRow,
    NeuroVLMMetrics,
    ReliabilityBin,
    calibration,
    neurovlm_metrics,
)
from evaluation.scoring.neurovlm_bench import BenchMetrics, bench_metrics
from evaluation.scoring.passk import DEFAULT_KS, ranked_pass_at_k, sampled_pass_at_k
from evaluation.scoring.rubric import rubric_agreement
from evaluation.scoring.scored import ScoredSample
from evaluation.scoring.stats import (
    DEFAULT_BOOT,
    DEFAULT_SEED,
    MIN_PATIENTS,
    Estimate,
    bootstrap_mean,
    median,
    wilson,
)
from evaluation.scoring.taxonomy import error_counts
from evaluation.scoring.version import versions_of


class LesionSummary(BaseModel):
    n_samples: int
    precision: float | None  # pooled over samples
    recall: float | None
    f1: float | None
    f1_mean: Estimate  # mean of per-sample F1
    hallucinated_finding_rate: float | None
    missed_lesion_rate: float | None
    normal_control_false_positive: Estimate | None = None
    # lesions whose best finding points inside their mask / lesions, pooled over the samples
    # where it could be measured (a label mask and recorded image geometry); beside recall
    localisation_rate: float | None = None
    localisation_lesions: int = 0  # the lesions that rate is over


class CostSummary(BaseModel):
    n: int
    prompt_tokens_mean: float | None = None
    completion_tokens_mean: float | None = None
    cost_total_usd: float | None = None
    cost_per_task_usd: float | None = None
    latency_median_s: float | None = None
    latency_p90_s: float | None = None


class LeaderboardRow(BaseModel):
    model: str
    n_samples: int
    n_cases: int
    n_scored: int
    format_failures: int
    refusals: int
    call_errors: int
    accuracy: Estimate
    strict_accuracy: Estimate
    sampled_pass_at: dict[str, Estimate] = Field(default_factory=dict)
    # units with k or more samples left out of sampled pass@k because some went unscored
    sampled_pass_left_out: dict[str, int] = Field(default_factory=dict)
    ranked_pass_at: dict[str, Estimate] = Field(default_factory=dict)
    judge_matches: int = 0
    lesions: LesionSummary | None = None
    sequence_recognition: Estimate | None = None
    modality_accuracy: Estimate | None = None
    plane_accuracy: Estimate | None = None
    bertscore: Estimate | None = None
    rubric: Estimate | None = None
    rubric_alpha: float | None = None
    # graders left out of the rubric because they failed the canary (obeyed the answer)
    rubric_canary_failed: list[str] = Field(default_factory=list)
    ece: float | None = None
    brier: float | None = None
    reliability: list[ReliabilityBin] = Field(default_factory=list)
    cost: CostSummary


class BreakdownRow(BaseModel):
    dimension: str  # family | disease_group | difficulty | modality
    key: str
    model: str
    n_samples: int
    unscored: int
    accuracy: Estimate
    sampled_pass_at_1: Estimate | None = None
    ranked_pass_at_1: Estimate | None = None
    lesion_f1: Estimate | None = None


class RunSummary(BaseModel):
    ks: list[int]
    leaderboard: list[LeaderboardRow]
    breakdowns: list[BreakdownRow]
    errors: dict[str, dict[str, dict[str, int]]]  # model -> categories/sub_labels -> counts
    neurovlm: dict[str, NeuroVLMMetrics] = Field(default_factory=dict)
    # the same answers by NeuroVLM-Bench's own definitions (scoring.neurovlm_bench), named apart
    neurovlm_bench: dict[str, BenchMetrics] = Field(default_factory=dict)
    cost_per_task: dict[str, dict[str, CostSummary]] = Field(default_factory=dict)
    format_failures: dict[str, dict[str, int]] = Field(default_factory=dict)
    # samples per scoring version; more than one: the figures mix versions (rescore the run)
    scoring_versions: dict[str, int] = Field(default_factory=dict)
    # a figure on fewer patients than this is marked thin (Estimate.thin)
    min_patients: int = MIN_PATIENTS

    @property
    def mixed_versions(self) -> bool:
        return len(self.scoring_versions) > 1


def _mean(
    samples: Sequence[ScoredSample], get: Callable[[ScoredSample], float | None], **boot: int
) -> Estimate:
    pairs, unscored = [], 0
    for s in samples:
        if (v := get(s)) is not None:
            pairs.append((v, s.patient_id))
        elif s.status is not ParseStatus.OK:
            # no usable answer (a failed call; a format failure or refusal the figure cannot
            # count as wrong): unscored. A read answer the figure does not apply to (a
            # classification answer for the differential's rank) is not counted at all.
            unscored += 1
    est = bootstrap_mean([v for v, _ in pairs], [c for _, c in pairs], **boot)
    return est.model_copy(update={"unscored": unscored})


def _units(samples: Sequence[ScoredSample]) -> dict[tuple[str, str], list[ScoredSample]]:
    units: dict[tuple[str, str], list[ScoredSample]] = defaultdict(list)
    for s in samples:
        units[(s.case_id, s.task or s.family.value)].append(s)
    return units


def _sampled_units(samples: Sequence[ScoredSample], k: int, **boot: int) -> tuple[Estimate, int]:
    """Sampled pass@k over the units with k counted samples (an unusable answer counts as a
    wrong one), and how many units that had k samples were left short by failed calls."""
    vals, clusters, left_out, unscored = [], [], 0, 0
    for unit in _units(samples).values():
        flags = [c for s in unit if (c := s.outcome) is not None]
        unscored += len(unit) - len(flags)
        if len(flags) >= k:
            vals.append(sampled_pass_at_k(len(flags), int(sum(flags)), k))
            clusters.append(unit[0].patient_id)
        elif len(unit) >= k and any(s.status is ParseStatus.ERROR for s in unit):
            left_out += 1  # (a unit with nothing to score against is not a pass@k unit)
    est = bootstrap_mean(vals, clusters, **boot)
    return est.model_copy(update={"unscored": unscored}), left_out


def _rank(s: ScoredSample) -> int | None:
    sc = s.score("differential_rank")
    d = sc.details_as(RankDetails) if sc is not None and sc.value is not None else None
    return d.rank if d is not None else None


def _ranked(samples: Sequence[ScoredSample], k: int, **boot: int) -> Estimate:
    """Ranked pass@k over the samples with a differential scored, and the unusable answers to
    gradable questions (no differential: the truth is not in it)."""

    def hit(s: ScoredSample) -> float | None:
        if s.score("differential_rank") is not None and s.value("differential_rank") is not None:
            return ranked_pass_at_k(_rank(s), k)
        return 0.0 if s.outcome == 0.0 and s.status is not ParseStatus.OK else None

    return _mean(samples, hit, **boot)


def _lesions(samples: Sequence[ScoredSample], **boot: int) -> LesionSummary | None:
    results = []
    for s in samples:
        sc = s.score("lesion_f1")
        if sc is not None and (d := sc.details_as(LesionDetails)) is not None:
            results.append((s, d.match))
    if not results:
        return None
    pos = sum(r.n_positive for _, r in results)
    les = sum(len(r.lesions) for _, r in results)
    p = sum(r.n_matched for _, r in results) / pos if pos else None
    rec = sum(r.n_detected for _, r in results) / les if les else None
    normals = [r for _, r in results if r.normal_false_positive is not None]
    measured = [r for _, r in results if r.localisation_rate is not None]
    n_loc = sum(len(r.lesions) for r in measured)
    return LesionSummary(
        localisation_rate=sum(r.n_localised for r in measured) / n_loc if n_loc else None,
        localisation_lesions=n_loc,
        n_samples=len(results),
        precision=p,
        recall=rec,
        f1=(2 * p * rec / (p + rec) if p + rec else 0.0)
        if p is not None and rec is not None
        else None,
        f1_mean=_mean([s for s, _ in results], lambda s: s.value("lesion_f1"), **boot),
        hallucinated_finding_rate=sum(r.n_hallucinated for _, r in results) / pos if pos else None,
        missed_lesion_rate=sum(r.n_missed for _, r in results) / les if les else None,
        normal_control_false_positive=(
            wilson(sum(bool(r.normal_false_positive) for r in normals), len(normals))
            if normals
            else None
        ),
    )


def _cost(samples: Sequence[ScoredSample]) -> CostSummary:
    def vals(name: str) -> list[float]:
        return [float(v) for s in samples if (v := getattr(s, name)) is not None]

    pt, ct, cost, lat = (
        vals("prompt_tokens"),
        vals("completion_tokens"),
        vals("cost_usd"),
        vals("latency_s"),
    )
    return CostSummary(
        n=len(samples),
        prompt_tokens_mean=float(np.mean(pt)) if pt else None,
        completion_tokens_mean=float(np.mean(ct)) if ct else None,
        cost_total_usd=float(sum(cost)) if cost else None,
        cost_per_task_usd=float(np.mean(cost)) if cost else None,
        latency_median_s=median(lat),
        latency_p90_s=float(np.quantile(lat, 0.9)) if lat else None,
    )


def _optional(e: Estimate) -> Estimate | None:
    return e if e.value is not None else None


def _row(model: str, samples: list[ScoredSample], ks: Sequence[int], **boot: int) -> LeaderboardRow:
    status = [s.status for s in samples]
    lesion_samples = [s for s in samples if s.family is TaskFamily.LESION] or samples
    rubric = [sc for s in samples if (sc := s.score("rubric")) is not None]
    conf = []
    for s in samples:
        dm = s.score("diagnosis_match") or s.score("classification_correct")
        said = dm.details_as(DiagnosisDetails) or dm.details_as(FieldDetails) if dm else None
        if dm is not None and dm.value is not None and said and said.confidence is not None:
            conf.append((float(said.confidence), bool(dm.value)))
    ece, brier, bins = calibration([c for c, _ in conf], [ok for _, ok in conf])
    passes = {k: _sampled_units(samples, k, **boot) for k in ks}
    return LeaderboardRow(
        model=model,
        n_samples=len(samples),
        n_cases=len({s.case_id for s in samples}),
        n_scored=sum(s.correct is not None for s in samples),
        format_failures=status.count(ParseStatus.FORMAT_FAILURE),
        refusals=status.count(ParseStatus.REFUSAL),
        call_errors=status.count(ParseStatus.ERROR),
        accuracy=_mean(samples, lambda s: s.correct, **boot),
        strict_accuracy=_mean(
            [s for s in samples if s.status is not ParseStatus.ERROR],
            lambda s: s.correct or 0.0,
            **boot,
        ).model_copy(update={"unscored": status.count(ParseStatus.ERROR)}),
        sampled_pass_at={str(k): passes[k][0] for k in ks},
        sampled_pass_left_out={str(k): passes[k][1] for k in ks},
        ranked_pass_at={str(k): _ranked(samples, k, **boot) for k in ks},
        judge_matches=sum(
            bool(
                (sc := s.score("diagnosis_match"))
                and (d := sc.details_as(DiagnosisDetails))
                and d.judge
            )
            for s in samples
        ),
        lesions=_lesions(lesion_samples, **boot),
        sequence_recognition=_optional(
            _mean(samples, lambda s: s.value("sequence_recognition"), **boot)
        ),
        modality_accuracy=_optional(_mean(samples, lambda s: s.value("modality_accuracy"), **boot)),
        plane_accuracy=_optional(_mean(samples, lambda s: s.value("plane_accuracy"), **boot)),
        bertscore=_optional(_mean(samples, lambda s: s.value("bertscore"), **boot)),
        rubric=_optional(_mean(samples, lambda s: s.value("rubric"), **boot)),
        rubric_alpha=rubric_agreement(rubric) if rubric else None,
        rubric_canary_failed=sorted(
            {g for sc in rubric if (j := sc.details_as(RubricDetails)) for g in j.canary_failed}
        ),
        ece=ece,
        brier=brier,
        reliability=bins,
        cost=_cost(samples),
    )


# The figures a subgroup of samples is reported with (scoring.subgroups), each computed as the
# leaderboard computes it: a subgroup holding every sample gives the leaderboard's figure.
HEADLINE_METRICS = ("accuracy", "strict_accuracy", "ranked_pass_at_1", "lesion_f1")


def headline_metrics(
    samples: Sequence[ScoredSample], *, n_boot: int = DEFAULT_BOOT, seed: int = DEFAULT_SEED
) -> dict[str, Estimate | None]:
    """Accuracy, strict accuracy, ranked pass@1 and lesion F1 of ``samples`` as the leaderboard
    computes them (None: the figure does not apply to any of them)."""
    boot = {"n_boot": n_boot, "seed": seed}
    errors = sum(s.status is ParseStatus.ERROR for s in samples)
    lesion = [s for s in samples if s.family is TaskFamily.LESION] or samples
    return {
        "accuracy": _optional(_mean(samples, lambda s: s.correct, **boot)),
        "strict_accuracy": _optional(
            _mean(
                [s for s in samples if s.status is not ParseStatus.ERROR],
                lambda s: s.correct or 0.0,
                **boot,
            ).model_copy(update={"unscored": errors})
        ),
        "ranked_pass_at_1": _optional(_ranked(samples, 1, **boot)),
        "lesion_f1": _optional(_mean(lesion, lambda s: s.value("lesion_f1"), **boot)),
    }


_DIMENSIONS: dict[str, Callable[[ScoredSample], str | None]] = {
    "family": lambda s: s.family.value,
    "disease_group": lambda s: s.disease_group.value if s.disease_group else None,
    "difficulty": lambda s: s.difficulty.value if s.difficulty else None,
    "modality": lambda s: s.modality,
}


def _neurovlm(samples: list[ScoredSample], **boot: int) -> NeuroVLMMetrics | None:
    cls = [s for s in samples if s.family is TaskFamily.CLASSIFICATION]
    if not cls:
        return None
    rows: list[ClassRow] = []
    flags: dict[str, int] = defaultdict(int)
    for s in cls:
        sc = s.score("classification_correct")
        field = sc.details_as(FieldDetails) if sc is not None and sc.value is not None else None
        if field is not None and field.truth:
            rows.append(
                ClassRow(
                    truth=field.truth,
                    predicted=field.stated,
                    confidence=field.confidence,
                    cluster=s.patient_id,
                )
            )
        fl = s.score("safety_flags")
        raised = fl.details_as(FlagsDetails) if fl is not None else None
        for f in raised.flags if raised is not None else []:
            flags[f.split(":", 1)[0]] += 1
    valid = [v for s in cls if (v := s.value("json_valid")) is not None]
    return neurovlm_metrics(
        rows,
        json_valid=(int(sum(valid)), len(valid)) if valid else None,
        flags=dict(flags),
        n_boot=min(boot.get("n_boot", 1000), 1000),
        seed=boot.get("seed", DEFAULT_SEED),
    )


def _neurovlm_bench(samples: list[ScoredSample]) -> BenchMetrics | None:
    rows = [
        read
        for s in samples
        if s.family is TaskFamily.CLASSIFICATION
        and (sc := s.score("neurovlm_bench")) is not None
        and (read := sc.details_as(BenchLabels)) is not None
    ]
    return bench_metrics(rows) if rows else None


def summarise(
    samples: list[ScoredSample],
    ks: Sequence[int] = DEFAULT_KS,
    *,
    n_boot: int = DEFAULT_BOOT,
    seed: int = DEFAULT_SEED,
) -> RunSummary:
    """Leaderboard, breakdowns, errors, lesion/NeuroVLM metrics and cost of a run."""
    boot = {"n_boot": n_boot, "seed": seed}
    by_model: dict[str, list[ScoredSample]] = defaultdict(list)
    for s in samples:
        by_model[s.model].append(s)
    breakdowns = []
    for model, ss in by_model.items():
        for dim, key_of in _DIMENSIONS.items():
            groups: dict[str, list[ScoredSample]] = defaultdict(list)
            for s in ss:
                key = key_of(s)
                if key is not None:
                    groups[key].append(s)
            for key, g in sorted(groups.items()):
                breakdowns.append(
                    BreakdownRow(
                        dimension=dim,
                        key=key,
                        model=model,
                        n_samples=len(g),
                        unscored=sum(s.correct is None for s in g),
                        accuracy=_mean(g, lambda s: s.correct, **boot),
                        sampled_pass_at_1=_optional(_sampled_units(g, 1, **boot)[0]),
                        ranked_pass_at_1=_optional(_ranked(g, 1, **boot)),
                        lesion_f1=_optional(_mean(g, lambda s: s.value("lesion_f1"), **boot)),
                    )
                )
    cost_per_task = {
        model: {
            fam: _cost([s for s in ss if s.family.value == fam])
            for fam in sorted({s.family.value for s in ss})
        }
        for model, ss in by_model.items()
    }
    neuro = {m: n for m, ss in by_model.items() if (n := _neurovlm(ss, **boot)) is not None}
    bench = {m: b for m, ss in by_model.items() if (b := _neurovlm_bench(ss)) is not None}
    return RunSummary(
        scoring_versions=versions_of(samples),
        ks=list(ks),
        leaderboard=[_row(m, ss, ks, **boot) for m, ss in sorted(by_model.items())],
        breakdowns=breakdowns,
        errors={
            m: error_counts([s.effective_error for s in ss]) for m, ss in sorted(by_model.items())
        },
        neurovlm=neuro,
        neurovlm_bench=bench,
        cost_per_task=cost_per_task,
        format_failures={
            m: {
                st.value: sum(s.status is st for s in ss)
                for st in ParseStatus
                if st is not ParseStatus.OK
            }
            for m, ss in sorted(by_model.items())
        },
    )
