"""A fast header scan: the few top-level elements the index needs, without a full parse.

pydicom stays the parser of record. This scanner only walks the element headers of a plain
little-endian Part 10 file (explicit or implicit VR), keeps the raw bytes of the top-level
elements in ``NEEDED_TAGS``, steps over everything else by its length (the 150 kB Siemens
blobs are never decoded) and stops at Pixel Data, where pydicom's ``stop_before_pixels``
stops. ``dicom.headers.scanned.ScannedDataset`` converts the kept elements with pydicom's own code.

The files of a series mostly share their bytes. After one full walk, a file becomes a
template (dicom.headers.template): later files of the same size compare whole runs of elements
against it in C (``bytes.startswith``) and walk only the elements that differ.

Anything unusual raises ``Fallback`` and the caller parses the file with pydicom: no preamble,
big endian, deflate, unknown transfer syntax, a command set, unknown VRs, undefined lengths
other than sequences, a delimiter at the top level, a needed tag twice, values crossing the
end of the file, deeply nested sequences, needed elements that pydicom treats specially (VR
UN, private tags in implicit VR) and functional-group sequences (enhanced objects).
"""

from __future__ import annotations

import struct
from typing import Any, cast

from pydicom.datadict import dictionary_VR, tag_for_keyword
from pydicom.dataelem import RawDataElement, empty_value_for_VR
from pydicom.tag import BaseTag
from pydicom.valuerep import EXPLICIT_VR_LENGTH_32, STANDARD_VR

IMPLICIT_LE = "1.2.840.10008.1.2"
# Transfer syntaxes whose dataset is explicit VR little endian (native or encapsulated).
EXPLICIT_LE_SYNTAXES = frozenset(
    {
        "1.2.840.10008.1.2.1",
        "1.2.840.10008.1.2.4.50",
        "1.2.840.10008.1.2.4.51",
        "1.2.840.10008.1.2.4.57",
        "1.2.840.10008.1.2.4.70",
        "1.2.840.10008.1.2.4.80",
        "1.2.840.10008.1.2.4.81",
        "1.2.840.10008.1.2.4.90",
        "1.2.840.10008.1.2.4.91",
        "1.2.840.10008.1.2.4.201",
        "1.2.840.10008.1.2.4.202",
        "1.2.840.10008.1.2.4.203",
        "1.2.840.10008.1.2.5",
    }
)

# Top-level keywords dicom.headers reads for classic objects. A keyword it asks for that is
# not listed here makes ScannedDataset raise Fallback (and the equivalence test fail).
NEEDED_KEYWORDS = (
    "SpecificCharacterSet",
    "PatientName",
    "PatientID",
    "IssuerOfPatientID",
    "PatientBirthDate",
    "ImageType",
    "SOPClassUID",
    "SOPInstanceUID",
    "Modality",
    "Manufacturer",
    "SeriesDescription",
    "ContrastBolusAgent",
    "ScanningSequence",
    "SequenceVariant",
    "ScanOptions",
    "MRAcquisitionType",
    "SequenceName",
    "SliceThickness",
    "RepetitionTime",
    "EchoTime",
    "InversionTime",
    "EchoNumbers",
    "SpacingBetweenSlices",
    "ProtocolName",
    "FlipAngle",
    "PulseSequenceName",
    "EchoPulseSequence",
    "InversionRecovery",
    "DiffusionBValue",
    "DiffusionGradientOrientation",
    "StudyInstanceUID",
    "SeriesInstanceUID",
    "SeriesNumber",
    "AcquisitionNumber",
    "InstanceNumber",
    "PatientOrientation",
    "ImagePositionPatient",
    "ImageOrientationPatient",
    "TemporalPositionIdentifier",
    "SamplesPerPixel",
    "PhotometricInterpretation",
    "NumberOfFrames",
    "Rows",
    "Columns",
    "PixelSpacing",
    "BitsAllocated",
    "BitsStored",
    "HighBit",
    "PixelRepresentation",
    "BurnedInAnnotation",
    "WindowCenter",
    "WindowWidth",
    "RescaleIntercept",
    "RescaleSlope",
    "RescaleType",
)
# Vendor diffusion tags dicom.headers reads as (group, element).
NEEDED_PRIVATE = (
    (0x0019, 0x100C),
    (0x0019, 0x100E),
    (0x0019, 0x10BB),
    (0x0019, 0x10BC),
    (0x0019, 0x10BD),
    (0x0043, 0x1039),
    (0x2001, 0x1003),
    (0x0065, 0x1009),
    (0x0065, 0x1037),
)
# Present at the top level: the object needs pydicom's full parse (functional groups, codes).
FALLBACK_KEYWORDS = (
    "ContrastBolusAgentSequence",
    "PerFrameFunctionalGroupsSequence",
    "SharedFunctionalGroupsSequence",
)


