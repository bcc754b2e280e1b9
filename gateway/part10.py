"""Fast paths for received instances: the Part 10 header by hand, the UIDs without a full parse.

The storage SCP writes what the peer sent byte for byte; only the 128-byte preamble, ``DICM``
and the File Meta Information group are added. pydicom's writer costs ~1 ms per instance for
that group, which matters at hundreds of instances per second.
"""

from __future__ import annotations

import struct
from io import BytesIO
from typing import Any, NamedTuple

from pydicom.filereader import read_dataset
from pydicom.uid import ExplicitVRBigEndian, ImplicitVRLittleEndian
from pynetdicom import PYNETDICOM_IMPLEMENTATION_UID, PYNETDICOM_IMPLEMENTATION_VERSION

_LAST_UID_TAG = 0x0020000E  # SeriesInstanceUID: the header scan stops after it
_STUDY_TAG = 0x0020000D
_PATIENT_ID_TAG = 0x00100020
_ISSUER_TAG = 0x00100021
_WANTED = (_PATIENT_ID_TAG, _ISSUER_TAG, _STUDY_TAG, _LAST_UID_TAG)
_ITEM, _ITEM_DELIMITER, _SEQ_DELIMITER = 0xFFFEE000, 0xFFFEE00D, 0xFFFEE0DD
_UNDEFINED = 0xFFFFFFFF
_MAX_DEPTH = 8
_HEADER = struct.Struct("<HHHH")
_U32 = struct.Struct("<I")
_LONG_VRS = {
    b"OB",
    b"OD",
    b"OF",
    b"OL",
    b"OV",
    b"OW",
    b"SQ",
    b"SV",
    b"UC",
    b"UN",
    b"UR",
    b"UT",
    b"UV",
}
_DEFLATED = {"1.2.840.10008.1.2.1.99", "1.2.840.10008.1.2.4.95"}


def _element(group: int, elem: int, vr: bytes, value: bytes) -> bytes:
    """One explicit VR little endian element (short-length VRs and OB)."""
    if len(value) % 2:
        value += b"\0" if vr in (b"UI", b"OB") else b" "
    if vr == b"OB":
        return struct.pack("<HH2sHI", group, elem, vr, 0, len(value)) + value
    return struct.pack("<HH2sH", group, elem, vr, len(value)) + value


def file_meta_bytes(
    sop_class: str, sop_instance: str, transfer_syntax: str, source_aet: str
) -> bytes:
    """Preamble, ``DICM`` and the File Meta Information group for one instance."""
    body = b"".join(
        (
            _element(0x0002, 0x0001, b"OB", b"\0\1"),
            _element(0x0002, 0x0002, b"UI", sop_class.encode("ascii")),
            _element(0x0002, 0x0003, b"UI", sop_instance.encode("ascii")),
            _element(0x0002, 0x0010, b"UI", transfer_syntax.encode("ascii")),
            _element(0x0002, 0x0012, b"UI", str(PYNETDICOM_IMPLEMENTATION_UID).encode("ascii")),
            _element(0x0002, 0x0013, b"SH", PYNETDICOM_IMPLEMENTATION_VERSION.encode("ascii")),
            _element(0x0002, 0x0016, b"AE", source_aet.encode("ascii", "replace")[:16]),
        )
    )
    group_length = struct.pack("<HH2sHI", 0x0002, 0x0000, b"UL", 4, len(body))
    return b"\0" * 128 + b"DICM" + group_length + body


class InstanceKeys(NamedTuple):
    """What the node files a received instance under: its study, series and patient."""

    study_uid: str
    series_uid: str
    patient_id: str = ""
    issuer: str = ""


def keys_of(ds: Any) -> InstanceKeys:
    """The keys of a decoded dataset (a deflated instance, whose bytes cannot be scanned in
    place), bounded as ``read_uids`` bounds them."""
    return InstanceKeys(
        str(ds.StudyInstanceUID),
        str(ds.SeriesInstanceUID),
        str(ds.get("PatientID", "") or "").strip()[:64],
        str(ds.get("IssuerOfPatientID", "") or "").strip()[:64],
    )


def read_uids(data: BytesIO | bytes, transfer_syntax: str) -> InstanceKeys | None:
    """The StudyInstanceUID, SeriesInstanceUID, PatientID and IssuerOfPatientID read from the
    start of an encoded dataset (a stream, or bytes: read in place, never copied but for
    pydicom's read).

    A byte walk over the top-level elements (stepping over sequences) for little endian
    encodings; pydicom reads anything the walk does not handle. Raises KeyError when a UID
    is missing. Returns None when the encoding needs a full decode (deflate).
    """
    if transfer_syntax in _DEFLATED:
        return None  # deflated: not parseable in place
    big = transfer_syntax == ExplicitVRBigEndian
    implicit = transfer_syntax == ImplicitVRLittleEndian
    if not big:
        if isinstance(data, bytes):
            found = scan_uids(memoryview(data), implicit)
        else:
            with data.getbuffer() as buf:  # (a BytesIO sharing bytes would copy them here)
                found = scan_uids(buf, implicit)
        if found is not None:
            return found
    if isinstance(data, bytes):
        data = BytesIO(data)
    data.seek(0)

    def stop(tag: Any, vr: Any, length: Any) -> bool:
        return int(tag) > _LAST_UID_TAG

    ds = read_dataset(data, implicit, not big, stop_when=stop)
    data.seek(0)
    study, series = ds.get("StudyInstanceUID"), ds.get("SeriesInstanceUID")
    if study is None or series is None:
        raise KeyError("StudyInstanceUID/SeriesInstanceUID missing")
    return InstanceKeys(
        str(study), str(series), _text(ds.get("PatientID")), _text(ds.get("IssuerOfPatientID"))
    )


