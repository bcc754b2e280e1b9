"""NIfTI input: one ``.nii`` / ``.nii.gz`` file (plus an optional BIDS JSON sidecar) -> SeriesInfo.

A NIfTI file becomes the same record a DICOM stack does, so that everything downstream
(rendering, prompts, evaluation) is unaware of the source format:

* geometry comes from the NIfTI header only (``img.affine`` already maps voxel (i, j, k) to RAS
  mm; no pixel data is read while indexing);
* the contrast class comes from the shared header classifier (:func:`dicom.classify.classify`)
  fed with a :class:`~dicom.headers.FrameHeader` built from the BIDS sidecar (BIDS timings are in
  seconds and converted to ms) and, for diffusion, from a sibling ``.bval`` file;
* without a sidecar only the file name is evidence, and the confidence is capped at 0.5.

Slice ``k`` of volume ``v`` is addressed by ``FrameRef(frame=v * n_slices + k)``;
:func:`load_nifti_volume` reads one 3D volume at a time, never a whole 4D file.

Sidecars and ``.bval`` / ``.bvec`` files are untrusted: sizes and string lengths are capped,
values of the wrong type are ignored with a warning in ``SeriesInfo.warnings``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
from nibabel.affines import voxel_sizes

from dicom.classify import SeriesContext, classify
from dicom.errors import DecodeError
from dicom.geometry import plane_of
from dicom.headers import DEFAULT_MEMORY_CAP, FrameHeader, contrast_agent_or_none
from dicom.records import NIFTI_SOP_CLASS, FileError, FrameRef, IndexResult, Plane, SeriesInfo
from dicom.uids import valid_uid

# Marks a SeriesInfo read from NIfTI: dicom.pixels dispatches on it to load_nifti_volume.
NIFTI_SUFFIXES = (".nii.gz", ".nii")

_STR_CAP = 256
_LIST_CAP = 64  # items kept from a list-valued sidecar field (ImageType)
_MAX_SIDECAR_BYTES = 4 << 20
_MAX_BVAL_BYTES = 1 << 20
_MAX_WARNINGS = 30
# One FrameRef per (slice, volume) is kept in the index: refuse headers that would need millions.
_MAX_FRAMES = 500_000
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]+")
# Above these values (in seconds) a BIDS timing is implausible: it was written in ms.
_SECONDS_LIMIT = {"RepetitionTime": 100.0, "EchoTime": 5.0, "InversionTime": 30.0}


class _NiftiRejected(Exception):
    """The file cannot be indexed; ``kind`` is the FileError kind."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class _Layout:
    """Voxel layout of a NIfTI file, from its header only."""

    raw_shape: tuple[int, ...]  # as stored (1 to 7 dims)
    cols: int
    rows: int
    slices: int
    extra: tuple[int, ...]  # dims beyond the third, flattened into volumes (C order)
    rgb: bool
    bits: int  # bits per stored sample
    signed: bool

    @property
    def n_volumes(self) -> int:
        return math.prod(self.extra) if self.extra else 1

    @property
    def shape(self) -> list[int]:
        """columns, rows, slices[, volumes]: trailing singleton dims beyond the third dropped."""
        base = [self.cols, self.rows, self.slices]
        return [*base, self.n_volumes] if self.n_volumes > 1 else base


# --------------------------------------------------------------------------------------------
# untrusted sidecar values


