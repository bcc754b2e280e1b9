"""Frames of multi-frame objects: enhanced objects (functional groups), Siemens mosaics and
UIH grids ('VFRAME' mosaics).

Split from dicom.headers.read, which calls these for the objects that need them; both read the
whole header with pydicom (the fast scanner hands these objects over).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence

from dicom.headers.frame import (
    FrameHeader,
    as_code_strings,
    as_float,
    as_floats,
    as_int,
    as_text,
    first_item,
    group_value,
)
from dicom.headers.pixel_rules import rescale, usable_window


def mosaic_frames(base: FrameHeader, ds: Dataset) -> list[FrameHeader]:
    """A Siemens mosaic's tiles, or the mosaic as one frame when its CSA header says nothing."""
    mosaic = _mosaic_tiles(ds)
    if mosaic is None:
        return [base]
    return _mosaic_frames(base, ds, *mosaic)


def _mosaic_tiles(ds: Dataset) -> tuple[int, tuple[float, float, float]] | None:
    """Number of slices in a Siemens mosaic and the slice normal, from the CSA image header."""
    if "MOSAIC" not in as_code_strings(ds.get("ImageType")):
        return None
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nibabel warns that its DICOM readers are experimental
        from nibabel.nicom import csareader

    csa = csareader.get_csa_header(ds, "image")
    if csa is None:
        return None
    n = csareader.get_n_mosaic(csa)
    normal = csareader.get_slice_normal(csa)
    if not n or normal is None:
        return None
    return int(n), (float(normal[0]), float(normal[1]), float(normal[2]))


def uih_grid_frames(base: FrameHeader, ds: Dataset) -> list[FrameHeader]:
    """A UIH grid's tiles, or the grid as one frame when its private header does not place them.

    United Imaging stores a DTI or fMRI volume per file as a grid (ImageType ending VFRAME) and
    documents it (dcm2niix's UIH/README.md, from rordenlab/dcm2niix#225): (0065,1050) holds
    the number of slices n, laid out ceil(sqrt(n)) tiles across and ceil(n / across) down, and
    item k of the sequence (0065,1051) holds the ImagePositionPatient of tile k. There is no
    top-level position, and unlike a Siemens mosaic's, each position is the tile's own corner.
    """
    grid = _uih_grid(base, ds)
    if grid is None:
        return [base]
    n, positions = grid
    across = math.ceil(math.sqrt(n))
    rows, cols = base.rows // math.ceil(n / across), base.cols // across
    return [
        replace(base, frame=k, extras={}, rows=rows, cols=cols, position=pos, mosaic_slices=n)
        for k, pos in enumerate(positions)
    ]


def _uih_grid(base: FrameHeader, ds: Dataset) -> tuple[int, list[tuple[float, ...]]] | None:
    """Number of tiles of a UIH grid and the position of each, from the 'Image Private Header'."""
    try:
        block = ds.private_block(0x0065, "Image Private Header")
    except KeyError:
        return None
    if 0x50 not in block or 0x51 not in block:
        return None
    n = as_int(block[0x50].value)
    items = block[0x51].value
    if not n or n < 1 or not isinstance(items, Sequence) or len(items) != n:
        return None
    across = math.ceil(math.sqrt(n))
    if base.cols % across or base.rows % math.ceil(n / across):
        return None
    positions = [as_floats(item.get("ImagePositionPatient"), 3) for item in items]
    if any(p is None for p in positions):
        return None
    return n, [p for p in positions if p is not None]


