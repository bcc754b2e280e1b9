"""Slice geometry: order along the slice normal, spacing and gaps, plane, voxel-to-RAS affine.

Voxel indices are (i = column, j = row, k = slice), as nibabel and dcm2niix use them; DICOM
patient coordinates are LPS, so the RAS affine flips the first two axes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dicom.records import Plane

LPS_TO_RAS = np.diag([-1.0, -1.0, 1.0, 1.0])
# Positions closer than this along the normal are the same slice (Philips jitters by 1e-4 mm).
POSITION_TOLERANCE_MM = 0.05
# Relative deviation from the median spacing that counts as non-uniform.
SPACING_TOLERANCE = 0.01


# A reslice into another plane builds each of its images from one row of every acquired slice,
# so its through-plane pixel is the slice spacing. Beyond these bounds it is a blocky strip and
# the stack is shown in the plane it was acquired in: slices more than RESLICE_MAX_SPACING_RATIO
# times the coarser in-plane pixel apart (a resliced pixel more than twice as tall as wide: a
# 2D coronal T2 at 4 mm over 0.45 mm pixels is 9x), or fewer than RESLICE_MIN_SLICES slices
# (a 10-slice DWI is a 10-row image, however thin its slices).
RESLICE_MAX_SPACING_RATIO = 2.0
RESLICE_MIN_SLICES = 24


def reslice_problem(shape: Sequence[int], spacing: Sequence[float]) -> str | None:
    """Why a stack's through-plane sampling cannot support a reslice into another plane, or
    None. ``shape`` is (columns, rows, slices[, ...]), ``spacing`` (column, row, slice) in mm."""
    if len(shape) < 3 or len(spacing) < 3:
        return "the stack has no slice axis"
    n = int(shape[2])
    if n < RESLICE_MIN_SLICES:
        return f"{n} slices (fewer than {RESLICE_MIN_SLICES})"
    in_plane = max(abs(float(spacing[0])), abs(float(spacing[1])))
    through = abs(float(spacing[2]))
    if in_plane > 0 and through > RESLICE_MAX_SPACING_RATIO * in_plane:
        return (
            f"slices {through:.3g} mm apart over {in_plane:.3g} mm pixels (more than "
            f"{RESLICE_MAX_SPACING_RATIO:g}x)"
        )
    return None


@dataclass(frozen=True)
class StackGeometry:
    affine: np.ndarray  # 4x4, voxel -> RAS mm
    spacing: tuple[float, float, float]  # column, row, slice (mm)
    plane: Plane
    obliquity_deg: float
    uniform: bool
    gaps: list[str]


def geometry_problem(
    orientation: Sequence[float] | np.ndarray, pixel_spacing: Sequence[float] | np.ndarray | None
) -> str | None:
    """Why a stack's header cannot place its pixels in space, or None.

    ImageOrientationPatient must be two finite, near-unit, near-perpendicular direction cosines;
    PixelSpacing (when given) two finite non-zero numbers. The sign of the spacing is not a
    problem here: orientation comes from ImageOrientationPatient and the positions, never from
    the spacing's sign (``stack_geometry`` uses its absolute value)."""
    o = np.asarray(list(orientation), dtype=float)
    if o.shape != (6,) or not np.all(np.isfinite(o)):
        return f"ImageOrientationPatient {_show(orientation)} is not six finite numbers"
    row, col = o[:3], o[3:]
    n_row, n_col = float(np.linalg.norm(row)), float(np.linalg.norm(col))
    if not (0.9 < n_row < 1.1 and 0.9 < n_col < 1.1):
        return f"ImageOrientationPatient {_show(orientation)} is not two unit direction cosines"
    if abs(float(row @ col)) / (n_row * n_col) > 0.05:
        return (
            f"ImageOrientationPatient {_show(orientation)}: rows and columns are not perpendicular"
        )
    if pixel_spacing is not None:
        ps = np.asarray(list(pixel_spacing), dtype=float)
        if ps.shape != (2,) or not np.all(np.isfinite(ps)) or np.any(ps == 0):
            return f"PixelSpacing {_show(pixel_spacing)} is not two finite non-zero numbers"
    return None


def affine_problem(affine: np.ndarray) -> str | None:
    """Why a stack's voxel-to-patient affine is unusable (not finite, or its slices collapse)."""
    if not np.all(np.isfinite(affine)):
        return "the slice positions give a non-finite affine"
    if abs(float(np.linalg.det(affine[:3, :3]))) < 1e-6:
        return "the slice positions do not span the stack (every slice at one position)"
    return None


def _show(values: Sequence[float] | np.ndarray | None) -> str:
    shown = list(values)[:6] if values is not None else []
    return "\\".join(f"{float(v):g}" for v in shown) or "(none)"