@dataclass
class _Sidecar:
    """A BIDS sidecar whose values are read defensively; problems go to ``warnings``."""

    data: dict[str, Any]
    name: str
    warnings: list[str] = field(default_factory=list)

    def _warn(self, key: str, expected: str, value: Any) -> None:
        self.warnings.append(
            f"sidecar {self.name}: {key} should be {expected}, got {type(value).__name__} "
            f"{_clean(repr(value), 40)}; ignored"
        )

    def text(self, key: str, cap: int = _STR_CAP) -> str:
        value = self.data.get(key)
        if value is None:
            return ""
        if not isinstance(value, str):
            self._warn(key, "a string", value)
            return ""
        return _clean(value, cap)

    def number(self, key: str) -> float | None:
        value = self.data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            self._warn(key, "a number", value)
            return None
        out = float(value)
        if not math.isfinite(out) or out < 0:
            self._warn(key, "a finite non-negative number", value)
            return None
        return out

    def integer(self, key: str) -> int | None:
        value = self.number(key)
        if value is None:
            return None
        if value != int(value) or value >= 2**31:
            self._warn(key, "an integer", self.data.get(key))
            return None
        return int(value)

    def millis(self, key: str) -> float | None:
        """A BIDS timing in seconds, returned in ms (a value plainly given in ms is kept)."""
        seconds = self.number(key)
        if seconds is None:
            return None
        if seconds > _SECONDS_LIMIT[key]:
            self.warnings.append(
                f"sidecar {self.name}: {key} {seconds:g} is not plausible in seconds (BIDS); "
                "read as milliseconds"
            )
            return round(seconds, 6)
        return round(seconds * 1000.0, 6)

    def floats(self, key: str, n: int) -> tuple[float, ...] | None:
        value = self.data.get(key)
        if value is None:
            return None
        if (
            not isinstance(value, list)
            or len(value) != n
            or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
            or not all(math.isfinite(float(v)) for v in value)
        ):
            self._warn(key, f"a list of {n} numbers", value)
            return None
        return tuple(float(v) for v in value)

    def codes(self, key: str, split_underscore: bool) -> tuple[str, ...]:
        """A DICOM code string list: JSON list, or a string joined with '\\' (or '_')."""
        value = self.data.get(key)
        if value is None:
            return ()
        if isinstance(value, str):
            parts = value.split("\\")
        elif isinstance(value, list):
            parts = []
            for item in value[:_LIST_CAP]:
                if isinstance(item, str):
                    parts.append(item)
                else:
                    self._warn(f"{key} item", "a string", item)
        else:
            self._warn(key, "a string or a list of strings", value)
            return ()
        if split_underscore:
            parts = [p for part in parts for p in part.split("_")]
        out = [_clean(p, 64).strip().upper() for p in parts[:_LIST_CAP]]
        return tuple(p for p in out if p)

    def uid(self, key: str) -> str:
        value = self.text(key, _STR_CAP)
        if value and not valid_uid(value):
            self.warnings.append(f"sidecar {self.name}: {key} is not a valid DICOM UID; ignored")
            return ""
        return value


def _clean(text: str, cap: int) -> str:
    """Control characters folded to spaces, length capped."""
    return _CONTROL_RE.sub(" ", text[: cap * 2])[:cap]


def _stem(path: Path) -> str:
    name = path.name
    for suffix in NIFTI_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def _read_small(path: Path, cap: int) -> bytes | None:
    """The bytes of a regular file of at most ``cap`` bytes; None if absent or too big."""
    if not path.is_file():
        return None
    with path.open("rb") as fp:
        data = fp.read(cap + 1)
    return data if len(data) <= cap else None


def _load_sidecar(nifti: Path, warnings: list[str]) -> _Sidecar | None:
    path = nifti.with_name(_stem(nifti) + ".json")
    if not path.exists():
        return None
    try:
        raw = _read_small(path, _MAX_SIDECAR_BYTES)
        if raw is None:
            warnings.append(
                f"sidecar {path.name} ignored: not a regular file or over "
                f"{_MAX_SIDECAR_BYTES >> 20} MiB"
            )
            return None
        data = json.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        warnings.append(f"sidecar {path.name} ignored: not valid JSON ({_clean(str(exc), 120)})")
        return None
    if not isinstance(data, dict):
        warnings.append(f"sidecar {path.name} ignored: top level is not a JSON object")
        return None
    return _Sidecar(data, path.name)


def _numbers_file(path: Path, warnings: list[str]) -> list[list[float]] | None:
    """Rows of numbers of a .bval / .bvec file; None (with a warning) if unusable."""
    try:
        raw = _read_small(path, _MAX_BVAL_BYTES)
        if raw is None:
            warnings.append(f"{path.name} ignored: not a regular file or over 1 MiB")
            return None
        rows = [
            [float(v) for v in line.split()]
            for line in raw.decode("ascii").splitlines()
            if line.strip()
        ]
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        warnings.append(f"{path.name} ignored: not a list of numbers ({_clean(str(exc), 80)})")
        return None
    if not all(math.isfinite(v) for row in rows for v in row):
        warnings.append(f"{path.name} ignored: non-finite values")
        return None
    return rows


