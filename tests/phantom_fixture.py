"""Phantom suites generated once per test session (registered in conftest.py), and the helpers
that read a case back through the imaging core.

``phantom_suite``: six cases chosen for what most tests need: MS (FLAIR plaques), MCA stroke
(CT + DWI/ADC), haemorrhage (CT), glioblastoma (T1 and T1C), abscess (restricted diffusion) and
an L3 normal case (CT then MRI, three turns). Other test modules use it too, so it stays small.

``phantom_more``: the disease pictures only the phantom tests look at: metastases, meningioma,
PCA stroke, hyperacute ACA stroke (L2: CT and MRI within hours), haemorrhage with MRI (L3) and
the L2 glioblastoma / abscess pair whose record decides. Generated only when a test asks.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest
from scipy import ndimage

PHANTOM_SEED = 11
PHANTOM_CASES = {"ms": 2, "stroke": 3, "ich": 4, "gbm": 5, "abscess": 8, "l3": 21}
PHANTOM_MORE = {
    "mets": 6,
    "meningioma": 7,
    "pca": 10,
    "gbm-l2": 15,
    "abscess-l2": 18,
    "aca-hyperacute": 19,
    "ich-mr": 24,
}


@dataclass
class PhantomSuite:
    root: Path
    seed: int
    manifest: object  # evaluation.datasets.phantoms.SuiteManifest
    cases: dict[str, int] = field(default_factory=lambda: dict(PHANTOM_CASES))

    def case_dir(self, key: str) -> Path:
        from evaluation.datasets.phantoms import case_spec

        return self.root / case_spec(self.cases[key]).case_id


def _generate(root: Path, cases: dict[str, int]) -> PhantomSuite:
    from evaluation.datasets.phantoms import generate_suite

    manifest = generate_suite(root, max(cases.values()), PHANTOM_SEED, only=sorted(cases.values()))
    return PhantomSuite(root, PHANTOM_SEED, manifest, dict(cases))


def _shared(factory: pytest.TempPathFactory, name: str, cases: dict[str, int]) -> PhantomSuite:
    """The suite generated once per test run: under xdist, by the first worker that asks, in
    the run's temporary folder all workers share (under a lock); the others read it. The
    generation is deterministic (tests/test_phantoms_suite.py) and costs 10-25 s of a core."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return _generate(factory.mktemp(name), cases)
    from evaluation.datasets.phantoms import SuiteManifest

    shared = factory.getbasetemp().parent  # pytest-N/, beside each worker's popen-gwN/
    root = shared / name
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        if not (root / "suite.json").exists():
            part = shared / f"{name}.part"
            shutil.rmtree(part, ignore_errors=True)  # left by a worker that died writing it
            _generate(part, cases)
            part.rename(root)
    manifest = SuiteManifest.model_validate_json((root / "suite.json").read_text(encoding="utf-8"))
    return PhantomSuite(root, PHANTOM_SEED, manifest, dict(cases))


@pytest.fixture(scope="session")
def phantom_suite(tmp_path_factory: pytest.TempPathFactory) -> PhantomSuite:
    return _shared(tmp_path_factory, "phantoms", PHANTOM_CASES)


@pytest.fixture(scope="session")
def phantom_more(tmp_path_factory: pytest.TempPathFactory) -> PhantomSuite:
    return _shared(tmp_path_factory, "phantoms-more", PHANTOM_MORE)


# --------------------------------------------------------------------------- reading cases


