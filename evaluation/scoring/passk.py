"""pass@k, both kinds, named apart.

- sampled pass@k: n independent samples of which c are correct; the chance that at least one
  of k drawn without replacement is correct, estimated without bias as 1 - C(n-c,k)/C(n,k)
  (Chen et al. 2021), computed as a product so that large n does not overflow.
- ranked pass@k: the truth is within the top k of one ranked differential.
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_KS: tuple[int, ...] = (1, 5)


def sampled_pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of P(at least one of k samples is correct) from c correct of n."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n} (draw more samples for pass@{k})")
    if n - c < k:
        return 1.0
    # 1 - prod_{i=n-c+1}^{n} (1 - k/i)  ==  1 - C(n-c,k)/C(n,k)
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def rank_of_truth(correct: Sequence[bool]) -> int | None:
    """1-based position of the first correct item of a ranked list, or None."""
    for i, ok in enumerate(correct, start=1):
        if ok:
            return i
    return None


def ranked_pass_at_k(rank: int | None, k: int) -> float:
    """1.0 when the truth is within the top k of the differential."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return 1.0 if rank is not None and rank <= k else 0.0
