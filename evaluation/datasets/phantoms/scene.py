"""A case's head on one grid: normal tissue fractions plus lesion compartments, and its signal.

Lesions are patched into local boxes of the cached normal grid: mass effect first (brain
compartments pushed outward, the skull left alone), then each compartment either replaces
tissue (a tumour, a haematoma) or turns part of the grey/white matter into modified tissue
(oedema, infarct, plaque). The signal of a voxel is the sum of its compartments' signals,
weighted by their fractions: the partial-volume model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from scipy import ndimage

from evaluation.datasets.phantoms.grids import Grid, GridTissues
from evaluation.datasets.phantoms.shapes import MassEffect, Shape
from evaluation.datasets.phantoms.tissue import (
    BRAIN_TISSUES,
    TISSUES,
    Modifier,
    Protocol,
    TissueParams,
    Weighting,
    air_value,
    normal_tissues,
    signal,
)


@dataclass(frozen=True)
class Component:
    """One compartment of a lesion."""

    name: str  # "core", "rim", "oedema", ... (components of a lesion share names across bases)
    shape: Shape
    mode: Literal["replace", "modify"]
    modifier: Modifier
    base: str = "wm"  # replace: the tissue whose properties the modifier starts from
    strength: tuple[tuple[str, float], ...] = (("gm", 1.0), ("wm", 1.0))  # modify: per tissue
    in_mask: bool = True  # part of the labelled lesion (oedema is not)

    def params(self, field_t: float, tissue: str | None = None) -> TissueParams:
        base = tissue if self.mode == "modify" and tissue else self.base
        return self.modifier.apply(normal_tissues(field_t)[base])


@dataclass
class Lesion:
    """A lesion as the generator planned it; ground-truth facts are filled in later."""

    kind: str  # ms_plaque, infarct, haematoma, glioblastoma, metastasis, meningioma, abscess
    label: str  # LesionTruth.type
    components: list[Component]
    centre: tuple[float, float, float]
    mass_effect: MassEffect | None = None
    enhancement: str = "none"  # an evaluation.case.Enhancement value
    fine_region: bool = False  # small white-matter lesion: periventricular/juxtacortical names
    extra_axial: bool = False
    facts: dict[str, object] = field(default_factory=dict)

    def box(self, mass_effect: bool = True) -> tuple[np.ndarray, np.ndarray]:
        los, his = zip(*(c.shape.box() for c in self.components), strict=True)
        lo, hi = np.min(np.stack(los), axis=0), np.max(np.stack(his), axis=0)
        if mass_effect and self.mass_effect is not None:
            mlo, mhi = self.mass_effect.box()
            lo, hi = np.minimum(lo, mlo), np.maximum(hi, mhi)
        return lo, hi


@dataclass
class Part:
    """A lesion compartment on a patch: its fraction map and where its properties come from."""

    lesion: int
    component: Component
    tissue: str | None  # the base tissue a modify-mode part was taken from
    fraction: np.ndarray  # on ``sub``
    sub: tuple[slice, slice, slice]  # where ``fraction`` lies, relative to the patch box


@dataclass
class Patch:
    box: tuple[slice, slice, slice]
    base: np.ndarray  # (T, *box) normal fractions after mass effect and lesion takeover
    parts: list[Part]


@dataclass
class Scene:
    grid: Grid
    tissues: GridTissues
    patches: list[Patch]

    def signal(self, proto: Protocol, field_t: float, b: float | None = None) -> np.ndarray:
        """Noise-free image of the whole grid (MR arbitrary units, CT HU), float32."""
        normal = normal_tissues(field_t)
        svals = np.array([signal(normal[t], proto, field_t, b) for t in TISSUES], np.float32)
        air = air_value(proto)
        out = _mix(self.tissues.fractions, svals, air)
        for p in self.patches:
            local = _mix(p.base, svals, air)
            for part in p.parts:
                s = signal(part.component.params(field_t, part.tissue), proto, field_t, b)
                local[part.sub] += part.fraction * np.float32(s - air)
            out[p.box] = local
        return out

    def adc(self, field_t: float) -> np.ndarray:
        """True ADC (10^-3 mm^2/s), fraction-weighted; air 0."""
        normal = normal_tissues(field_t)
        vals = np.array([normal[t].adc for t in TISSUES], np.float32)
        out = _mix(self.tissues.fractions, vals, 0.0)
        for p in self.patches:
            local = _mix(p.base, vals, 0.0)
            for part in p.parts:
                adc = part.component.params(field_t, part.tissue).adc
                local[part.sub] += part.fraction * np.float32(adc)
            out[p.box] = local
        return out


def patch_values(
    patch: Patch, field_t: float, value: Callable[[TissueParams], float]
) -> np.ndarray:
    """Noise-free per-voxel value of one patch for any tissue property or signal."""
    normal = normal_tissues(field_t)
    out = np.zeros(patch.base.shape[1:], np.float32)
    for t, name in enumerate(TISSUES):
        out += patch.base[t] * np.float32(value(normal[name]))
    for part in patch.parts:
        v = value(part.component.params(field_t, part.tissue))
        out[part.sub] += part.fraction * np.float32(v)
    return out


def _mix(fractions: np.ndarray, values: np.ndarray, air: float) -> np.ndarray:
    """sum_t f_t * (v_t - air) + air (one matrix-vector product over the tissue axis)."""
    t = fractions.shape[0]
    out = (values.astype(np.float32) - np.float32(air)) @ fractions.reshape(t, -1)
    out += np.float32(air)
    return out.reshape(fractions.shape[1:]).astype(np.float32, copy=False)


def _clusters(boxes: list[tuple[slice, slice, slice] | None]) -> list[list[int]]:
    """Group lesions whose boxes overlap (transitively), so each group shares one patch."""
    idx = [i for i, b in enumerate(boxes) if b is not None]
    groups: list[list[int]] = []
    for i in idx:
        bi = boxes[i]
        assert bi is not None
        hit = [
            g
            for g in groups
            if any(_overlap(bi, boxes[j]) for j in g)  # type: ignore[arg-type]
        ]
        merged = [i] + [j for g in hit for j in g]
        groups = [g for g in groups if g not in hit] + [sorted(merged)]
    return sorted(groups)


def _overlap(a: tuple[slice, ...], b: tuple[slice, ...]) -> bool:
    return all(x.start < y.stop and y.start < x.stop for x, y in zip(a, b, strict=True))


def _union(boxes: list[tuple[slice, slice, slice]]) -> tuple[slice, slice, slice]:
    return tuple(  # type: ignore[return-value]
        slice(min(b[v].start for b in boxes), max(b[v].stop for b in boxes)) for v in range(3)
    )


def _deform(
    gt: GridTissues, box: tuple[slice, slice, slice], base: np.ndarray, me: MassEffect
) -> None:
    """Push the brain compartments of ``base`` (a patch) away from the mass, in place."""
    g = gt.grid
    lo, hi = me.box()
    own = g.box(lo, hi)
    if own is None:
        return
    inner = intersect(box, own)
    if inner is None:
        return
    sub = inner[0]  # the mass effect's reach, relative to the patch
    absolute = tuple(
        slice(b.start + s.start, b.start + s.stop) for b, s in zip(box, sub, strict=True)
    )
    shape = tuple(s.stop - s.start for s in sub)
    x, y, z = g.points(absolute)  # type: ignore[arg-type]
    x, y, z = (np.broadcast_to(a[..., 0], shape) for a in (x, y, z))
    sx, sy, sz = me.source(x, y, z)
    src = {0: sx, 1: sy, 2: sz}
    moved = (np.abs(sx - x) + np.abs(sy - y) + np.abs(sz - z)) > 1e-3
    vox = [((src[g.axes[v]] - g.origin[g.axes[v]]) / g.steps[v])[moved] for v in range(3)]
    local = base[(slice(None), *sub)]  # a view: writes go to ``base``
    brain_idx = [TISSUES.index(t) for t in BRAIN_TISSUES]
    brain_before = local[brain_idx].sum(axis=0)
    for ti in brain_idx:
        sampled = ndimage.map_coordinates(gt.fractions[ti], vox, order=1, mode="nearest")
        local[ti][moved] = sampled.astype(np.float32) * np.float32(gt.scale)
    # The skull does not move: brain pushed into it is squeezed back into the cranial space.
    brain_after = local[brain_idx].sum(axis=0)
    scale = np.where(brain_after > brain_before, brain_before / np.maximum(brain_after, 1e-6), 1.0)
    for ti in brain_idx:
        local[ti] *= scale.astype(np.float32)


def _component_weight(
    grid: Grid, box: tuple[slice, slice, slice], comp: Component, slab: int
) -> tuple[tuple[slice, slice, slice], np.ndarray] | None:
    """(sub-box relative to the patch, weight on it) of a component, or None if it misses."""
    lo, hi = comp.shape.box()
    sub = grid.box(lo, hi)
    if sub is None:
        return None
    inner = tuple(
        slice(max(s.start, b.start), min(s.stop, b.stop)) for s, b in zip(sub, box, strict=True)
    )
    if any(s.stop <= s.start for s in inner):
        return None
    x, y, z = grid.points(inner, slab)  # type: ignore[arg-type]
    w = comp.shape(x, y, z).mean(axis=3).astype(np.float32)
    if not w.any():
        return None
    local = tuple(
        slice(s.start - b.start, s.stop - b.start) for s, b in zip(inner, box, strict=True)
    )
    return local, w  # type: ignore[return-value]


def intersect(
    a: tuple[slice, ...], b: tuple[slice, ...]
) -> tuple[tuple[slice, ...], tuple[slice, ...]] | None:
    """Slices of the overlap of boxes a and b, relative to a and to b."""
    lo = [max(x.start, y.start) for x, y in zip(a, b, strict=True)]
    hi = [min(x.stop, y.stop) for x, y in zip(a, b, strict=True)]
    if any(h <= low for low, h in zip(lo, hi, strict=True)):
        return None
    ra = tuple(slice(low - x.start, h - x.start) for low, h, x in zip(lo, hi, a, strict=True))
    rb = tuple(slice(low - y.start, h - y.start) for low, h, y in zip(lo, hi, b, strict=True))
    return ra, rb


def build_scene(
    gt: GridTissues, lesions: list[Lesion], slab: int = 1, mass_effect: bool = True
) -> Scene:
    """Patch the lesions into the cached normal grid ``gt``."""
    grid = gt.grid
    boxes = []
    for les in lesions:
        lo, hi = les.box(mass_effect)
        boxes.append(grid.box(lo, hi))
    patches: list[Patch] = []
    brain_idx = [TISSUES.index(t) for t in BRAIN_TISSUES]
    for group in _clusters(boxes):
        box = _union([boxes[i] for i in group if boxes[i] is not None])  # type: ignore[misc]
        base = gt.box(box)
        parts: list[Part] = []
        for li in group:
            les = lesions[li]
            if mass_effect and les.mass_effect is not None:
                _deform(gt, box, base, les.mass_effect)
            for comp in les.components:
                hit = _component_weight(grid, box, comp, slab)
                if hit is None:
                    continue
                sub, w = hit
                if comp.mode == "replace":
                    # Lesions live inside the skull: take the brain/CSF share of each voxel,
                    # including what earlier lesion parts hold there.
                    brain = base[brain_idx][(slice(None), *sub)].sum(axis=0)
                    keep = 1.0 - w
                    for p in parts:
                        ov = intersect(sub, p.sub)
                        if ov is not None:
                            brain[ov[0]] += p.fraction[ov[1]]
                            p.fraction[ov[1]] *= keep[ov[0]]
                    for t in brain_idx:
                        base[(t, *sub)] *= keep
                    parts.append(Part(li, comp, None, (w * brain).astype(np.float32), sub))
                else:
                    for tissue, strength in comp.strength:
                        ti = TISSUES.index(tissue)
                        amount = (w * np.float32(strength) * base[(ti, *sub)]).astype(np.float32)
                        base[(ti, *sub)] -= amount
                        parts.append(Part(li, comp, tissue, amount, sub))
        patches.append(Patch(box, base, parts))
    return Scene(grid, gt, patches)


def label_map(scene: Scene, n_lesions: int, threshold: float = 0.5) -> np.ndarray:
    """uint8 labels (lesion index + 1) where a labelled lesion fills >= ``threshold`` of a voxel."""
    out = np.zeros(scene.grid.shape, dtype=np.uint8)
    for p in scene.patches:
        shape = p.base.shape[1:]
        per = np.zeros((n_lesions, *shape), dtype=np.float32)
        for part in p.parts:
            if part.component.in_mask:
                per[(part.lesion, *part.sub)] += part.fraction
        best = per.argmax(axis=0)
        keep = per.max(axis=0) >= threshold
        region = out[p.box]
        region[keep] = (best[keep] + 1).astype(np.uint8)
    return out


def is_mr(proto: Protocol) -> bool:
    return proto.weighting is not Weighting.CT
