"""Acquisition grids and the resampling of the 1 mm head into them.

A Grid is an axis-aligned voxel lattice in RAS mm, indexed (i=column, j=row, k=slice) like
the imaging core's SeriesInfo. Resampling is separable: along each axis a sparse matrix
averages the 1 mm source over the target voxel (the slice thickness along the slice axis), which
is the partial-volume effect of a real acquisition. Sparse products (no BLAS) keep it
bit-for-bit reproducible.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
from scipy import sparse

from evaluation.datasets.phantoms.anatomy import Anatomy
from evaluation.datasets.phantoms.tissue import TISSUES


@dataclass(frozen=True)
class Grid:
    """Voxel centres: world = origin + i*step_i*axis_i + j*step_j*axis_j + k*step_k*axis_k."""

    name: str
    shape: tuple[int, int, int]
    # For each voxel axis: the RAS axis it runs along (0, 1, 2) and the signed step in mm.
    axes: tuple[int, int, int]
    steps: tuple[float, float, float]
    origin: tuple[float, float, float]  # RAS mm of voxel (0, 0, 0)
    thickness: float  # slice thickness along k (>= |step_k| leaves no gap)

    @property
    def affine(self) -> np.ndarray:
        a = np.zeros((4, 4))
        for v, (ax, st) in enumerate(zip(self.axes, self.steps, strict=True)):
            a[ax, v] = st
        a[:3, 3] = self.origin
        a[3, 3] = 1.0
        return a

    def coords(self, v: int, idx: np.ndarray | None = None) -> np.ndarray:
        """World coordinate (along RAS axis ``axes[v]``) of voxel indices along axis v."""
        n = self.shape[v]
        i = np.arange(n, dtype=np.float64) if idx is None else idx.astype(np.float64)
        return self.origin[self.axes[v]] + i * self.steps[v]

    def box(self, lo: np.ndarray, hi: np.ndarray) -> tuple[slice, slice, slice] | None:
        """Voxel slices covering the RAS box [lo, hi] (mm), or None when it misses the grid."""
        out = []
        for v in range(3):
            ax, st = self.axes[v], self.steps[v]
            a = (lo[ax] - self.origin[ax]) / st
            b = (hi[ax] - self.origin[ax]) / st
            i0 = max(0, int(np.floor(min(a, b))))
            i1 = min(self.shape[v], int(np.ceil(max(a, b))) + 1)
            if i1 <= i0:
                return None
            out.append(slice(i0, i1))
        return (out[0], out[1], out[2])

    def points(
        self, box: tuple[slice, slice, slice], slab: int = 1
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """RAS coordinate arrays broadcastable to the box shape (plus a trailing slab axis).

        With ``slab`` > 1 each voxel is sampled at ``slab`` positions across the slice
        thickness (last axis), so thin lesions are partial-volumed like in a real slice.
        """
        ras: list[np.ndarray] = [np.zeros(1)] * 3
        offsets = (
            ((np.arange(slab) + 0.5) / slab - 0.5) * self.thickness if slab > 1 else np.zeros(1)
        )
        for v in range(3):
            c = self.coords(v, np.arange(box[v].start, box[v].stop))
            shape = [1, 1, 1, 1]
            if v == 2:
                c = c[:, None] + np.sign(self.steps[2]) * offsets[None, :]
                shape[2], shape[3] = c.shape
            else:
                shape[v] = c.shape[0]
            ras[self.axes[v]] = c.reshape(shape).astype(np.float32)
        return ras[0], ras[1], ras[2]


def _axis_matrix(
    centres: np.ndarray, width: float, src0: float, src_step: float, n_src: int
) -> sparse.csr_matrix:
    """Rows: target voxels; weights: overlap of the target box with each 1 mm source box."""
    w = max(width, abs(src_step))
    rows, cols, vals = [], [], []
    for r, c in enumerate(centres):
        lo = (c - w / 2 - src0) / src_step
        hi = (c + w / 2 - src0) / src_step
        lo, hi = min(lo, hi), max(lo, hi)
        s0, s1 = max(0, int(np.floor(lo + 0.5))), min(n_src - 1, int(np.ceil(hi - 0.5)))
        for s in range(s0, s1 + 1):
            ov = min(hi, s + 0.5) - max(lo, s - 0.5)
            if ov > 1e-6:
                rows.append(r)
                cols.append(s)
                vals.append(ov)
    m = sparse.csr_matrix(
        (np.array(vals, dtype=np.float32), (rows, cols)), shape=(len(centres), n_src)
    )
    total = np.asarray(m.sum(axis=1)).ravel()
    # Rows are normalised by the box width, so voxels beyond the source grid fade to air.
    scale = np.where(total > 0, 1.0 / (w / abs(src_step)), 0.0).astype(np.float32)
    return sparse.csr_matrix(sparse.diags(scale) @ m)


def resample(anatomy: Anatomy, grid: Grid, volume: np.ndarray) -> np.ndarray:
    """Resample one float32 volume of the anatomy grid into ``grid`` (i, j, k order)."""
    src = anatomy.affine
    data = volume
    # labels[a] says what array axis a holds: "r0".."r2" (RAS source) or "g0".."g2" (grid).
    labels = ["r0", "r1", "r2"]
    for v in range(3):
        ax = grid.axes[v]
        width = grid.thickness if v == 2 else abs(grid.steps[v])
        m = _axis_matrix(grid.coords(v), width, src[ax, 3], src[ax, ax], anatomy.shape[ax])
        pos = labels.index(f"r{ax}")
        moved = np.moveaxis(data, pos, 0)
        rest = moved.shape[1:]
        flat = np.ascontiguousarray(moved).reshape(moved.shape[0], -1)
        data = np.asarray(m @ flat, dtype=np.float32).reshape((m.shape[0], *rest))
        labels = [f"g{v}", *[lab for i, lab in enumerate(labels) if i != pos]]
    perm = [labels.index(f"g{v}") for v in range(3)]
    return np.ascontiguousarray(np.transpose(data, perm))


@dataclass
class GridTissues:
    """Normal tissue fractions of the head on one grid (T, i, j, k): float32, or uint8 x scale."""

    grid: Grid
    fractions: np.ndarray
    scale: float = 1.0  # 1/255 when ``fractions`` is the anatomy's uint8 array

    def tissue(self, name: str) -> np.ndarray:
        return self.fractions[TISSUES.index(name)].astype(np.float32) * np.float32(self.scale)

    def box(self, box: tuple[slice, slice, slice]) -> np.ndarray:
        """float32 fractions (T, *box)."""
        return self.fractions[(slice(None), *box)].astype(np.float32) * np.float32(self.scale)


_CACHE: dict[Grid, GridTissues] = {}
_CACHE_LOCK = threading.Lock()


def grid_tissues(anatomy: Anatomy, grid: Grid) -> GridTissues:
    """Tissue fractions on ``grid`` (cached per process: geometry does not vary per case)."""
    with _CACHE_LOCK:
        hit = _CACHE.get(grid)
    if hit is not None:
        return hit
    frac = np.stack(
        [
            resample(anatomy, grid, anatomy.fractions[t].astype(np.float32) / 255.0)
            for t in range(len(TISSUES))
        ]
    )
    gt = GridTissues(grid, frac)
    with _CACHE_LOCK:
        _CACHE[grid] = gt
    return gt


def _centred(n: int, step: float, centre: float) -> float:
    """Origin so that ``n`` voxels of ``step`` are centred on ``centre``."""
    return centre - step * (n - 1) / 2.0


# Axial grids: columns run to the patient's left, rows to posterior (DICOM LPS +x, +y), so
# the stored image is already in radiological view; slices go from inferior to superior.
MR_AXIAL = Grid(
    "mr_axial",
    (256, 256, 26),
    (0, 1, 2),
    (-0.9, -0.9, 6.0),
    (_centred(256, -0.9, 0.0), _centred(256, -0.9, -17.0), -52.0),
    5.0,
)
CT_AXIAL = Grid(
    "ct_axial",
    (256, 256, 33),
    (0, 1, 2),
    (-0.9, -0.9, 5.0),
    (_centred(256, -0.9, 0.0), _centred(256, -0.9, -17.0), -62.0),
    5.0,
)
# Sagittal 3D: columns run posterior, rows inferior, slices from the patient's right to left.
SAG_T1 = Grid(
    "sag_t1",
    (192, 176, 144),
    (1, 2, 0),
    (-1.2, -1.2, -1.2),
    (_centred(144, -1.2, 0.0), _centred(192, -1.2, -17.0), _centred(176, -1.2, 5.0)),
    1.2,
)


def binned(grid: Grid, factor: int) -> Grid:
    """The grid of ``grid`` with in-plane pixels binned ``factor`` x ``factor`` (e.g. DWI)."""
    shift = [(factor - 1) / 2.0 * grid.steps[v] for v in range(2)]
    origin = list(grid.origin)
    for v in range(2):
        origin[grid.axes[v]] += shift[v]
    return Grid(
        f"{grid.name}_bin{factor}",
        (grid.shape[0] // factor, grid.shape[1] // factor, grid.shape[2]),
        grid.axes,
        (grid.steps[0] * factor, grid.steps[1] * factor, grid.steps[2]),
        (origin[0], origin[1], origin[2]),
        grid.thickness,
    )


def bin_array(data: np.ndarray, factor: int) -> np.ndarray:
    """Average ``factor`` x ``factor`` blocks in the first two axes."""
    i, j = data.shape[0] // factor, data.shape[1] // factor
    d = data[: i * factor, : j * factor]
    return d.reshape(i, factor, j, factor, *d.shape[2:]).mean(axis=(1, 3)).astype(np.float32)


def anatomy_tissues(anatomy: Anatomy) -> GridTissues:
    """The 1 mm head itself as GridTissues (no copy; lesion masks are built on it)."""
    return GridTissues(anatomy_grid(anatomy), anatomy.fractions, 1.0 / 255.0)


def anatomy_grid(anatomy: Anatomy) -> Grid:
    """The 1 mm RAS grid of the anatomy itself (masks are written on it)."""
    a = anatomy.affine
    return Grid(
        "anatomy_1mm",
        anatomy.shape,
        (0, 1, 2),
        (float(a[0, 0]), float(a[1, 1]), float(a[2, 2])),
        (float(a[0, 3]), float(a[1, 3]), float(a[2, 3])),
        float(a[2, 2]),
    )
