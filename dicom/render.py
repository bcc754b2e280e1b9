"""Render stacks into what a VLM can read: windowed, normalised slices and labelled montages.

Display convention: radiological. Axial and coronal images show the patient's right on the
image left (marked R) and the left on the image right (marked L); axial images have anterior
at the top. Labels carry the sequence and the slice position in mm, never a name, an ID or a
date of the patient. Identical input gives byte-identical PNGs.
"""

from __future__ import annotations

import functools
import hashlib
import io
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from dicom.errors import ImagingError, SeriesNotFoundError
from dicom.headers import DEFAULT_MEMORY_CAP
from dicom.index import index_path
from dicom.parallel import idle_cpus
from dicom.percentile import percentile_of_sorted
from dicom.pixels import load_volume
from dicom.records import (
    CLINICAL_CLASSES,
    FileError,
    IndexResult,
    Plane,
    RenderedImage,
    RenderManifest,
    SequenceClass,
    SeriesInfo,
)

# Neuro CT windows, level/width in HU.
CT_WINDOWS: dict[str, tuple[float, float]] = {
    "brain": (40.0, 80.0),
    "subdural": (75.0, 215.0),
    "stroke": (40.0, 40.0),
    "bone": (600.0, 2800.0),
    "soft": (40.0, 380.0),
}
MR_PERCENTILES = (0.5, 99.5)
DIFFUSION_CHOICES = ("trace", "b1000", "b0")
_RENDER_THREADS = 4


class RenderError(ImagingError):
    """A stack could not be rendered (bad options, no usable slices)."""


@dataclass
class RenderOptions:
    n_slices: int = 12
    indices: list[int] | None = None
    window: str = "auto"  # auto | brain | subdural | stroke | bone | soft | dicom | C/W
    reslice_axial: bool = True
    tile_size: int = 256
    columns: int = 4
    diffusion: str = "trace"
    singles: bool = False
    montage: bool = True
    memory_cap: int = DEFAULT_MEMORY_CAP


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