def keyword_tag(keyword: str) -> int:
    tag = tag_for_keyword(keyword)
    if tag is None:  # pragma: no cover - a typo in the lists above
        raise ValueError(f"unknown DICOM keyword {keyword!r}")
    return int(tag)


KEYWORD_TAGS = {kw: keyword_tag(kw) for kw in NEEDED_KEYWORDS}
PRIVATE_TAGS = frozenset(g << 16 | e for g, e in NEEDED_PRIVATE)
NEEDED_TAGS = frozenset(KEYWORD_TAGS.values()) | PRIVATE_TAGS
FALLBACK_TAGS = frozenset(keyword_tag(kw) for kw in FALLBACK_KEYWORDS)
CHARSET_TAG = 0x00080005
TS_TAG = 0x00020010
MEDIA_SOP_CLASS_TAG = 0x00020002
_PIXEL_TAGS = frozenset({0x7FE00010, 0x7FE00009, 0x7FE00008})
_SPECIAL_TAGS = NEEDED_TAGS | FALLBACK_TAGS | _PIXEL_TAGS
_ITEM, _ITEM_END, _SEQ_END = 0xFFFEE000, 0xFFFEE00D, 0xFFFEE0DD
UNDEFINED = 0xFFFFFFFF
_MAX_DEPTH = 16
CHUNK = 16 * 1024

# Explicit VR header size (8 or 12 bytes) by the two VR bytes read as a little-endian uint16;
# a VR missing from the table is unknown.
_EXPLICIT_HEADER = {
    int.from_bytes(v.encode(), "little"): 12 if v in EXPLICIT_VR_LENGTH_32 else 8
    for v in STANDARD_VR
    if len(v) == 2
}
_SQ = int.from_bytes(b"SQ", "little")
_UN = int.from_bytes(b"UN", "little")
_HEADER = struct.Struct("<HHHHL")  # group, element, VR (or length low word), length, long length
_HEADER8 = struct.Struct("<HHHH")
_LONG = struct.Struct("<L")


def header_size(vr: bytes) -> int:
    """Size of an explicit VR element header (8 or 12 bytes) by its VR; 0 if unknown."""
    return _EXPLICIT_HEADER.get(int.from_bytes(vr, "little"), 0)


class Fallback(Exception):
    """The file needs pydicom's full parser; the message says why (for tests and debugging)."""


class Reader:
    """Reads a file in chunks; ``view(pos, n)`` gives a buffer holding bytes pos..pos+n."""

    __slots__ = ("base", "data", "fp", "size", "to_end")

    def __init__(self, fp: Any, size: int, first: int = CHUNK, to_end: bool = False) -> None:
        self.fp = fp
        self.size = size
        self.base = 0
        self.data = fp.read(max(first, CHUNK))
        # A read that starts less than two chunks from the end reads on to it.
        self.to_end = to_end

    def view(self, pos: int, n: int) -> tuple[bytes, int]:
        off = pos - self.base
        if off < 0 or off + n > len(self.data):
            if pos + n > self.size:
                raise Fallback(f"element at byte {pos} runs past the end of the file")
            self.fp.seek(pos)
            left = self.size - pos
            self.data = self.fp.read(left if self.to_end and left <= 2 * CHUNK else max(n, CHUNK))
            self.base, off = pos, 0
        return self.data, off


class ScannedHeader:
    """Raw needed elements of one file and where its header pass stopped."""

    __slots__ = ("after", "elements", "implicit", "meta", "size", "stop", "tail")

    def __init__(
        self,
        meta: dict[int, RawDataElement],
        elements: dict[int, RawDataElement],
        implicit: bool,
        stop: int,
        after: bytes,
        size: int,
        tail: tuple[int, bytes] | None = None,
    ) -> None:
        self.meta = meta
        self.elements = elements
        self.implicit = implicit
        self.stop = stop  # offset of the Pixel Data element header, or the file size
        self.after = after  # up to 12 bytes at ``stop``
        self.size = size
        self.tail = tail  # (offset, the file's bytes from it to its end) when they were read

    def raw_values(self, tags: tuple[int, ...]) -> tuple[Any, ...]:
        """The raw (VR, value) of each of ``tags``, None where absent: a hashable key."""
        els = self.elements
        return tuple(None if (raw := els.get(t)) is None else (raw.VR, raw.value) for t in tags)

    def values_key(self, tags: tuple[int, ...]) -> tuple[Any, ...]:
        """A hashable key of the raw values of ``tags`` and of the encoding context."""
        els, meta = self.elements, self.meta
        out: list[Any] = [self.implicit]
        for tag in (TS_TAG, MEDIA_SOP_CLASS_TAG):
            raw = meta.get(tag)
            out.append(None if raw is None else (raw.VR, raw.value))
        for tag in (CHARSET_TAG, *tags):
            raw = els.get(tag)
            out.append(None if raw is None else (raw.VR, raw.value))
        return tuple(out)


