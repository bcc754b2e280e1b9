"""The frame header record and the rules that read each of its fields from a dataset.

Shared by the pydicom path (dicom.headers.read), the fast path (dicom.headers.fast) and the
multi-frame splitters (dicom.headers.multiframe).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pydicom
from pydicom.dataset import Dataset
from pydicom.uid import UID

from dicom.defaults import DEFAULT_MEMORY_CAP as DEFAULT_MEMORY_CAP
from dicom.errors import InvalidImageError, NonImageError, TooLargeError
from dicom.headers.elements import NEEDED_PRIVATE
from dicom.headers.pixel_rules import check_layout, integer, rescale, usable_window
from dicom.records import PatientKey

if TYPE_CHECKING:
    from dicom.headers.scanned import ScannedDataset

# Values larger than this are not read in the header pass (Siemens XA puts 150 kB blobs there).
DEFER_SIZE = 64 * 1024

NATIVE_LITTLE_ENDIAN = {
    "1.2.840.10008.1.2",  # Implicit VR Little Endian
    "1.2.840.10008.1.2.1",  # Explicit VR Little Endian
}

_NON_IMAGE_SOP_PREFIXES = (
    "1.2.840.10008.5.1.4.1.1.88.",  # structured reports
    "1.2.840.10008.5.1.4.1.1.66",  # raw data, spatial registration, fiducials, segmentation...
    "1.2.840.10008.5.1.4.1.1.11.",  # presentation states
    "1.2.840.10008.5.1.4.1.1.104.",  # encapsulated documents
    "1.2.840.10008.5.1.4.1.1.481.",  # RT objects
    "1.2.840.10008.5.1.4.1.1.9.",  # waveforms
)


_NO_PATIENT = PatientKey()


@dataclass(slots=True)
class FrameHeader:
    """Everything the index needs to know about one 2D image, taken from headers only."""

    path: str
    frame: int | None
    sop_instance_uid: str
    sop_class_uid: str
    study_uid: str
    series_uid: str
    series_number: int | None
    description: str
    protocol: str
    modality: str
    manufacturer: str
    image_type: tuple[str, ...]
    frame_type: tuple[str, ...]
    rows: int
    cols: int
    samples_per_pixel: int
    photometric: str
    bits_allocated: int
    bits_stored: int
    pixel_representation: int
    number_of_frames: int
    pixel_spacing: tuple[float, ...] | None  # (row spacing, column spacing)
    orientation: tuple[float, ...] | None
    position: tuple[float, ...] | None
    slice_thickness: float | None
    spacing_between_slices: float | None
    echo_number: int | None
    echo_time: float | None
    repetition_time: float | None
    inversion_time: float | None
    flip_angle: float | None
    scanning_sequence: tuple[str, ...]
    sequence_variant: tuple[str, ...]
    scan_options: tuple[str, ...]
    sequence_name: str
    mr_acquisition_type: str
    echo_pulse_sequence: str
    inversion_recovery: bool
    b_value: float | None
    direction: tuple[float, ...] | None
    contrast_agent: str | None
    rescale_slope: float
    rescale_intercept: float
    temporal_index: int | None
    acquisition_number: int | None
    instance_number: int | None
    transfer_syntax: str
    burned_in_annotation: bool
    pixel_offset: int | None
    patient: PatientKey = _NO_PATIENT  # shared by the files with the same series elements
    mosaic_slices: int | None = None
    window: tuple[float, float] | None = None
    extras: dict[str, Any] = field(default_factory=dict)


_PIXEL_TAGS = (b"\xe0\x7f\x10\x00", b"\xe0\x7f\x08\x00", b"\xe0\x7f\x09\x00")


def pixel_data(
    path: str, pos: int, head: bytes, ts: str, size: int | None
) -> tuple[int | None, int | None]:
    """Check the Pixel Data element follows the header; return its offset and its length in
    bytes, each when known.

    ``head`` is the (up to) 12 bytes where the header pass stopped, at byte ``pos``. An image
    object whose file ends before its pixel data is truncated, not empty. The offset
    (uncompressed little-endian data in a plain file, whose ``size`` is given) lets the pixels
    be read later without parsing the header again; the length (uncompressed little-endian
    data) is checked against what the header describes (pixel_rules.check_pixel_length).
    """
    tag = head[:4]
    if ts == "1.2.840.10008.1.2.2" and len(tag) == 4:  # big endian
        tag = tag[1::-1] + tag[3:1:-1]
    if tag not in _PIXEL_TAGS:
        raise InvalidImageError(
            f"{path}: image object has no Pixel Data (7FE0,0010) after its header (byte {pos}): "
            "the file is truncated, or its pixels sit in a private element"
        )
    if ts not in NATIVE_LITTLE_ENDIAN or tag != _PIXEL_TAGS[0]:
        return None, None
    if ts == "1.2.840.10008.1.2":
        length, start = int.from_bytes(head[4:8], "little"), pos + 8
    elif head[4:6] in (b"OB", b"OW"):
        length, start = int.from_bytes(head[8:12], "little"), pos + 12
    else:
        return None, None
    if length == 0xFFFFFFFF:
        return None, None
    if size is None:
        return None, length
    if size < start + length:
        raise InvalidImageError(
            f"{path}: pixel data truncated: {size - start} of {length} bytes present"
        )
    return start, length


def as_float(value: Any) -> float | None:
    try:
        if value is None or value == "":
            return None
        if isinstance(value, list | tuple | pydicom.multival.MultiValue):
            value = value[0]
        out = float(value)
        return out if math.isfinite(out) else None
    except (TypeError, ValueError, IndexError):
        return None


def as_int(value: Any) -> int | None:
    f = as_float(value)
    return int(f) if f is not None else None


def as_text(value: Any, limit: int = 256) -> str:
    if value is None:
        return ""
    return str(value)[:limit]


def as_code_strings(value: Any) -> tuple[str, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        return tuple(v.strip().upper() for v in value.split("\\") if v.strip())
    return tuple(str(v).strip().upper() for v in value if str(v).strip())


def as_floats(value: Any, n: int) -> tuple[float, ...] | None:
    if value is None:
        return None
    try:
        out = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        return None
    if len(out) != n or not all(math.isfinite(v) for v in out):
        return None
    return out


def first_item(ds: Dataset | None, keyword: str) -> Dataset | None:
    if ds is None:
        return None
    seq = ds.get(keyword)
    if seq is None:
        return None
    try:
        return seq[0] if len(seq) else None
    except (TypeError, IndexError):
        return None


def group_value(frame: Dataset | None, shared: Dataset | None, seq: str, attr: str) -> Any:
    """An attribute from a functional group macro: per-frame first, then shared."""
    for groups in (frame, shared):
        item = first_item(groups, seq)
        if item is not None and attr in item:
            return item.get(attr)
    return None


# Values scanners and converters write when no contrast agent was given.
NO_CONTRAST_VALUES = frozenset({"", "none", "no", "n", "0", "nil", "-"})


def contrast_agent_or_none(text: str) -> str | None:
    """The agent named in a ContrastBolusAgent-like text, or None for 'none', '', '0'..."""
    agent = text.strip()
    return agent if agent.lower() not in NO_CONTRAST_VALUES else None


def _contrast_agent(ds: Dataset | ScannedDataset) -> str | None:
    agent = contrast_agent_or_none(as_text(ds.get("ContrastBolusAgent")))
    if agent:
        return agent
    for item in ds.get("ContrastBolusAgentSequence") or []:
        meaning = as_text(item.get("CodeMeaning")).strip()
        if meaning:
            return meaning
    return None


def _vendor_diffusion(
    ds: Dataset | ScannedDataset,
) -> tuple[float | None, tuple[float, ...] | None]:
    """b-value and gradient direction from standard or vendor private tags (classic objects)."""
    b = as_float(ds.get("DiffusionBValue"))
    direction = as_floats(ds.get("DiffusionGradientOrientation"), 3)
    manufacturer = as_text(ds.get("Manufacturer")).upper()
    if b is None and "SIEMENS" in manufacturer:
        elem = ds.get((0x0019, 0x100C))
        if elem is not None:
            b = as_float(elem.value)
            d = ds.get((0x0019, 0x100E))
            direction = as_floats(d.value, 3) if d is not None else None
        elif "DIFFUSION" in as_code_strings(ds.get("ImageType")):
            seq_name = as_text(ds.get("SequenceName"))
            if "_b" in seq_name:
                b = as_float(seq_name.split("_b", 1)[1].rstrip("t#0123456789") or None)
    if b is None and "GE" in manufacturer:
        elem = ds.get((0x0043, 0x1039))
        if elem is not None:
            b_raw = as_float(elem.value)
            if b_raw is not None:
                # GE encodes the b-value in the first slop_int, sometimes offset by 1e9.
                b = float(b_raw % 1_000_000_000) if b_raw >= 1e9 else b_raw
                parts = [ds.get((0x0019, t)) for t in (0x10BB, 0x10BC, 0x10BD)]
                if all(p is not None for p in parts):
                    direction = as_floats([p.value for p in parts if p is not None], 3)
    if b is None and "PHILIPS" in manufacturer:
        elem = ds.get((0x2001, 0x1003))
        if elem is not None:
            b = as_float(elem.value)
    if is_uih(manufacturer):
        # UIH (dcm2niix's UIH/README.md): (0065,1009) FD is the b-value the sequence applied
        # ((0065,100A) the one chosen in the UI), (0065,1037) FD the gradient direction. As in
        # dcm2niix, they win over the standard elements (rordenlab/dcm2niix#993).
        elem = ds.get((0x0065, 0x1009))
        b_uih = _fd(elem.value, 1) if elem is not None else None
        if b_uih is not None:
            b = b_uih[0]
        elem = ds.get((0x0065, 0x1037))
        d_uih = _fd(elem.value, 3) if elem is not None else None
        if d_uih is not None:
            direction = d_uih
    return b, direction


def is_uih(manufacturer: str) -> bool:
    """United Imaging Healthcare writes Manufacturer 'UIH'."""
    m = manufacturer.upper()
    return "UIH" in m or "UNITED IMAGING" in m


def _fd(value: Any, n: int) -> tuple[float, ...] | None:
    """``n`` FD values, also when an implicit-VR file leaves a private element as raw bytes."""
    if isinstance(value, bytes):
        if len(value) != 8 * n:
            return None
        value = struct.unpack(f"<{n}d", value)
    elif n == 1 and not isinstance(value, list | tuple | pydicom.multival.MultiValue):
        value = [value]
    return as_floats(value, n)


# Elements whose values usually change from file to file within a series, in three tiers.
# FILE_KEYWORDS are unique to each file; VOLUME_* elements repeat across the files of a volume
# or b-value; WINDOW_KEYWORDS repeat in some series and change with every slice in others.
# set_unique_fields reads only the first, set_volume_fields only the second (and series
# elements), window_of only the third, and series_fields none: so that the fast path
# (dicom.headers.fast) can share each tier's fields between files whose raw values for it are
# identical.
FILE_KEYWORDS = ("SOPInstanceUID", "ImagePositionPatient", "InstanceNumber")
WINDOW_KEYWORDS = ("WindowCenter", "WindowWidth")
VOLUME_KEYWORDS = (
    "AcquisitionNumber",
    "TemporalPositionIdentifier",
    "RescaleSlope",
    "RescaleIntercept",
    "RescaleType",
    "SequenceName",
    "PulseSequenceName",
    "DiffusionBValue",
    "DiffusionGradientOrientation",
)
VOLUME_PRIVATE_TAGS = NEEDED_PRIVATE  # every vendor diffusion tag read changes per volume
VOLUME_FIELDS = (
    "acquisition_number",
    "temporal_index",
    "rescale_slope",
    "rescale_intercept",
    "sequence_name",
    "b_value",
    "direction",
)


def set_file_fields(
    fh: FrameHeader, path: str, ds: Dataset | ScannedDataset, pixel_offset: int | None
) -> None:
    """The fields that usually differ between the files of one series."""
    set_volume_fields(fh, ds)
    fh.window = window_of(ds)
    set_unique_fields(fh, path, ds, pixel_offset)


def set_unique_fields(
    fh: FrameHeader, path: str, ds: Dataset | ScannedDataset, pixel_offset: int | None
) -> None:
    fh.path = path
    fh.pixel_offset = pixel_offset
    fh.sop_instance_uid = as_text(ds.get("SOPInstanceUID"), 64)
    fh.position = as_floats(ds.get("ImagePositionPatient"), 3)
    fh.instance_number = as_int(ds.get("InstanceNumber"))


def set_volume_fields(fh: FrameHeader, ds: Dataset | ScannedDataset) -> None:
    """The VOLUME_FIELDS, from VOLUME_* elements (and series elements)."""
    fh.acquisition_number = as_int(ds.get("AcquisitionNumber"))
    fh.temporal_index = as_int(ds.get("TemporalPositionIdentifier"))
    fh.rescale_slope, fh.rescale_intercept = rescale(
        fh, ds.get("RescaleSlope"), ds.get("RescaleIntercept"), ds.get("RescaleType")
    )
    fh.sequence_name = as_text(ds.get("SequenceName") or ds.get("PulseSequenceName"), 64)
    fh.b_value, fh.direction = _vendor_diffusion(ds)


def window_of(ds: Dataset | ScannedDataset) -> tuple[float, float] | None:
    """The file's first VOI window (center, width), from the WINDOW_KEYWORDS elements; None
    when there is none or it cannot be one (a display hint: the renderer derives its own)."""
    return usable_window(as_float(ds.get("WindowCenter")), as_float(ds.get("WindowWidth")))


def series_fields(path: str, ds: Dataset | ScannedDataset, memory_cap: int) -> FrameHeader:
    """A classic frame header from all but the FILE and VOLUME elements (placeholders)."""
    sop_class = as_text(
        ds.get("SOPClassUID") or getattr(ds.file_meta, "MediaStorageSOPClassUID", "")
    )
    has_pixels = "Rows" in ds or "Columns" in ds
    name = UID(sop_class).name if sop_class else "unknown SOP class"
    if sop_class.startswith(_NON_IMAGE_SOP_PREFIXES):
        raise NonImageError(f"{path}: {name} object holds no image")
    if not has_pixels:
        if sop_class.startswith("1.2.840.10008.5.1.4.1.1."):
            raise InvalidImageError(
                f"{path}: {name} object lacks Rows/Columns: header truncated or corrupt"
            )
        raise NonImageError(f"{path}: {name} object holds no image")

    rows = as_int(ds.get("Rows"))
    cols = as_int(ds.get("Columns"))
    if not rows or not cols or rows <= 0 or cols <= 0:
        raise InvalidImageError(
            f"{path}: invalid image size (Rows={ds.get('Rows')!r}, Columns={ds.get('Columns')!r})"
        )
    spp = as_int(ds.get("SamplesPerPixel")) or 1
    bits = integer(path, "BitsAllocated", ds.get("BitsAllocated"))
    bits = 16 if bits is None else bits
    n_frames = as_int(ds.get("NumberOfFrames")) or 1
    if spp not in (1, 3) or n_frames < 1:
        raise InvalidImageError(
            f"{path}: unsupported pixel layout (SamplesPerPixel={spp}, BitsAllocated={bits}, "
            f"NumberOfFrames={n_frames})"
        )
    bits_stored = integer(path, "BitsStored", ds.get("BitsStored"))
    bits_stored = bits if bits_stored is None else bits_stored
    pixel_representation = integer(path, "PixelRepresentation", ds.get("PixelRepresentation"))
    pixel_representation = pixel_representation or 0
    photometric = as_text(ds.get("PhotometricInterpretation"), 32).strip().upper()
    check_layout(
        path,
        samples=spp,
        photometric=photometric,
        bits_allocated=bits,
        bits_stored=bits_stored,
        high_bit=integer(path, "HighBit", ds.get("HighBit")),
        pixel_representation=pixel_representation,
    )
    # A float32 working copy of every frame is what decoding will need at most.
    needed = rows * cols * n_frames * spp * max(4, bits // 8)
    if needed > memory_cap:
        raise TooLargeError(
            f"{path}: {cols}x{rows}x{n_frames} frames would need {needed / 2**30:.1f} GiB to "
            f"decode, over the {memory_cap / 2**30:.1f} GiB memory cap; refused before allocation"
        )

    ts = as_text(getattr(ds.file_meta, "TransferSyntaxUID", "")) or "1.2.840.10008.1.2"
    image_type = as_code_strings(ds.get("ImageType"))

    base = FrameHeader(
        path=path,
        frame=None,
        sop_instance_uid="",
        sop_class_uid=sop_class,
        study_uid=as_text(ds.get("StudyInstanceUID"), 64),
        series_uid=as_text(ds.get("SeriesInstanceUID"), 64),
        series_number=as_int(ds.get("SeriesNumber")),
        description=as_text(ds.get("SeriesDescription")),
        protocol=as_text(ds.get("ProtocolName")),
        modality=as_text(ds.get("Modality"), 16).upper(),
        manufacturer=as_text(ds.get("Manufacturer"), 64),
        image_type=image_type,
        frame_type=(),
        rows=rows,
        cols=cols,
        samples_per_pixel=spp,
        photometric=photometric,
        bits_allocated=bits,
        bits_stored=bits_stored,
        pixel_representation=pixel_representation,
        number_of_frames=n_frames,
        pixel_spacing=as_floats(ds.get("PixelSpacing"), 2),
        orientation=as_floats(ds.get("ImageOrientationPatient"), 6),
        position=None,
        slice_thickness=as_float(ds.get("SliceThickness")),
        spacing_between_slices=as_float(ds.get("SpacingBetweenSlices")),
        echo_number=as_int(ds.get("EchoNumbers")),
        echo_time=as_float(ds.get("EchoTime")),
        repetition_time=as_float(ds.get("RepetitionTime")),
        inversion_time=as_float(ds.get("InversionTime")),
        flip_angle=as_float(ds.get("FlipAngle")),
        scanning_sequence=as_code_strings(ds.get("ScanningSequence")),
        sequence_variant=as_code_strings(ds.get("SequenceVariant")),
        scan_options=as_code_strings(ds.get("ScanOptions")),
        sequence_name="",
        mr_acquisition_type=as_text(ds.get("MRAcquisitionType"), 8).upper(),
        echo_pulse_sequence=as_text(ds.get("EchoPulseSequence"), 16).upper(),
        inversion_recovery=as_text(ds.get("InversionRecovery")).upper() == "YES",
        b_value=None,
        direction=None,
        contrast_agent=_contrast_agent(ds),
        rescale_slope=1.0,
        rescale_intercept=0.0,
        temporal_index=None,
        acquisition_number=None,
        instance_number=None,
        transfer_syntax=ts,
        burned_in_annotation=as_text(ds.get("BurnedInAnnotation")).upper() == "YES",
        pixel_offset=None,
        patient=PatientKey.of(
            as_text(ds.get("PatientID"), 64),
            as_text(ds.get("IssuerOfPatientID"), 64),
            as_text(ds.get("PatientName"), 324),
            as_text(ds.get("PatientBirthDate"), 8),
        ),
    )
    po = as_code_strings(ds.get("PatientOrientation"))
    if len(po) == 2:
        base.extras["patient_orientation"] = po
    return base