def _diffusion(
    nifti: Path, n_volumes: int, warnings: list[str]
) -> tuple[list[float], list[tuple[float, float, float] | None], str]:
    """b-values (one per volume when consistent), gradient directions, and the .bval name."""
    bval_path = nifti.with_name(_stem(nifti) + ".bval")
    if not bval_path.exists():
        return [], [], ""
    rows = _numbers_file(bval_path, warnings)
    if rows is None:
        return [], [], ""
    bvals = [v for row in rows for v in row]
    if not bvals or any(v < 0 for v in bvals):
        warnings.append(f"{bval_path.name} ignored: empty or negative b-values")
        return [], [], ""
    if len(bvals) != n_volumes:
        warnings.append(
            f"{bval_path.name} lists {len(bvals)} b-values for {n_volumes} volume(s): "
            "b-values used for the class only"
        )
        return bvals, [], bval_path.name
    directions: list[tuple[float, float, float] | None] = []
    bvec_path = nifti.with_name(_stem(nifti) + ".bvec")
    if bvec_path.exists():
        vec = _numbers_file(bvec_path, warnings)
        if vec is not None and len(vec) == 3 and all(len(r) == n_volumes for r in vec):
            directions = [(vec[0][v], vec[1][v], vec[2][v]) for v in range(n_volumes)]
        elif vec is not None:
            warnings.append(f"{bvec_path.name} ignored: expected 3 rows of {n_volumes} values")
    return bvals, directions, bval_path.name


# --------------------------------------------------------------------------------------------
# header


def _open(path: Path) -> nib.Nifti1Image:
    """Open a NIfTI file, header only (no pixel data is read; no memory map is kept)."""
    if not path.is_file():
        raise _NiftiRejected("unreadable", f"{path}: not a regular file")
    try:
        img = nib.load(str(path), mmap=False)
    except Exception as exc:
        raise _NiftiRejected(
            "unreadable", f"{path}: not a readable NIfTI file ({_clean(str(exc), 200)})"
        ) from exc
    if not isinstance(img, nib.Nifti1Image):  # Nifti2Image is a subclass
        raise _NiftiRejected("unreadable", f"{path}: {type(img).__name__} is not NIfTI-1/2")
    return img


def _layout(path: Path, img: nib.Nifti1Image, memory_cap: int) -> _Layout:
    """Shape and data type from the header, with the memory cap checked before any read."""
    raw = tuple(int(d) for d in img.shape)
    if not 1 <= len(raw) <= 7 or any(d <= 0 for d in raw):
        raise _NiftiRejected("invalid", f"{path}: invalid image dimensions {raw}")
    dtype = np.dtype(img.get_data_dtype())
    rgb = dtype.names is not None
    if rgb and not {"R", "G", "B"} <= set(dtype.names or ()):
        raise _NiftiRejected("invalid", f"{path}: unsupported structured data type {dtype}")
    if dtype.kind == "c":
        raise _NiftiRejected("invalid", f"{path}: complex-valued data ({dtype}) is not supported")
    padded = raw + (1,) * (3 - len(raw))
    extra = tuple(padded[3:])
    while extra and extra[-1] == 1:
        extra = extra[:-1]
    bits = 8 if rgb else dtype.itemsize * 8
    layout = _Layout(raw, padded[0], padded[1], padded[2], extra, rgb, bits, dtype.kind in "if")
    per_volume = layout.cols * layout.rows * layout.slices * (3 if rgb else 1) * 4
    if per_volume > memory_cap:
        raise _NiftiRejected(
            "too_large",
            f"{path}: a {layout.cols}x{layout.rows}x{layout.slices} volume would need "
            f"{per_volume / 2**30:.1f} GiB as float32, over the {memory_cap / 2**30:.1f} GiB "
            "memory cap; refused before reading any pixel data",
        )
    n_frames = layout.slices * layout.n_volumes
    if n_frames > _MAX_FRAMES:
        raise _NiftiRejected(
            "too_large",
            f"{path}: {layout.slices} slices x {layout.n_volumes} volumes = {n_frames} images, "
            f"over the {_MAX_FRAMES} images one series may hold",
        )
    if not path.name.lower().endswith(".gz"):
        needed = int(float(img.header["vox_offset"])) + math.prod(raw) * dtype.itemsize
        size = path.stat().st_size
        if size < needed:
            raise _NiftiRejected(
                "unreadable",
                f"{path}: truncated: the header declares {needed} bytes, the file holds {size}",
            )
    return layout


