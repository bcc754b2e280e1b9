"""The phantom head: MNI152 brain templates shipped inside nilearn, wrapped in CSF, skull and scalp.

The ICBM 2009a templates that nilearn bundles (T1, grey- and white-matter probability, 1 mm,
skull-stripped) give the brain; CSF is the brain mask minus grey and white matter. Around the
brain we add a subarachnoid space, a three-layer skull (inner table, fatty diploe, outer
table), a scalp (galea, fat, skin) and temporalis muscles, so MR and CT look like heads. Built
once (about 5 s), cached on disk and kept per process; everything is in RAS millimetres, MNI space.
"""

from __future__ import annotations

import hashlib
import importlib.util
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import nibabel as nib
import numpy as np
from scipy import ndimage

from dicom import atomic_write
from evaluation.datasets.phantoms.tissue import TISSUES

_FILES = {
    "t1": "mni_icbm152_t1_tal_nlin_sym_09a_converted.nii.gz",
    "gm": "mni_icbm152_gm_tal_nlin_sym_09a_converted.nii.gz",
    "wm": "mni_icbm152_wm_tal_nlin_sym_09a_converted.nii.gz",
}
# Slices of padding below the template, which stops at the lower medulla, so the skull closes.
_PAD_INFERIOR = 16
ANATOMY_SOURCE = "MNI152 ICBM 2009a symmetric templates (nilearn bundled data), 1 mm"


class AnatomyError(RuntimeError):
    """The bundled templates could not be found or read."""


@dataclass
class Anatomy:
    """Tissue fractions of the normal head on a 1 mm RAS grid (uint8, 255 = whole voxel)."""

    fractions: np.ndarray  # (len(TISSUES), X, Y, Z) uint8
    affine: np.ndarray  # voxel -> RAS mm
    brain: np.ndarray  # bool: inside the template brain mask
    cache: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def shape(self) -> tuple[int, int, int]:
        s = self.fractions.shape[1:]
        return (int(s[0]), int(s[1]), int(s[2]))

    def fraction(self, tissue: str) -> np.ndarray:
        """One tissue's fraction map as float32 in 0..1."""
        return self.fractions[TISSUES.index(tissue)].astype(np.float32) / 255.0

    def world_to_voxel(self, points: np.ndarray) -> np.ndarray:
        """(N, 3) RAS mm -> (N, 3) voxel coordinates of this grid."""
        inv = np.linalg.inv(self.affine)
        return points @ inv[:3, :3].T + inv[:3, 3]

    def sample(self, volume: np.ndarray, points: np.ndarray, order: int = 1) -> np.ndarray:
        """Values of a volume on this grid at RAS points (N, 3); outside: 0."""
        vox = self.world_to_voxel(points).T
        return ndimage.map_coordinates(volume, vox, order=order, mode="constant", cval=0.0)

    def intracranial(self) -> np.ndarray:
        """float32 fraction of each voxel inside the skull (brain + CSF)."""
        if "intracranial" not in self.cache:
            idx = [TISSUES.index(t) for t in ("csf", "gm", "wm")]
            self.cache["intracranial"] = (
                self.fractions[idx].astype(np.float32).sum(axis=0) / 255.0
            ).astype(np.float32)
        return self.cache["intracranial"]


