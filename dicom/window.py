"""Windowing: which voxels are head, the display window, and the mapping to 8-bit grey.

Two exact routes to the same numbers. A float volume (a DWI trace, RGB, per-slice rescaled
or NIfTI data) is sorted once (dicom.percentile.percentile_of_sorted). A volume of stored
integers under one modality LUT (most MR and CT) is never converted as a whole: its histogram
gives the order statistics (percentile_of_counts), its head mask is a comparison of stored
values, and its slices go to grey through a table with one entry per stored value, computed
with the float32 arithmetic dicom.pixels applies to each pixel. Both routes give the window,
head mask and grey levels the float route gives for the same pixels, bit for bit.

The renderer gives both routes a regular in-plane subsample of the volume (``stats_sample``:
every slice, every n-th row and column, about a million voxels; smaller volumes whole) rather
than every voxel, which makes the histogram or sort, a large part of a cold render, 2-8x
cheaper on big volumes. Measured on the corpus: the head threshold does not move, and the
window moves by at most half a grey level on BRAINIX and 7 of 255 on the worst case (the GE
MP-RAGE, mostly positive background noise, whose head threshold sits in a sparse tail of its
histogram); tests/test_render_fast.py pins both. The helpers stay exact on the data given.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dicom.display import RenderError
from dicom.percentile import counts_u16, percentile_of_counts, percentile_of_sorted
from dicom.records import SequenceClass, SeriesInfo

# Neuro CT windows, level/width in HU.
CT_WINDOWS: dict[str, tuple[float, float]] = {
    "brain": (40.0, 80.0),
    "subdural": (75.0, 215.0),
    "stroke": (40.0, 40.0),
    "bone": (600.0, 2800.0),
    "soft": (40.0, 380.0),
}
MR_PERCENTILES = (0.5, 99.5)
# The MR window is taken inside the skull: the head mask with each slice's holes filled (the
# skull's dark ring, the ventricles), its largest component, eroded by this much from the head's
# surface (scalp and skull are about 10-12 mm together). Computed on a subsample of about
# BRAIN_SAMPLE voxels: a mask, not an outline, so a coarse grid serves.
BRAIN_EROSION_MM = 15.0
BRAIN_VOXEL_MM = 4.0  # the grid of the mask: every n-th voxel along each axis, about this apart
BRAIN_SAMPLE = 1 << 18  # and at most about this many voxels
BRAIN_MIN_FRACTION = 0.05  # of the head's voxels: less, and no brain region was found
CT_HEAD_HU = -300.0  # above: head (soft tissue, bone), below: air
STATS_SAMPLE = 1 << 20  # voxels that decide the head threshold and the window (about)
Percentiles = Callable[[tuple[float, ...]], Any]


@dataclass(frozen=True)
class HeadStats:
    """Which voxels are head (``data > threshold``) and the percentiles of their values.

    ``threshold`` is in the units of the data it was computed from (stored values for a
    StoredLUT route); None: every voxel. ``percentiles(q)`` is over the head's values after
    the modality LUT (over every voxel when no voxel is head).
    """

    threshold: float | None
    percentiles: Percentiles
    step: int = 1  # computed from every step-th row and column of each slice
    # Percentiles over the brain region (see ``brain_region``) after the modality LUT; None when
    # not sought (CT, RGB) or not found, and then ``brain_note`` says why when it was sought.
    brain: Percentiles | None = None
    brain_note: str = ""


def stats_sample(data: np.ndarray) -> tuple[np.ndarray, int]:
    """A regular subsample of a volume (i, j, k[, channel]) for its head statistics: every
    slice, every ``step``-th column and row, about STATS_SAMPLE voxels (a view), and ``step``."""
    voxels = int(np.prod(data.shape[:3]))
    step = max(1, math.isqrt(voxels // STATS_SAMPLE))
    return (data[::step, ::step] if step > 1 else data), step


def volume_head_stats(
    data: np.ndarray,
    lut: StoredLUT | None,
    ct: bool,
    rgb: bool = False,
    spacing: tuple[float, float, float] | None = None,
) -> HeadStats:
    """Head statistics of a whole volume (stored values through ``lut`` when given), from its
    :func:`stats_sample`; the order of the values is irrelevant, so the volume as stored.

    For MR with a voxel ``spacing`` (mm, along the volume's axes), also the percentiles inside
    the brain (:func:`brain_stats`)."""
    sample, step = stats_sample(data)
    stats = stored_head_stats(sample, lut, ct) if lut is not None else head_stats(sample, ct, rgb)
    stats = replace(stats, step=step)
    if ct or rgb or spacing is None or stats.threshold is None:
        return stats
    return brain_stats(data, lut, stats, spacing)


def brain_stats(
    data: np.ndarray,
    lut: StoredLUT | None,
    stats: HeadStats,
    spacing: tuple[float, float, float],
) -> HeadStats:
    """``stats`` with the percentiles of the voxels inside the skull (``brain_region`` of a
    regular subsample about BRAIN_VOXEL_MM apart, at most about BRAIN_SAMPLE voxels), or with
    the reason none were found. Stored values and float values give the same numbers
    (histogram / sort)."""
    assert stats.threshold is not None
    steps = [max(1, int(BRAIN_VOXEL_MM // mm)) if mm > 0 else 1 for mm in spacing]
    size = [-(-n // k) for n, k in zip(data.shape[:3], steps, strict=True)]
    more = math.isqrt(int(np.prod(size)) // BRAIN_SAMPLE)
    if more > 1:  # a grid still too fine: coarser in-plane
        steps[0], steps[1] = steps[0] * more, steps[1] * more
    coarse = data[:: steps[0], :: steps[1], :: steps[2]]
    head = coarse > stats.threshold
    grid = (spacing[0] * steps[0], spacing[1] * steps[1], spacing[2] * steps[2])
    region, note = brain_region(head, grid)
    if region is None:
        return replace(stats, brain_note=note)
    values = coarse[region]
    if lut is not None:
        counts = counts_u16(lut.index(values))
        brain = functools.partial(percentile_of_counts, lut.values[: counts.size], counts)
    else:
        values = values.astype(np.float32, copy=False)
        values.sort()
        brain = functools.partial(percentile_of_sorted, values)
    return replace(stats, brain=brain)


def brain_region(
    head: np.ndarray, spacing: tuple[float, float, float]
) -> tuple[np.ndarray | None, str]:
    """The voxels inside the skull of a head mask (i, j, slice), or None and why not.

    Each slice filled across the head (the skull's dark ring and the CSF lie inside it), then
    eroded by BRAIN_EROSION_MM, a box per axis in voxels of ``spacing`` (what is thinner than
    twice that, a neck or a marker, goes). Beyond the volume counts as outside the head, so
    the end slices of a stack that stops in the skull base go too: a sample of the brain, not
    all of it, decides the window; a slab too thin for that keeps its slices. Last, the voxels
    below the head threshold (bone, air) are left out."""
    from scipy import ndimage  # imported here: ~0.1 s, and only MR windows need it

    n_head = int(np.count_nonzero(head))
    if n_head == 0:
        return None, "no voxel above the head threshold"
    # Each slice filled between the head's first and last voxel along its rows and along its
    # columns (the skull's dark ring, the ventricles and the sinuses are inside both spans):
    # four running ORs, a few times cheaper than labelling the background.
    filled = np.ones_like(head)
    for axis in (0, 1):
        filled &= np.logical_or.accumulate(head, axis=axis)
        filled &= np.flip(np.logical_or.accumulate(np.flip(head, axis), axis=axis), axis)
    region = filled.view(np.uint8)
    for axis in (0, 1, 2):
        r = round(BRAIN_EROSION_MM / spacing[axis]) if spacing[axis] > 0 else 0
        if r == 0:
            continue
        eroded = ndimage.minimum_filter1d(region, 2 * r + 1, axis=axis, mode="constant")
        if axis == 2 and np.count_nonzero(eroded) < BRAIN_MIN_FRACTION * n_head:
            break  # a slab too thin to erode through-plane: its in-plane core serves
        region = eroded
    inside = region.view(bool) & head  # tissue inside the skull, not its dark bone or air
    n_inside = int(np.count_nonzero(inside))
    if n_inside < BRAIN_MIN_FRACTION * n_head:
        return None, (
            f"nothing of the head is more than {BRAIN_EROSION_MM:g} mm inside its surface "
            "(a small or cut field of view)"
        )
    return inside, ""


def is_ct(series: SeriesInfo) -> bool:
    return series.series_class is SequenceClass.CT or series.modality == "CT"


def head_stats(data: np.ndarray, ct: bool, rgb: bool = False) -> HeadStats:
    """Head threshold of a float volume: CT above -300 HU; MR above a tenth of the 99th
    percentile of the positive values (one sort serves that and the window percentiles)."""
    if rgb:
        return HeadStats(None, functools.partial(np.percentile, data))
    if ct:
        return HeadStats(CT_HEAD_HU, functools.partial(_percentiles_above, data, CT_HEAD_HU))
    # The voxels with every axis in increasing memory order (a view), so that they are read in
    # storage order and flattened without a copy; the order of values is irrelevant.
    flips = tuple(axis for axis, stride in enumerate(data.strides) if stride < 0)
    flat = (np.flip(data, flips) if flips else data).ravel(order="K")
    positive = flat[flat > 0]
    positive.sort()
    if positive.size == 0:
        return HeadStats(math.inf, functools.partial(np.percentile, flat))
    threshold = 0.1 * float(percentile_of_sorted(positive, 99.0))
    # threshold > 0, so the voxels above it are exactly the positive values above it: the
    # tail of the sorted values after the float32 threshold (``data > threshold`` compares a
    # Python float with float32 data as float32).
    first = int(np.searchsorted(positive, np.float32(threshold), side="right"))
    return HeadStats(threshold, functools.partial(percentile_of_sorted, positive[first:]))


def head_mask(data: np.ndarray, ct: bool) -> np.ndarray:
    """Voxels that belong to the head (not air): a threshold suits both CT and MR here."""
    threshold = head_stats(data, ct).threshold
    assert threshold is not None  # only RGB volumes have none
    return data > threshold


def _percentiles_above(data: np.ndarray, threshold: float, q: tuple[float, ...]) -> Any:
    inside = data[data > threshold]
    return np.percentile(inside if inside.size else data.ravel(), q)


class StoredLUT:
    """The modality LUT of a volume of stored integers (uint8/16, int8/16), tabulated: entry
    ``i`` is the float32 value of stored value ``i + offset``, computed as dicom.pixels does."""

    def __init__(self, dtype: np.dtype, slope: float, intercept: float) -> None:
        if dtype.kind not in "iu" or dtype.itemsize > 2:
            raise ValueError(f"no stored-value table for {dtype}")
        self.dtype = dtype
        self.offset = -(1 << (8 * dtype.itemsize - 1)) if dtype.kind == "i" else 0
        n = 1 << (8 * dtype.itemsize)
        self.values = (np.arange(n, dtype=np.int32) + self.offset).astype(np.float32)
        if slope != 1.0 or intercept != 0.0:
            self.values *= np.float32(slope)
            self.values += np.float32(intercept)

    def index(self, stored: np.ndarray) -> np.ndarray:
        """The table index of each stored value (order-preserving; unsigned, same layout)."""
        if self.offset == 0:
            return stored
        unsigned = stored.view(np.dtype(f"u{self.dtype.itemsize}"))
        return unsigned ^ unsigned.dtype.type(-self.offset)

    def cut(self, threshold: float) -> int:
        """The stored value ``c`` such that ``stored > c`` exactly when ``value > threshold``
        (float32 comparison, as on the float volume)."""
        below = int(np.searchsorted(self.values, np.float32(threshold), side="right"))
        return below - 1 + self.offset


def stored_head_stats(stored: np.ndarray, lut: StoredLUT, ct: bool) -> HeadStats:
    """``head_stats`` of the float volume ``lut.values[lut.index(stored)]``, exactly, from
    the stored values; the threshold is in stored units."""
    counts: np.ndarray | None = None

    def histogram() -> np.ndarray:
        nonlocal counts
        if counts is None:
            counts = counts_u16(lut.index(stored))
        return counts

    def above(first: int, q: tuple[float, ...]) -> Any:
        c = histogram()
        if first >= c.size or not c[first:].any():
            first = 0  # no voxel is head: every voxel
        return percentile_of_counts(lut.values[first : c.size], c[first:], q)

    if ct:
        cut = lut.cut(CT_HEAD_HU)
        return HeadStats(cut, functools.partial(above, cut + 1 - lut.offset))
    c = histogram()
    values = lut.values[: c.size]
    first_positive = int(np.searchsorted(values, np.float32(0.0), side="right"))
    if not c[first_positive:].any():
        return HeadStats(np.iinfo(lut.dtype).max, functools.partial(above, c.size))
    p99 = percentile_of_counts(values[first_positive:], c[first_positive:], 99.0)
    threshold = 0.1 * float(p99)
    cut = lut.cut(threshold)
    return HeadStats(cut, functools.partial(above, cut + 1 - lut.offset))


def window_for(series: SeriesInfo, stats: HeadStats, name: str) -> tuple[float, float, str]:
    """(center, width, description) of the display window."""
    ct = is_ct(series)
    if name == "auto":
        name = "brain" if ct else "percentile"
    if name in CT_WINDOWS:
        if not ct:
            raise RenderError(
                f"window {name!r} is a CT (Hounsfield) preset; series {series.key} is {series.modality}"
            )
        c, w = CT_WINDOWS[name]
        return c, w, f"CT {name} {c:g}/{w:g} HU"
    if re.fullmatch(r"-?\d+(\.\d+)?/\d+(\.\d+)?", name):
        c, w = (float(v) for v in name.split("/"))
        if not w > 0:  # a width of 0 divides by zero: every pixel black or white
            raise RenderError(f"window {name!r}: the width (after the /) must be more than 0")
        return c, w, f"custom {c:g}/{w:g}"
    if name == "percentile":
        if stats.brain is not None:
            lo, hi = (float(v) for v in stats.brain(MR_PERCENTILES))
            where = f"inside the brain (head less {BRAIN_EROSION_MM:g} mm)"
        else:
            lo, hi = (float(v) for v in stats.percentiles(MR_PERCENTILES))
            where = "inside the head" + (
                f" (no brain region: {stats.brain_note})" if stats.brain_note else ""
            )
        if hi <= lo:
            hi = lo + 1.0
        sampled = f", 1 in {stats.step}x{stats.step} voxels in-plane" if stats.step > 1 else ""
        return (
            (lo + hi) / 2,
            hi - lo,
            f"MR p{MR_PERCENTILES[0]:g}-p{MR_PERCENTILES[1]:g} {where}{sampled}",
        )
    raise RenderError(
        f"unknown window {name!r}: use auto, {', '.join(CT_WINDOWS)}, percentile or CENTER/WIDTH"
    )


def to_uint8(img: np.ndarray, center: float, width: float, rgb: bool = False) -> np.ndarray:
    """Grey levels 0..255 of float values: ((x - lo) / width) * 255, rounded, clipped."""
    if rgb:
        return np.clip(img, 0, 255).astype(np.uint8)
    lo = center - width / 2
    scaled = img.astype(np.float64)  # computed in place, in this order
    scaled -= lo
    scaled /= width
    scaled *= 255.0
    np.rint(scaled, out=scaled)
    return np.clip(scaled, 0, 255, out=scaled).astype(np.uint8)


def stored_to_uint8(
    lut: StoredLUT, center: float, width: float
) -> Callable[[np.ndarray], np.ndarray]:
    """``to_uint8`` of stored values through the LUT, as one table lookup per pixel."""
    grey = to_uint8(lut.values, center, width)
    return lambda stored: np.take(grey, lut.index(stored))
