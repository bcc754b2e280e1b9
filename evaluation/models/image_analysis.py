"""Classical analysis of rendered slices: asymmetric signal against the mirror hemisphere.

For each tile of a montage (or a single slice) the head is segmented, the midline taken as the
centre of the head, and the slice compared with its left-right mirror image. Regions much
brighter than their mirror (FLAIR, T2, DWI, T1C, CT: hyper) or much darker (ADC, CT: hypo)
become blobs with a side, a rough region and a size. Images are radiological: a blob on the
image LEFT is in the patient's RIGHT hemisphere. Overlay text (yellow marks) is ignored.
"""

from __future__ import annotations

import hashlib
import io
import re
import threading
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, replace

import numpy as np
from scipy import ndimage

HEAD_WIDTH_MM = 140.0  # typical biparietal width: converts pixels to mm without a header
_TILE_SIZES = (512, 384, 320, 256, 192, 160, 128)
_SEQ_WORDS = (
    ("T1C", r"\bT1C\b|post[- ]?contrast|\+C\b|T1C\+"),
    ("FLAIR", r"\bFLAIR\b"),
    ("ADC", r"\bADC\b"),
    ("DWI", r"\bDWI\b|\bTRACE\b|\bb=\s*\d{3,4}"),
    ("SWI", r"\bSWI\b|\bT2STAR\b|T2\*"),
    ("CT", r"\bCT\b"),
    ("T2", r"\bT2\b"),
    ("T1", r"\bT1\b"),
)


@dataclass(frozen=True)
class Blob:
    sequence: str
    kind: str  # "hyper" | "hypo"
    side: str  # patient side: "left" | "right" | "midline"
    region: str
    diameter_mm: float
    area_frac: float  # of the brain area in that tile
    contrast: float  # mean difference to the mirror, in grey levels
    ring: bool
    z_mm: float | None
    peripheral: bool
    # its centre on the image it was found on (PNG pixels; None: not recorded), and that
    # image's number in the request (set by the caller that numbers the images)
    point: tuple[float, float] | None = None
    image: int | None = None


def sequence_of(label: str) -> str | None:
    for name, pattern in _SEQ_WORDS:
        if re.search(pattern, label, re.I):
            return name
    return None


def plane_of(label: str) -> str | None:
    m = re.search(r"\b(axial|sagittal|coronal)\b", label, re.I)
    return m.group(1).lower() if m else None