def _affine(path: Path, img: nib.Nifti1Image, warnings: list[str]) -> np.ndarray:
    affine = np.asarray(img.affine, dtype=float)
    if affine.shape != (4, 4) or not np.all(np.isfinite(affine)):
        raise _NiftiRejected("invalid", f"{path}: the header's affine is not finite")
    if abs(np.linalg.det(affine[:3, :3])) < 1e-12:
        raise _NiftiRejected("invalid", f"{path}: the header's affine is singular")
    hdr = img.header
    if int(hdr["sform_code"]) == 0 and int(hdr["qform_code"]) == 0:
        warnings.append(
            "NIfTI header has neither sform nor qform: patient orientation is unknown "
            "(voxel sizes only); plane and left/right may be wrong"
        )
    return affine


# --------------------------------------------------------------------------------------------
# index


def index_nifti(path: Path, memory_cap: int = DEFAULT_MEMORY_CAP) -> IndexResult:
    """Index one NIfTI file (``.nii`` or ``.nii.gz``) and its BIDS sidecar as one SeriesInfo.

    Only the header, the sidecar (``<name>.json``) and a sibling ``<name>.bval`` / ``.bvec`` are
    read. A file nibabel cannot read gives a FileError of kind ``unreadable``; a volume that
    would need more than ``memory_cap`` bytes as float32 gives ``too_large``; an inconsistent
    header gives ``invalid``. Never raises for a bad file.
    """
    path = Path(path)
    try:
        series = _series(path, memory_cap)
    except _NiftiRejected as exc:
        error = FileError(path=str(path), kind=exc.kind, message=str(exc))
        return IndexResult(errors=[error], n_files=1)
    except Exception as exc:  # a bug or oddity in one file must not stop the caller
        error = FileError(path=str(path), kind="unreadable", message=f"{path}: {exc!r}")
        return IndexResult(errors=[error], n_files=1)
    return IndexResult(series=[series], n_files=1)


def _series(path: Path, memory_cap: int) -> SeriesInfo:
    img = _open(path)
    layout = _layout(path, img, memory_cap)
    warnings: list[str] = []
    affine = _affine(path, img, warnings)
    spacing = [round(float(v), 6) for v in voxel_sizes(affine)]
    slice_dir = affine[:3, 2]
    plane, oblique = plane_of(slice_dir)
    # LPS positions of the origin (voxel 0, 0) of every slice.
    ks = np.arange(layout.slices, dtype=float)
    ras = affine[:3, 3][None, :] + ks[:, None] * slice_dir[None, :]
    lps = ras * np.array([-1.0, -1.0, 1.0])
    positions = [(float(p[0]), float(p[1]), float(p[2])) for p in np.round(lps, 6)]

    sidecar = _load_sidecar(path, warnings)
    stem = _clean(_stem(path), _STR_CAP)
    if sidecar is not None:
        _check_acquisition_plane(sidecar, plane, warnings)
    bvals, directions, bval_name = _diffusion(path, layout.n_volumes, warnings)
    header = _frame_header(path, layout, affine, spacing, positions[0], sidecar, stem)
    if not bvals and header.b_value is not None:
        bvals = [header.b_value]
    unique_b = sorted({round(b) for b in bvals})
    if len(unique_b) == 1 and header.b_value is None:
        header.b_value = float(unique_b[0])
    ctx = SeriesContext(b_values=unique_b, n_stacks=1, n_files=1, n_volumes=layout.n_volumes)
    result = classify([header], ctx, plane)
    series_uid = (sidecar.uid("SeriesInstanceUID") if sidecar else "") or (
        "nifti:" + hashlib.sha1(str(path.absolute()).encode("utf-8")).hexdigest()[:16]
    )
    sources = " and ".join(n for n in (sidecar.name if sidecar else "", bval_name) if n)
    if sidecar is not None:
        reason = f"BIDS sidecar {sources}: {result.reason}"
        confidence = result.confidence
        warnings.extend(sidecar.warnings)
    else:
        extra = f" and {bval_name}" if bval_name else ""
        reason = f"no BIDS sidecar: from the file name {stem!r}{extra}; {result.reason}"
        confidence = min(result.confidence, 0.5)

    n_slices = layout.slices
    volumes = [
        [
            FrameRef(path=str(path), frame=v * n_slices + k, position=positions[k])
            for k in range(n_slices)
        ]
        for v in range(layout.n_volumes)
    ]
    labels: list[str] = []
    if layout.n_volumes > 1:
        for v in range(layout.n_volumes):
            if len(bvals) == layout.n_volumes:
                label = f"b={bvals[v]:g}"
                d = directions[v] if directions else None
                if d is not None and bvals[v] > 0 and any(d):
                    label += " direction (" + ", ".join(f"{x:.3f}" for x in d) + ")"
                labels.append(label)
            else:
                labels.append(f"volume {v + 1}")
    n_directions = len(
        {
            tuple(round(x, 3) for x in d)
            for d, b in zip(directions, bvals, strict=False)
            if d is not None and b > 0 and any(d)
        }
    )
    if len(warnings) > _MAX_WARNINGS:
        warnings = [*warnings[:_MAX_WARNINGS], f"{len(warnings) - _MAX_WARNINGS} more warnings"]
    return SeriesInfo(
        path=str(path),
        study_uid=header.study_uid,
        series_uid=series_uid,
        series_number=header.series_number,
        description=header.description,
        modality=header.modality,
        manufacturer=header.manufacturer,
        sop_class_uid=NIFTI_SOP_CLASS,
        series_class=result.series_class,
        detail=result.detail,
        reason=reason,
        confidence=confidence,
        plane=plane,
        obliquity_deg=round(oblique, 3),
        shape=layout.shape,
        spacing=spacing,
        affine=[[round(float(v), 6) for v in row] for row in affine],
        b_values=sorted({float(round(b)) for b in bvals}),
        n_directions=n_directions,
        echo_numbers=[header.echo_number] if header.echo_number is not None else [],
        contrast_agent=header.contrast_agent,
        acquisition_3d=header.mr_acquisition_type == "3D",
        photometric="RGB" if layout.rgb else "MONOCHROME2",
        samples_per_pixel=3 if layout.rgb else 1,
        n_files=1,
        volume_labels=labels,
        volumes=volumes,
        warnings=warnings,
    )


