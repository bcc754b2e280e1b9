"""Statistics against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from evaluation.scoring.stats import (
    bootstrap_mean,
    cohen_kappa,
    mcnemar,
    paired_bootstrap,
    wilson,
)


def test_wilson_interval_for_8_of_10() -> None:
    # p = 0.8, z = 1.95996: centre (0.8 + z^2/20)/(1 + z^2/10) = 0.71674,
    # half-width z*sqrt(0.016 + z^2/400)/(1 + z^2/10) = 0.22658
    e = wilson(8, 10)
    assert e.value == 0.8
    assert e.low == pytest.approx(0.4902, abs=1e-4)
    assert e.high == pytest.approx(0.9433, abs=1e-4)


def test_wilson_edges() -> None:
    assert wilson(0, 10).low == 0.0
    assert wilson(10, 10).high == 1.0
    assert wilson(0, 0).value is None


def test_mcnemar_exact_for_small_counts() -> None:
    # b=1, c=9: two-sided exact binomial p = 2 * P(X <= 1 | n=10, 0.5) = 2 * 11/1024
    r = mcnemar(1, 9)
    assert r.exact
    assert r.p_value == pytest.approx(22 / 1024)


def test_mcnemar_chi_square_with_continuity_for_large_counts() -> None:
    # b=10, c=30: chi2 = (|10-30| - 1)^2 / 40 = 9.025, p = 0.002663
    r = mcnemar(10, 30)
    assert not r.exact
    assert r.statistic == pytest.approx(9.025)
    assert r.p_value == pytest.approx(0.002663, abs=2e-6)


def test_mcnemar_no_discordant_pairs() -> None:
    assert mcnemar(0, 0).p_value == 1.0


def test_cohen_kappa_known_table() -> None:
    # 2x2 table [[20, 5], [10, 15]]: po = 0.7, pe = (25*30 + 25*20)/2500 = 0.5, kappa = 0.4
    a = ["y"] * 25 + ["n"] * 25
    b = ["y"] * 20 + ["n"] * 5 + ["y"] * 10 + ["n"] * 15
    assert cohen_kappa(a, b) == pytest.approx(0.4)
    assert cohen_kappa(a, a) == pytest.approx(1.0)


def test_bootstrap_is_seeded_and_covers_the_mean() -> None:
    values = list(np.random.default_rng(1).random(200))
    a = bootstrap_mean(values, seed=7)
    b = bootstrap_mean(values, seed=7)
    assert a == b
    assert a.low is not None and a.high is not None
    assert a.low < a.value < a.high  # type: ignore[operator]


def test_clustered_bootstrap_widens_with_clustered_data() -> None:
    # 20 patients x 10 samples each; outcomes identical within a patient (fully clustered).
    rng = np.random.default_rng(3)
    per_patient = rng.integers(0, 2, size=20)
    values = [float(v) for v in per_patient for _ in range(10)]
    clusters = [p for p in range(20) for _ in range(10)]
    naive = bootstrap_mean(values, seed=1)
    clustered = bootstrap_mean(values, clusters, seed=1)
    assert clustered.method == "bootstrap-cluster" and clustered.n_clusters == 20
    assert naive.value == clustered.value
    width = lambda e: e.high - e.low  # noqa: E731
    assert width(clustered) > 2.5 * width(naive)  # ~sqrt(10) wider in theory


def test_paired_bootstrap_detects_a_real_difference() -> None:
    a = [1.0] * 40 + [0.0] * 10
    b = [1.0] * 20 + [0.0] * 30
    r = paired_bootstrap(a, b, seed=2)
    assert r.difference.value == pytest.approx(0.4)
    assert r.difference.low > 0  # type: ignore[operator]
    assert r.p_value < 0.01
    same = paired_bootstrap(a, a, seed=2)
    assert same.p_value == 1.0
