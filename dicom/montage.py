"""Tiles, marks and montages: the drawing half of rendering (dicom.render does the numbers).

Images are numpy arrays (grey tiles, RGB sheets) from the fitted tile to the PNG encoder:
Pillow only resamples and rasterises text, so no sheet is converted between Pillow's
four-bytes-per-pixel images and arrays (~6 ms for a 1024 x 800 montage).

Labels are yellow on the image (orientation marks, slice position), white and grey in the
title bar of a montage or single slice. Text is rasterised once per (text, size, anchor) and
thread: the R/L marks of a montage's twelve tiles are one bitmap, drawn twelve times.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageFont

from dicom.display import side_marks
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
) -> tuple[np.ndarray, tuple[int, int]]:
    """The anti-aliased coverage of ``text`` (rows, cols, 1; uint32, ready to blend) and its
    offset from the anchor point."""
    font = _font(size)
    if isinstance(font, ImageFont.FreeTypeFont):
        core, offset = font.getmask2(text, "L", anchor=anchor)
    else:  # pragma: no cover - Pillow without FreeType: a bitmap font, no anchors
        core, offset = font.getmask(text, "L"), (0, 0)
    bitmap = Image.new("L", core.size)
    bitmap.im = core
    alpha = np.asarray(bitmap, dtype=np.uint32)[..., None]
    return alpha, (int(offset[0]), int(offset[1]))


def draw_text(
    img: np.ndarray,
    xy: tuple[int, int],
    text: str,
    fill: tuple[int, int, int],
    size: int,
    anchor: str,
) -> None:
    """Draw ``text`` into an RGB array (in place, clipped to it) as ImageDraw.text draws it
    on the same pixels: the same bitmap, blended as Pillow's paste blends (x * (255 - a) +
    fill * a) / 255, rounded."""
    if not text:
        return
    coverage, (dx, dy) = _glyphs_of_thread(text, size, anchor, threading.get_ident())
    x, y = xy[0] + dx, xy[1] + dy
    height, width = img.shape[:2]
    x0, y0 = max(x, 0), max(y, 0)
    x1, y1 = min(x + coverage.shape[1], width), min(y + coverage.shape[0], height)
    if x0 >= x1 or y0 >= y1:
        return
    alpha = coverage[y0 - y : y1 - y, x0 - x : x1 - x]
    region = img[y0:y1, x0:x1]
    blend = region * (255 - alpha) + np.array(fill, dtype=np.uint32) * alpha + 128
    blend += blend >> 8
    region[...] = blend >> 8


def tile_fit(w: int, h: int, pixel_mm: tuple[float, float], size: int) -> tuple[int, int, int, int]:
    """Where fit_tile puts a w x h image of ``pixel_mm`` pixels in its tile: (new width, new
    height, top, left) in tile pixels (the one rule fit_tile and a tile's geometry read)."""
    width_mm, height_mm = w * pixel_mm[0], h * pixel_mm[1]
    scale = size / max(width_mm, height_mm)
    new_w, new_h = max(1, round(width_mm * scale)), max(1, round(height_mm * scale))
    return new_w, new_h, (size - new_h) // 2, (size - new_w) // 2


def tile_origins(n: int, columns: int, size: int) -> list[tuple[int, int]]:
    """(top, left) of each of ``n`` tiles on a montage sheet (the one layout rule)."""
    cols = max(1, min(columns, n))
    bar = max(24, size // 8)
    return [(bar + (k // cols) * size, (k % cols) * size) for k in range(n)]


def single_origin(size: int) -> tuple[int, int]:
    """(top, left) of the tile of a single slice, under its bar."""
    return max(18, size // 12), 0


def fit_tile(img: np.ndarray, pixel_mm: tuple[float, float], size: int) -> np.ndarray:
    """Resample to square pixels and centre in a size x size tile (black background), grey
    (rows, cols) or RGB (rows, cols, 3) as ``img``.

    Shrinking averages the source pixels under each tile pixel (box filter: the whole image
    contributes, nothing aliases, at about half the cost of bilinear's wider kernel);
    enlarging interpolates bilinearly.
    """
    h, w = img.shape[:2]
    new_w, new_h, r0, c0 = tile_fit(w, h, pixel_mm, size)
    shrink = new_w <= w and new_h <= h
    resample = Image.Resampling.BOX if shrink else Image.Resampling.BILINEAR
    mode = "RGB" if img.ndim == 3 else "L"
    fitted = Image.fromarray(np.ascontiguousarray(img), mode=mode).resize((new_w, new_h), resample)
    tile = np.zeros((size, size, *img.shape[2:]), dtype=np.uint8)
    tile[r0 : r0 + new_h, c0 : c0 + new_w] = np.asarray(fitted)
    return tile


def _rgb(img: np.ndarray) -> np.ndarray:
    if img.ndim == 3:
        return img
    out = np.empty((*img.shape, 3), dtype=np.uint8)
    _put(out, img)
    return out


def _put(dst: np.ndarray, img: np.ndarray) -> None:
    """Copy grey or RGB ``img`` into RGB ``dst``."""
    if img.ndim == 3:
        dst[...] = img
        return
    for channel in range(3):  # one plane at a time: ~8x faster than a broadcast assignment
        dst[..., channel] = img


def mark_tile(tile: np.ndarray, plane: Plane | None, oriented: bool, text: str) -> None:
    """Slice position at the bottom left; R/L (axial, coronal) or A/P (sagittal) at the sides
    (drawn into the RGB ``tile``, which may be a view of a montage)."""
    size = tile.shape[1]
    font = max(10, size // 16)
    draw_text(tile, (4, size - 4), text, YELLOW, font, "ls")
    marks = side_marks(plane) if oriented else None
    if marks is None:
        return
    left, right = marks
    draw_text(tile, (4, size // 2), left, YELLOW, font, "lm")
    draw_text(tile, (size - 4, size // 2), right, YELLOW, font, "rm")


@dataclass(frozen=True)
class Marks:
    """What every tile of a stack is marked with besides its position label."""

    plane: Plane | None
    oriented: bool  # the stack has patient geometry: R/L (or A/P) marks apply


def single(tile: np.ndarray, label: str, marks: Marks, header: str) -> np.ndarray:
    """A single slice (RGB): the marked tile under a bar with its label."""
    size = tile.shape[0]
    bar = single_origin(size)[0]
    out = np.zeros((size + bar, size, 3), dtype=np.uint8)
    _put(out[bar:], tile)
    mark_tile(out[bar:], marks.plane, marks.oriented, label)
    draw_text(out, (4, bar // 2), header, WHITE, max(10, bar * 2 // 3), "lm")
    return out


def montage(
    tiles: list[np.ndarray],
    labels: list[str],
    marks: Marks,
    columns: int,
    title: str,
    orient: str,
) -> np.ndarray:
    """Marked tiles in rows of ``columns`` under a bar with the title and the orientation (RGB).

    The sheet is assembled in grey and expanded to RGB once; each tile's marks are drawn
    into its place (clipped to it), the title and orientation into the bar.
    """
    size = tiles[0].shape[0]
    cols = max(1, min(columns, len(tiles)))
    nrows = (len(tiles) + cols - 1) // cols
    bar = max(24, size // 8)
    sheet = np.zeros((nrows * size + bar, cols * size, *tiles[0].shape[2:]), dtype=np.uint8)
    places = tile_origins(len(tiles), columns, size)
    for (r, c), tile in zip(places, tiles, strict=True):
        sheet[r : r + size, c : c + size] = tile
    out = _rgb(sheet)
    for (r, c), label in zip(places, labels, strict=True):
        mark_tile(out[r : r + size, c : c + size], marks.plane, marks.oriented, label)
    draw_text(out[:bar], (6, bar // 3), title, WHITE, max(11, bar // 3), "lm")
    draw_text(out[:bar], (6, bar * 3 // 4), orient, GREY, max(9, bar // 4), "lm")
    return out
