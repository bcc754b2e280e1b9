"""The header reader: every file's header, no pixels, one FrameHeader per 2D image.

One entry point, ``read_headers(sources, ...)``: the fast scanner for plain little-endian
files (elements, template, scan, scanned, fast), pydicom for the rest (read), enhanced
multi-frame objects and mosaics split into frames (multiframe), in forked workers for large
folders and through an optional persistent cache (batch, cache). ``read_frames`` reads one
file the same way. The record and its field rules are in ``frame``.
"""

from __future__ import annotations

from dicom.headers.batch import ProgressFn, read_headers, read_headers_keeping
from dicom.headers.fast import clear_caches
from dicom.headers.frame import DEFAULT_MEMORY_CAP, FrameHeader, contrast_agent_or_none
from dicom.headers.kept import keeping_pixels, take_kept_pixels
from dicom.headers.read import read_frames

__all__ = [
    "DEFAULT_MEMORY_CAP",
    "FrameHeader",
    "ProgressFn",
    "clear_caches",
    "contrast_agent_or_none",
    "keeping_pixels",
    "read_frames",
    "read_headers",
    "read_headers_keeping",
    "take_kept_pixels",
]
