"""Typed records that cross stage boundaries in the imaging core."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1
# SeriesInfo.sop_class_uid of a series read from a NIfTI file (no DICOM SOP class).
NIFTI_SOP_CLASS = "nifti"


class SequenceClass(StrEnum):
    """Series classes: the vocabulary of ``labels.json`` plus UNKNOWN."""

    T1 = "T1"
    T1C = "T1C"
    T2 = "T2"
    FLAIR = "FLAIR"
    PD = "PD"
    DWI = "DWI"
    ADC = "ADC"
    TRACE = "TRACE"
    SWI = "SWI"
    T2STAR = "T2STAR"
    CT = "CT"
    LOCALIZER = "LOCALIZER"
    DERIVED_MAP = "DERIVED_MAP"
    PERFUSION = "PERFUSION"
    FMRI = "FMRI"
    FIELDMAP = "FIELDMAP"
    NON_IMAGE = "NON_IMAGE"
    MASK = "MASK"
    UNKNOWN = "UNKNOWN"


# Classes a model is shown by default; the rest (localisers, masks, maps, fMRI) are skipped.
CLINICAL_CLASSES: frozenset[SequenceClass] = frozenset(
    {
        SequenceClass.T1,
        SequenceClass.T1C,
        SequenceClass.T2,
        SequenceClass.FLAIR,
        SequenceClass.PD,
        SequenceClass.DWI,
        SequenceClass.ADC,
        SequenceClass.TRACE,
        SequenceClass.SWI,
        SequenceClass.T2STAR,
        SequenceClass.CT,
    }
)


class Plane(StrEnum):
    AXIAL = "axial"
    SAGITTAL = "sagittal"
    CORONAL = "coronal"


class FileError(BaseModel):
    """One input file that could not be used, and why."""

    path: str
    kind: str  # not_dicom | unreadable | non_image | too_large | invalid | decode | geometry
    message: str


_CONTROL = dict.fromkeys(range(32)) | {0x7F: None}


def _clean(value: object, limit: int) -> str:
    text = "" if value is None else str(value)
    return text.translate(_CONTROL).strip(" \0")[:limit]


def _norm_name(value: object) -> str:
    import unicodedata

    text = unicodedata.normalize("NFKC", _clean(value, 324).split("=")[0]).upper()
    parts = [" ".join(p.split()) for p in text.split("^")]
    while parts and not parts[-1]:
        parts.pop()
    return "^".join(parts)


class PatientKey(BaseModel):
    """Who an instance belongs to, as its header says: PatientID with its issuer, the name
    (alphabetic group, normalised) and the birth date. Part of every key a study, series,
    case or instance is found by (``dicom.identity.patients_in``): a UID is not an identity."""

    model_config = ConfigDict(frozen=True)

    patient_id: str = ""
    issuer: str = ""  # IssuerOfPatientID, "" when absent
    name: str = ""  # "FAMILY^GIVEN^MIDDLE" upper-cased, spaces and empty trailing parts dropped
    birth_date: str = ""  # YYYYMMDD as the header has it, "" when absent

    @classmethod
    def of(
        cls,
        patient_id: object = "",
        issuer: object = "",
        name: object = "",
        birth_date: object = "",
    ) -> PatientKey:
        """The key from header values (hostile: bounded, control characters and padding
        dropped; the name normalised so that case and spacing do not make two people)."""
        return cls(
            patient_id=_clean(patient_id, 64),
            issuer=_clean(issuer, 64),
            name=_norm_name(name),
            birth_date=_clean(birth_date, 8),
        )

    def same_patient(self, other: PatientKey) -> bool:
        """The same person by the rule: equal PatientID, and the issuer, name and birth date
        agree wherever both carry one (an absent value contradicts nothing)."""
        if self.patient_id != other.patient_id:
            return False
        return all(
            not a or not b or a == b
            for a, b in (
                (self.issuer, other.issuer),
                (self.name, other.name),
                (self.birth_date, other.birth_date),
            )
        )

    def describe(self) -> str:
        """For a reviewer (never for a model): ID, issuer, name, birth date."""
        parts = [f"ID {self.patient_id or '(none)'}"]
        if self.issuer:
            parts[0] += f" ({self.issuer})"
        if self.name:
            parts.append(self.name)
        if self.birth_date:
            parts.append(f"born {self.birth_date}")
        return ", ".join(parts)


class FrameRef(BaseModel):
    """Where one 2D image lives: a file (or archive member) and, for multi-frame objects, a frame."""

    model_config = ConfigDict(frozen=True)

    path: str
    frame: int | None = None
    position: tuple[float, float, float] | None = None
    rescale_slope: float = 1.0
    rescale_intercept: float = 0.0
    # Byte offset of native (uncompressed, little-endian) pixel data, so that the pixels
    # can be read later without parsing the header again.
    pixel_offset: int | None = None
    mosaic_slices: int | None = None
    # the instance the image is of, as its header names it (empty for NIfTI): what a report
    # on the image references
    sop_instance_uid: str = ""
    sop_class_uid: str = ""


class SeriesInfo(BaseModel):
    """One stack of a series: a set of 2D images sharing geometry and contrast.

    A DICOM series that mixes orientations, image sizes, echoes or b-values is split into
    several stacks; each is a SeriesInfo with the same ``series_uid`` and its own ``stack``.
    Repeated positions within a stack (time points, diffusion directions) are volumes.
    """

    model_config = ConfigDict(populate_by_name=True)

    schema_version: int = SCHEMA_VERSION
    path: str
    study_uid: str
    series_uid: str
    series_number: int | None = None
    description: str = ""
    modality: str = ""
    manufacturer: str = ""
    sop_class_uid: str = ""
    stack: int = 0
    stack_label: str = ""
    series_class: SequenceClass = Field(alias="class", default=SequenceClass.UNKNOWN)
    detail: str = ""
    reason: str = ""
    confidence: float = 0.0
    plane: Plane | None = None
    obliquity_deg: float | None = None
    shape: list[int] = Field(default_factory=list)  # columns, rows, slices[, volumes]
    spacing: list[float] = Field(default_factory=list)  # mm: column, row, slice
    affine: list[list[float]] | None = None  # voxel (i=col, j=row, k=slice) -> RAS mm
    slice_spacing_uniform: bool = True
    slice_gaps: list[str] = Field(default_factory=list)
    b_values: list[float] = Field(default_factory=list)
    n_directions: int = 0
    echo_numbers: list[int] = Field(default_factory=list)
    contrast_agent: str | None = None
    acquisition_3d: bool = False
    photometric: str = ""
    samples_per_pixel: int = 1
    bits_allocated: int = 16
    bits_stored: int = 16
    pixel_representation: int = 0
    burned_in_annotation: bool = False
    # every patient its files name (one, unless the series mixes patients: never evaluated)
    patients: list[PatientKey] = Field(default_factory=list)
    n_files: int = 0
    volume_labels: list[str] = Field(default_factory=list)
    volumes: list[list[FrameRef]] = Field(default_factory=list, repr=False)
    warnings: list[str] = Field(default_factory=list)
    errors: list[FileError] = Field(default_factory=list)

    @property
    def renderable(self) -> bool:
        return (
            self.series_class is not SequenceClass.NON_IMAGE
            and bool(self.volumes)
            and not any(e.kind == "geometry" for e in self.errors)
        )

    @property
    def key(self) -> str:
        """Stable identifier of this stack: the series UID, plus the stack index when split."""
        return self.series_uid if self.stack == 0 else f"{self.series_uid}#{self.stack}"


class IndexResult(BaseModel):
    """What indexing a path found: series stacks and the files it could not use."""

    series: list[SeriesInfo] = Field(default_factory=list)
    errors: list[FileError] = Field(default_factory=list)
    n_files: int = 0
    # The study's other series, known from their headers where the study is kept and not in
    # the indexed path (a gateway fetches from its PACS only the series a routing rule shows):
    # never rendered; a case's record counts and lists them as not shown, with why.
    not_fetched: list[SeriesInfo] = Field(default_factory=list)
    # With ``index_path(keep_headers=True)``: SeriesInstanceUID -> the whole header (a pydicom
    # Dataset, pixels excepted) of the series' first file. Not serialised; pickled with the
    # index (the gateway hands it to its evaluation worker).
    series_headers: dict[str, Any] = Field(default_factory=dict, exclude=True, repr=False)


class TilePlace(BaseModel):
    """Where one slice sits on a rendered PNG and where its pixels lie in the patient.

    Pixel coordinates are continuous, in the PNG's pixels (x to the right, y down, the PNG's
    top-left corner at (0, 0), a pixel's centre at n + 0.5). ``to_ras`` (3 rows of 3) maps
    (x, y, 1) to RAS mm; ``to_source`` (2 rows of 3), set when the tile is an acquired slice of
    one stored instance, maps (x, y, 1) to (column, row) on that instance (pixel centres at
    integers, as DICOM's image coordinates are offset by 0.5: see ``scoord_point``).
    """

    model_config = ConfigDict(frozen=True)

    x: int  # the tile's box on the PNG: left, top, side (px)
    y: int
    size: int
    slice_index: int  # display slice of the stack
    to_ras: list[list[float]] | None = None  # None: the stack has no patient geometry
    to_source: list[list[float]] | None = None  # None: resliced (or no instance to name)
    sop_instance_uid: str = ""  # the acquired slice's instance (with ``to_source``)
    sop_class_uid: str = ""
    frame: int | None = None  # 1-based frame of a multi-frame instance

    def contains(self, x: float, y: float) -> bool:
        return self.x <= x < self.x + self.size and self.y <= y < self.y + self.size

    def ras(self, x: float, y: float) -> tuple[float, float, float] | None:
        """The patient position (RAS mm) under PNG pixel (x, y); None without geometry."""
        if self.to_ras is None:
            return None
        m = self.to_ras
        return tuple(m[i][0] * x + m[i][1] * y + m[i][2] for i in range(3))  # type: ignore[return-value]

    def scoord_point(self, x: float, y: float) -> tuple[float, float] | None:
        """(column, row) on the source instance in DICOM image coordinates (the top-left
        corner of the top-left pixel at (0, 0), its centre at (0.5, 0.5)); None when resliced."""
        if self.to_source is None:
            return None
        m = self.to_source
        return (
            m[0][0] * x + m[0][1] * y + m[0][2] + 0.5,
            m[1][0] * x + m[1][1] * y + m[1][2] + 0.5,
        )


class RenderedImage(BaseModel):
    """One PNG shown to a model: exactly what was rendered, from what, and how."""

    file: str
    kind: str  # slice | montage
    series_uid: str
    stack: int
    series_class: str
    label: str
    slice_indices: list[int]
    slice_positions_mm: list[float]
    volume: str
    window: str  # e.g. "CT brain 40/80" or "MR p1-p99.5 inside head"
    window_center: float
    window_width: float
    orientation: str  # e.g. "axial, radiological (patient right on image left)"
    width: int
    height: int
    sha256: str
    # each slice's place on the PNG and in the patient (what a point on the image refers to)
    tiles: list[TilePlace] = Field(default_factory=list)


class RenderManifest(BaseModel):
    schema_version: int = SCHEMA_VERSION
    source: str
    images: list[RenderedImage] = Field(default_factory=list)
    errors: list[FileError] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
