"""Lossless 8-bit PNG encoding of rendered images, several times faster than Pillow's.

Pillow tries all five PNG row filters on every row and keeps the best (its cost is ~30 ms for
a 1024 x 800 RGB montage before any compression), then deflates with zlib. Here every row uses
the "Up" filter (the difference to the row above, one vectorised numpy subtraction: rendered
slices are smooth from row to row, and the black background becomes runs of zeros), and the
stream is deflated by ISA-L (the ``isal`` package: same zlib format, ~5x faster than zlib at
its fastest levels) when installed, else by zlib at level 1. Output is deterministic for a
given installation; any PNG reader gives back exactly the pixels passed in.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_COLOUR_TYPE = {1: 0, 3: 2}  # samples per pixel -> PNG colour type (greyscale, truecolour)


def _deflater() -> tuple[Callable[[Any], bytes], str]:
    try:
        from isal import isal_zlib
    except ImportError:  # the slower, standard library fallback
        return (lambda data: zlib.compress(data, 1)), f"zlib {zlib.ZLIB_RUNTIME_VERSION} level 1"

    return (lambda data: isal_zlib.compress(data, 2)), "isal level 2"


_deflate, DEFLATE = _deflater()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return (
        struct.pack(">I", len(data))
        + kind
        + data
        + struct.pack(">I", zlib.crc32(data, zlib.crc32(kind)))
    )


def encode_png(pixels: np.ndarray) -> bytes:
    """PNG bytes of a uint8 image, (rows, cols) greyscale or (rows, cols, 3) RGB."""
    if pixels.dtype != np.uint8 or pixels.ndim not in (2, 3) or 0 in pixels.shape:
        raise ValueError(
            f"encode_png needs a non-empty uint8 image, got {pixels.dtype} {pixels.shape}"
        )
    samples = 1 if pixels.ndim == 2 else pixels.shape[2]
    if samples not in _COLOUR_TYPE:
        raise ValueError(f"encode_png needs 1 or 3 samples per pixel, got {samples}")
    height, width = pixels.shape[:2]
    rows = np.ascontiguousarray(pixels).reshape(height, width * samples)
    filtered = np.empty((height, rows.shape[1] + 1), dtype=np.uint8)
    filtered[0, 0] = 0  # the first row has no row above: no filter
    filtered[1:, 0] = 2  # Up
    filtered[0, 1:] = rows[0]
    np.subtract(rows[1:], rows[:-1], out=filtered[1:, 1:])  # modulo 256, as PNG defines it
    header = struct.pack(">IIBBBBB", width, height, 8, _COLOUR_TYPE[samples], 0, 0, 0)
    return (
        _SIGNATURE
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", _deflate(filtered.data))
        + _chunk(b"IEND", b"")
    )