def decode(png: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        return np.asarray(im.convert("RGB"), dtype=np.uint8)


def _grey(rgb: np.ndarray) -> np.ndarray:
    r, g, b = (rgb[..., i].astype(np.int16) for i in range(3))
    overlay = (r - b > 60) & (g - b > 60)  # the yellow R/L and position marks
    # = rgb.mean(axis=2) bit for bit (a sum of three bytes is exact in float64), ~5x faster
    grey = ((r + g + b).astype(np.float64) / 3).astype(np.float32)
    grey[ndimage.maximum_filter(overlay, size=5)] = 0
    if grey.shape[0] >= 160 and grey.shape[1] >= 160:
        # Half resolution: plenty for lesions of a few mm, and four times less work.
        grey = grey[: grey.shape[0] // 2 * 2, : grey.shape[1] // 2 * 2]
        grey = grey.reshape(grey.shape[0] // 2, 2, grey.shape[1] // 2, 2).mean(axis=(1, 3))
    return grey


def tiles(rgb: np.ndarray, montage: bool) -> list[np.ndarray]:
    """Tiles of a montage (header bar above a grid of square tiles), or the one slice."""
    return [t for t, _ in placed_tiles(rgb, montage)]


def placed_tiles(rgb: np.ndarray, montage: bool) -> list[tuple[np.ndarray, tuple[int, int]]]:
    """Each tile with its (top, left) on the image."""
    h, w = rgb.shape[:2]
    if montage:
        for size in _TILE_SIZES:
            bar = max(24, size // 8)
            if w % size == 0 and h > bar and (h - bar) % size == 0:
                rows, cols = (h - bar) // size, w // size
                found = [
                    (
                        rgb[bar + r * size : bar + (r + 1) * size, c * size : (c + 1) * size],
                        (bar + r * size, c * size),
                    )
                    for r in range(rows)
                    for c in range(cols)
                ]
                return [(t, o) for t, o in found if t.max() > 0]  # skip empty grid cells
    if h > w:  # single slice with a header bar on top
        return [(rgb[h - w :, :], (h - w, 0))]
    return [(rgb, (0, 0))]


def tile_positions(label: str, n: int) -> list[float | None]:
    """Slice positions of a montage's tiles from its label ("..., S 10 mm to S 80 mm")."""
    m = re.search(r"([SI]) (\d+(?:\.\d+)?) mm to ([SI]) (\d+(?:\.\d+)?) mm", label)
    if m and n > 1:
        a = float(m.group(2)) * (1 if m.group(1) == "S" else -1)
        b = float(m.group(4)) * (1 if m.group(3) == "S" else -1)
        return [float(v) for v in np.linspace(a, b, n)]
    m = re.search(r"\b([SI]) (\d+(?:\.\d+)?) mm", label)
    if m and n == 1:
        return [float(m.group(2)) * (1 if m.group(1) == "S" else -1)]
    return [None] * n


def _region(y: float, x: float, z: float | None) -> tuple[str, bool]:
    """Rough region from the blob's place in the head: y 0=anterior..1, x 0=midline..1=lateral."""
    peripheral = x > 0.78 or y < 0.08 or y > 0.92
    if z is not None and z < -15:
        if y > 0.62:
            return ("cerebellum" if x > 0.15 else "brainstem"), peripheral
        return "temporal", peripheral
    if x < 0.4 and 0.3 < y < 0.72:
        if z is not None and z < 15:
            return "basal ganglia", peripheral
        return "periventricular white matter", peripheral
    if y < 0.36:
        return "frontal", peripheral
    if y > 0.72:
        return "occipital", peripheral
    if z is not None and z < 25 and x > 0.55:
        return "temporal", peripheral
    return "parietal", peripheral


def analyse_tile(grey: np.ndarray, sequence: str | None, z: float | None) -> list[Blob]:
    if grey.max() <= 0:
        return []
    positive = grey[grey > 0]
    head = grey > 0.12 * float(np.percentile(positive, 99))
    head = ndimage.binary_fill_holes(ndimage.binary_opening(head))
    lab, n = ndimage.label(head)
    if n == 0:
        return []
    sizes = ndimage.sum(head, lab, range(1, n + 1))
    head = lab == (int(np.argmax(sizes)) + 1)
    rows, cols = np.nonzero(head)
    r0, r1, c0, c1 = rows.min(), rows.max(), cols.min(), cols.max()
    width = max(1, c1 - c0)
    if width < 16 or (r1 - r0) < 16:
        return []
    # The brain without scalp and skull: the head eroded by ~1/18 of its width.
    brain = ndimage.distance_transform_cdt(head, metric="chessboard") > max(2, width // 18)
    if brain.sum() < 100:
        return []
    mid = (c0 + c1) / 2.0
    smooth = ndimage.gaussian_filter(grey, 1.0)
    cols_idx = np.clip(
        np.round(2 * mid - np.arange(grey.shape[1])).astype(int), 0, grey.shape[1] - 1
    )
    mirror = smooth[:, cols_idx]
    both = brain & brain[:, cols_idx]
    diff = np.where(both, smooth - mirror, 0.0)
    vals = smooth[both]
    if vals.size < 100:
        return []  # the head is too far off-centre to be mirrored
    spread = float(np.percentile(vals, 90) - np.percentile(vals, 10)) or 1.0
    # Noise of the left-right difference (robust): noisy sequences (DWI) need a higher bar.
    d = diff[both]
    noise = 1.4826 * float(np.median(np.abs(d - np.median(d))))
    bar = max(0.3 * spread, 4.0 * noise)
    kinds = []
    seq = sequence or "UNKNOWN"
    if seq in ("FLAIR", "T2", "DWI", "T1C", "CT", "UNKNOWN"):
        kinds.append(("hyper", (diff > bar) & (smooth > np.percentile(vals, 70))))
    if seq in ("ADC", "CT", "SWI"):
        kinds.append(("hypo", (diff < -bar) & (smooth < np.percentile(vals, 35))))
    mm_per_px = HEAD_WIDTH_MM / width
    brain_area = float(brain.sum())
    out: list[Blob] = []
    for kind, raw in kinds:
        mask = ndimage.binary_opening(raw)
        lab, n = ndimage.label(mask)
        if n == 0:
            continue
        areas = np.bincount(lab.ravel())
        keep = [k for k in range(1, n + 1) if areas[k] >= max(5, 0.0015 * brain_area)]
        if not keep:
            continue
        filled_lab, _ = ndimage.label(ndimage.binary_fill_holes(mask))
        filled_areas = np.bincount(filled_lab.ravel())
        centres = ndimage.center_of_mass(mask, lab, keep)
        means = ndimage.mean(np.abs(diff), lab, keep)
        for k, (cy, cx), contrast in zip(keep, centres, means, strict=True):
            area = int(areas[k])
            rr, cc = np.nonzero(lab == k)
            filled = int(filled_areas[filled_lab[rr[0], cc[0]]])
            x_rel = abs(cx - mid) / (width / 2)
            y_rel = (cy - r0) / max(1, r1 - r0)
            side = "midline" if x_rel < 0.06 else ("right" if cx < mid else "left")
            region, peripheral = _region(y_rel, x_rel, z)
            out.append(
                Blob(
                    sequence=seq,
                    kind=kind,
                    side=side,
                    region=region,
                    diameter_mm=round(2 * float(np.sqrt(filled / np.pi)) * mm_per_px, 1),
                    area_frac=area / brain_area,
                    contrast=float(contrast),
                    ring=filled > 1.4 * area and filled > 10,
                    z_mm=z,
                    peripheral=peripheral,
                    point=_inside(rr, cc, cy, cx),
                )
            )
    return out


def _inside(rr: np.ndarray, cc: np.ndarray, cy: float, cx: float) -> tuple[float, float]:
    """The centre (x, y) of the blob's pixel nearest its centroid: a point on the blob even
    when it is a ring or a crescent."""
    k = int(np.argmin((rr - cy) ** 2 + (cc - cx) ** 2))
    return float(cc[k]) + 0.5, float(rr[k]) + 0.5


_MEMO: OrderedDict[tuple[str, str, str], Future[tuple[str | None, tuple[Blob, ...]]]] = (
    OrderedDict()
)
_MEMO_SIZE = 1024
_MEMO_LOCK = threading.Lock()


def analyse_image(png: bytes, label: str, kind: str) -> tuple[str | None, list[Blob]]:
    """(sequence, blobs) of one image part.

    Memoised by content: every task family and turn of a case sends the same images (often at
    the same moment, from several threads: the first analyses, the others wait for it), and the
    analysis is a pure function of the PNG and its label.
    """
    key = (hashlib.sha256(png).hexdigest(), label, kind)
    with _MEMO_LOCK:
        future = _MEMO.get(key)
        mine = future is None
        if future is None:
            future = _MEMO[key] = Future()
            if len(_MEMO) > _MEMO_SIZE:
                _MEMO.popitem(last=False)
        else:
            _MEMO.move_to_end(key)
    if mine:
        try:
            seq, blobs = _analyse(png, label, kind)
        except BaseException as exc:
            with _MEMO_LOCK:
                _MEMO.pop(key, None)
            future.set_exception(exc)
            raise
        future.set_result((seq, tuple(blobs)))
    seq, found = future.result()
    return seq, list(found)


def _analyse(png: bytes, label: str, kind: str) -> tuple[str | None, list[Blob]]:
    seq = sequence_of(label)
    rgb = decode(png)
    parts = placed_tiles(rgb, montage=(kind == "montage" or "montage" in label.lower()))
    zs = tile_positions(label, len(parts))
    blobs: list[Blob] = []
    for (tile, (top, left)), z in zip(parts, zs, strict=True):
        grey = _grey(tile)
        fx, fy = tile.shape[1] / grey.shape[1], tile.shape[0] / grey.shape[0]  # half resolution
        for b in analyse_tile(grey, seq, z):
            x, y = b.point if b.point is not None else (0.0, 0.0)
            blobs.append(replace(b, point=(round(left + x * fx, 1), round(top + y * fy, 1))))
    return seq, blobs