def slice_centre(
    orientation: Sequence[float] | np.ndarray,
    position: Sequence[float] | np.ndarray,
    pixel_spacing: Sequence[float] | np.ndarray,
    rows: int,
    cols: int,
) -> tuple[np.ndarray, np.ndarray] | None:
    """(centre of one slice in RAS mm, unit slice normal in RAS), as the renderer labels tiles;
    None when the header cannot place the slice (``geometry_problem``). The spacing's sign is
    ignored, as everywhere: the directions are the orientation's."""
    if geometry_problem(orientation, pixel_spacing) is not None:
        return None
    o = np.asarray(list(orientation), dtype=float)
    dr, dc = abs(float(pixel_spacing[0])), abs(float(pixel_spacing[1]))  # rows, columns
    centre = np.asarray(position, dtype=float) + o[:3] * (cols - 1) / 2 * dc
    centre = centre + o[3:] * (rows - 1) / 2 * dr
    flip = LPS_TO_RAS.diagonal()[:3]
    return centre * flip, slice_normal(list(o)) * flip


def slice_normal(orientation: Sequence[float]) -> np.ndarray:
    """Unit normal of an image plane from ImageOrientationPatient (row cosines, column cosines)."""
    row = np.asarray(orientation[:3], dtype=float)
    col = np.asarray(orientation[3:6], dtype=float)
    n = np.cross(row, col)
    norm = np.linalg.norm(n)
    return n / norm if norm > 0 else np.array([0.0, 0.0, 1.0])


def plane_of(normal: np.ndarray) -> tuple[Plane, float]:
    """The anatomical plane closest to a slice normal, and the angle to it in degrees."""
    axis = int(np.argmax(np.abs(normal)))
    plane = (Plane.SAGITTAL, Plane.CORONAL, Plane.AXIAL)[axis]
    cos = min(1.0, float(abs(normal[axis]) / (np.linalg.norm(normal) or 1.0)))
    return plane, float(np.degrees(np.arccos(cos)))


def project(positions: Sequence[Sequence[float]], normal: np.ndarray) -> np.ndarray:
    return np.asarray(positions, dtype=float) @ normal


def stack_geometry(
    orientation: Sequence[float],
    pixel_spacing: Sequence[float] | None,
    positions: Sequence[Sequence[float]],
    slice_thickness: float | None = None,
) -> StackGeometry:
    """Geometry of slices already sorted along the normal (one position per slice)."""
    row_dir = np.asarray(orientation[:3], dtype=float)
    col_dir = np.asarray(orientation[3:6], dtype=float)
    normal = slice_normal(orientation)
    # The sign of the spacing never flips the image: the direction is the orientation's.
    dr, dc = (
        (abs(float(pixel_spacing[0])), abs(float(pixel_spacing[1])))
        if pixel_spacing
        else (1.0, 1.0)
    )
    pos = np.asarray(positions, dtype=float)
    gaps: list[str] = []
    uniform = True
    if len(pos) > 1:
        steps = np.diff(pos @ normal)
        median = float(np.median(steps))
        slice_step = (pos[-1] - pos[0]) / (len(pos) - 1)
        dk = float(abs(median))
        if median > 0:
            deviation = np.abs(steps - median) / median
            uniform = bool(np.all(deviation <= SPACING_TOLERANCE))
            for idx in np.nonzero(deviation > SPACING_TOLERANCE)[0]:
                kind = "gap" if steps[idx] > median else "overlap"
                gaps.append(
                    f"{kind} between slices {idx} and {idx + 1}: {steps[idx]:.2f} mm "
                    f"(median spacing {median:.2f} mm)"
                )
    else:
        dk = float(slice_thickness or 1.0)
        slice_step = normal * dk
    lps = np.eye(4)
    lps[:3, 0] = row_dir * dc
    lps[:3, 1] = col_dir * dr
    lps[:3, 2] = slice_step
    lps[:3, 3] = pos[0]
    plane, oblique = plane_of(normal)
    return StackGeometry(
        affine=LPS_TO_RAS @ lps,
        spacing=(dc, dr, dk),
        plane=plane,
        obliquity_deg=round(oblique, 3),
        uniform=uniform,
        gaps=gaps,
    )


def cluster_positions(projections: np.ndarray) -> np.ndarray:
    """Label each projected position with the index of its slice (sorted along the normal)."""
    order = np.argsort(projections, kind="stable")
    labels = np.empty(len(projections), dtype=int)
    current = -1
    last = None
    for idx in order:
        value = projections[idx]
        if last is None or value - last > POSITION_TOLERANCE_MM:
            current += 1
            last = value
        labels[idx] = current
    return labels