def scan_meta(rd: Reader, pos: int) -> tuple[dict[int, RawDataElement], int]:
    """File meta elements (explicit VR little endian) up to the first non-0002 group."""
    meta: dict[int, RawDataElement] = {}
    last = -1
    size = rd.size
    data, base = rd.data, rd.base
    end = base + len(data)
    while True:
        if pos + 8 > size:
            raise Fallback("file ends inside the file meta")
        if pos < base or pos + 12 > end:  # the element header (8 or 12 bytes) in the buffer
            data, _ = rd.view(pos, min(12, size - pos))
            base = rd.base
            end = base + len(data)
        off = pos - base
        group, elem, vr_i, length = _HEADER8.unpack_from(data, off)
        if group != 2:
            return meta, pos
        tag = group << 16 | elem
        hdr = _EXPLICIT_HEADER.get(vr_i, 0)
        if tag <= last or hdr == 0:
            raise Fallback("irregular file meta")
        last = tag
        if hdr == 12:
            if pos + 12 > size:
                raise Fallback(f"element at byte {pos} runs past the end of the file")
            (length,) = _LONG.unpack_from(data, off + 8)
        if length == UNDEFINED:
            raise Fallback("undefined length in the file meta")
        if tag in (TS_TAG, MEDIA_SOP_CLASS_TAG):
            vr = data[off + 4 : off + 6].decode("ascii")
            if length == 0:
                value = cast("bytes | None", empty_value_for_VR(vr, raw=True))
            else:
                vdata, voff = rd.view(pos + hdr, length)
                value = bytes(vdata[voff : voff + length])
                data, base = rd.data, rd.base
                end = base + len(data)
            meta[tag] = RawDataElement(BaseTag(tag), vr, length, value, pos + hdr, False, True)
        pos += hdr + length
        if pos > size:
            raise Fallback("file meta value runs past the end of the file")


def scan_dataset(
    rd: Reader,
    pos: int,
    implicit: bool,
    elements: dict[int, RawDataElement],
    bounds: list[int] | None = None,
) -> int:
    """Walk top-level elements from ``pos`` up to Pixel Data; return where the pass stopped.

    Like pydicom, reads in file order and stops at the first Pixel Data tag. Needed elements
    go into ``elements``; the start of every element walked is appended to ``bounds``.
    """
    size = rd.size
    special = _SPECIAL_TAGS
    explicit_header = _EXPLICIT_HEADER
    unpack = _HEADER.unpack_from
    data, base = rd.data, rd.base
    end = base + len(data)
    while True:
        if pos + 12 > end:  # refill, or handle the last bytes of the file
            if pos >= size:
                if pos > size:
                    raise Fallback("the last element runs past the end of the file")
                return pos
            if size - pos < 12:
                nxt = step(rd, pos, implicit, elements)[1]
                if nxt < 0:
                    return -nxt - 1
                if bounds is not None:
                    bounds.append(pos)
                pos = nxt
                continue
            data, _ = rd.view(pos, 12)
            base = rd.base
            end = base + len(data)
        if bounds is not None:
            bounds.append(pos)
        group, elem, vr_i, length, long_length = unpack(data, pos - base)
        if implicit:
            length = length << 16 | vr_i
            hdr = 8
        else:
            hdr = explicit_header.get(vr_i, 0)
            if hdr == 12:
                length = long_length
            elif hdr == 0:
                raise Fallback(f"unknown VR at byte {pos}")
        tag = group << 16 | elem
        if tag in special or length == UNDEFINED or group == 0xFFFE:
            pos = special_element(rd, pos, hdr, tag, length, implicit, elements)
            if pos < 0:
                if bounds is not None:
                    bounds.pop()  # the stop is not an element of the header
                return -pos - 1
            data, base = rd.data, rd.base
            end = base + len(data)
        else:
            pos += hdr + length


def step(
    rd: Reader, pos: int, implicit: bool, elements: dict[int, RawDataElement]
) -> tuple[int, int]:
    """Walk the one element at ``pos``: (its tag, the next offset, or -stop-1 at the stop)."""
    remaining = rd.size - pos
    if remaining < 8:
        raise Fallback("trailing bytes shorter than an element header")
    if remaining < 12:
        data, off = rd.view(pos, 8)
        group, elem, vr_i, length = _HEADER8.unpack_from(data, off)
        long_length = None
    else:
        data, off = rd.view(pos, 12)
        group, elem, vr_i, length, long_length = _HEADER.unpack_from(data, off)
    if implicit:
        length, hdr = length << 16 | vr_i, 8
    else:
        hdr = _EXPLICIT_HEADER.get(vr_i, 0)
        if hdr == 12:
            if long_length is None:
                raise Fallback("trailing bytes shorter than an element header")
            length = long_length
        elif hdr == 0:
            raise Fallback(f"unknown VR at byte {pos}")
    tag = group << 16 | elem
    if tag in _SPECIAL_TAGS or length == UNDEFINED or group == 0xFFFE:
        return tag, special_element(rd, pos, hdr, tag, length, implicit, elements)
    nxt = pos + hdr + length
    if nxt > rd.size:
        raise Fallback(f"({group:04X},{elem:04X}) runs past the end of the file")
    return tag, nxt


