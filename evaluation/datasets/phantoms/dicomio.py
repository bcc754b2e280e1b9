"""Write DICOM Part 10 files fast: encode a series' fixed header once, splice per-instance parts.

Every element is encoded by pydicom itself (``write_data_element``), in tag order, in Explicit
VR Little Endian; only the few elements that change per image (SOP Instance UID, position,
instance number, b-value, pixels) are encoded per file. The bytes are those ``pydicom.dcmwrite``
would write for the same dataset (a test holds us to it), at a fraction of the cost.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from pathlib import Path

from pydicom.dataelem import DataElement
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.filebase import DicomBytesIO
from pydicom.filewriter import write_data_element, write_file_meta_info
from pydicom.tag import BaseTag, Tag
from pydicom.uid import UID, ExplicitVRLittleEndian

IMPLEMENTATION_VERSION = "NEUROSANDBOX_PH1"
PREAMBLE = b"\x00" * 128 + b"DICM"
PIXEL_TAG = Tag(0x7FE0, 0x0010)


# UUID namespace of the phantom generator (a fixed, randomly chosen UUID).
_NAMESPACE = uuid.UUID("6f2d7c1e-3b9a-4f5e-9c2d-8a1b7e4c0d35")


def uid(*parts: object) -> str:
    """A UID derived from ``parts``: same parts, same UID, on every machine.

    PS3.5 B.2: "2.25." followed by the decimal value of a UUID; here a name-based UUID (v5)
    of the parts. (pydicom's generate_uid ignores its entropy sources when prefix is None.)
    """
    name = "\x1f".join(str(p) for p in parts)
    return f"2.25.{uuid.uuid5(_NAMESPACE, name).int}"


IMPLEMENTATION_UID = uid("implementation-class", IMPLEMENTATION_VERSION)


def _buffer() -> DicomBytesIO:
    fp = DicomBytesIO()
    fp.is_little_endian = True
    fp.is_implicit_VR = False
    return fp


def _encode(elems: Iterable[DataElement], encodings: list[str]) -> bytes:
    fp = _buffer()
    for elem in elems:
        write_data_element(fp, elem, encodings)
    return fp.getvalue()


def file_meta(sop_class: str, sop_instance: str) -> FileMetaDataset:
    meta = FileMetaDataset()
    meta.FileMetaInformationVersion = b"\x00\x01"
    meta.MediaStorageSOPClassUID = UID(sop_class)
    meta.MediaStorageSOPInstanceUID = UID(sop_instance)
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    meta.ImplementationClassUID = UID(IMPLEMENTATION_UID)
    meta.ImplementationVersionName = IMPLEMENTATION_VERSION
    return meta


def _meta_bytes(sop_class: str, sop_instance: str) -> bytes:
    """The File Meta group as pydicom's write_file_meta_info writes it."""
    fp = _buffer()
    write_file_meta_info(fp, file_meta(sop_class, sop_instance), enforce_standard=True)
    return fp.getvalue()


class _Meta:
    """File Meta bytes with only the SOP Instance UID encoded per file."""

    def __init__(self, sop_class: str) -> None:
        meta = file_meta(sop_class, "1.2")
        enc: list[str] = []
        self.before = _encode([meta[Tag(0x0002, 0x0001)], meta[Tag(0x0002, 0x0002)]], enc)
        self.after = _encode([meta[Tag(0x0002, t)] for t in (0x0010, 0x0012, 0x0013)], enc)

    def encode(self, sop_instance: str) -> bytes:
        mid = _encode([DataElement(Tag(0x0002, 0x0003), "UI", sop_instance)], [])
        n = len(self.before) + len(mid) + len(self.after)
        return (
            b"\x02\x00\x00\x00UL\x04\x00" + n.to_bytes(4, "little") + self.before + mid + self.after
        )


class SeriesWriter:
    """Writes the instances of one series that share every element but ``varying`` ones.

    ``fixed`` holds the shared elements (it must not contain any varying tag or Pixel Data);
    each ``encode`` call gives the varying elements as a Dataset plus the pixel bytes.
    """

    def __init__(self, fixed: Dataset, varying: Iterable[str | int]) -> None:
        self.sop_class = str(fixed.SOPClassUID)
        self.encodings: list[str] = list(fixed._character_set)
        vtags = sorted({Tag(v) for v in varying} | {PIXEL_TAG})
        for t in vtags:
            if t in fixed:
                raise ValueError(f"tag {t} is both fixed and varying")
        self.vtags: list[BaseTag] = vtags
        elems = sorted(fixed.elements(), key=lambda e: e.tag)
        chunks: list[list[DataElement]] = [[] for _ in range(len(vtags) + 1)]
        for e in elems:
            slot = sum(1 for t in vtags if t < e.tag)
            chunks[slot].append(e)  # type: ignore[arg-type]
        self.chunks = [_encode(c, self.encodings) for c in chunks]
        self.meta = _Meta(self.sop_class)

    def encode(self, varying: Dataset, pixels: bytes) -> bytes:
        """The complete Part 10 file for one instance."""
        if len(pixels) % 2:
            raise ValueError("pixel data must have an even number of bytes")
        parts = [PREAMBLE, self.meta.encode(str(varying.SOPInstanceUID))]
        fp = _buffer()
        for i, t in enumerate(self.vtags):
            fp.write(self.chunks[i])
            if t == PIXEL_TAG:
                fp.write(b"\xe0\x7f\x10\x00OW\x00\x00" + len(pixels).to_bytes(4, "little"))
                fp.write(pixels)
            else:
                elem = varying.get(t)
                if elem is None:
                    raise ValueError(f"varying tag {t} missing for {varying.SOPInstanceUID}")
                write_data_element(fp, elem, self.encodings)
        fp.write(self.chunks[-1])
        parts.append(fp.getvalue())
        return b"".join(parts)

    def write(self, path: Path, varying: Dataset, pixels: bytes) -> None:
        path.write_bytes(self.encode(varying, pixels))


def full_dataset(fixed: Dataset, varying: Dataset, pixels: bytes) -> Dataset:
    """The whole instance as one pydicom Dataset (what a naive writer would build)."""
    ds = Dataset()
    for e in fixed:
        ds.add(e)
    for e in varying:
        ds.add(e)
    ds.add_new(PIXEL_TAG, "OW", pixels)
    ds.file_meta = file_meta(str(fixed.SOPClassUID), str(varying.SOPInstanceUID))
    return ds
