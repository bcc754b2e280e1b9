"""Ground truth measured on the 1 mm label mask: where each lesion is, how big, what signal.

Signal per sequence compares the lesion with the normal parenchyma that the same voxels held
before disease (grey/white matter mix; grey matter for extra-axial lesions), both noise-free
from the tissue model. A lesion whose parts disagree (a bright rim around a dark core) is
'mixed'. Thresholds: MR ratio >= 1.15 hyper, <= 0.87 hypo; CT difference >= +6 HU hyperdense,
<= -4 HU hypodense.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from evaluation.case import Enhancement, Hemisphere, LesionTruth, Signal
from evaluation.datasets.phantoms.atlas import Atlas
from evaluation.datasets.phantoms.scene import Lesion, Part, Patch, Scene, intersect, patch_values
from evaluation.datasets.phantoms.tissue import (
    TISSUES,
    Protocol,
    TissueParams,
    normal_tissues,
    signal,
)

MR_HYPER, MR_HYPO = 1.15, 0.87
CT_HYPER, CT_HYPO = 6.0, -4.0


def _classify(lesion_v: float, ref_v: float, ct: bool) -> Signal:
    if ct:
        d = lesion_v - ref_v
        return (
            Signal.HYPERDENSE
            if d >= CT_HYPER
            else Signal.HYPODENSE
            if d <= CT_HYPO
            else Signal.ISODENSE
        )
    r = lesion_v / max(ref_v, 1e-9)
    return Signal.HYPER if r >= MR_HYPER else Signal.HYPO if r <= MR_HYPO else Signal.ISO


def _value_fn(seq: str, proto: Protocol | None, field_t: float) -> Callable[[TissueParams], float]:
    if seq == "ADC":
        return lambda p: p.adc
    assert proto is not None
    b = proto.b if seq == "DWI" else None
    return lambda p: signal(p, proto, field_t, b)


def lesion_patch(scene: Scene, li: int) -> Patch | None:
    """The patch that holds lesion ``li`` (None if the lesion misses the grid)."""
    for p in scene.patches:
        if any(part.lesion == li for part in p.parts):
            return p
    return None


def lesion_signals(
    scene: Scene,
    labels: np.ndarray,
    li: int,
    sequences: dict[str, Protocol | None],
    field_t: float,
    extra_axial: bool,
) -> tuple[dict[str, Signal], dict[str, dict[str, float]]]:
    """Signal class per sequence (SequenceClass value) and the raw ratios behind it."""
    patch = lesion_patch(scene, li)
    if patch is None:
        return {}, {}
    full = labels[patch.box] == li + 1
    if not full.any():
        return {}, {}
    # Work in the lesion's own bounding box inside the patch (the patch also holds oedema).
    idx = np.argwhere(full)
    sub = tuple(slice(int(a), int(b) + 1) for a, b in zip(idx.min(0), idx.max(0), strict=True))
    parts = []
    for q in patch.parts:
        ov = intersect(sub, q.sub)
        if ov is not None:
            frac = np.zeros(tuple(x.stop - x.start for x in sub), np.float32)
            frac[ov[0]] = q.fraction[ov[1]]
            whole = (slice(None), slice(None), slice(None))
            parts.append(Part(q.lesion, q.component, q.tissue, frac, whole))
    patch = Patch(
        tuple(
            slice(p.start + s.start, p.start + s.stop) for p, s in zip(patch.box, sub, strict=True)
        ),  # type: ignore[arg-type]
        patch.base[(slice(None), *sub)],
        parts,
    )
    in_lesion = full[sub]
    total = np.zeros(in_lesion.shape, np.float32)
    per_comp: dict[str, np.ndarray] = {}
    for part in patch.parts:
        if part.lesion == li and part.component.in_mask:
            total += part.fraction
            per_comp.setdefault(part.component.name, np.zeros_like(total))
            per_comp[part.component.name] += part.fraction
    n = int(in_lesion.sum())
    regions = []
    for name, f in per_comp.items():
        dom = in_lesion & (f >= 0.5 * np.maximum(total, 1e-6))
        if dom.sum() >= max(5, 0.1 * n):
            regions.append((name, dom))
    if not regions:
        regions = [("lesion", in_lesion)]
    # What these voxels held before disease (original fractions on the mask grid).
    orig = scene.tissues.box(patch.box)
    gm, wm = orig[TISSUES.index("gm")], orig[TISSUES.index("wm")]
    par = gm + wm
    normal = normal_tissues(field_t)
    out: dict[str, Signal] = {}
    raw: dict[str, dict[str, float]] = {}
    for seq, proto in sequences.items():
        fn = _value_fn(seq, proto, field_t)
        vals = patch_values(patch, field_t, fn)
        sg, sw = fn(normal["gm"]), fn(normal["wm"])
        ref = np.where(par > 0.2, (gm * sg + wm * sw) / np.maximum(par, 1e-6), sg)
        if extra_axial:
            ref = np.full_like(ref, sg)
        ct = seq == "CT"
        classes = []
        raw[seq] = {}
        for name, m in regions:
            lv, rv = float(vals[m].mean()), float(ref[m].mean())
            raw[seq][name] = round(lv - rv, 3) if ct else round(lv / max(rv, 1e-9), 3)
            classes.append(_classify(lv, rv, ct))
        uniq = set(classes)
        out[seq] = classes[0] if len(uniq) == 1 else Signal.MIXED
    return out, raw


def max_diameter(points: np.ndarray) -> float:
    """Largest distance between two voxel centres (mm), +1 voxel."""
    if len(points) < 2:
        return 1.0
    if len(points) > 1500:
        # Extreme points along many directions hold the diameter; keep those.
        dirs = np.random.default_rng(0).normal(size=(64, 3))
        proj = points @ dirs.T
        keep = np.unique(np.concatenate([proj.argmax(axis=0), proj.argmin(axis=0)]))
        points = points[keep]
    d = np.sqrt(((points[:, None, :] - points[None, :, :]) ** 2).sum(-1))
    return float(d.max()) + 1.0


def lesion_truth(
    lesion: Lesion,
    li: int,
    labels: np.ndarray,
    affine: np.ndarray,
    atlas: Atlas,
    signals: dict[str, Signal],
    restricted: bool,
    box: tuple[slice, slice, slice] | None = None,
) -> LesionTruth:
    """The lesion as measured on the label mask (``box``: where to look, for speed)."""
    box = box or (slice(None), slice(None), slice(None))
    idx = np.argwhere(labels[box] == li + 1) + np.array([b.start or 0 for b in box])
    pts = idx @ affine[:3, :3].T + affine[:3, 3]
    hemi, region, lobe = atlas.describe(
        pts, fine=lesion.fine_region, extra_axial=lesion.extra_axial
    )
    c = pts.mean(axis=0)
    return LesionTruth(
        id=f"L{li + 1}",
        type=lesion.label,
        hemisphere=hemi if isinstance(hemi, Hemisphere) else Hemisphere(hemi),
        region=region,
        lobe=lobe,
        center_mm=(round(float(c[0]), 1), round(float(c[1]), 1), round(float(c[2]), 1)),
        size_mm=round(max_diameter(pts), 1),
        signal=signals,
        enhancement=Enhancement(lesion.enhancement),
        diffusion_restriction=restricted,
        mask_label=li + 1,
    )


def restricted_diffusion(raw: dict[str, dict[str, float]]) -> bool:
    """Some part of the lesion is bright on DWI and dark on ADC."""
    dwi, adc = raw.get("DWI", {}), raw.get("ADC", {})
    return any(dwi.get(k, 0) >= MR_HYPER and adc.get(k, 9) <= MR_HYPO for k in adc)
