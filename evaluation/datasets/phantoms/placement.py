"""Where lesions go and what they share: candidate points from the atlas, sides, oedema.

Placement uses the coordinate atlas, so a periventricular plaque really touches a ventricle
and a metastasis sits at the grey-white junction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from evaluation.datasets.phantoms.atlas import Atlas, deep_structure, lobe
from evaluation.datasets.phantoms.scene import Component, Lesion
from evaluation.datasets.phantoms.shapes import BlobShape
from evaluation.datasets.phantoms.tissue import Modifier


@dataclass
class Plan:
    group: str
    lesions: list[Lesion]
    facts: dict[str, object] = field(default_factory=dict)


# --------------------------------------------------------------------------- placement


_CANDIDATES: dict[str, np.ndarray] = {}


def candidates(atlas: Atlas, kind: str) -> np.ndarray:
    """RAS points (N, 3) of the 1 mm grid suitable for a lesion of ``kind`` (cached)."""
    if kind in _CANDIDATES:
        return _CANDIDATES[kind]
    a = atlas.anatomy
    axes = [a.affine[i, i] * np.arange(n) + a.affine[i, 3] for i, n in enumerate(a.shape)]
    x, y, z = np.meshgrid(*[v.astype(np.float32) for v in axes], indexing="ij", sparse=True)
    deep = deep_structure(x, y, z)
    white, vd, cd = atlas.white, atlas.ventricle_dist, atlas.cortex_dist
    cerebral = (deep == 0) & (z > -25)
    if kind == "periventricular":
        m = white & (vd >= 3) & (vd <= 6) & (z > -2) & (z < 32) & (np.abs(x) > 6) & cerebral
    elif kind == "juxtacortical":
        m = white & (cd >= 1) & (cd <= 2.5) & (vd > 12) & cerebral & (z > -10)
    elif kind == "infratentorial":
        m = white & ((deep == 6) | (deep == 7)) & (z > -50) & (z < -15)
    elif kind == "deep_wm":
        m = white & (cd >= 7) & (vd >= 7) & cerebral & (z > -10) & (z < 50)
    elif kind == "gw_junction":
        m = white & (cd >= 1.5) & (cd <= 4) & cerebral & (vd > 10)
    elif kind == "cerebellar":
        m = white & (deep == 6) & (np.abs(x) > 12) & (z > -50)
    else:
        raise ValueError(f"unknown placement kind {kind!r}")
    idx = np.argwhere(m)
    pts = idx.astype(np.float64) @ a.affine[:3, :3].T + a.affine[:3, 3]
    _CANDIDATES[kind] = pts
    return pts


def pick(
    rng: np.random.Generator,
    pts: np.ndarray,
    where: Callable[[np.ndarray], np.ndarray] | None = None,
    avoid: list[np.ndarray] | None = None,
    spacing: float = 0.0,
) -> np.ndarray:
    """One candidate point satisfying ``where``, at least ``spacing`` mm from ``avoid``."""
    ok = np.ones(len(pts), dtype=bool) if where is None else where(pts)
    for p in avoid or []:
        ok &= np.linalg.norm(pts - p, axis=1) >= spacing
    idx = np.flatnonzero(ok)
    if len(idx) == 0:
        idx = np.arange(len(pts))
    return pts[idx[rng.integers(len(idx))]]


def side(rng: np.random.Generator) -> int:
    """+1 right (RAS +x), -1 left."""
    return 1 if rng.random() < 0.5 else -1


def in_lobes(*names: str) -> Callable[[np.ndarray], np.ndarray]:
    from evaluation.datasets.phantoms.atlas import LOBES

    codes = [LOBES.index(n) for n in names]
    return lambda p: np.isin(lobe(p[:, 0], p[:, 1], p[:, 2]), codes)


def on_side(sx: int, base: Callable[[np.ndarray], np.ndarray] | None = None):  # type: ignore[no-untyped-def]
    def f(p: np.ndarray) -> np.ndarray:
        ok = p[:, 0] * sx > 4
        return ok & base(p) if base else ok

    return f


# --------------------------------------------------------------------------- tissue changes

OEDEMA = Modifier(t1=1.35, t2=2.2, pd=1.12, adc=1.8, hu=-8)
WM_ONLY = (("gm", 0.2), ("wm", 1.0))
# Oedema around a haematoma is partly cytotoxic and ionic: it swells the grey matter of a
# putamen or of the cerebellar cortex too, not only the white matter tracts.
GREY_AND_WHITE = (("gm", 0.8), ("wm", 1.0))


def oedema(blob: BlobShape, strength: tuple[tuple[str, float], ...] = WM_ONLY) -> Component:
    """Oedema (vasogenic by default: mostly white matter), fading out over several millimetres."""
    soft = BlobShape(
        blob.centre, blob.radii, blob.rot, blob.wobble, blob.wobble_dirs, 0.2 * min(blob.radii)
    )
    return Component("oedema", soft, "modify", OEDEMA, strength=strength, in_mask=False)


# --------------------------------------------------------------------------- groups
