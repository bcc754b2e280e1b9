"""A coordinate atlas on MNI space: hemisphere, lobe and region of any point or lesion.

Lobes and deep structures come from coordinate rules (planes and ellipsoids fitted by eye to
the MNI152 2009a template: central sulcus, Sylvian line, tentorium, thalamus, basal ganglia);
periventricular and juxtacortical white matter come from distance maps to the ventricles and
the cortex of the template itself. Region names are those of ``evaluation.case.REGIONS``.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import ndimage

from evaluation.case import Hemisphere
from evaluation.datasets.phantoms.anatomy import Anatomy, cached_arrays, get_anatomy

LOBES: tuple[str, ...] = ("frontal", "parietal", "temporal", "occipital", "insula")


def _ell(
    x: np.ndarray,
    y: np.ndarray,
    z: np.ndarray,
    c: tuple[float, float, float],
    r: tuple[float, float, float],
) -> np.ndarray:
    return ((x - c[0]) / r[0]) ** 2 + ((y - c[1]) / r[1]) ** 2 + ((z - c[2]) / r[2]) ** 2 <= 1.0


DEEP: tuple[str, ...] = (
    "",
    "insula",
    "corpus callosum",
    "internal capsule",
    "basal ganglia",
    "thalamus",
    "cerebellum",
    "brainstem",
)


def deep_structure(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Index into DEEP of the deep structure at each point (0: none)."""
    ax = np.abs(x)
    out = np.zeros(np.broadcast(x, y, z).shape, dtype=np.uint8)
    brainstem = ((x / 12.0) ** 2 + ((y + 28.0) / 15.0) ** 2 <= 1.0) & (z <= -6) & (z >= -75)
    tent = np.where(y < -50, -12.0 + 0.4 * (y + 50.0), -12.0)
    cerebellum = (y < -38) & (z < tent) & ~brainstem
    thalamus = _ell(ax, y, z, (11.0, -18.0, 6.0), (7.0, 11.0, 8.0))
    bg = _ell(ax, y, z, (13.0, 12.0, 8.0), (5.0, 9.0, 9.0)) | _ell(
        ax, y, z, (23.0, 2.0, 1.0), (7.0, 14.0, 9.0)
    )
    capsule = _ell(ax, y, z, (19.0, -4.0, 5.0), (4.5, 19.0, 10.0))
    callosum = (ax < 12) & (y > -40) & (y < 33) & (z > 5) & (z < 28)
    insula = (ax > 31) & (ax < 42) & (y > -25) & (y < 22) & (z > -8) & (z < 22)
    # Later entries win where the rules overlap.
    for mask, name in (
        (insula, "insula"),
        (callosum, "corpus callosum"),
        (capsule, "internal capsule"),
        (bg, "basal ganglia"),
        (thalamus, "thalamus"),
        (cerebellum, "cerebellum"),
        (brainstem, "brainstem"),
    ):
        out[np.broadcast_to(mask, out.shape)] = DEEP.index(name)
    return out


