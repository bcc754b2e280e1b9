"""Paired comparison of two models on the same cases: McNemar and a paired bootstrap."""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel

from evaluation.case import TaskFamily
from evaluation.scoring.scored import ScoredSample
from evaluation.scoring.stats import (
    DEFAULT_BOOT,
    DEFAULT_SEED,
    McNemar,
    PairedDifference,
    mcnemar,
    paired_bootstrap,
)
from evaluation.scoring.version import SCORING_VERSION, versions_of


class PairedComparison(BaseModel):
    model_a: str
    model_b: str
    n_units: int
    both_right: int
    a_only: int
    b_only: int
    both_wrong: int
    accuracy_a: float | None
    accuracy_b: float | None
    mcnemar: McNemar
    bootstrap: PairedDifference  # mean per-unit accuracy of a minus b, clustered by patient


class ScoringVersionMismatch(ValueError):
    """Samples scored with different scoring versions were about to be compared."""


def refuse_mixed_versions(samples: list[ScoredSample]) -> None:
    versions = versions_of(samples)
    if len(versions) > 1:
        held = ", ".join(f"{v}: {n} samples" for v, n in versions.items())
        raise ScoringVersionMismatch(
            f"these samples were scored with different scoring versions ({held}); scores of "
            f"two versions are not comparable: rescore the run first "
            f"(neurosandbox runs rescore RUN_DIR) to bring it to version {SCORING_VERSION}"
        )


def compare(
    samples: list[ScoredSample],
    model_a: str,
    model_b: str,
    *,
    family: TaskFamily | None = None,
    n_boot: int = DEFAULT_BOOT,
    seed: int = DEFAULT_SEED,
) -> PairedComparison:
    """Two models on the units both answered: McNemar on each unit's first scored sample,
    paired bootstrap on each unit's mean correctness over all its scored samples.

    Raises ScoringVersionMismatch when those samples were scored with different versions."""
    per: dict[str, dict[tuple[str, str], list[ScoredSample]]] = {model_a: {}, model_b: {}}
    for s in samples:
        if s.model in per and (family is None or s.family is family) and s.correct is not None:
            per[s.model].setdefault((s.case_id, s.family.value), []).append(s)
    common = sorted(set(per[model_a]) & set(per[model_b]))
    if not common:
        raise ValueError(f"{model_a} and {model_b} share no scored case/task to compare")
    refuse_mixed_versions([s for m in per.values() for u in common for s in m[u]])
    first_a, first_b, mean_a, mean_b, clusters = [], [], [], [], []
    for u in common:
        ua = sorted(per[model_a][u], key=lambda s: s.sample_index)
        ub = sorted(per[model_b][u], key=lambda s: s.sample_index)
        first_a.append(bool(ua[0].correct))
        first_b.append(bool(ub[0].correct))
        mean_a.append(float(np.mean([s.correct for s in ua])))
        mean_b.append(float(np.mean([s.correct for s in ub])))
        clusters.append(ua[0].patient_id)
    b = sum(x and not y for x, y in zip(first_a, first_b, strict=True))
    c = sum(y and not x for x, y in zip(first_a, first_b, strict=True))
    both = sum(x and y for x, y in zip(first_a, first_b, strict=True))
    return PairedComparison(
        model_a=model_a,
        model_b=model_b,
        n_units=len(common),
        both_right=both,
        a_only=b,
        b_only=c,
        both_wrong=len(common) - both - b - c,
        accuracy_a=float(np.mean(mean_a)),
        accuracy_b=float(np.mean(mean_b)),
        mcnemar=mcnemar(b, c),
        bootstrap=paired_bootstrap(mean_a, mean_b, clusters, n_boot=n_boot, seed=seed),
    )
