"""Header-only reading of one file: one FrameHeader per 2D image it holds.

Classic objects give one frame; enhanced multi-frame objects give one per frame, with the
per-frame and shared functional groups flattened; Siemens mosaics and UIH grids give one per
tile. No pixel data is read here. The fast scanner (dicom.headers.fast) reads most files; pydicom
reads the rest, and every file the scanner finds an error in.
"""

from __future__ import annotations

import os
from typing import Any

import pydicom
from pydicom.dataset import Dataset
from pydicom.errors import InvalidDicomError

from dicom.errors import (
    InvalidImageError,
    NonImageError,
    NotDicomError,
    TooLargeError,
    UnreadableHeaderError,
)
from dicom.headers.fast import read_frames_fast
from dicom.headers.frame import (
    DEFAULT_MEMORY_CAP,
    DEFER_SIZE,
    FrameHeader,
    as_text,
    pixel_data,
    series_fields,
    set_file_fields,
)
from dicom.headers.multiframe import enhanced_frames, mosaic_frames, uih_grid_frames
from dicom.headers.pixel_rules import check_pixel_length
from dicom.sources import HEADER_PREFIX, is_plain_file, open_source


def read_frames(
    path: str, memory_cap: int = DEFAULT_MEMORY_CAP, fast: bool = True
) -> list[FrameHeader]:
    """Read the header of one file and return its frames; raise an ImagingError subclass.

    Files go through the fast scanner (dicom.headers.scan) first; whatever it does not handle,
    and any file it finds an error in, is parsed again by pydicom, so that errors and unusual
    files get pydicom's behaviour and messages. ``fast=False`` forces pydicom.
    """
    if fast:
        frames = read_frames_fast(path, memory_cap)
        if frames is not None:
            return frames
    return _read_pydicom(path, memory_cap, DEFER_SIZE)[0]


def read_frames_and_header(
    path: str, memory_cap: int = DEFAULT_MEMORY_CAP
) -> tuple[list[FrameHeader], pydicom.Dataset]:
    """One read of a file giving both its frames and its whole header (pixels excepted, no
    value deferred, no file object held: usable once the file is closed, and picklable)."""
    frames, ds = _read_pydicom(path, memory_cap, None)
    header = pydicom.Dataset(ds)
    header.file_meta = ds.file_meta
    return frames, header


def _read_pydicom(
    path: str, memory_cap: int, defer_size: int | None
) -> tuple[list[FrameHeader], pydicom.Dataset]:
    try:
        fp = open_source(path, prefix=min(HEADER_PREFIX, memory_cap))
    except OSError as exc:
        raise UnreadableHeaderError(f"{path}: cannot open: {exc}") from exc
    with fp:
        head = fp.read(132)
        fp.seek(0)
        has_preamble = len(head) == 132 and head[128:132] == b"DICM"
        if not has_preamble and not _looks_like_raw_dataset(head):
            raise NotDicomError(f"{path}: not a DICOM file (no DICM preamble, no DICOM tags)")
        try:
            ds = pydicom.dcmread(
                _Budget(fp, path),
                stop_before_pixels=True,
                defer_size=defer_size,
                force=not has_preamble,
            )
            pixel_offset = pixel_length = None
            if "Rows" in ds or "Columns" in ds:
                pos = fp.tell()
                plain = is_plain_file(path)
                pixel_offset, pixel_length = pixel_data(
                    path,
                    pos,
                    fp.read(12),
                    as_text(getattr(ds.file_meta, "TransferSyntaxUID", "") or ""),
                    os.fstat(fp.fileno()).st_size if plain else None,
                )
            # Touch the elements the index needs now, so that a malformed value fails here.
            frames = _frames_from_dataset(path, ds, pixel_offset, pixel_length, memory_cap)
        except WorkBoundError as exc:
            raise UnreadableHeaderError(str(exc)) from exc
        except RecursionError as exc:
            raise UnreadableHeaderError(
                f"{path}: header nests sequences too deeply to parse safely"
            ) from exc
        except InvalidDicomError as exc:
            raise NotDicomError(f"{path}: not a DICOM file ({exc})") from exc
        except (NonImageError, InvalidImageError, TooLargeError):
            raise
        except Exception as exc:
            raise UnreadableHeaderError(f"{path}: unreadable header: {exc}") from exc
    return frames, ds


# The most reads pydicom may make of one header (each element takes one or two): a real header
# takes a few thousand (20,000 for the corpus' largest enhanced MR), while a DICM preamble
# followed by zeros parses as endless empty elements, at ~0.35 s per MB.
MAX_HEADER_READS = 2_000_000


class WorkBoundError(Exception):
    """A header that takes more work to parse than any real one."""


class _Budget:
    """A file object that counts pydicom's reads of a header and stops it past the bound."""

    def __init__(self, fp: Any, path: str, limit: int = MAX_HEADER_READS) -> None:
        self._fp, self._path, self._left, self._limit = fp, path, limit, limit

    def read(self, n: int = -1) -> bytes:
        self._left -= 1
        if self._left < 0:
            raise WorkBoundError(
                f"{self._path}: header still unparsed after {self._limit:,} reads "
                "(degenerate elements, e.g. zeros after the DICM preamble): over the work bound "
                "for one file, not read"
            )
        data: bytes = self._fp.read(n)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fp, name)


def _looks_like_raw_dataset(head: bytes) -> bool:
    """A DICOM dataset without preamble starts with a group 0x0002 or 0x0008 tag."""
    if len(head) < 8:
        return False
    group = int.from_bytes(head[0:2], "little")
    return group in (0x0002, 0x0008)


def _frames_from_dataset(
    path: str, ds: Dataset, pixel_offset: int | None, pixel_length: int | None, memory_cap: int
) -> list[FrameHeader]:
    base = series_fields(path, ds, memory_cap)
    check_pixel_length(base, pixel_length)
    set_file_fields(base, path, ds, pixel_offset)
    if "PerFrameFunctionalGroupsSequence" in ds or "SharedFunctionalGroupsSequence" in ds:
        return enhanced_frames(base, ds)
    if "MOSAIC" in base.image_type:
        return mosaic_frames(base, ds)
    if "VFRAME" in base.image_type:
        return uih_grid_frames(base, ds)
    return [base]
