"""Images that come with a dataset (data-URIs, PNG/JPEG files) made into checked PNGs in the cache.

Every image is decoded with a pixel budget (a decompression bomb is refused, not decoded),
converted to 8-bit grey or RGB and written as PNG under ``<cache>/images/<sha256>.png``; a PNG
without text chunks is used as it is. The model is sent exactly the bytes whose hash is recorded.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
import warnings
from pathlib import Path

from dicom import atomic_write
from evaluation.case import ImageRef
from evaluation.errors import DatasetError

MAX_IMAGE_BYTES = 40 * 1024 * 1024
MAX_PIXELS = 8192 * 8192
_DATA_URI = re.compile(r"^data:image/[\w.+-]+;base64,", re.I)


def decode_data_uri(value: str) -> bytes:
    """Bytes of a ``data:image/...;base64,`` URI (or of bare base64)."""
    payload = _DATA_URI.sub("", value.strip(), count=1)
    if len(payload) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise DatasetError(f"embedded image larger than {MAX_IMAGE_BYTES >> 20} MiB")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise DatasetError(f"embedded image is not valid base64: {exc}") from exc


def to_png(data: bytes) -> bytes:
    """Checked PNG bytes of an image file's bytes (PNG without text chunks passes unchanged)."""
    from PIL import Image

    from evaluation.phi import png_text_chunks

    if len(data) > MAX_IMAGE_BYTES:
        raise DatasetError(f"image larger than {MAX_IMAGE_BYTES >> 20} MiB")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as im:
                w, h = im.size
                if w * h > MAX_PIXELS or w < 1 or h < 1:
                    raise DatasetError(f"image of {w}x{h} pixels is over the {MAX_PIXELS} budget")
                if im.format == "PNG" and im.mode in ("L", "RGB") and not png_text_chunks(data):
                    return data
                im.load()
                out = im.convert("L" if im.mode in ("L", "I", "I;16", "F", "1") else "RGB")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombWarning) as exc:
        if isinstance(exc, DatasetError):
            raise
        raise DatasetError(f"not a readable image: {exc}") from exc
    buf = io.BytesIO()
    out.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def cache_png(png: bytes, cache_dir: Path) -> tuple[Path, str]:
    """Write PNG bytes under their hash (once); return (path, sha256)."""
    sha = hashlib.sha256(png).hexdigest()
    path = cache_dir / "images" / f"{sha}.png"
    if not path.exists():
        with atomic_write(path, fsync=False) as fh:
            fh.write(png)
    return path, sha


def image_ref(
    data: bytes,
    cache_dir: Path,
    label: str,
    *,
    source_path: Path | None = None,
    **fields: object,
) -> ImageRef:
    """An ImageRef for image bytes: the original file when it is already a clean PNG."""
    png = to_png(data)
    if source_path is not None and png is data:
        path, sha = source_path, hashlib.sha256(data).hexdigest()
    else:
        path, sha = cache_png(png, cache_dir)
    return ImageRef(path=str(path), sha256=sha, label=label, **fields)