class Study:
    """A case's images (via the imaging core) and its lesion mask."""

    def __init__(self, folder: Path) -> None:
        from dicom.index import index_path
        from evaluation.case import Case

        self.folder = folder
        self.case = Case.model_validate_json((folder / "case.json").read_text(encoding="utf-8"))
        self.index = index_path(folder / "dicom", workers=1)
        img: Any = nib.load(folder / "masks" / "lesions.nii.gz")
        self.mask = np.asarray(img.dataobj)
        self.mask_affine = img.affine
        self._depth: dict[int, np.ndarray] = {}
        self._volumes: dict[
            tuple[str, float | None, str | None], tuple[np.ndarray, np.ndarray]
        ] = {}
        self._outside: np.ndarray | None = None

    @property
    def truth(self):  # type: ignore[no-untyped-def]
        gt = self.case.ground_truth
        assert gt is not None, self.folder.name
        return gt

    def series(self, cls: str, b: float | None = None, plane: str | None = None):  # type: ignore[no-untyped-def]
        hits = [s for s in self.index.series if s.series_class.value == cls]
        if b is not None:
            hits = [s for s in hits if s.b_values and abs(s.b_values[0] - b) < 1]
        if plane is not None:
            hits = [s for s in hits if s.plane and s.plane.value == plane]
        assert len(hits) == 1, f"{self.folder.name}: {len(hits)} stacks of class {cls} (b={b})"
        return hits[0]

    def volume(
        self, cls: str, b: float | None = None, plane: str | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        from dicom.pixels import load_volume

        key = (cls, b, plane)
        if key not in self._volumes:  # decoded once per study: several tests read each series
            s = self.series(cls, b, plane)
            assert s.affine is not None
            data, affine = np.asarray(load_volume(s).data), np.array(s.affine)
            data.flags.writeable = affine.flags.writeable = False
            self._volumes[key] = (data, affine)
        return self._volumes[key]

    def depth(self, label: int) -> np.ndarray:
        """mm from each voxel of lesion ``label`` to the nearest voxel outside it (1 mm grid).

        Computed in the lesion's bounding box plus one voxel: the nearest outside voxel of any
        lesion voxel lies in that box, so this equals the transform of the whole volume.
        """
        if label not in self._depth:
            inside = self.mask == label
            out = np.zeros(self.mask.shape, np.float32)
            idx = np.argwhere(inside)
            if len(idx):
                lo = np.maximum(idx.min(axis=0) - 1, 0)
                hi = np.minimum(idx.max(axis=0) + 2, self.mask.shape)
                box = tuple(slice(int(a), int(b)) for a, b in zip(lo, hi, strict=True))
                out[box] = ndimage.distance_transform_edt(inside[box])
            self._depth[label] = out
        return self._depth[label]

    def voxels(self, pts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(in-volume flags, clipped 1 mm mask voxel indices) of RAS points."""
        vox = np.rint((pts - self.mask_affine[:3, 3]) / np.diag(self.mask_affine)[:3]).astype(int)
        ok = np.all((vox >= 0) & (vox < self.mask.shape), axis=1)
        return ok, np.clip(vox, 0, np.array(self.mask.shape) - 1)

    def mask_at(self, pts: np.ndarray, depth: float = 0.0) -> np.ndarray:
        """Label at RAS points (nearest 1 mm voxel); 0 where the point is < depth mm inside."""
        ok, v = self.voxels(pts)
        labels = np.where(ok, self.mask[v[:, 0], v[:, 1], v[:, 2]], 0).astype(int)
        if depth > 0:
            for lab in np.unique(labels[labels > 0]):
                sel = labels == lab
                d = self.depth(int(lab))[v[sel, 0], v[sel, 1], v[sel, 2]]
                labels[sel] = np.where(d >= depth, lab, 0)
        return labels

    def distance_outside(self, pts: np.ndarray, reach: int = 45) -> np.ndarray:
        """mm from each RAS point to the nearest lesion voxel (any label; 0 inside).

        Exact up to ``reach`` mm (the transform runs in the lesions' box grown by ``reach``,
        which holds every lesion voxel); farther points get ``inf``.
        """
        if self._outside is None:
            out = np.full(self.mask.shape, np.inf, np.float32)
            idx = np.argwhere(self.mask > 0)
            if len(idx):
                lo = np.maximum(idx.min(axis=0) - reach, 0)
                hi = np.minimum(idx.max(axis=0) + reach + 1, self.mask.shape)
                box = tuple(slice(int(a), int(b)) for a, b in zip(lo, hi, strict=True))
                out[box] = ndimage.distance_transform_edt(self.mask[box] == 0)
            self._outside = out
        ok, v = self.voxels(pts)
        return np.where(ok, self._outside[v[:, 0], v[:, 1], v[:, 2]], np.inf)


class Studies:
    """Cases of the session suites read on first use, each once."""

    def __init__(self, *suites: PhantomSuite) -> None:
        self.suites = suites
        self._cache: dict[str, Study] = {}

    def __getitem__(self, key: str) -> Study:
        if key not in self._cache:
            suite = next(s for s in self.suites if key in s.cases)
            self._cache[key] = Study(suite.case_dir(key))
        return self._cache[key]


def centres(shape: tuple[int, ...], affine: np.ndarray) -> np.ndarray:
    """RAS mm of every voxel centre (N, 3), in the order of ``flat``."""
    i, j, k = (np.arange(n, dtype=np.float64) for n in shape[:3])
    a = affine[:3, :3]
    pts = (
        i[:, None, None, None] * a[:, 0]
        + j[None, :, None, None] * a[:, 1]
        + (k[:, None] * a[:, 2] + affine[:3, 3])[None, None]
    )
    return pts.reshape(-1, 3)


def flat(data: np.ndarray) -> np.ndarray:
    """Voxel values in the order of ``centres`` (C order over i, j, k)."""
    return np.asarray(data).reshape(-1)


def sample(data: np.ndarray, affine: np.ndarray, pts: np.ndarray) -> np.ndarray:
    vox = np.rint((pts - affine[:3, 3]) @ np.linalg.inv(affine[:3, :3]).T).astype(int)
    vox = np.clip(vox, 0, np.array(data.shape[:3]) - 1)
    return data[vox[:, 0], vox[:, 1], vox[:, 2]]


MIRROR = np.array([-1.0, 1.0, 1.0])  # the head is symmetric about x = 0 (MNI152 sym)
