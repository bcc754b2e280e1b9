"""Render stacks into what a VLM can read: windowed, normalised slices and labelled montages.

Display convention: radiological (dicom.display). Labels carry the sequence and the slice
position in mm, never a name, an ID or a date of the patient. Identical input gives
byte-identical PNGs.

The work is what the montage needs: the stack is read once (stored integers when it has one
modality LUT, dicom.pixels.load_stored), the head threshold and window come from one sort or
histogram of a regular in-plane subsample of it (dicom.window.stats_sample, about a million
voxels), the head's extent is probed from both ends, and only the chosen slices are converted
to grey, fitted, labelled (dicom.montage) and encoded (dicom.png).
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import re
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from nibabel.orientations import OrientationError

from dicom.display import (
    DisplayVolume,
    RenderError,
    canonical,
    crop_box,
    display_volume,
    position_label,
    select_slices,
    slice_2d,
)
from dicom.errors import ImagingError
from dicom.geometry import reslice_problem
from dicom.headers import DEFAULT_MEMORY_CAP, keeping_pixels
from dicom.index import index_path
from dicom.montage import (
    Marks,
    fit_tile,
    montage,
    single,
    single_origin,
    tile_fit,
    tile_origins,
)
from dicom.parallel import idle_cpus
from dicom.pixels import load_stored, load_volume
from dicom.png import encode_png
from dicom.records import (
    CLINICAL_CLASSES,
    FileError,
    FrameRef,
    IndexResult,
    Plane,
    RenderedImage,
    RenderManifest,
    SequenceClass,
    SeriesInfo,
    TilePlace,
)
from dicom.selection import find_series, one_per_dwi_series
from dicom.window import (
    CT_WINDOWS,
    MR_PERCENTILES,
    HeadStats,
    StoredLUT,
    is_ct,
    stored_to_uint8,
    to_uint8,
    volume_head_stats,
    window_for,
)

__all__ = [
    "CLINICAL_CLASSES",
    "CT_WINDOWS",
    "DIFFUSION_CHOICES",
    "MR_PERCENTILES",
    "DisplayVolume",
    "RenderError",
    "RenderOptions",
    "choose_diffusion_volume",
    "clear_caches",
    "default_targets",
    "display_volume",
    "find_series",
    "render_path",
    "render_stack",
    "select_slices",
    "sequence_label",
    "slice_2d",
    "window_for",
]

DIFFUSION_CHOICES = ("trace", "b1000", "b0")
_RENDER_THREADS = 4


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
    # Trace-weighted image: geometric mean over the gradient directions (in place: the
    # same float32 operations, in the same order, as log(max(x, 1e-3)) summed volume by volume).
    log_sum = None
    for v in range(len(pick.volumes)):
        vol = load_volume(pick, v, memory_cap)
        warnings.extend(vol.warnings)
        lg = np.maximum(vol.data, 1e-3, out=vol.data)
        np.log(lg, out=lg)
        if log_sum is None:
            log_sum = lg
        else:
            log_sum += lg
    assert log_sum is not None
    log_sum /= len(pick.volumes)
    return (
        pick,
        np.exp(log_sum, out=log_sum),
        f"b={b} trace ({len(pick.volumes)} directions)",
        warnings,
    )


def clear_caches() -> None:
    """Forget what earlier reads and renders left in this process (scan templates, converted
    header values, loaded fonts and rasterised labels), e.g. to time a cold render."""
    from dicom import montage
    from dicom.headers import clear_caches

    clear_caches()
    montage.clear_caches()


def sequence_label(series: SeriesInfo, volume_label: str) -> str:
    """The label shown to the model: class, plane and acquisition detail. No patient data."""
    parts = [series.series_class.value]
    if volume_label:
        parts.append(volume_label)
    elif series.detail:
        parts.append(series.detail)
    return " | ".join(parts)


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


def _unique_names(
    images: list[RenderedImage], files: list[tuple[str, bytes]], series_uid: str, taken: set[str]
) -> list[tuple[str, bytes]]:
    """File names no earlier stack of this render used (two series may share a number and a
    class: Siemens XA30 numbers its perfusion series alike); the records follow the rename."""
    tag = hashlib.sha256(series_uid.encode()).hexdigest()[:8]
    renamed: dict[str, str] = {}
    for name, _ in files:
        new, n = name, 1
        while new in taken:
            stem, dot, ext = name.rpartition(".")
            new = f"{stem}_{tag}{'' if n == 1 else f'_{n}'}{dot}{ext}"
            n += 1
        taken.add(new)
        renamed[name] = new
    for img in images:
        img.file = renamed.get(img.file, img.file)
    return [(renamed[name], data) for name, data in files]


def _write(out_dir: Path, files: list[tuple[str, bytes]]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, data in files:
        (out_dir / name).write_bytes(data)


# What one stack renders to: image records, PNG files (name, bytes), warnings.
_Rendered = tuple[list[RenderedImage], list[tuple[str, bytes]], list[str]]


@dataclass
class _Source:
    """The volume to show, how its values become grey, and which voxels are head."""

    series: SeriesInfo
    dv: DisplayVolume
    stats: HeadStats
    rgb: bool
    lut: StoredLUT | None  # stored integers: their modality LUT; None: float values
    warnings: list[str]


def _source(
    series: SeriesInfo, options: RenderOptions, siblings: list[SeriesInfo] | None
) -> _Source:
    warnings: list[str] = []
    lut = None
    if series.series_class is SequenceClass.DWI and siblings:
        series, data, vlabel, w = choose_diffusion_volume(
            siblings, options.diffusion, options.memory_cap
        )
        warnings.extend(w)
    else:
        vlabel = series.volume_labels[0] if series.volume_labels else ""
        stored = load_stored(series, 0, options.memory_cap)
        if stored is not None:
            lut = StoredLUT(stored.data.dtype, stored.slope, stored.intercept)
        vol = stored if stored is not None else load_volume(series, 0, options.memory_cap)
        data = vol.data
        warnings.extend(vol.warnings)
    rgb = data.ndim == 4 and data.shape[3] == 3
    reslice = options.reslice_axial
    if reslice and series.affine is not None and series.plane not in (None, Plane.AXIAL):
        why = reslice_problem(series.shape, series.spacing)
        if why is not None:
            assert series.plane is not None
            reslice = False
            warnings.append(
                f"series {series.key}: shown in its acquired {series.plane.value} plane, not "
                f"resliced to axial: {why}"
            )
    dv = display_volume(series, data, reslice, vlabel)
    warnings.extend(dv.warnings)
    ct = is_ct(series)
    spacing = (
        (float(series.spacing[0]), float(series.spacing[1]), float(series.spacing[2]))
        if len(series.spacing) >= 3
        else None
    )
    stats = volume_head_stats(data, lut, ct, rgb, spacing)
    return _Source(series, dv, stats, rgb, lut, warnings)


def _render_images(
    series: SeriesInfo,
    options: RenderOptions,
    siblings: list[SeriesInfo] | None,
    lesion_mask: SeriesInfo | None,
) -> _Rendered:
    """The records, PNG files (name, bytes) and warnings of one stack; writes nothing."""
    src = _source(series, options, siblings)
    series, dv, rgb, warnings = src.series, src.dv, src.rgb, src.warnings
    center, width, wdesc = (
        (127.5, 255.0, "RGB passed through")
        if rgb
        else window_for(series, src.stats, options.window)
    )
    # The window says why it is not the brain's: so do the warnings and the image itself.
    head_window = bool(src.stats.brain_note) and "inside the head" in wdesc
    if head_window:
        warnings.append(
            f"series {series.key}: MR window from the whole head, no brain region: "
            f"{src.stats.brain_note}"
        )
    grey: Callable[[np.ndarray], np.ndarray]
    if src.lut is not None:
        grey = stored_to_uint8(src.lut, center, width)
    else:
        grey = lambda img: to_uint8(img, center, width, rgb)  # noqa: E731
    lesion = None
    if lesion_mask is not None:
        lesion = _lesion_in_display(series, lesion_mask, dv, options.memory_cap)
    threshold = src.stats.threshold
    picks = select_slices(dv, threshold, options.n_slices, options.indices, lesion)
    images2d = [slice_2d(dv, k) for k in picks]
    mask2d = np.zeros(images2d[0].shape[:2], dtype=bool)
    if threshold is None:
        mask2d[...] = True
    else:
        for img in images2d:
            mask2d |= img > threshold
    r0, c0, r1, c1 = crop_box(mask2d)
    tiles, labels, positions = [], [], []
    for k, img in zip(picks, images2d, strict=True):
        text, mm = position_label(dv, k)
        tiles.append(fit_tile(grey(img[r0:r1, c0:c1]), dv.pixel_mm, options.tile_size))
        labels.append(text)
        positions.append(mm)
    marks = Marks(dv.plane, dv.affine is not None)
    seq = sequence_label(series, dv.volume_label)
    orient = (
        f"{dv.plane.value if dv.plane else 'unknown plane'}, radiological (patient right on image left)"
        if dv.affine is not None
        else "as stored (no patient geometry)"
    )
    bar = f"{orient}; window: whole head (no brain region)" if head_window else orient
    stem = f"{series.series_number if series.series_number is not None else 'x'}_{_safe_name(series.series_class.value)}"
    if series.stack:
        stem += f"_s{series.stack}"
    records: list[RenderedImage] = []
    files: list[tuple[str, bytes]] = []

    crop = (r0, c0, r1, c1)
    # The stored slices' inverse affine, once per stack (tile_place maps every tile through it).
    inverse = None if series.affine is None else np.linalg.inv(np.asarray(series.affine))

    def emit(
        img: np.ndarray,
        name: str,
        kind: str,
        idx: list[int],
        pos: list[float],
        label: str,
        origins: list[tuple[int, int]],
    ) -> None:
        data_png = encode_png(img)
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
                width=img.shape[1],
                height=img.shape[0],
                sha256=hashlib.sha256(data_png).hexdigest(),
                tiles=[
                    tile_place(series, dv, k, crop, options.tile_size, o, inverse)
                    for k, o in zip(idx, origins, strict=True)
                ],
            )
        )

    if options.singles:
        for k, tile, text, mm in zip(picks, tiles, labels, positions, strict=True):
            image = single(tile, text, marks, f"{seq} | {text}")
            name = f"{stem}_slice{k:03d}.png"
            origin = [single_origin(options.tile_size)]
            emit(image, name, "slice", [k], [mm], f"{seq} | {text}", origin)
    if options.montage:
        sheet = montage(tiles, labels, marks, options.columns, seq, bar)
        origins = tile_origins(len(tiles), options.columns, options.tile_size)
        emit(sheet, f"{stem}_montage.png", "montage", picks, positions, seq, origins)
    return records, files, warnings


def tile_place(
    series: SeriesInfo,
    dv: DisplayVolume,
    k: int,
    crop: tuple[int, int, int, int],
    size: int,
    origin: tuple[int, int],
    inverse: np.ndarray | None = None,
) -> TilePlace:
    """Where display slice ``k`` sits on its PNG (tile at ``origin`` = (top, left)) and the
    affine maps of a PNG pixel to RAS mm and, for an acquired slice, to its instance's pixels.

    The chain is the renderer's own: the crop ``crop`` = (r0, c0, r1, c1) of the radiological
    slice (slice_2d), fitted into the tile (montage.tile_fit), the display volume's voxel
    (u, v, k) and its affine; every step is affine, so the composition is exact.
    ``inverse`` is ``series.affine``'s inverse when the caller has it (once per stack).
    """
    r0, c0, r1, c1 = crop
    top, left = origin
    new_w, new_h, tr0, tc0 = tile_fit(c1 - c0, r1 - r0, dv.pixel_mm, size)
    sx, sy = (c1 - c0) / new_w, (r1 - r0) / new_h
    # display (col, row, 1) from PNG (x, y, 1): pixel centres at n + 0.5 on both sides
    disp = np.array(
        [
            [sx, 0.0, c0 - sx * (left + tc0) - 0.5],
            [0.0, sy, r0 - sy * (top + tr0) - 0.5],
            [0.0, 0.0, 1.0],
        ]
    )
    place = TilePlace(x=left, y=top, size=size, slice_index=k)
    if dv.affine is None:
        return place
    in_plane = [a for a in (0, 1, 2) if a != dv.axis]
    nu, nv = dv.data.shape[in_plane[0]], dv.data.shape[in_plane[1]]
    # slice_2d flips both axes: col c is u = nu - 1 - c, row r is v = nv - 1 - r
    voxel = np.zeros((4, 3))
    voxel[in_plane[0]] = [-disp[0, 0], -disp[0, 1], nu - 1 - disp[0, 2]]
    voxel[in_plane[1]] = [-disp[1, 0], -disp[1, 1], nv - 1 - disp[1, 2]]
    voxel[dv.axis] = [0.0, 0.0, float(k)]
    voxel[3] = [0.0, 0.0, 1.0]
    to_ras = (np.asarray(dv.affine) @ voxel)[:3]
    update: dict[str, object] = {"to_ras": _rounded(to_ras)}
    if series.affine is not None:
        if inverse is None:
            inverse = np.linalg.inv(np.asarray(series.affine))
        stored = inverse @ np.vstack([to_ras, [0.0, 0.0, 1.0]])
        slice_k = stored[2, 2]
        acquired = abs(stored[2, 0]) < 1e-6 and abs(stored[2, 1]) < 1e-6
        if acquired and abs(slice_k - round(slice_k)) < 1e-3:
            frames = _frames_of(series, dv.volume_label)
            n = round(slice_k)
            if 0 <= n < len(frames) and frames[n].sop_instance_uid:
                ref = frames[n]
                update |= {
                    "to_source": _rounded(stored[:2]),
                    "sop_instance_uid": ref.sop_instance_uid,
                    "sop_class_uid": ref.sop_class_uid,
                    "frame": None if ref.frame is None else ref.frame + 1,
                }
    return place.model_copy(update=update)


def _frames_of(series: SeriesInfo, volume_label: str) -> list[FrameRef]:
    """The stored slices (k = 0, 1, ...) of the volume shown."""
    if not series.volumes:
        return []
    labels = series.volume_labels
    v = labels.index(volume_label) if volume_label in labels else 0
    return series.volumes[v] if v < len(series.volumes) else []


def _rounded(m: np.ndarray) -> list[list[float]]:
    return [[round(float(x), 6) for x in row] for row in m]


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
    canon, _ = canonical(data, np.array(mask_series.affine))
    return canon > 0


def default_targets(
    index: IndexResult, classes: Collection[SequenceClass] | None = None
) -> list[SeriesInfo]:
    """The stacks rendered when none is named: one per series of ``classes`` (default: the
    clinical classes)."""
    wanted = CLINICAL_CLASSES if classes is None else frozenset(classes)
    return [s for s in index.series if s.renderable and s.series_class in wanted]


def render_path(
    path: str | Path,
    out_dir: str | Path,
    options: RenderOptions | None = None,
    series_uid: str | None = None,
    mask_uid: str | None = None,
    index: IndexResult | None = None,
    classes: Collection[SequenceClass] | None = None,
) -> RenderManifest:
    """Index ``path``, render the chosen series (``series_uid``: a UID, stack key, series
    number or short UID, see dicom.selection; else every series of ``classes``, by default the
    clinical ones) into ``out_dir``, write manifest.json. A selector naming no series or several
    raises a SeriesSelectionError listing the choices."""
    options = options or RenderOptions()
    if index is not None:
        return _render_index(path, out_dir, options, series_uid, mask_uid, index, classes)
    # Indexed here: the header pass keeps the small files' pixel bytes it reads, and the
    # stacks render from them instead of opening each file again (dicom.headers.kept).
    with keeping_pixels():
        index = index_path(path, memory_cap=options.memory_cap)
        return _render_index(path, out_dir, options, series_uid, mask_uid, index, classes)


def _render_index(
    path: str | Path,
    out_dir: str | Path,
    options: RenderOptions,
    series_uid: str | None,
    mask_uid: str | None,
    index: IndexResult,
    classes: Collection[SequenceClass] | None,
) -> RenderManifest:
    out = Path(out_dir)
    targets = one_per_dwi_series(
        find_series(index, series_uid) if series_uid else default_targets(index, classes)
    )
    mask = find_series(index, mask_uid)[0] if mask_uid else None
    # a stack whose geometry is broken is an error of its own; its neighbours render
    broken = [e for s in index.series for e in s.errors if e.kind == "geometry"]
    manifest = RenderManifest(source=str(path), errors=[*index.errors, *broken])
    jobs = [(s, [x for x in index.series if x.series_uid == s.series_uid]) for s in targets]

    def run(job: tuple[SeriesInfo, list[SeriesInfo]]) -> tuple[_Rendered | None, Exception | None]:
        try:
            return _render_images(job[0], options, job[1], mask), None
        except ImagingError as exc:
            return None, exc
        except (ValueError, ArithmeticError, np.linalg.LinAlgError, OrientationError) as exc:
            # what the header checks did not foresee still stays with this stack
            return None, RenderError(f"{type(exc).__name__}: {exc}")

    # Stacks render in threads when CPUs are idle (numpy, the decoders and PNG encoding
    # release the GIL); files are written and recorded in target order, as a serial run would.
    written: set[str] = set()
    n_threads = min(len(jobs), idle_cpus(), _RENDER_THREADS)
    pool = ThreadPoolExecutor(n_threads) if n_threads > 1 else None
    try:
        if pool is not None:  # each thread in a copy of this context (its kept pixels)
            contexts = [contextvars.copy_context() for _ in jobs]
            results = pool.map(lambda c, j: c.run(run, j), contexts, jobs)
        else:
            results = map(run, jobs)
        for (s, _), (result, exc) in zip(jobs, results, strict=True):
            if result is None:
                manifest.errors.append(
                    FileError(path=s.path, kind="render", message=f"series {s.key}: {exc}")
                )
                continue
            images, files, warnings = result
            files = _unique_names(images, files, s.series_uid, written)
            _write(out, files)
            manifest.images.extend(images)
            manifest.warnings.extend(warnings)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").write_text(manifest.model_dump_json(indent=2))
    return manifest


# Every module whose code decides the bytes of a rendered PNG: a change to any of them must
# invalidate cached renders. The classifier and the selection decide which stacks are rendered
# and the sequence label drawn on each.
RENDER_MODULES = (
    "render",
    "display",
    "window",
    "montage",
    "png",
    "pixels",
    "percentile",
    "geometry",
    "classify",
    "selection",
)


@functools.cache  # the sources do not change while a process runs
def renderer_version() -> str:
    """A digest of the renderer's code: the part of a render cache key that says which code drew it."""
    import importlib

    h = hashlib.sha256()
    for name in RENDER_MODULES:
        module = importlib.import_module(f"dicom.{name}")
        h.update(name.encode() + b"\0" + Path(str(module.__file__)).read_bytes())
    return h.hexdigest()[:16]
