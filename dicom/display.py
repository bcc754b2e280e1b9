"""Display geometry: a volume reoriented for viewing, its slices, which slices to show, where.

Display convention: radiological. Axial and coronal images show the patient's right on the
image left and the left on the image right; axial images have anterior at the top. Every
function here works on views (flips and transposes), never on copies of the volume.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dicom.errors import ImagingError
from dicom.records import Plane, SeriesInfo


class RenderError(ImagingError):
    """A stack could not be rendered (bad options, no usable slices)."""


def side_marks(plane: Plane | str | None) -> tuple[str, str] | None:
    """The letters at an image's left and right edges in the display convention: R and L for
    axial and coronal images, A and P for sagittal ones; None for an unknown plane (no patient
    geometry: the image is shown as stored, and its sides name nothing)."""
    try:
        p = Plane(plane) if plane is not None else None
    except ValueError:
        return None
    if p in (Plane.AXIAL, Plane.CORONAL):
        return ("R", "L")
    if p is Plane.SAGITTAL:
        return ("A", "P")
    return None


@dataclass
class DisplayVolume:
    """A volume reoriented for display along one anatomical axis."""

    data: np.ndarray  # x, y, z (RAS-canonical) or raw i, j, k when there is no geometry
    affine: np.ndarray | None
    axis: int  # the slicing axis in ``data``
    plane: Plane | None
    pixel_mm: tuple[float, float]  # (width, height) of a display pixel
    volume_label: str
    warnings: list[str] = field(default_factory=list)


def canonical(data: np.ndarray, affine: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """RAS-canonical view (flips and transposes, no copy) and its affine."""
    # Imported here: nibabel costs ~0.3 s to import, and `neurosandbox inspect` never needs it.
    from nibabel.orientations import apply_orientation, inv_ornt_aff, io_orientation

    ornt = io_orientation(affine)
    out = apply_orientation(data, ornt)
    return out, affine @ inv_ornt_aff(ornt, data.shape[:3])


def display_volume(
    series: SeriesInfo, data: np.ndarray, reslice_axial: bool, label: str
) -> DisplayVolume:
    """Reorient to RAS and choose the display axis (axial unless kept in the native plane)."""
    if series.affine is None:
        # No patient geometry: show the stored image as it is, without orientation marks.
        return DisplayVolume(
            data,
            None,
            2,
            series.plane,
            _pixel_mm(series),
            label,
            ["no patient geometry: shown as stored, no R/L marks"],
        )
    canon, aff = canonical(data, np.array(series.affine))
    if reslice_axial or series.plane in (None, Plane.AXIAL):
        axis, plane = 2, Plane.AXIAL
    else:
        axis, plane = (0, Plane.SAGITTAL) if series.plane is Plane.SAGITTAL else (1, Plane.CORONAL)
    zooms = np.sqrt((aff[:3, :3] ** 2).sum(axis=0))
    in_plane = [a for a in (0, 1, 2) if a != axis]
    return DisplayVolume(
        canon, aff, axis, plane, (float(zooms[in_plane[0]]), float(zooms[in_plane[1]])), label
    )


def _pixel_mm(series: SeriesInfo) -> tuple[float, float]:
    if len(series.spacing) >= 2 and series.spacing[0] > 0 and series.spacing[1] > 0:
        return float(series.spacing[0]), float(series.spacing[1])
    return 1.0, 1.0


def _plane(dv: DisplayVolume, index: int) -> np.ndarray:
    key: list[int | slice] = [slice(None)] * 3
    key[dv.axis] = index
    return dv.data[tuple(key)]


def slice_2d(dv: DisplayVolume, index: int) -> np.ndarray:
    """One display slice as (rows, cols[, 3]), radiological orientation."""
    plane = _plane(dv, index)
    if dv.affine is None:
        return np.swapaxes(plane, 0, 1)  # (i, j) -> (row, col) as stored
    # plane is (u, v) with u, v increasing toward R/A/S: transpose and flip both so that
    # patient right is on the image left and anterior (or superior) is at the top.
    return np.swapaxes(plane, 0, 1)[::-1, ::-1]


def head_extent(dv: DisplayVolume, threshold: float | None) -> tuple[int, int] | None:
    """First and last display slice with more than 2% head (``data > threshold``; None: all).

    Probed from both ends, so that only the slices outside the head are read. (0, depth - 1)
    when no voxel is head; None when some are but no slice reaches 2%.
    """
    depth = dv.data.shape[dv.axis]
    if threshold is None:
        return 0, depth - 1

    def fraction(k: int) -> tuple[float, bool]:
        plane = _plane(dv, k)
        count = int(np.count_nonzero(plane > threshold))
        return count / plane.size, count > 0

    any_head = False
    for lo in range(depth):
        area, some = fraction(lo)
        any_head = any_head or some
        if area > 0.02:
            break
    else:
        return None if any_head else (0, depth - 1)
    for hi in range(depth - 1, lo, -1):
        if fraction(hi)[0] > 0.02:
            return lo, hi
    return lo, lo


def select_slices(
    dv: DisplayVolume,
    threshold: float | None,
    n: int,
    indices: list[int] | None,
    lesion: np.ndarray | None,
) -> list[int]:
    """Explicit indices, slices through a lesion mask, or N evenly spaced slices over the head
    (``data > threshold``) less its caps."""
    depth = dv.data.shape[dv.axis]
    if indices:
        bad = [i for i in indices if not 0 <= i < depth]
        if bad:
            raise RenderError(f"slice indices {bad} out of range 0..{depth - 1}")
        return list(dict.fromkeys(indices))
    if n < 1:
        raise RenderError("number of slices must be at least 1")
    other = tuple(a for a in range(3) if a != dv.axis)
    if lesion is not None and lesion.any():
        candidates = np.nonzero(lesion.any(axis=other))[0]
    else:
        extent = head_extent(dv, threshold)
        if extent is None:
            candidates = np.arange(depth)
        else:
            lo, hi = extent
            # Trim the caps of the skull, where a slice shows little brain.
            trim = round((hi - lo) * 0.06)
            candidates = np.arange(lo + trim, hi - trim + 1)
    if candidates.size <= n:
        return [int(c) for c in candidates]
    picks = np.linspace(0, candidates.size - 1, n)
    return [int(candidates[round(p)]) for p in picks]


def crop_box(mask2d: np.ndarray, margin: float = 0.06) -> tuple[int, int, int, int]:
    """(row0, col0, row1, col1) around the head of a 2-D mask, with a margin."""
    rows = np.nonzero(mask2d.any(axis=1))[0]
    cols = np.nonzero(mask2d.any(axis=0))[0]
    h, w = mask2d.shape
    if rows.size == 0 or cols.size == 0:
        return 0, 0, h, w
    mr, mc = int(h * margin), int(w * margin)
    return (
        max(0, rows[0] - mr),
        max(0, cols[0] - mc),
        min(h, rows[-1] + 1 + mr),
        min(w, cols[-1] + 1 + mc),
    )


def position_label(dv: DisplayVolume, index: int) -> tuple[str, float]:
    """The slice's label ("S 12.3 mm", or "slice 4" without geometry) and its position in mm."""
    if dv.affine is None:
        return f"slice {index + 1}", float(index)
    # Position of the slice centre (an oblique slice's corner sits elsewhere along the axis).
    voxel = [(n - 1) / 2.0 for n in dv.data.shape[:3]] + [1.0]
    voxel[dv.axis] = float(index)
    mm = float((dv.affine @ np.array(voxel))[dv.axis])
    letter = {0: ("R", "L"), 1: ("A", "P"), 2: ("S", "I")}[dv.axis]
    side = letter[0] if mm >= 0 else letter[1]
    return f"{side} {abs(mm):.1f} mm", round(mm, 2)
