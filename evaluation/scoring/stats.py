"""Statistics for the summaries: intervals, paired tests, agreement.

- ``bootstrap_mean``: percentile bootstrap of a mean, resampling whole clusters (patients) with
  replacement, so that several samples or tasks of one patient do not pass for independent
  evidence; seeded, so a summary is reproducible.
- ``wilson``: Wilson score interval for a proportion.
- ``mcnemar``: paired binary outcomes of two models; exact binomial when b + c < 25, else the
  chi-square statistic with continuity correction.
- ``paired_bootstrap``: difference of two models' means on the same units, clustered.
- ``cohen_kappa``: agreement of two raters beyond chance.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np
from pydantic import BaseModel, computed_field

DEFAULT_BOOT = 2000
DEFAULT_SEED = 20240601
# A figure resting on fewer patients than this is marked thin evidence: its interval is as wide
# as the bootstrap can draw ([0, 1] over two patients) and says little (docs/evaluation.md).
MIN_PATIENTS = 10


class Estimate(BaseModel):
    value: float | None
    low: float | None = None
    high: float | None = None
    n: int = 0
    n_clusters: int | None = None
    method: str = ""
    # samples of the figure's population it could not count (None: not counted for this figure)
    unscored: int | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def patients(self) -> int:
        """The independent units the figure rests on: patients, else its n."""
        return self.n_clusters if self.n_clusters is not None else self.n

    @computed_field  # type: ignore[prop-decorator]
    @property
    def thin(self) -> bool:
        """Fewer patients than MIN_PATIENTS behind a figure that has a value."""
        return self.value is not None and self.patients < MIN_PATIENTS

    @property
    def note(self) -> str:
        """What stands beside the figure: its unscored samples and thin evidence ("" if none)."""
        parts = []
        if self.unscored:
            parts.append(f"{self.unscored} unscored")
        if self.thin:
            p = self.patients
            parts.append(f"{p} patient{'s' if p != 1 else ''}, fewer than {MIN_PATIENTS}")
        return "; ".join(parts)


def wilson(successes: int, n: int, confidence: float = 0.95) -> Estimate:
    """Wilson score interval for successes/n."""
    if n <= 0:
        return Estimate(value=None, n=0, method="wilson")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be within 0..n, got {successes}/{n}")
    # the normal quantile as scipy.stats.norm.ppf computes it (its _ppf is ndtri), without
    # importing scipy.stats: 0.5 s of CPU in every process that prints a leaderboard
    from scipy.special import ndtri

    z = float(ndtri(0.5 + confidence / 2))
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact bounds at the edges
    high = 1.0 if successes == n else min(1.0, centre + half)
    return Estimate(value=p, low=low, high=high, n=n, method="wilson")


def _cluster_index(clusters: Sequence[Hashable]) -> tuple[np.ndarray, int]:
    ids: dict[Hashable, int] = {}
    idx = np.array([ids.setdefault(c, len(ids)) for c in clusters], dtype=np.int64)
    return idx, len(ids)


def bootstrap_mean(
    values: Sequence[float],
    clusters: Sequence[Hashable] | None = None,
    *,
    n_boot: int = DEFAULT_BOOT,
    seed: int = DEFAULT_SEED,
    confidence: float = 0.95,
) -> Estimate:
    """Mean with a percentile bootstrap interval, resampling clusters (default: each value)."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return Estimate(value=None, n=0, method="bootstrap")
    clusters = list(range(len(v))) if clusters is None else list(clusters)
    if len(clusters) != len(v):
        raise ValueError(f"{len(v)} values but {len(clusters)} cluster ids")
    idx, k = _cluster_index(clusters)
    sums = np.bincount(idx, weights=v, minlength=k)
    counts = np.bincount(idx, minlength=k).astype(float)
    rng = np.random.default_rng(seed)
    draw = rng.integers(0, k, size=(n_boot, k))
    means = sums[draw].sum(axis=1) / counts[draw].sum(axis=1)
    alpha = (1 - confidence) / 2
    return Estimate(
        value=float(v.mean()),
        low=float(np.quantile(means, alpha)),
        high=float(np.quantile(means, 1 - alpha)),
        n=int(v.size),
        n_clusters=k,
        method="bootstrap-cluster" if k < v.size else "bootstrap",
    )


