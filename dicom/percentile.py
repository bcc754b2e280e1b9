"""np.percentile from a sorted array: the same numbers, several times faster on big volumes.

numpy's percentile selects order statistics with introselect (``partition``), which on this
project's hardware costs ~15 ns per value; numpy's vectorised ``sort`` costs ~3 ns. Rendering
asks for two percentile sets over the millions of voxels inside the head, so it sorts once and
reads the order statistics here. The interpolation is numpy's own (its 'linear' method
helpers), so results are bit-identical; a self-check against ``np.percentile`` runs at first
use, and if numpy's internals are missing or disagree, ``np.percentile`` is used instead.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

_helpers: Any = None
_checked: bool | None = None


def _load_helpers() -> Any:
    try:
        impl: Any = importlib.import_module("numpy.lib._function_base_impl")
        return impl, impl._QuantileMethods["linear"]
    except (ImportError, AttributeError, KeyError):
        return None


def _from_sorted(values: np.ndarray, q: float | tuple[float, ...]) -> Any:
    """numpy 2's ``_quantile`` (linear method, 1-D, no NaN) with the partition skipped."""
    impl, method = _helpers
    weak_q = type(q) in (int, float)
    quantiles = np.true_divide(q, 100, out=...)
    virtual = np.asanyarray(method["get_virtual_index"](values.shape[0], quantiles))
    previous_idx, next_idx = impl._get_indexes(values, virtual, values.shape[0])
    previous, nxt = values[previous_idx], values[next_idx]
    gamma = impl._get_gamma(virtual, previous_idx, method)
    gamma = float(gamma) if weak_q else gamma.reshape(virtual.shape)
    return impl._lerp(previous, nxt, gamma)


def _self_check() -> bool:
    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 200, 1001):
        sample = (rng.standard_normal(n) * 300).astype(np.float32)
        ordered = np.sort(sample)
        for q in (99.0, (0.5, 99.5), 50, (0.0, 100.0)):
            want, got = np.percentile(sample, q), _from_sorted(ordered, q)
            if type(want) is not type(got) or np.asarray(want).dtype != np.asarray(got).dtype:
                return False
            if not np.array_equal(np.asarray(want), np.asarray(got)):
                return False
    return True


def percentile_of_sorted(values: np.ndarray, q: float | tuple[float, ...]) -> Any:
    """``np.percentile(x, q)`` given ``values = np.sort(x)`` (1-D, finite, not empty)."""
    global _helpers, _checked
    if _checked is None:
        _helpers = _load_helpers()
        _checked = _helpers is not None and _self_check()
    if not _checked:
        return np.percentile(values, q)
    return _from_sorted(values, q)