def _canonical(data: np.ndarray, affine: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """RAS-canonical view (flips and transposes, no copy) and its affine."""
    # Imported here: nibabel costs ~0.3 s to import, and `neurosandbox inspect` never needs it.
    from nibabel.orientations import apply_orientation, inv_ornt_aff, io_orientation

    ornt = io_orientation(affine)
    out = apply_orientation(data, ornt)
    return out, affine @ inv_ornt_aff(ornt, data.shape[:3])


def choose_diffusion_volume(
    stacks: list[SeriesInfo], mode: str, memory_cap: int
) -> tuple[SeriesInfo, np.ndarray, str, list[str]]:
    """From the stacks of one DWI series pick b=0, b~1000 or the trace (geometric mean)."""
    if mode not in DIFFUSION_CHOICES:
        raise RenderError(f"diffusion choice {mode!r} is not one of {', '.join(DIFFUSION_CHOICES)}")
    weighted = [s for s in stacks if s.b_values and s.b_values[0] > 0]
    b0 = [s for s in stacks if not s.b_values or s.b_values[0] == 0]
    warnings: list[str] = []
    if mode == "b0" or not weighted:
        if mode != "b0":
            warnings.append("no diffusion-weighted stack (b>0) found: rendering b=0")
        pick = b0[0] if b0 else stacks[0]
        vol = load_volume(pick, 0, memory_cap)
        return pick, vol.data, f"b={int(pick.b_values[0]) if pick.b_values else 0}", vol.warnings
    pick = min(weighted, key=lambda s: (abs(s.b_values[0] - 1000), s.b_values[0]))
    b = int(pick.b_values[0])
    if mode == "b1000" or len(pick.volumes) == 1:
        vol = load_volume(pick, 0, memory_cap)
        label = f"b={b}" if len(pick.volumes) == 1 else f"b={b}, {pick.volume_labels[0]}"
        return pick, vol.data, label, vol.warnings
    # Trace-weighted image: geometric mean over the gradient directions.
    log_sum = None
    for v in range(len(pick.volumes)):
        vol = load_volume(pick, v, memory_cap)
        warnings.extend(vol.warnings)
        lg = np.log(np.maximum(vol.data, 1e-3))
        log_sum = lg if log_sum is None else log_sum + lg
    assert log_sum is not None
    trace = np.exp(log_sum / len(pick.volumes)).astype(np.float32)
    return pick, trace, f"b={b} trace ({len(pick.volumes)} directions)", warnings


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
    canon, aff = _canonical(data, np.array(series.affine))
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


def slice_2d(dv: DisplayVolume, index: int) -> np.ndarray:
    """One display slice as (rows, cols[, 3]), radiological orientation."""
    key: list[int | slice] = [slice(None)] * 3
    key[dv.axis] = index
    plane = dv.data[tuple(key)]
    if dv.affine is None:
        return np.swapaxes(plane, 0, 1)  # (i, j) -> (row, col) as stored
    # plane is (u, v) with u, v increasing toward R/A/S: transpose and flip both so that
    # patient right is on the image left and anterior (or superior) is at the top.
    return np.swapaxes(plane, 0, 1)[::-1, ::-1]


def head_mask(data: np.ndarray, is_ct: bool) -> np.ndarray:
    """Voxels that belong to the head (not air): a threshold suits both CT and MR here."""
    return _head_mask_and_values(data, is_ct)[0]


def _head_mask_and_values(data: np.ndarray, is_ct: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """The head mask and, for MR, the sorted values inside it (for the percentile window).

    One sort of the positive values serves both percentiles (see dicom.percentile).
    """
    if is_ct:
        return data > -300.0, None
    # The same voxels with every axis in increasing memory order (a view), so that they are
    # read in storage order and flattened without a copy; the order of values is irrelevant.
    flips = tuple(axis for axis, stride in enumerate(data.strides) if stride < 0)
    forward = np.flip(data, flips) if flips else data
    flat = forward.ravel(order="K")
    positive = flat[flat > 0]
    positive.sort()
    if positive.size == 0:
        return np.zeros(data.shape, dtype=bool), None
    threshold = 0.1 * float(percentile_of_sorted(positive, 99.0))
    mask = forward > threshold  # a Python float against float32 compares as float32
    # threshold > 0, so the voxels above it are exactly the positive values above it: the
    # tail of the sorted values after the float32 threshold.
    first = int(np.searchsorted(positive, np.float32(threshold), side="right"))
    return (np.flip(mask, flips) if flips else mask), positive[first:]


def window_for(
    series: SeriesInfo,
    data: np.ndarray,
    mask: np.ndarray,
    name: str,
    inside_sorted: np.ndarray | None = None,
) -> tuple[float, float, str]:
    """(center, width, description) of the display window.

    ``inside_sorted`` (optional) is ``np.sort(data[mask])``, when the caller has it already.
    """
    is_ct = series.series_class is SequenceClass.CT or series.modality == "CT"
    if name == "auto":
        name = "brain" if is_ct else "percentile"
    if name in CT_WINDOWS:
        if not is_ct:
            raise RenderError(
                f"window {name!r} is a CT (Hounsfield) preset; series {series.key} is {series.modality}"
            )
        c, w = CT_WINDOWS[name]
        return c, w, f"CT {name} {c:g}/{w:g} HU"
    if re.fullmatch(r"-?\d+(\.\d+)?/\d+(\.\d+)?", name):
        c, w = (float(v) for v in name.split("/"))
        return c, w, f"custom {c:g}/{w:g}"
    if name == "percentile":
        if inside_sorted is not None and inside_sorted.size:
            pct = percentile_of_sorted(inside_sorted, MR_PERCENTILES)
        else:
            pct = np.percentile(data[mask] if mask.any() else data.ravel(), MR_PERCENTILES)
        lo, hi = (float(v) for v in pct)
        if hi <= lo:
            hi = lo + 1.0
        return (
            (lo + hi) / 2,
            hi - lo,
            f"MR p{MR_PERCENTILES[0]:g}-p{MR_PERCENTILES[1]:g} inside head",
        )
    raise RenderError(
        f"unknown window {name!r}: use auto, {', '.join(CT_WINDOWS)}, percentile or CENTER/WIDTH"
    )


def _to_uint8(img: np.ndarray, center: float, width: float, rgb: bool) -> np.ndarray:
    if rgb:
        return np.clip(img, 0, 255).astype(np.uint8)
    lo = center - width / 2
    scaled = img.astype(np.float64)  # then ((x - lo) / width) * 255, rounded, in place
    scaled -= lo
    scaled /= width
    scaled *= 255.0
    np.rint(scaled, out=scaled)
    return np.clip(scaled, 0, 255, out=scaled).astype(np.uint8)


def select_slices(
    dv: DisplayVolume,
    mask: np.ndarray,
    n: int,
    indices: list[int] | None,
    lesion: np.ndarray | None,
) -> list[int]:
    """N evenly spaced slices over the head, explicit indices, or slices through a mask."""
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
        area = mask.mean(axis=other) if mask.any() else np.ones(depth)
        candidates = np.nonzero(area > 0.02)[0]
        if candidates.size == 0:
            candidates = np.arange(depth)
        else:
            lo, hi = int(candidates[0]), int(candidates[-1])
            # Trim the caps of the skull, where a slice shows little brain.
            trim = round((hi - lo) * 0.06)
            candidates = np.arange(lo + trim, hi - trim + 1)
    if candidates.size <= n:
        return [int(c) for c in candidates]
    picks = np.linspace(0, candidates.size - 1, n)
    return [int(candidates[round(p)]) for p in picks]


def _crop_box(mask2d: np.ndarray, margin: float = 0.06) -> tuple[int, int, int, int]:
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


def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    # One font object per thread: FreeType faces are not safe to share between threads.
    return _font_of_thread(size, threading.get_ident())


@functools.lru_cache(maxsize=64)
def _font_of_thread(size: int, _thread: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def _fit_tile(img: np.ndarray, pixel_mm: tuple[float, float], size: int) -> Image.Image:
    """Resample to square pixels and fit into a size x size tile (black background)."""
    h, w = img.shape[:2]
    width_mm, height_mm = w * pixel_mm[0], h * pixel_mm[1]
    scale = size / max(width_mm, height_mm)
    new_w, new_h = max(1, round(width_mm * scale)), max(1, round(height_mm * scale))
    mode = "RGB" if img.ndim == 3 else "L"
    pil = Image.fromarray(np.ascontiguousarray(img), mode=mode).resize(
        (new_w, new_h), Image.Resampling.BILINEAR
    )
    tile = Image.new(mode, (size, size), 0)
    tile.paste(pil, ((size - new_w) // 2, (size - new_h) // 2))
    return tile.convert("RGB")


def _position_label(dv: DisplayVolume, index: int) -> tuple[str, float]:
    if dv.affine is None:
        return f"slice {index + 1}", float(index)
    # Position of the slice centre (an oblique slice's corner sits elsewhere along the axis).
    voxel = [(n - 1) / 2.0 for n in dv.data.shape[:3]] + [1.0]
    voxel[dv.axis] = float(index)
    mm = float((dv.affine @ np.array(voxel))[dv.axis])
    letter = {0: ("R", "L"), 1: ("A", "P"), 2: ("S", "I")}[dv.axis]
    side = letter[0] if mm >= 0 else letter[1]
    return f"{side} {abs(mm):.1f} mm", round(mm, 2)


def _mark_tile(tile: Image.Image, dv: DisplayVolume, text: str) -> None:
    draw = ImageDraw.Draw(tile)
    size = tile.size[0]
    font = _font(max(10, size // 16))
    draw.text((4, size - 4), text, fill=(255, 255, 0), font=font, anchor="ls")
    if dv.affine is not None and dv.plane in (Plane.AXIAL, Plane.CORONAL):
        draw.text((4, size // 2), "R", fill=(255, 255, 0), font=font, anchor="lm")
        draw.text((size - 4, size // 2), "L", fill=(255, 255, 0), font=font, anchor="rm")
    elif dv.affine is not None and dv.plane is Plane.SAGITTAL:
        draw.text((4, size // 2), "A", fill=(255, 255, 0), font=font, anchor="lm")
        draw.text((size - 4, size // 2), "P", fill=(255, 255, 0), font=font, anchor="rm")


def sequence_label(series: SeriesInfo, volume_label: str) -> str:
    """The label shown to the model: class, plane and acquisition detail. No patient data."""
    parts = [series.series_class.value]
    if volume_label:
        parts.append(volume_label)
    elif series.detail:
        parts.append(series.detail)
    return " | ".join(parts)


def _png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=False, compress_level=1)
    return buf.getvalue()


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")[:60] or "series"


def render_stack(
    series: SeriesInfo,
    out_dir: Path,
    options: RenderOptions,
    siblings: list[SeriesInfo] | None = None,
    lesion_mask: SeriesInfo | None = None,
) -> tuple[list[RenderedImage], list[str]]:
    """Render one stack (or, for DWI, the chosen diffusion volume of its series)."""
    records, files, warnings = _render_images(series, options, siblings, lesion_mask)
    _write(out_dir, files)
    return records, warnings


def _write(out_dir: Path, files: list[tuple[str, bytes]]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, data in files:
        (out_dir / name).write_bytes(data)


# What one stack renders to: image records, PNG files (name, bytes), warnings.
_Rendered = tuple[list[RenderedImage], list[tuple[str, bytes]], list[str]]


def _render_images(
    series: SeriesInfo,
    options: RenderOptions,
    siblings: list[SeriesInfo] | None,
    lesion_mask: SeriesInfo | None,
) -> _Rendered:
    """The records, PNG files (name, bytes) and warnings of one stack; writes nothing."""
    warnings: list[str] = []
    if series.series_class is SequenceClass.DWI and siblings:
        series, data, vlabel, w = choose_diffusion_volume(
            siblings, options.diffusion, options.memory_cap
        )
        warnings.extend(w)
    else:
        vol = load_volume(series, 0, options.memory_cap)
        data, vlabel = vol.data, (series.volume_labels[0] if series.volume_labels else "")
        warnings.extend(vol.warnings)
    rgb = data.ndim == 4 and data.shape[3] == 3
    dv = display_volume(series, data, options.reslice_axial, vlabel)
    warnings.extend(dv.warnings)
    is_ct = series.series_class is SequenceClass.CT or series.modality == "CT"
    if rgb:
        mask, inside = np.ones(dv.data.shape[:3], dtype=bool), None
    else:
        mask, inside = _head_mask_and_values(dv.data, is_ct)
    center, width, wdesc = (
        (127.5, 255.0, "RGB passed through")
        if rgb
        else window_for(series, dv.data, mask, options.window, inside)
    )
    lesion = None
    if lesion_mask is not None:
        lesion = _lesion_in_display(series, lesion_mask, dv, options.memory_cap)
    picks = select_slices(dv, mask, options.n_slices, options.indices, lesion)
    images2d = [slice_2d(dv, k) for k in picks]
    mask_dv = replace(dv, data=mask)
    mask2d = np.zeros(images2d[0].shape[:2], dtype=bool)
    for k in picks:
        mask2d |= slice_2d(mask_dv, k)
    r0, c0, r1, c1 = _crop_box(mask2d)
    tiles, labels, positions = [], [], []
    for k, img in zip(picks, images2d, strict=True):
        u8 = _to_uint8(img[r0:r1, c0:c1], center, width, rgb)
        text, mm = _position_label(dv, k)
        tile = _fit_tile(u8, dv.pixel_mm, options.tile_size)
        _mark_tile(tile, dv, text)
        tiles.append(tile)
        labels.append(text)
        positions.append(mm)
    seq = sequence_label(series, dv.volume_label)
    orient = (
        f"{dv.plane.value if dv.plane else 'unknown plane'}, radiological (patient right on image left)"
        if dv.affine is not None
        else "as stored (no patient geometry)"
    )
    stem = f"{series.series_number if series.series_number is not None else 'x'}_{_safe_name(series.series_class.value)}"
    if series.stack:
        stem += f"_s{series.stack}"
    records: list[RenderedImage] = []
    files: list[tuple[str, bytes]] = []

    def emit(
        img: Image.Image, name: str, kind: str, idx: list[int], pos: list[float], label: str
    ) -> None:
        data_png = _png_bytes(img)
        files.append((name, data_png))
        records.append(
            RenderedImage(
                file=name,
                kind=kind,
                series_uid=series.series_uid,
                stack=series.stack,
                series_class=series.series_class.value,
                label=label,
                slice_indices=idx,
                slice_positions_mm=pos,
                volume=dv.volume_label,
                window=wdesc,
                window_center=round(center, 4),
                window_width=round(width, 4),
                orientation=orient,
                width=img.size[0],
                height=img.size[1],
                sha256=hashlib.sha256(data_png).hexdigest(),
            )
        )

    if options.singles:
        for k, tile, text, mm in zip(picks, tiles, labels, positions, strict=True):
            single = _with_header(tile, f"{seq} | {text}")
            emit(single, f"{stem}_slice{k:03d}.png", "slice", [k], [mm], f"{seq} | {text}")
    if options.montage:
        montage = _montage(tiles, options.columns, seq, orient)
        emit(montage, f"{stem}_montage.png", "montage", picks, positions, seq)
    return records, files, warnings


def _with_header(tile: Image.Image, text: str) -> Image.Image:
    bar = max(18, tile.size[0] // 12)
    out = Image.new("RGB", (tile.size[0], tile.size[1] + bar), (0, 0, 0))
    out.paste(tile, (0, bar))
    ImageDraw.Draw(out).text(
        (4, bar // 2), text, fill=(255, 255, 255), font=_font(max(10, bar * 2 // 3)), anchor="lm"
    )
    return out


def _montage(tiles: list[Image.Image], columns: int, title: str, orient: str) -> Image.Image:
    size = tiles[0].size[0]
    cols = max(1, min(columns, len(tiles)))
    nrows = (len(tiles) + cols - 1) // cols
    bar = max(24, size // 8)
    out = Image.new("RGB", (cols * size, nrows * size + bar), (0, 0, 0))
    draw = ImageDraw.Draw(out)
    draw.text(
        (6, bar // 3), title, fill=(255, 255, 255), font=_font(max(11, bar // 3)), anchor="lm"
    )
    draw.text(
        (6, bar * 3 // 4), orient, fill=(200, 200, 200), font=_font(max(9, bar // 4)), anchor="lm"
    )
    for n, tile in enumerate(tiles):
        out.paste(tile, ((n % cols) * size, bar + (n // cols) * size))
    return out


def _lesion_in_display(
    series: SeriesInfo, mask_series: SeriesInfo, dv: DisplayVolume, cap: int
) -> np.ndarray:
    if (
        mask_series.shape[:3] != series.shape[:3]
        or mask_series.affine is None
        or series.affine is None
    ):
        raise RenderError(
            f"mask series {mask_series.key} is not on the grid of series {series.key}"
        )
    if not np.allclose(np.array(mask_series.affine), np.array(series.affine), atol=0.1):
        raise RenderError(
            f"mask series {mask_series.key} is not on the grid of series {series.key}"
        )
    data = load_volume(mask_series, 0, cap).data
    canon, _ = _canonical(data, np.array(mask_series.affine))
    return canon > 0


def _one_per_dwi_series(stacks: list[SeriesInfo]) -> list[SeriesInfo]:
    """A DWI series renders once (its b-value stacks are combined by the diffusion choice)."""
    out: list[SeriesInfo] = []
    seen_dwi: set[str] = set()
    for s in stacks:
        if s.series_class is SequenceClass.DWI:
            if s.series_uid in seen_dwi:
                continue
            seen_dwi.add(s.series_uid)
        out.append(s)
    return out


def default_targets(index: IndexResult) -> list[SeriesInfo]:
    """The stacks rendered when none is named: one per clinical series."""
    return [s for s in index.series if s.renderable and s.series_class in CLINICAL_CLASSES]


def find_series(index: IndexResult, uid: str) -> list[SeriesInfo]:
    """Stacks matching a series UID (all its stacks) or a stack key ``UID#n``."""
    hits = [s for s in index.series if s.key == uid or s.series_uid == uid]
    if not hits:
        known = ", ".join(sorted({s.series_uid for s in index.series if s.series_uid})[:5])
        raise SeriesNotFoundError(f"no series {uid!r} in this input (first known: {known})")
    return hits


def render_path(
    path: str | Path,
    out_dir: str | Path,
    options: RenderOptions | None = None,
    series_uid: str | None = None,
    mask_uid: str | None = None,
    index: IndexResult | None = None,
) -> RenderManifest:
    """Index ``path``, render the chosen (or default) series into ``out_dir``, write manifest.json."""
    options = options or RenderOptions()
    out = Path(out_dir)
    index = index or index_path(path, memory_cap=options.memory_cap)
    targets = _one_per_dwi_series(
        find_series(index, series_uid) if series_uid else default_targets(index)
    )
    mask = find_series(index, mask_uid)[0] if mask_uid else None
    manifest = RenderManifest(source=str(path), errors=list(index.errors))
    jobs = [(s, [x for x in index.series if x.series_uid == s.series_uid]) for s in targets]

    def run(job: tuple[SeriesInfo, list[SeriesInfo]]) -> tuple[_Rendered | None, Exception | None]:
        try:
            return _render_images(job[0], options, job[1], mask), None
        except ImagingError as exc:
            return None, exc

    # Stacks render in threads when CPUs are idle (numpy, the decoders and PNG encoding
    # release the GIL); files are written and recorded in target order, as a serial run would.
    n_threads = min(len(jobs), idle_cpus(), _RENDER_THREADS)
    pool = ThreadPoolExecutor(n_threads) if n_threads > 1 else None
    try:
        results = pool.map(run, jobs) if pool is not None else map(run, jobs)
        for (s, _), (result, exc) in zip(jobs, results, strict=True):
            if result is None:
                manifest.errors.append(
                    FileError(path=s.path, kind="render", message=f"series {s.key}: {exc}")
                )
                continue
            images, files, warnings = result
            _write(out, files)
            manifest.images.extend(images)
            manifest.warnings.extend(warnings)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").write_text(manifest.model_dump_json(indent=2))
    return manifest
