"""The header values that give stored pixels their meaning, checked where they are read.

A file whose header makes its pixels meaningless is refused in the header pass, like a
truncated one: a per-file ``MeaninglessPixelsError`` (kind ``invalid``) naming the attribute
and its value, so that the series renders without it instead of rendering it as noise or one
grey. The class:

- the pixel layout: BitsAllocated not 1, 8, 16, 32 or 64; BitsStored outside 1..BitsAllocated;
  HighBit other than BitsStored - 1 (the standard's only layout, and the one decoders read);
  PixelRepresentation not 0 or 1; a PhotometricInterpretation the standard does not define, or
  one that disagrees with SamplesPerPixel;
- the amount of pixel data: native Pixel Data that does not hold exactly Rows x Columns x
  NumberOfFrames x SamplesPerPixel x BitsAllocated (an absurd NumberOfFrames, Rows or Columns,
  or bits that are not the data's);
- the modality LUT: a RescaleSlope or RescaleIntercept that is present but not a finite number,
  a zero slope, a mapping of the stored range that leaves float32 (where the pixels are
  decoded) or that float32 cannot resolve, and for CT in Hounsfield units a range no CT has.

An unusable VOI window (WindowWidth not positive or not finite) only drops the window: it is a
display hint, and the renderer derives its window from the data.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from pydicom.multival import MultiValue

from dicom.errors import MeaninglessPixelsError


class PixelHeader(Protocol):
    """What these rules read of a frame header (dicom.headers.frame.FrameHeader)."""

    path: str
    modality: str
    rows: int
    cols: int
    number_of_frames: int
    samples_per_pixel: int
    photometric: str
    bits_allocated: int
    bits_stored: int
    pixel_representation: int


BITS_ALLOCATED = (1, 8, 16, 32, 64)
# Samples per pixel of each PhotometricInterpretation of PS3.3 C.7.6.3.1.2 (retired ones too).
PHOTOMETRIC_SAMPLES = {
    "MONOCHROME1": 1,
    "MONOCHROME2": 1,
    "PALETTE COLOR": 1,
    "RGB": 3,
    "HSV": 3,
    "YBR_FULL": 3,
    "YBR_FULL_422": 3,
    "YBR_PARTIAL_422": 3,
    "YBR_PARTIAL_420": 3,
    "YBR_ICT": 3,
    "YBR_RCT": 3,
    "ARGB": 4,
    "CMYK": 4,
}
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38  # the smallest normal float32
# Decoded values must stay this far inside float32, so that a difference or a sum of two of
# them (a window's width, a mean) is finite too.
MAX_VALUE = FLOAT32_MAX / 4
# The stored range must map to at least this many distinct float32 values (2**8 grey levels
# at float32's 2**-23 relative precision): an intercept that swamps the slope leaves fewer.
MIN_RELATIVE_SPAN = 2.0**-15
# Hounsfield units: air is -1000, water 0, dense metal under 100,000 even on an extended
# scale. A CT whose stored range spans less than 100 HU cannot show air, water and bone, and
# one that reaches past a million HU is not in Hounsfield units.
CT_MIN_SPAN_HU = 100.0
CT_MAX_HU = 1e6


def _first(value: Any) -> Any:
    if isinstance(value, list | tuple | MultiValue):
        return value[0] if len(value) else None
    return value


def _shown(value: Any) -> str:
    return repr(str(_first(value))[:32])


def number(path: str, keyword: str, value: Any, where: str = "") -> float | None:
    """A numeric header value (the first of several); None when absent or empty; a
    MeaninglessPixelsError when present but not a finite number."""
    if value is None or value == "":
        return None
    first = _first(value)
    try:
        out = float(first)
    except (TypeError, ValueError, IndexError):
        out = math.nan
    if not math.isfinite(out):
        raise MeaninglessPixelsError(
            f"{path}: {where}{keyword} {_shown(first)} is not a finite number: the meaning of "
            "the stored pixel values is unknown"
        )
    return out


def integer(path: str, keyword: str, value: Any) -> int | None:
    """An integer header value; None when absent or empty; an error when not an integer."""
    if value is None or value == "":
        return None
    try:
        out = float(_first(value))
    except (TypeError, ValueError, IndexError):
        out = math.nan
    if not math.isfinite(out) or out != int(out):
        raise MeaninglessPixelsError(f"{path}: {keyword} {_shown(value)} is not an integer")
    return int(out)


def check_layout(
    path: str,
    *,
    samples: int,
    photometric: str,
    bits_allocated: int,
    bits_stored: int,
    high_bit: int | None,
    pixel_representation: int,
) -> None:
    """The Image Pixel module's description of each stored value (PS3.3 C.7.6.3)."""
    if bits_allocated not in BITS_ALLOCATED:
        raise MeaninglessPixelsError(
            f"{path}: BitsAllocated {bits_allocated} is not 1, 8, 16, 32 or 64: the pixels "
            "cannot be read"
        )
    if not 1 <= bits_stored <= bits_allocated:
        raise MeaninglessPixelsError(
            f"{path}: BitsStored {bits_stored} with BitsAllocated {bits_allocated}: the stored "
            f"bits must number 1 to {bits_allocated}; the pixels would be read as noise"
        )
    if high_bit is not None and high_bit != bits_stored - 1:
        raise MeaninglessPixelsError(
            f"{path}: HighBit {high_bit} with BitsStored {bits_stored} (BitsAllocated "
            f"{bits_allocated}): the standard places the stored bits at 0..{bits_stored - 1} "
            "(HighBit = BitsStored - 1); read that way these pixels would be wrong"
        )
    if pixel_representation not in (0, 1):
        raise MeaninglessPixelsError(
            f"{path}: PixelRepresentation {pixel_representation} is neither 0 (unsigned) nor "
            "1 (two's complement): the sign of the stored values is unknown"
        )
    if photometric:
        expected = PHOTOMETRIC_SAMPLES.get(photometric)
        if expected is None:
            raise MeaninglessPixelsError(
                f"{path}: PhotometricInterpretation {_shown(photometric)} is not one the "
                "standard defines: the meaning of the samples is unknown"
            )
        if expected != samples:
            raise MeaninglessPixelsError(
                f"{path}: PhotometricInterpretation {photometric} has {expected} sample(s) "
                f"per pixel, the header says SamplesPerPixel {samples}"
            )