def _text(value: Any) -> str:
    return "" if value is None else str(value).strip(" \0")[:64]


def scan_uids(buf: Any, implicit: bool) -> InstanceKeys | None:
    """The keys of a little endian dataset, or None when pydicom should read it instead.

    Raises KeyError when the walk reaches past (0020,000E) without finding both.
    """
    end = len(buf)
    pos = 0
    found: dict[int, str] = {}
    while pos + 8 <= end:
        tag, length, hdr = _element_header(buf, pos, implicit)
        if tag < 0:
            return None
        if tag > _LAST_UID_TAG:
            break
        pos += hdr
        if length == _UNDEFINED:
            if not implicit and bytes(buf[pos - hdr + 4 : pos - hdr + 6]) != b"SQ":
                return None  # UN with undefined length, or stray: pydicom decides
            pos = _skip_items(buf, pos, implicit, 1)
            if pos < 0:
                return None
            continue
        if pos + length > end:
            return None
        if tag in _WANTED:
            raw = bytes(buf[pos : pos + min(length, 256)])
            found[tag] = raw.decode("utf-8", "replace").strip("\0 ")[:64]
        pos += length
    if pos + 8 > end and pos != end:
        return None  # trailing bytes shorter than a header
    if _STUDY_TAG not in found or _LAST_UID_TAG not in found:
        raise KeyError("StudyInstanceUID/SeriesInstanceUID missing")
    return InstanceKeys(
        found[_STUDY_TAG],
        found[_LAST_UID_TAG],
        found.get(_PATIENT_ID_TAG, ""),
        found.get(_ISSUER_TAG, ""),
    )


def _element_header(buf: Any, pos: int, implicit: bool) -> tuple[int, int, int]:
    """(tag, value length, header size) at ``pos``; tag -1 when the header is unusable."""
    group, elem, vr_or_len, short_len = _HEADER.unpack_from(buf, pos)
    tag = group << 16 | elem
    if implicit:
        return tag, vr_or_len | short_len << 16, 8
    vr = vr_or_len.to_bytes(2, "little")
    if group == 0xFFFE:  # item and delimiters have no VR in any encoding
        return tag, vr_or_len | short_len << 16, 8
    if vr in _LONG_VRS:
        if pos + 12 > len(buf):
            return -1, 0, 0
        return tag, _U32.unpack_from(buf, pos + 8)[0], 12
    if not (0x41 <= vr[0] <= 0x5A and 0x41 <= vr[1] <= 0x5A):
        return -1, 0, 0
    return tag, short_len, 8


def _skip_items(buf: Any, pos: int, implicit: bool, depth: int) -> int:
    """The offset after an undefined-length sequence starting at ``pos``; -1 if unusual."""
    if depth > _MAX_DEPTH:
        return -1
    end = len(buf)
    while pos + 8 <= end:
        group, elem, low, high = _HEADER.unpack_from(buf, pos)
        tag, length = group << 16 | elem, low | high << 16
        pos += 8
        if tag == _SEQ_DELIMITER:
            return pos
        if tag != _ITEM:
            return -1
        if length != _UNDEFINED:
            pos += length
            continue
        while True:  # an undefined-length item: its elements up to the item delimiter
            if pos + 8 > end:
                return -1
            tag, length, hdr = _element_header(buf, pos, implicit)
            if tag < 0:
                return -1
            pos += hdr
            if tag == _ITEM_DELIMITER:
                break
            if length == _UNDEFINED:
                if not implicit and bytes(buf[pos - hdr + 4 : pos - hdr + 6]) != b"SQ":
                    return -1
                pos = _skip_items(buf, pos, implicit, depth + 1)
                if pos < 0:
                    return -1
            else:
                pos += length
    return -1


class FileMeta(NamedTuple):
    """What a Part 10 file's File Meta Information says of its dataset, and where it starts."""

    sop_class: str
    sop_instance: str
    transfer_syntax: str
    dataset_offset: int  # the first byte of the dataset after the meta group


_META_WANTED = {0x00020002: "sop_class", 0x00020003: "sop_instance", 0x00020010: "ts"}


def read_file_meta(buf: Any) -> FileMeta:
    """The File Meta Information of a Part 10 file's bytes (a buffer): a walk over the group
    0002 elements (explicit VR little endian by the standard) up to the first element of
    another group. ValueError when there is no ``DICM`` prefix, the group is malformed or
    lacks one of the three UIDs. The UIDs are as written (check them)."""
    end = len(buf)
    if end < 132 + 8 or bytes(buf[128:132]) != b"DICM":
        raise ValueError("not a DICOM Part 10 file: no 128-byte preamble and 'DICM'")
    pos = 132
    found: dict[str, str] = {}
    while pos + 8 <= end:
        group = _HEADER.unpack_from(buf, pos)[0]
        if group != 0x0002:
            break
        tag, length, hdr = _element_header(buf, pos, False)
        if tag < 0 or length == _UNDEFINED or pos + hdr + length > end:
            raise ValueError(f"a malformed File Meta Information element at byte {pos}")
        name = _META_WANTED.get(tag)
        if name is not None:
            raw = bytes(buf[pos + hdr : pos + hdr + min(length, 128)])
            found[name] = raw.decode("ascii", "replace").strip("\0 ")
        pos += hdr + length
    missing = [n for n in ("sop_class", "sop_instance", "ts") if not found.get(n)]
    if missing:
        raise ValueError(f"File Meta Information without {', '.join(missing)}")
    return FileMeta(found["sop_class"], found["sop_instance"], found["ts"], pos)