def _check_acquisition_plane(sidecar: _Sidecar, plane: Plane, warnings: list[str]) -> None:
    """Note when the converter reoriented the slices (dcm2niix does so for 3D acquisitions).

    ``plane`` always describes the slices as stored (the k axis of the affine), because the
    volumes, slice positions and rendering follow that axis; the acquisition plane from the
    sidecar's ImageOrientationPatientDICOM is only reported.
    """
    iop = sidecar.floats("ImageOrientationPatientDICOM", 6)
    if iop is None:
        return
    normal = np.cross(np.array(iop[:3]), np.array(iop[3:]))
    if float(np.linalg.norm(normal)) < 1e-6:
        return
    acquired, _ = plane_of(normal)
    if acquired is not plane:
        warnings.append(
            f"acquired as {acquired.value} slices (sidecar ImageOrientationPatientDICOM) but the "
            f"NIfTI stores {plane.value} slices: the converter reoriented the volume; plane, "
            "slice positions and rendering follow the stored slices"
        )


def _unit(v: np.ndarray) -> tuple[float, float, float]:
    n = float(np.linalg.norm(v)) or 1.0
    return (float(v[0] / n), float(v[1] / n), float(v[2] / n))


def _frame_header(
    path: Path,
    layout: _Layout,
    affine: np.ndarray,
    spacing: list[float],
    first_position: tuple[float, float, float],
    sidecar: _Sidecar | None,
    stem: str,
) -> FrameHeader:
    """What the classifier needs, from the sidecar (or the file name alone without one)."""
    flip = np.array([-1.0, -1.0, 1.0])
    orientation = _unit(affine[:3, 0] * flip) + _unit(affine[:3, 1] * flip)
    s = sidecar or _Sidecar({}, "")
    agent = s.text("ContrastBolusAgent") or s.text("ContrastBolusIngredient")
    return FrameHeader(
        path=str(path),
        frame=None,
        sop_instance_uid="",
        sop_class_uid=NIFTI_SOP_CLASS,
        study_uid=s.uid("StudyInstanceUID"),
        series_uid="",
        series_number=s.integer("SeriesNumber"),
        description=s.text("SeriesDescription") or stem,
        protocol=s.text("ProtocolName"),
        modality=(s.text("Modality", 16).strip().upper() or "MR"),
        manufacturer=s.text("Manufacturer", 64),
        image_type=s.codes("ImageType", split_underscore=False),
        frame_type=(),
        rows=layout.rows,
        cols=layout.cols,
        samples_per_pixel=3 if layout.rgb else 1,
        photometric="RGB" if layout.rgb else "MONOCHROME2",
        bits_allocated=layout.bits,
        bits_stored=layout.bits,
        pixel_representation=1 if layout.signed else 0,
        number_of_frames=layout.slices,
        pixel_spacing=(spacing[1], spacing[0]),
        orientation=orientation,
        position=first_position,
        slice_thickness=s.number("SliceThickness") or spacing[2],
        spacing_between_slices=s.number("SpacingBetweenSlices"),
        echo_number=s.integer("EchoNumber"),
        echo_time=s.millis("EchoTime"),
        repetition_time=s.millis("RepetitionTime"),
        inversion_time=s.millis("InversionTime"),
        flip_angle=s.number("FlipAngle"),
        scanning_sequence=s.codes("ScanningSequence", split_underscore=True),
        sequence_variant=s.codes("SequenceVariant", split_underscore=True),
        scan_options=s.codes("ScanOptions", split_underscore=False),
        sequence_name=s.text("SequenceName", 64) or s.text("PulseSequenceName", 64),
        mr_acquisition_type=s.text("MRAcquisitionType", 8).strip().upper(),
        echo_pulse_sequence="",
        inversion_recovery=False,
        b_value=s.number("DiffusionBValue"),
        direction=None,
        contrast_agent=contrast_agent_or_none(agent),
        rescale_slope=1.0,
        rescale_intercept=0.0,
        temporal_index=None,
        acquisition_number=s.integer("AcquisitionNumber"),
        instance_number=None,
        transfer_syntax="",
        burned_in_annotation=False,
        pixel_offset=None,
    )