def template_dir() -> Path:
    """Where nilearn keeps its bundled MNI152 templates (found without importing nilearn)."""
    spec = importlib.util.find_spec("nilearn")
    if spec is None or not spec.submodule_search_locations:
        raise AnatomyError(
            "nilearn is not installed: it ships the MNI152 templates the phantoms use"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data"
    missing = [f for f in _FILES.values() if not (folder / f).exists()]
    if missing:
        raise AnatomyError(
            f"nilearn at {folder} lacks the bundled templates {missing}; reinstall nilearn>=0.11"
        )
    return folder


def _load(name: str) -> tuple[np.ndarray, np.ndarray]:
    img = cast(nib.Nifti1Image, nib.load(template_dir() / _FILES[name]))
    data = np.asarray(img.dataobj, dtype=np.float32)
    return data / max(float(data.max()), 1e-6), np.asarray(img.affine, dtype=np.float64)


def _ramp(d: np.ndarray, start: float, stop: float) -> np.ndarray:
    """Fraction of a voxel whose centre is at signed distance d inside the shell [start, stop)."""
    inner = np.clip(d - start + 0.5, 0.0, 1.0)
    outer = np.clip(d - stop + 0.5, 0.0, 1.0)
    return inner - outer


def _up2(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Linear upsampling by 2 along every axis (2 mm voxel i covers 1 mm voxels 2i, 2i+1)."""
    for axis, n in enumerate(shape):
        a = np.moveaxis(a, axis, 0)
        prev = np.concatenate([a[:1], a[:-1]])
        nxt = np.concatenate([a[1:], a[-1:]])
        out = np.empty((2 * a.shape[0], *a.shape[1:]), dtype=np.float32)
        out[0::2] = 0.75 * a + 0.25 * prev
        out[1::2] = 0.75 * a + 0.25 * nxt
        if out.shape[0] < n:
            out = np.concatenate([out, out[-1:]])
        a = np.moveaxis(out[:n], 0, axis)
    return np.ascontiguousarray(a)


def _signed_distance(mask: np.ndarray, step: float) -> np.ndarray:
    outside = ndimage.distance_transform_edt(~mask, sampling=step)
    inside = ndimage.distance_transform_edt(mask, sampling=step)
    return (outside - inside).astype(np.float32)


def _closing(mask: np.ndarray, radius: float, step: float) -> np.ndarray:
    """Morphological closing by distance transforms (padded, so the grid edge is outside)."""
    p = int(np.ceil(radius / step)) + 2
    padded = np.pad(mask, p)
    dil = ndimage.distance_transform_edt(~padded, sampling=step) <= radius
    closed = ndimage.distance_transform_edt(dil, sampling=step) > radius
    closed = ndimage.binary_fill_holes(closed)
    return np.asarray(closed[p:-p, p:-p, p:-p], dtype=bool)


def _ellipsoid(
    x: np.ndarray,
    y: np.ndarray,
    z: np.ndarray,
    c: tuple[float, float, float],
    r: tuple[float, float, float],
) -> np.ndarray:
    """Soft (about 1 mm edge) ellipsoid indicator."""
    q = np.sqrt(((x - c[0]) / r[0]) ** 2 + ((y - c[1]) / r[1]) ** 2 + ((z - c[2]) / r[2]) ** 2)
    return np.clip((1.0 - q) * min(r) + 0.5, 0.0, 1.0).astype(np.float32)


def build_anatomy() -> Anatomy:
    """Build the head from the templates (deterministic; about 2 s)."""
    t1, affine = _load("t1")
    gm, _ = _load("gm")
    wm, _ = _load("wm")
    pad = ((0, 0), (0, 0), (_PAD_INFERIOR, 0))
    t1, gm, wm = (np.pad(a, pad) for a in (t1, gm, wm))
    affine = affine.copy()
    affine[:3, 3] -= affine[:3, 2] * _PAD_INFERIOR
    shape = t1.shape
    brain = t1 > 0.2  # nilearn's load_mni152_brain_mask threshold
    gm = np.where(brain, gm, np.float32(0.0))
    wm = np.where(brain, wm, np.float32(0.0))
    axes1 = [
        (affine[i, i] * np.arange(n) + affine[i, 3]).astype(np.float32) for i, n in enumerate(shape)
    ]
    x, y, z = np.meshgrid(*axes1, indexing="ij", sparse=True)

    # Skull and scalp from distances computed at 2 mm: the inner hull (closing 8 mm) is the
    # dura; the head hull (a wider closing of skull and orbits) carries the scalp.
    s2 = tuple(n // 2 for n in shape)
    b2 = brain[: 2 * s2[0], : 2 * s2[1], : 2 * s2[2]]
    b2 = b2.reshape(s2[0], 2, s2[1], 2, s2[2], 2).mean(axis=(1, 3, 5)) > 0.5
    hull = _closing(b2, 8.0, 2.0)
    sd_in2 = _signed_distance(hull, 2.0)
    x2, y2, z2 = (a[: 2 * n].reshape(n, 2).mean(axis=1) for a, n in zip(axes1, s2, strict=True))
    X2, Y2, Z2 = np.meshgrid(x2, y2, z2, indexing="ij", sparse=True)
    orbit2 = sum(_ellipsoid(X2, Y2, Z2, (sx * 30.0, 44.0, -40.0), (15, 24, 11)) for sx in (-1, 1))
    head = _closing((sd_in2 <= 9.0) | (np.asarray(orbit2) > 0.5), 20.0, 2.0)
    sd_head2 = _signed_distance(head, 2.0)
    sd_in = _up2(sd_in2, shape)
    sd_head = _up2(sd_head2, shape)

    intracranial = np.maximum(np.clip(3.0 - sd_in, 0.0, 1.0), brain.astype(np.float32))
    csf = np.clip(intracranial - gm - wm, 0.0, 1.0)
    inner = _ramp(sd_in, 2.5, 4.5)
    diploe = _ramp(sd_in, 4.5, 7.0)
    outer = _ramp(sd_in, 7.0, 9.0)
    # Inside the head but outside the skull: skull base bone below, soft tissue above.
    filler = np.clip(0.5 - sd_head, 0.0, 1.0) * np.clip(sd_in - 8.5, 0.0, 1.0)
    base = np.clip((-20.0 - z) / 10.0, 0.0, 1.0)
    eyes = sum(_ellipsoid(x, y, z, (sx * 32.0, 58.0, -44.0), (12, 12, 12)) for sx in (-1, 1))
    orbit_fat = sum(_ellipsoid(x, y, z, (sx * 30.0, 44.0, -40.0), (15, 24, 11)) for sx in (-1, 1))
    # Temporalis: a thick muscle over the temporal squama on each side.
    temporal = (
        np.clip((np.abs(x) - 48.0) / 8.0, 0, 1)
        * np.clip(1 - np.abs(z - 5.0) / 35.0, 0, 1)
        * np.clip(1 - np.abs(y + 10.0) / 45.0, 0, 1)
    )
    muscle_w = 1.0 + 7.0 * np.minimum(temporal * 1.8, 1.0)
    galea = _ramp(sd_head, 0.0, muscle_w)
    fat = _ramp(sd_head, muscle_w, 4.5 + muscle_w)
    skin = _ramp(sd_head, 4.5 + muscle_w, 6.0 + muscle_w)
    maps = {  # order = priority when fractions compete for a voxel
        "csf": csf + eyes,
        "gm": gm,
        "wm": wm,
        "fat": fat + orbit_fat,
        "bone": inner + outer + filler * base,
        "marrow": diploe,
        "muscle": galea + skin + filler * (1.0 - base),
    }
    total = np.zeros(shape, dtype=np.float32)
    fractions = np.zeros((len(TISSUES), *shape), dtype=np.uint8)
    for name, part in maps.items():
        part = np.minimum(np.clip(part, 0.0, 1.0), 1.0 - total)
        total += part
        fractions[TISSUES.index(name)] = np.rint(part * 255.0).astype(np.uint8)
    return Anatomy(fractions=fractions, affine=affine, brain=brain)


ANATOMY_VERSION = 1
_LOCK = threading.Lock()
_ANATOMY: Anatomy | None = None


def cache_dir(root: Path | None = None) -> Path:
    """Where the built head is kept between processes: ROOT/phantoms, the per-user cache
    folder the caller passes (the settings' ``cache``), else ~/.cache/neurosandbox/phantoms."""
    return (root or Path.home() / ".cache" / "neurosandbox") / "phantoms"


def _stamp() -> str:
    folder = template_dir()
    return hashlib.sha256(
        "|".join(f"{f}:{(folder / f).stat().st_size}" for f in sorted(_FILES.values())).encode()
    ).hexdigest()[:12]


def _digest(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in sorted(arrays):
        h.update(k.encode())
        h.update(np.ascontiguousarray(arrays[k]).tobytes())
    return h.hexdigest()


def cached_arrays(
    name: str, build: Callable[[], dict[str, np.ndarray]], cache: Path | None = None
) -> dict[str, np.ndarray]:
    """Arrays built by ``build``, kept in an .npz under cache_dir(cache), checked by digest."""
    path = cache_dir(cache) / f"{name}-v{ANATOMY_VERSION}-{_stamp()}.npz"
    try:
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files if k != "_digest"}
            digest = str(z["_digest"])
        if _digest(arrays) == digest:
            return arrays
    except (OSError, KeyError, ValueError, EOFError):
        pass  # missing, truncated or tampered: rebuild
    arrays = build()
    try:
        with atomic_write(path, fsync=False) as fh:
            payload: dict[str, Any] = {"_digest": np.array(_digest(arrays)), **arrays}
            np.savez_compressed(fh, **payload)
    except OSError:
        pass  # a read-only cache only costs the rebuild next time
    return arrays


def get_anatomy(cache: Path | None = None) -> Anatomy:
    """The process-wide head: from the disk cache (under ``cache_dir(cache)``) when valid,
    else built (and cached)."""
    global _ANATOMY
    with _LOCK:
        if _ANATOMY is None:

            def build() -> dict[str, np.ndarray]:
                a = build_anatomy()
                return {"fractions": a.fractions, "affine": a.affine, "brain": a.brain}

            arrays = cached_arrays("anatomy", build, cache)
            _ANATOMY = Anatomy(
                fractions=arrays["fractions"], affine=arrays["affine"], brain=arrays["brain"]
            )
        return _ANATOMY
