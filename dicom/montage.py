"""Tiles, marks and montages: the drawing half of rendering (dicom.render does the numbers).

Labels are yellow on the image (orientation marks, slice position), white and grey in the
title bar of a montage or single slice. Text is rasterised once per (text, size, anchor) and
thread: the R/L marks of a montage's twelve tiles are one bitmap, drawn twelve times.
"""

from __future__ import annotations

import functools
import threading

import numpy as np
from PIL import Image, ImageFont

from dicom.records import Plane

YELLOW = (255, 255, 0)
WHITE = (255, 255, 255)
GREY = (200, 200, 200)


def clear_caches() -> None:
    """Forget the loaded fonts and rasterised labels (e.g. to time a cold render)."""
    _font_of_thread.cache_clear()
    _glyphs_of_thread.cache_clear()


def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    # One font object per thread: FreeType faces are not safe to share between threads.
    return _font_of_thread(size, threading.get_ident())


# DejaVu Sans (Debian's fonts-dejavu-core, installed by make setup): clear word spacing in
# labels such as "post-contrast spin-echo T1". Pillow's bundled font is the fallback.
LABEL_FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"


@functools.lru_cache(maxsize=64)
def _font_of_thread(size: int, _thread: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    try:
        return ImageFont.truetype(LABEL_FONT, size=size)
    except OSError:
        return ImageFont.load_default(size=size)


@functools.lru_cache(maxsize=1024)
def _glyphs_of_thread(
    text: str, size: int, anchor: str, _thread: int
) -> tuple[Image.Image, tuple[int, int]]:
    """The anti-aliased coverage bitmap of ``text`` and its offset from the anchor point."""
    font = _font(size)
    if isinstance(font, ImageFont.FreeTypeFont):
        core, offset = font.getmask2(text, "L", anchor=anchor)
    else:  # pragma: no cover - Pillow without FreeType: a bitmap font, no anchors
        core, offset = font.getmask(text, "L"), (0, 0)
    bitmap = Image.new("L", core.size)
    bitmap.im = core
    return bitmap, (int(offset[0]), int(offset[1]))


def draw_text(
    img: Image.Image,
    xy: tuple[int, int],
    text: str,
    fill: tuple[int, int, int],
    size: int,
    anchor: str,
) -> None:
    """Draw ``text`` as ImageDraw.text does (same bitmap, same blending), from a cached bitmap."""
    if not text:
        return
    bitmap, (dx, dy) = _glyphs_of_thread(text, size, anchor, threading.get_ident())
    x, y = xy[0] + dx, xy[1] + dy
    img.paste(fill, (x, y, x + bitmap.size[0], y + bitmap.size[1]), bitmap)


def fit_tile(img: np.ndarray, pixel_mm: tuple[float, float], size: int) -> Image.Image:
    """Resample to square pixels and fit into a size x size RGB tile (black background)."""
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


def mark_tile(tile: Image.Image, plane: Plane | None, oriented: bool, text: str) -> None:
    """Slice position at the bottom left; R/L (axial, coronal) or A/P (sagittal) at the sides."""
    size = tile.size[0]
    font = max(10, size // 16)
    draw_text(tile, (4, size - 4), text, YELLOW, font, "ls")
    if not oriented:
        return
    if plane in (Plane.AXIAL, Plane.CORONAL):
        left, right = "R", "L"
    elif plane is Plane.SAGITTAL:
        left, right = "A", "P"
    else:
        return
    draw_text(tile, (4, size // 2), left, YELLOW, font, "lm")
    draw_text(tile, (size - 4, size // 2), right, YELLOW, font, "rm")


def with_header(tile: Image.Image, text: str) -> Image.Image:
    """A single slice: the tile under a bar with its label."""
    bar = max(18, tile.size[0] // 12)
    out = Image.new("RGB", (tile.size[0], tile.size[1] + bar), (0, 0, 0))
    out.paste(tile, (0, bar))
    draw_text(out, (4, bar // 2), text, WHITE, max(10, bar * 2 // 3), "lm")
    return out


def montage(tiles: list[Image.Image], columns: int, title: str, orient: str) -> Image.Image:
    """Tiles in rows of ``columns`` under a bar with the title and the orientation."""
    size = tiles[0].size[0]
    cols = max(1, min(columns, len(tiles)))
    nrows = (len(tiles) + cols - 1) // cols
    bar = max(24, size // 8)
    out = Image.new("RGB", (cols * size, nrows * size + bar), (0, 0, 0))
    draw_text(out, (6, bar // 3), title, WHITE, max(11, bar // 3), "lm")
    draw_text(out, (6, bar * 3 // 4), orient, GREY, max(9, bar // 4), "lm")
    for n, tile in enumerate(tiles):
        out.paste(tile, ((n % cols) * size, bar + (n // cols) * size))
    return out