def cluster_resamples(
    clusters: Sequence[Hashable], n_boot: int, seed: int = DEFAULT_SEED
) -> list[np.ndarray]:
    """Item indices of n_boot bootstrap resamples that draw whole clusters with replacement."""
    idx, k = _cluster_index(clusters)
    members = [np.flatnonzero(idx == j) for j in range(k)]
    draws = np.random.default_rng(seed).integers(0, k, size=(n_boot, k))
    return [np.concatenate([members[j] for j in row]) for row in draws]


def percentile_interval(
    boots: Sequence[float], confidence: float = 0.95
) -> tuple[float | None, float | None]:
    if not len(boots):
        return None, None
    alpha = (1 - confidence) / 2
    return float(np.quantile(boots, alpha)), float(np.quantile(boots, 1 - alpha))


class McNemar(BaseModel):
    b: int  # first right, second wrong
    c: int  # first wrong, second right
    statistic: float | None
    p_value: float
    exact: bool


def mcnemar(b: int, c: int, exact_below: int = 25) -> McNemar:
    """McNemar's test on the discordant counts of a paired 2x2 table."""
    from scipy import stats as st  # here, not at import: 0.5 s of every process's start

    n = b + c
    if n == 0:
        return McNemar(b=b, c=c, statistic=None, p_value=1.0, exact=True)
    if n < exact_below:
        p = min(1.0, 2 * float(st.binom.cdf(min(b, c), n, 0.5)))
        return McNemar(b=b, c=c, statistic=None, p_value=p, exact=True)
    chi2 = (abs(b - c) - 1) ** 2 / n
    return McNemar(b=b, c=c, statistic=chi2, p_value=float(st.chi2.sf(chi2, 1)), exact=False)


class PairedDifference(BaseModel):
    difference: Estimate  # mean(a) - mean(b)
    p_value: float  # two-sided, from the bootstrap distribution


def paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    clusters: Sequence[Hashable] | None = None,
    *,
    n_boot: int = DEFAULT_BOOT,
    seed: int = DEFAULT_SEED,
) -> PairedDifference:
    """Difference of means of two models on the same units, clustered bootstrap."""
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} vs {len(b)}")
    diffs = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    est = bootstrap_mean(diffs.tolist(), clusters, n_boot=n_boot, seed=seed)
    if est.value is None:
        return PairedDifference(difference=est, p_value=1.0)
    clusters = list(range(len(diffs))) if clusters is None else list(clusters)
    idx, k = _cluster_index(clusters)
    sums = np.bincount(idx, weights=diffs, minlength=k)
    counts = np.bincount(idx, minlength=k).astype(float)
    draw = np.random.default_rng(seed).integers(0, k, size=(n_boot, k))
    means = sums[draw].sum(axis=1) / counts[draw].sum(axis=1)
    p = 2 * min(float(np.mean(means <= 0)), float(np.mean(means >= 0)))
    return PairedDifference(difference=est, p_value=min(1.0, p))


def cohen_kappa(a: Sequence[Hashable], b: Sequence[Hashable]) -> float | None:
    """Cohen's kappa of two raters' labels on the same items (None when undefined)."""
    if len(a) != len(b):
        raise ValueError(f"raters labelled {len(a)} and {len(b)} items")
    n = len(a)
    if n == 0:
        return None
    labels = sorted(set(a) | set(b), key=str)
    po = sum(x == y for x, y in zip(a, b, strict=True)) / n
    pe = sum((list(a).count(lab) / n) * (list(b).count(lab) / n) for lab in labels)
    if pe == 1.0:
        return None
    return (po - pe) / (1 - pe)


def median(values: Sequence[float]) -> float | None:
    return float(np.median(values)) if len(values) else None
