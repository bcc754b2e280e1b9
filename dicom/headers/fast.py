"""The fast path of the header pass: dicom.headers.elements + dicom.headers.scanned + shared fields.

For a file the fast scanner handles, the fields that are the same for the files of a series
(dicom.headers.series_fields) are computed once per distinct set of raw series values and
shared; only the per-file fields (dicom.headers.FILE_KEYWORDS) are converted for every file.
Everything else returns None, and dicom.headers.read_frames reads the file with pydicom.
"""

from __future__ import annotations

import operator
import os
from dataclasses import fields
from typing import Any

from dicom.headers import kept, scanned, template
from dicom.headers.elements import NEEDED_TAGS, keyword_tag
from dicom.headers.frame import (
    FILE_KEYWORDS,
    VOLUME_FIELDS,
    VOLUME_KEYWORDS,
    VOLUME_PRIVATE_TAGS,
    WINDOW_KEYWORDS,
    FrameHeader,
    pixel_data,
    series_fields,
    set_unique_fields,
    set_volume_fields,
    window_of,
)
from dicom.headers.pixel_rules import check_pixel_length
from dicom.headers.scan import scan_file
from dicom.headers.scanned import ScannedDataset
from dicom.sources import HEADER_PREFIX, is_plain_file, open_source

_FILE_TAGS = frozenset(keyword_tag(kw) for kw in FILE_KEYWORDS)
_VOLUME_TAGS = tuple(
    sorted(
        {keyword_tag(kw) for kw in VOLUME_KEYWORDS} | {g << 16 | e for g, e in VOLUME_PRIVATE_TAGS}
    )
)
_WINDOW_TAGS = tuple(keyword_tag(kw) for kw in WINDOW_KEYWORDS)
_NOT_SERIES = _FILE_TAGS | set(_VOLUME_TAGS) | set(_WINDOW_TAGS)
_SERIES_TAGS = tuple(sorted(NEEDED_TAGS - _NOT_SERIES))
_NOT_VOLUME = _FILE_TAGS | frozenset(_WINDOW_TAGS)
_NOT_WINDOW = _FILE_TAGS | frozenset(_VOLUME_TAGS)
_FIELDS_OF = operator.attrgetter(*(f.name for f in fields(FrameHeader)))
_VOLUME_OF = operator.attrgetter(*VOLUME_FIELDS)
# By (memory cap, raw values of the series elements): the series fields, and the volume
# fields by the raw values of the volume elements. See read_frames_fast.
_SERIES_MEMO: dict[tuple[Any, ...], tuple[FrameHeader, dict[tuple[Any, ...], Any]]] = {}
# The window by (character set, raw values of the window elements).
_WINDOW_MEMO: dict[tuple[Any, ...], tuple[float, float] | None] = {}
# Bounds on what a long-running process keeps (at most ~256k small entries).
_MAX_SERIES = 512
_MAX_VOLUMES = 512
_MAX_WINDOWS = 4096


def clear_caches() -> None:
    """Forget what earlier reads left in this process (scan templates, converted values and
    series fields), e.g. to time a cold read."""

    _SERIES_MEMO.clear()
    _WINDOW_MEMO.clear()
    scanned.clear_memo()
    template.clear()


def read_frames_fast(path: str, memory_cap: int) -> list[FrameHeader] | None:
    """Frames from the fast scanner, or None when pydicom has to read this file.

    The series fields are computed once per distinct set of raw series values, the volume
    fields once per distinct set of raw volume values within it (see headers.FILE_KEYWORDS),
    and only the unique fields are converted for every file.
    """
    plain = is_plain_file(path)
    try:
        with open_source(path, prefix=min(HEADER_PREFIX, memory_cap)) as fp:
            size = os.fstat(fp.fileno()).st_size if plain else fp.seek(0, os.SEEK_END)
            fp.seek(0)
            scan = scan_file(fp, size, tail=plain and kept.keeping())
        ds = ScannedDataset(scan)
        pixel_offset = pixel_length = None
        if "Rows" in ds or "Columns" in ds:
            ts = str(ds.file_meta.TransferSyntaxUID or "")[:256]  # as headers._s
            pixel_offset, pixel_length = pixel_data(
                path, scan.stop, scan.after, ts, scan.size if plain else None
            )
        key = (memory_cap, *scan.values_key(_SERIES_TAGS))
        entry = _SERIES_MEMO.get(key)
        if entry is None:
            base = series_fields(path, ScannedDataset(scan, hidden=_NOT_SERIES), memory_cap)
            if "MOSAIC" in base.image_type or "VFRAME" in base.image_type:
                return None  # needs the CSA header or UIH's private sequence: pydicom
            if len(_SERIES_MEMO) >= _MAX_SERIES:
                _SERIES_MEMO.clear()
            _SERIES_MEMO[key] = entry = (base, {})
        template, volumes = entry
        check_pixel_length(template, pixel_length)
        fh = FrameHeader(*_FIELDS_OF(template))
        fh.extras = dict(template.extras)
        vkey = scan.raw_values(_VOLUME_TAGS)
        volume = volumes.get(vkey)
        if volume is None:
            set_volume_fields(fh, ScannedDataset(scan, hidden=_NOT_VOLUME))
            if len(volumes) >= _MAX_VOLUMES:
                volumes.clear()
            volumes[vkey] = volume = _VOLUME_OF(fh)
        else:
            for name, value in zip(VOLUME_FIELDS, volume, strict=True):
                setattr(fh, name, value)
        wkey = (key[1], key[4], *scan.raw_values(_WINDOW_TAGS))  # implicit VR, character set
        if wkey in _WINDOW_MEMO:
            fh.window = _WINDOW_MEMO[wkey]
        else:
            if len(_WINDOW_MEMO) >= _MAX_WINDOWS:
                _WINDOW_MEMO.clear()
            fh.window = _WINDOW_MEMO[wkey] = window_of(ScannedDataset(scan, hidden=_NOT_WINDOW))
        set_unique_fields(fh, path, ds, pixel_offset)
        if scan.tail is not None and pixel_offset is not None and pixel_offset >= scan.tail[0]:
            kept.keep(path, pixel_offset, scan.tail[1][pixel_offset - scan.tail[0] :])
    except Exception:  # Fallback, or an error pydicom should report in its own words
        return None
    return [fh]
