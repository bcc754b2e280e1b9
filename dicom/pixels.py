"""Decode the pixels of one stack volume, only when it is rendered.

Native little-endian single-frame files are read straight from the pixel offset recorded in
the header pass (no second parse); everything else (compressed transfer syntaxes, big endian,
multi-frame, mosaics, archives) goes through pydicom with the pylibjpeg/openjpeg/libjpeg/RLE
plugins. A slice that fails to decode is zero-filled and reported; the rest of the stack is kept.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import pydicom
from numpy.typing import DTypeLike

from dicom.errors import DecodeError, TooLargeError
from dicom.headers import DEFAULT_MEMORY_CAP, take_kept_pixels
from dicom.records import NIFTI_SOP_CLASS, FrameRef, SeriesInfo
from dicom.sources import is_plain_file, open_source


@dataclass
class Volume:
    """A decoded volume in voxel order (i = column, j = row, k = slice[, RGB channel])."""

    data: np.ndarray
    warnings: list[str] = field(default_factory=list)
    failed_slices: list[int] = field(default_factory=list)


def load_volume(
    series: SeriesInfo, volume: int = 0, memory_cap: int = DEFAULT_MEMORY_CAP
) -> Volume:
    """Decode volume ``volume`` of a stack, modality LUT (RescaleSlope/Intercept) applied.

    The array is indexed (column, row, slice[, channel]) but stored slice by slice (it is a
    transposed view), so that each decoded slice is written to contiguous memory.
    """
    if series.sop_class_uid == NIFTI_SOP_CLASS:
        from dicom.nifti import load_nifti_volume

        return Volume(load_nifti_volume(series, volume, memory_cap))
    refs = _volume_refs(series, volume, memory_cap)
    return _decode(series, refs, np.float32, rescale=True, file_cap=memory_cap)


@dataclass
class StoredVolume(Volume):
    """Stored integer values, before the modality LUT ``value * slope + intercept``, which is
    the same for every slice (and increasing: slope > 0)."""

    slope: float = 1.0
    intercept: float = 0.0


def load_stored(
    series: SeriesInfo, volume: int = 0, memory_cap: int = DEFAULT_MEMORY_CAP
) -> StoredVolume | None:
    """Volume ``volume`` as stored integers (indexed as ``load_volume``'s), or None when its
    values are not plain integers of at most 16 bits under one increasing modality LUT."""
    if series.sop_class_uid == NIFTI_SOP_CLASS or series.samples_per_pixel != 1:
        return None
    dtype = _native_dtype(series)
    if dtype is None or dtype.itemsize > 2:
        return None
    refs = _volume_refs(series, volume, memory_cap)
    luts = {(r.rescale_slope, r.rescale_intercept) for r in refs}
    if len(luts) != 1:
        return None
    ((slope, intercept),) = luts
    if not slope > 0:
        return None
    try:
        vol = _decode(series, refs, dtype, rescale=False, file_cap=memory_cap)
    except _NotStored:
        return None
    if vol.failed_slices and intercept != 0:
        return None  # a blank slice must read 0 after the LUT, as load_volume gives it
    return StoredVolume(vol.data, vol.warnings, vol.failed_slices, slope, intercept)


class _NotStored(Exception):
    """A decoder returned values that do not fit the stored integer type."""


def _volume_refs(series: SeriesInfo, volume: int, memory_cap: int) -> list[FrameRef]:
    if not series.volumes:
        raise DecodeError(f"series {series.key}: no image to decode ({series.series_class})")
    if not 0 <= volume < len(series.volumes):
        raise DecodeError(
            f"series {series.key}: volume {volume} out of range 0..{len(series.volumes) - 1}"
        )
    refs = series.volumes[volume]
    cols, rows = series.shape[0], series.shape[1]
    needed = cols * rows * len(refs) * 4 * series.samples_per_pixel
    if needed > memory_cap:
        raise TooLargeError(
            f"series {series.key}: volume needs {needed / 2**30:.2f} GiB, over the "
            f"{memory_cap / 2**30:.2f} GiB memory cap"
        )
    return refs


def _decode(
    series: SeriesInfo, refs: list[FrameRef], dtype: DTypeLike, rescale: bool, file_cap: int
) -> Volume:
    cols, rows = series.shape[0], series.shape[1]
    spp = series.samples_per_pixel
    shape: tuple[int, ...] = (len(refs), rows, cols) + ((3,) if spp == 3 else ())
    out = np.zeros(shape, dtype=dtype)
    failed: list[int] = []
    errors: list[str] = []
    native = _native_dtype(series)
    # Group slices by file so a multi-frame object or mosaic is decoded once.
    by_file: dict[str, list[tuple[int, FrameRef]]] = defaultdict(list)
    for k, ref in enumerate(refs):
        by_file[ref.path].append((k, ref))
    if native is not None and len(by_file) == len(refs) and hasattr(os, "preadv"):
        # One native single-frame file per slice (the common case): read each straight into
        # its slice (or a reused buffer), without the per-file dispatch below.
        by_file = _read_native(series, refs, native, out, rescale, failed, errors)
    for path, items in by_file.items():
        try:
            decoded = _decode_file(path, items, rows, cols, spp, series, native, file_cap)
            for k, img, ref in decoded:
                if rescale:
                    _store(out[k], img, ref)
                elif img.dtype == out.dtype or np.can_cast(img.dtype, out.dtype, "safe"):
                    out[k] = img
                else:
                    raise _NotStored(f"{path}: decoded as {img.dtype}, not {out.dtype}")
        except _NotStored:
            raise
        except Exception as exc:  # one bad file must not cost the whole stack
            failed.extend(k for k, _ in items)
            errors.append(f"{path}: {exc}")
    warnings = []
    if failed:
        if len(failed) == len(refs):
            raise DecodeError(f"series {series.key}: no slice could be decoded: {errors[0]}")
        warnings.append(
            f"series {series.key}: {len(failed)} of {len(refs)} slices failed to decode and are "
            f"blank ({errors[0]}); rendered the other {len(refs) - len(failed)}"
        )
    data = out.transpose(2, 1, 0, 3) if spp == 3 else out.transpose(2, 1, 0)
    return Volume(data, warnings, sorted(failed))


def _native_dtype(series: SeriesInfo) -> np.dtype | None:
    bits, signed = series.bits_allocated, series.pixel_representation == 1
    if series.samples_per_pixel != 1 or bits not in (8, 16, 32):
        return None
    if signed and series.bits_stored != bits:
        return None  # needs sign extension: let pydicom do it
    kind = "i" if signed else "u"
    return np.dtype(f"<{kind}{bits // 8}")


def _decode_file(
    path: str,
    items: list[tuple[int, FrameRef]],
    rows: int,
    cols: int,
    spp: int,
    series: SeriesInfo,
    dtype: np.dtype | None,
    file_cap: int,
) -> list[tuple[int, np.ndarray, FrameRef]]:
    first = items[0][1]
    if (
        len(items) == 1
        and first.pixel_offset is not None
        and first.frame is None
        and dtype is not None
    ):
        raw = _read_values(path, first.pixel_offset, rows * cols, dtype)
        if raw.size != rows * cols:
            raise DecodeError(f"pixel data truncated ({raw.size} of {rows * cols} values)")
        if series.bits_stored < series.bits_allocated and dtype.kind == "u":
            raw = raw & ((1 << series.bits_stored) - 1)
        return [(items[0][0], raw.reshape(rows, cols), first)]
    if is_plain_file(path) and os.path.getsize(path) > file_cap:
        raise TooLargeError(f"{path}: file is {os.path.getsize(path)} bytes, over the memory cap")
    with open_source(path, max_bytes=file_cap) as fp:
        ds = pydicom.dcmread(fp)
        arr = ds.pixel_array
    planes = []
    for k, ref in items:
        if ref.mosaic_slices:
            tiles = math.ceil(math.sqrt(ref.mosaic_slices))
            t = ref.frame or 0
            r0, c0 = (t // tiles) * rows, (t % tiles) * cols
            img = arr[r0 : r0 + rows, c0 : c0 + cols]
        elif ref.frame is not None and arr.ndim >= 3 and (spp == 1 or arr.ndim == 4):
            img = arr[ref.frame]
        else:
            img = arr
        if img.shape[:2] != (rows, cols):
            raise DecodeError(f"decoded image is {img.shape[:2]}, header says {(rows, cols)}")
        planes.append((k, img, ref))
    return planes


def _read_native(
    series: SeriesInfo,
    refs: list[FrameRef],
    native: np.dtype,
    out: np.ndarray,
    rescale: bool,
    failed: list[int],
    errors: list[str],
) -> dict[str, list[tuple[int, FrameRef]]]:
    """Read the native slices of ``refs`` into ``out`` as ``_decode_file`` + ``_store`` would;
    return the slices left for the general path (other files), by file."""
    rest: dict[str, list[tuple[int, FrameRef]]] = {}
    direct = not rescale and out.dtype == native
    buf = None if direct else np.empty(out.shape[1:], dtype=native)
    bits_mask = None
    if series.bits_stored < series.bits_allocated and native.kind == "u":
        bits_mask = native.type((1 << series.bits_stored) - 1)
    for k, ref in enumerate(refs):
        if ref.pixel_offset is None or ref.frame is not None:
            rest[ref.path] = [(k, ref)]
            continue
        dst = out[k] if buf is None else buf
        try:
            done = _read_into(ref.path, ref.pixel_offset, dst)
            if done < dst.nbytes:
                raise DecodeError(
                    f"pixel data truncated ({done // native.itemsize} of {dst.size} values)"
                )
        except Exception as exc:  # one bad file must not cost the whole stack
            out[k] = 0
            failed.append(k)
            errors.append(f"{ref.path}: {exc}")
            continue
        if bits_mask is not None:
            np.bitwise_and(dst, bits_mask, out=dst)
        if buf is not None:
            if rescale:
                _store(out[k], buf, ref)
            else:
                out[k] = buf
    return rest


def _read_into(path: str, offset: int, dst: np.ndarray) -> int:
    """pread the bytes of contiguous ``dst`` from ``offset``; the number of bytes read.
    Bytes the header pass kept (dicom.headers.kept) are taken instead of reading the file."""
    view = dst.data.cast("B")
    kept = take_kept_pixels(path, offset)
    if kept is not None:
        n = min(len(kept), len(view))
        view[:n] = kept[:n]
        return n
    done = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while done < len(view):
            n = os.preadv(fd, [view[done:]], offset + done)
            if n <= 0:
                break
            done += n
    finally:
        os.close(fd)
    return done


def _read_values(path: str, offset: int, count: int, dtype: np.dtype) -> np.ndarray:
    """Up to ``count`` values from ``offset``, as np.fromfile gives them (fewer at the end of
    the file). pread into the array costs a quarter of np.fromfile's time per call, which
    counts for the 780 files of a DWI trace."""
    if not hasattr(os, "preadv"):
        return np.fromfile(path, dtype=dtype, count=count, offset=offset)
    out = np.empty(count, dtype=dtype)
    done = _read_into(path, offset, out)
    return out[: done // dtype.itemsize]


def _store(dst: np.ndarray, img: np.ndarray, ref: FrameRef) -> None:
    """Write (rows, cols[, 3]) stored values into a float32 slice, modality LUT applied."""
    dst[...] = img
    if img.ndim == 2 and (ref.rescale_slope != 1.0 or ref.rescale_intercept != 0.0):
        dst *= np.float32(ref.rescale_slope)
        dst += np.float32(ref.rescale_intercept)