def check_pixel_length(fh: PixelHeader, length: int | None) -> None:
    """Native Pixel Data of ``length`` bytes holds exactly the frames the header describes
    (or one byte more, the padding to an even length)."""
    if length is None:
        return
    samples = 2 if fh.photometric == "YBR_FULL_422" else fh.samples_per_pixel
    values = fh.rows * fh.cols * fh.number_of_frames * samples
    needed = -(-values // 8) if fh.bits_allocated == 1 else values * (fh.bits_allocated // 8)
    if needed <= length <= needed + 1:
        return
    frames = f"{fh.number_of_frames} frame(s)"
    raise MeaninglessPixelsError(
        f"{fh.path}: pixel data holds {length} bytes; Rows {fh.rows} x Columns {fh.cols} x "
        f"{frames} x {fh.samples_per_pixel} sample(s) x BitsAllocated {fh.bits_allocated} "
        f"need {needed}: the header does not describe these pixels"
        + (" (truncated)" if length < needed else "")
    )


def stored_range(bits_stored: int, pixel_representation: int) -> tuple[int, int]:
    """The lowest and highest value ``bits_stored`` bits hold."""
    if pixel_representation == 1:
        return -(1 << (bits_stored - 1)), (1 << (bits_stored - 1)) - 1
    return 0, (1 << bits_stored) - 1


def rescale(
    fh: PixelHeader,
    slope_value: Any,
    intercept_value: Any,
    rescale_type: Any = None,
    default: tuple[float, float] = (1.0, 0.0),
    where: str = "",
) -> tuple[float, float]:
    """(slope, intercept) of the modality LUT, the defaults where absent; an error when the
    LUT makes the stored values meaningless (see the module's docstring)."""
    path = fh.path
    slope = number(path, "RescaleSlope", slope_value, where)
    intercept = number(path, "RescaleIntercept", intercept_value, where)
    slope = default[0] if slope is None else slope
    intercept = default[1] if intercept is None else intercept
    if slope == 1.0 and intercept == 0.0:
        return slope, intercept
    lut = f"{where}RescaleSlope {slope:g} and RescaleIntercept {intercept:g}"
    if slope == 0:
        raise MeaninglessPixelsError(
            f"{path}: {where}RescaleSlope 0 maps every stored value to {intercept:g}: the "
            "image would be one grey"
        )
    if fh.samples_per_pixel != 1:
        return slope, intercept  # colour values are not rescaled (dicom.pixels)
    lo, hi = stored_range(fh.bits_stored, fh.pixel_representation)
    a, b = sorted((slope * lo + intercept, slope * hi + intercept))
    span = b - a
    mapped = f"map the stored values {lo}..{hi} to {a:.7g}..{b:.7g}"
    largest = max(abs(a), abs(b))
    if not largest <= MAX_VALUE:
        raise MeaninglessPixelsError(
            f"{path}: {lut} {mapped}: beyond float32, where pixels are decoded (the image "
            "would be blank)"
        )
    if abs(slope) < FLOAT32_TINY or span < largest * MIN_RELATIVE_SPAN:
        raise MeaninglessPixelsError(
            f"{path}: {lut} {mapped}: float32, where pixels are decoded, cannot tell the "
            "stored values apart (the image would be one grey)"
        )
    kind = str(rescale_type or "").strip().upper()
    hounsfield = fh.modality == "CT" and kind in ("", "HU")
    if hounsfield and (span < CT_MIN_SPAN_HU or largest > CT_MAX_HU):
        raise MeaninglessPixelsError(
            f"{path}: {lut} {mapped} HU: not a CT's Hounsfield range (air -1000, water "
            f"0, at least {CT_MIN_SPAN_HU:g} HU between the lowest and highest stored "
            f"values, none beyond {CT_MAX_HU:g})"
        )
    return slope, intercept


def usable_window(center: float | None, width: float | None) -> tuple[float, float] | None:
    """A VOI window (center, width), or None when it cannot be one (not finite, width <= 0)."""
    if center is None or width is None or not width > 0:
        return None
    return (center, width)