def enhanced_frames(base: FrameHeader, ds: Dataset) -> list[FrameHeader]:
    shared = first_item(ds, "SharedFunctionalGroupsSequence")
    per_frame = ds.get("PerFrameFunctionalGroupsSequence") or []
    frames: list[FrameHeader] = []
    for i in range(base.number_of_frames):
        fg = per_frame[i] if i < len(per_frame) else None

        def gv(seq: str, attr: str, _fg: Dataset | None = fg) -> Any:
            return group_value(_fg, shared, seq, attr)

        fr = replace(base, frame=i, extras=dict(base.extras))
        fr.position = as_floats(gv("PlanePositionSequence", "ImagePositionPatient"), 3)
        fr.orientation = as_floats(gv("PlaneOrientationSequence", "ImageOrientationPatient"), 6)
        fr.pixel_spacing = as_floats(gv("PixelMeasuresSequence", "PixelSpacing"), 2)
        fr.slice_thickness = as_float(gv("PixelMeasuresSequence", "SliceThickness"))
        sbs = as_float(gv("PixelMeasuresSequence", "SpacingBetweenSlices"))
        fr.spacing_between_slices = sbs if sbs is not None else base.spacing_between_slices
        fr.rescale_slope, fr.rescale_intercept = rescale(
            fr,
            gv("PixelValueTransformationSequence", "RescaleSlope"),
            gv("PixelValueTransformationSequence", "RescaleIntercept"),
            gv("PixelValueTransformationSequence", "RescaleType"),
            default=(base.rescale_slope, base.rescale_intercept),
            where=f"frame {i + 1}: ",
        )
        te = as_float(gv("MREchoSequence", "EffectiveEchoTime"))
        fr.echo_time = te if te is not None else base.echo_time
        tr = as_float(gv("MRTimingAndRelatedParametersSequence", "RepetitionTime"))
        fr.repetition_time = tr if tr is not None else base.repetition_time
        fa = as_float(gv("MRTimingAndRelatedParametersSequence", "FlipAngle"))
        fr.flip_angle = fa if fa is not None else base.flip_angle
        ti = as_float(gv("MRModifierSequence", "InversionTimes"))
        fr.inversion_time = ti if ti is not None else base.inversion_time
        ft = as_code_strings(
            gv("MRImageFrameTypeSequence", "FrameType")
            or gv("CTImageFrameTypeSequence", "FrameType")
        )
        fr.frame_type = ft
        b = as_float(gv("MRDiffusionSequence", "DiffusionBValue"))
        if b is not None:
            fr.b_value = b
            grad = first_item(
                first_item(fg, "MRDiffusionSequence"), "DiffusionGradientDirectionSequence"
            )
            fr.direction = (
                as_floats(grad.get("DiffusionGradientOrientation"), 3) if grad is not None else None
            )
        tpi = as_int(gv("FrameContentSequence", "TemporalPositionIndex"))
        if tpi is not None:
            fr.temporal_index = tpi
        stack_id = gv("FrameContentSequence", "StackID")
        if stack_id is not None:
            fr.extras["stack_id"] = as_text(stack_id, 16)
        window = usable_window(
            as_float(gv("FrameVOILUTSequence", "WindowCenter")),
            as_float(gv("FrameVOILUTSequence", "WindowWidth")),
        )
        if window is not None:
            fr.window = window
        frames.append(fr)
    return frames


def _mosaic_frames(
    base: FrameHeader, ds: Dataset, n: int, normal: tuple[float, float, float]
) -> list[FrameHeader]:
    """Expand a Siemens mosaic into its tiles, with the true position of each slice."""
    if base.orientation is None or base.position is None or base.pixel_spacing is None:
        return [base]
    tiles_per_side = math.ceil(math.sqrt(n))
    rows, cols = base.rows // tiles_per_side, base.cols // tiles_per_side
    row_dir = np.array(base.orientation[:3])
    col_dir = np.array(base.orientation[3:])
    dr, dc = base.pixel_spacing
    # IPP of a mosaic is the corner of the whole mosaic; shift to the corner of the first tile.
    offset = (base.cols - cols) / 2.0 * dc * row_dir + (base.rows - rows) / 2.0 * dr * col_dir
    first = np.array(base.position) + offset
    step = base.spacing_between_slices or base.slice_thickness or 1.0
    nvec = np.array(normal)
    frames = []
    for k in range(n):
        pos = first + k * step * nvec
        frames.append(
            replace(
                base,
                frame=k,
                extras={},
                rows=rows,
                cols=cols,
                position=(float(pos[0]), float(pos[1]), float(pos[2])),
                mosaic_slices=n,
            )
        )
    return frames