def lobe(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Index into LOBES of the cerebral lobe at each point, by coordinate rules (MNI mm)."""
    shape = np.broadcast(x, y, z).shape
    x, y, z = (np.broadcast_to(a, shape) for a in (x, y, z))
    central = -12.0 - 0.45 * np.maximum(z - 20.0, 0.0)  # central sulcus, y of the fundus
    sylvian = np.minimum(22.0, 6.0 - 0.25 * (y - 10.0))  # upper border of the temporal lobe
    # Above the temporal stem only lateral points are temporal; lower down, medial ones too.
    lateral = np.clip(38.0 + 1.6 * np.minimum(z, 0.0), 14.0, 38.0)
    out = np.where(y > central, 0, 1).astype(np.uint8)
    out[(z < sylvian) & (np.abs(x) > lateral) & (y < 22) & (y > -70)] = 2
    # Below the parietal lobe (z < 0) the posterior brain is temporal, then occipital.
    out[(out == 1) & (z < 0)] = 2
    out[(y <= -70) | ((y <= -58) & (z < 0) & (y <= central))] = 3
    return out


@dataclass
class Atlas:
    anatomy: Anatomy
    ventricles: np.ndarray  # bool, 1 mm grid
    ventricle_dist: np.ndarray  # mm to the nearest ventricle voxel (float32)
    cortex_dist: np.ndarray  # mm to the nearest cortical grey-matter voxel (float32)
    white: np.ndarray  # bool: white matter dominates (template probabilities)

    def at(self, points: np.ndarray) -> dict[str, np.ndarray]:
        """Per point: hemisphere, lobe, deep structure, periventricular/juxtacortical flags."""
        x, y, z = points[:, 0], points[:, 1], points[:, 2]
        a = self.anatomy
        vent = a.sample(self.ventricle_dist, points, order=1)
        cortex = a.sample(self.cortex_dist, points, order=1)
        white = a.sample(self.white.astype(np.float32), points, order=1) > 0.5
        inside = a.sample(a.brain.astype(np.float32), points, order=1) > 0.5
        hemi = np.where(x > 2.0, "right", np.where(x < -2.0, "left", "midline")).astype(object)
        return {
            "hemisphere": hemi,
            "lobe": np.array(LOBES, dtype=object)[lobe(x, y, z)],
            "deep": np.array(DEEP, dtype=object)[deep_structure(x, y, z)],
            "periventricular": white & (vent <= 8.0),
            "juxtacortical": white & (cortex <= 3.0),
            "inside": inside,
            "ventricle_mm": vent,
            "cortex_mm": cortex,
        }

    def describe(
        self, points: np.ndarray, fine: bool, extra_axial: bool = False
    ) -> tuple[Hemisphere, str, str | None]:
        """Hemisphere, region and lobe of a lesion given its voxel centres (N, 3) in RAS mm.

        ``fine`` uses the white-matter subregions radiologists name for small lesions
        (periventricular, juxtacortical); large lesions get their lobe or deep structure.
        """
        info = self.at(points)
        n = len(points)
        hemis = Counter(info["hemisphere"].tolist())
        left, right = hemis.get("left", 0), hemis.get("right", 0)
        if min(left, right) > 0.2 * n:
            hemisphere = Hemisphere.BILATERAL
        elif max(left, right) == 0:
            hemisphere = Hemisphere.MIDLINE
        else:
            hemisphere = Hemisphere.RIGHT if right >= left else Hemisphere.LEFT
        lobe_name = Counter(info["lobe"].tolist()).most_common(1)[0][0]
        if extra_axial:
            return hemisphere, "extra-axial", lobe_name
        deep = Counter(info["deep"].tolist()).most_common(1)[0][0]
        if not fine:
            # A large lesion centred on a deep structure (a putaminal haematoma spilling into
            # the white matter) is named after where it is centred.
            c = points.mean(axis=0)
            at_centre = DEEP[int(deep_structure(c[:1], c[1:2], c[2:3])[0])]
            if at_centre in ("basal ganglia", "thalamus", "cerebellum", "brainstem"):
                deep = at_centre
        if deep in ("brainstem", "cerebellum", "thalamus", "basal ganglia", "corpus callosum"):
            return hemisphere, deep, None
        if deep in ("internal capsule",):
            return hemisphere, deep, None
        if deep == "insula":
            return hemisphere, "insula", "insula"
        if fine:
            # Periventricular: the lesion abuts a ventricle (radiologists' usage).
            vent = info["ventricle_mm"]
            if vent.min() <= 3.0 or info["periventricular"].mean() >= 0.4:
                return hemisphere, "periventricular white matter", lobe_name
            if info["juxtacortical"].mean() >= 0.3:
                return hemisphere, "juxtacortical", lobe_name
        return hemisphere, lobe_name, lobe_name


def _build_maps(anatomy: Anatomy) -> dict[str, np.ndarray]:
    gm = anatomy.fraction("gm")
    wm = anatomy.fraction("wm")
    brain = anatomy.brain
    shape = anatomy.shape
    axes = [anatomy.affine[i, i] * np.arange(n) + anatomy.affine[i, 3] for i, n in enumerate(shape)]
    x, y, z = np.meshgrid(*[a.astype(np.float32) for a in axes], indexing="ij", sparse=True)
    # Ventricles: deep CSF inside the brain, away from its surface, near the midline.
    depth = ndimage.distance_transform_edt(brain)
    fluid = brain & (gm + wm < 0.5) & (depth > 9.0)
    fluid &= (np.abs(x) < 36) & (z > -45) & (z < 40) & (y > -60) & (y < 40)
    labels, n = ndimage.label(fluid)
    sizes = ndimage.sum(fluid, labels, index=np.arange(1, n + 1))
    keep = np.isin(labels, 1 + np.flatnonzero(sizes >= 150))
    ventricles = np.asarray(keep, dtype=bool)
    deep = deep_structure(x, y, z) > 0
    cortex = brain & (gm > 0.5) & ~deep
    white = brain & (wm > gm) & (wm > 0.3)
    return {
        "ventricles": ventricles,
        "ventricle_dist": ndimage.distance_transform_edt(~ventricles).astype(np.float32),
        "cortex_dist": ndimage.distance_transform_edt(~cortex).astype(np.float32),
        "white": white,
    }


_LOCK = threading.Lock()
_ATLAS: Atlas | None = None


def get_atlas(cache: Path | None = None) -> Atlas:
    """The process-wide atlas of the phantom head (maps cached on disk like the anatomy,
    under ``cache_dir(cache)``)."""
    global _ATLAS
    with _LOCK:
        if _ATLAS is None:
            anatomy = get_anatomy(cache)
            maps = cached_arrays("atlas", lambda: _build_maps(anatomy), cache)
            _ATLAS = Atlas(
                anatomy=anatomy,
                ventricles=maps["ventricles"],
                ventricle_dist=maps["ventricle_dist"],
                cortex_dist=maps["cortex_dist"],
                white=maps["white"],
            )
        return _ATLAS