# --------------------------------------------------------------------------------------------
# pixels


def load_nifti_volume(
    series: SeriesInfo, volume: int = 0, memory_cap: int = DEFAULT_MEMORY_CAP
) -> np.ndarray:
    """Read 3D volume ``volume`` of the NIfTI file behind ``series`` as float32.

    The result has shape (columns, rows, slices) in the file's voxel order (the order of
    ``series.affine``), with scl_slope / scl_inter applied; RGB files give (columns, rows,
    slices, 3). Only the requested volume is read, never the whole of a 4D file. Raises
    DecodeError with the reason on any failure.
    """
    path = Path(series.path)
    try:
        img = _open(path)
        layout = _layout(path, img, memory_cap)
    except _NiftiRejected as exc:
        raise DecodeError(f"cannot load NIfTI volume: {exc}") from exc
    if series.shape and layout.shape != series.shape:
        raise DecodeError(
            f"{path}: shape is now {layout.shape}, the index recorded {series.shape}: "
            "the file changed since indexing; index it again"
        )
    if not 0 <= volume < layout.n_volumes:
        raise DecodeError(f"{path}: volume {volume} out of range 0..{layout.n_volumes - 1}")
    try:
        if len(layout.raw_shape) <= 3:
            data = np.asarray(img.dataobj).reshape(layout.cols, layout.rows, layout.slices)
        else:
            stored = layout.raw_shape[3:]
            tail = tuple(int(i) for i in np.unravel_index(volume, stored))
            data = np.asarray(img.dataobj[(slice(None), slice(None), slice(None), *tail)])
        if layout.rgb:
            out = np.stack([data["R"], data["G"], data["B"]], axis=-1).astype(np.float32)
        else:
            out = np.asarray(data, dtype=np.float32)
    except DecodeError:
        raise
    except Exception as exc:
        raise DecodeError(
            f"{path}: cannot read volume {volume}: {_clean(str(exc), 200) or type(exc).__name__}"
        ) from exc
    expected = (layout.cols, layout.rows, layout.slices) + ((3,) if layout.rgb else ())
    if out.shape != expected:
        raise DecodeError(f"{path}: read an array of shape {out.shape}, expected {expected}")
    return out


__all__ = ["NIFTI_SOP_CLASS", "index_nifti", "load_nifti_volume"]