def special_element(
    rd: Reader,
    pos: int,
    hdr: int,
    tag: int,
    length: int,
    implicit: bool,
    elements: dict[int, RawDataElement],
) -> int:
    """Handle a needed, pixel, fallback or undefined-length element at ``pos``.

    Returns the offset of the next element, or ``-pos - 1`` when the header pass stops here.
    """
    name = f"({tag >> 16:04X},{tag & 0xFFFF:04X})"
    if tag in _PIXEL_TAGS:
        return -pos - 1
    if tag in FALLBACK_TAGS:
        raise Fallback(f"{name} needs the full parser")
    if tag >> 16 == 0xFFFE:
        raise Fallback(f"delimiter {name} at the top level")
    vr_i = -1
    if not implicit:
        data, off = rd.view(pos, 6)
        vr_i = data[off + 4] | data[off + 5] << 8
    if tag in NEEDED_TAGS:
        if tag in elements:
            raise Fallback(f"{name} appears twice")
        if length == UNDEFINED:
            raise Fallback(f"{name} has an undefined length")
        start = pos + hdr
        if start + length > rd.size:
            raise Fallback(f"{name} runs past the end of the file")
        if implicit and tag in PRIVATE_TAGS:
            raise Fallback(f"{name} needs a private VR lookup")
        if vr_i == _UN:
            raise Fallback(f"{name} has VR UN")
        vr = None if implicit else vr_i.to_bytes(2, "little").decode("ascii")
        if length == 0:  # as pydicom stores an empty value
            value = cast("bytes | None", empty_value_for_VR(vr, raw=True))
        else:
            data, off = rd.view(start, length)
            value = data[off : off + length]
        elements[tag] = RawDataElement(BaseTag(tag), vr, length, value, start, implicit, True)
        return start + length
    if length != UNDEFINED:  # pragma: no cover - only undefined lengths get here
        return pos + hdr + length
    # An undefined length outside the needed tags: a sequence to step over, or give up.
    is_sq = _dictionary_vr(tag) == "SQ" if implicit else vr_i == _SQ
    if not is_sq:
        raise Fallback(f"undefined length {name} is not a sequence")
    return _skip_sequence(rd, pos + hdr, implicit, 1)


def _dictionary_vr(tag: int) -> str:
    try:
        return str(dictionary_VR(tag))
    except KeyError:
        return ""


def _skip_sequence(rd: Reader, pos: int, implicit: bool, depth: int) -> int:
    """Step over the items of an undefined-length sequence; return the offset after it."""
    if depth > _MAX_DEPTH:
        raise Fallback("sequences nested too deeply for the scanner")
    while True:
        data, off = rd.view(pos, 8)
        group, elem, low, high = _HEADER8.unpack_from(data, off)
        tag, length = group << 16 | elem, high << 16 | low
        pos += 8
        if tag == _SEQ_END:
            return pos
        if tag != _ITEM:
            raise Fallback(f"unexpected ({group:04X},{elem:04X}) in a sequence")
        if length != UNDEFINED:
            pos += length
            continue
        while True:  # an undefined-length item: walk its elements to the item end
            data, off = rd.view(pos, 8)
            group, elem, vr_i, low_length = _HEADER8.unpack_from(data, off)
            tag = group << 16 | elem
            if tag == _ITEM_END:
                pos += 8
                break
            if implicit:
                hdr, length = 8, low_length << 16 | vr_i
                is_sq = length == UNDEFINED and _dictionary_vr(tag) == "SQ"
            else:
                hdr = _EXPLICIT_HEADER.get(vr_i, 0)
                if hdr == 0:
                    raise Fallback("unknown VR inside a sequence")
                length = low_length
                if hdr == 12:
                    data, off = rd.view(pos, 12)
                    (length,) = struct.unpack_from("<L", data, off + 8)
                is_sq = vr_i == _SQ
            if length == UNDEFINED:
                if not is_sq:
                    raise Fallback("undefined length inside a sequence is not a sequence")
                pos = _skip_sequence(rd, pos + hdr, implicit, depth + 1)
            else:
                pos += hdr + length
