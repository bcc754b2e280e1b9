"""pass@k: the unbiased estimator against brute-force enumeration; ranked pass@k apart."""

from __future__ import annotations

from itertools import combinations
from math import comb

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evaluation.scoring.passk import (
    rank_of_truth,
    ranked_pass_at_k,
    sampled_pass_at_k,
)


def brute_force(n: int, c: int, k: int) -> float:
    """Fraction of all k-subsets of n samples (c of them correct) holding a correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 12).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))
    )
)
def test_sampled_pass_at_k_equals_enumeration(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    assert sampled_pass_at_k(n, c, k) == pytest.approx(brute_force(n, c, k), abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 400).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))
    )
)
def test_sampled_pass_at_k_is_stable_for_large_n(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    value = sampled_pass_at_k(n, c, k)
    exact = 1 - comb(n - c, k) / comb(n, k)  # exact integers, then one division
    assert 0.0 <= value <= 1.0
    assert value == pytest.approx(exact, abs=1e-9)


def test_sampled_pass_at_k_known_values() -> None:
    assert sampled_pass_at_k(5, 1, 1) == pytest.approx(0.2)
    assert sampled_pass_at_k(5, 1, 5) == 1.0
    assert sampled_pass_at_k(5, 0, 5) == 0.0
    assert sampled_pass_at_k(10, 3, 5) == pytest.approx(1 - comb(7, 5) / comb(10, 5))


def test_sampled_pass_at_k_rejects_too_few_samples() -> None:
    with pytest.raises(ValueError, match="draw more samples"):
        sampled_pass_at_k(3, 1, 5)
    with pytest.raises(ValueError):
        sampled_pass_at_k(3, 4, 1)


def test_ranked_pass_at_k_is_about_one_differential() -> None:
    rank = rank_of_truth([False, False, True, False])
    assert rank == 3
    assert ranked_pass_at_k(rank, 1) == 0.0
    assert ranked_pass_at_k(rank, 3) == 1.0
    assert ranked_pass_at_k(rank, 5) == 1.0
    assert ranked_pass_at_k(rank_of_truth([False, False]), 5) == 0.0
