"""DICOM headers of the phantom series, and writing them as Part 10 files.

The headers tell the truth about the simulated acquisition: ScanningSequence, SequenceVariant,
TR/TE/TI, flip angle, DiffusionBValue, ContrastBolusAgent, ImageType, the slice geometry of
the grid and the CT rescale. Patient identity is the case's fake (planted) PHI.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydicom.dataset import Dataset

from evaluation.datasets.phantoms.acquire import CT_OFFSET, Acquired
from evaluation.datasets.phantoms.dicomio import SeriesWriter, uid
from evaluation.datasets.phantoms.grids import Grid

MR_STORAGE = "1.2.840.10008.5.1.4.1.1.4"
CT_STORAGE = "1.2.840.10008.5.1.4.1.1.2"
GENERATOR = "neurosandbox-phantoms"
GENERATOR_VERSION = "4"  # bump when the same seed gives other files
CONTRAST_AGENT = "gadoterate meglumine"


@dataclass(frozen=True)
class SeriesDef:
    role: str
    number: int
    description: str
    seq_class: str  # the SequenceClass the generator intends (what the classifier must find)
    modality: str
    image_type: tuple[str, ...]
    scanning_sequence: tuple[str, ...] = ()
    sequence_variant: tuple[str, ...] = ()
    scan_options: tuple[str, ...] = ()
    acquisition: str = "2D"
    sequence_name: str = ""
    echo_train: int = 1


SERIES: dict[str, SeriesDef] = {
    s.role: s
    for s in (
        SeriesDef(
            "t1_3d",
            2,
            "t1_mprage_sag_p2_iso",
            "T1",
            "MR",
            ("ORIGINAL", "PRIMARY", "M", "ND", "NORM"),
            ("GR", "IR"),
            ("SK", "SP", "MP"),
            ("IR",),
            "3D",
            "*tfl3d1_16ns",
        ),
        SeriesDef(
            "t2",
            3,
            "t2_tse_tra_5mm",
            "T2",
            "MR",
            ("ORIGINAL", "PRIMARY", "M", "ND", "NORM"),
            ("SE",),
            ("SK", "SP", "OSP"),
            ("SAT1",),
            "2D",
            "*tse2d1_15",
            15,
        ),
        SeriesDef(
            "flair",
            4,
            "t2_tirm_tra_dark-fluid_5mm",
            "FLAIR",
            "MR",
            ("ORIGINAL", "PRIMARY", "M", "ND", "NORM"),
            ("SE", "IR"),
            ("SK", "SP", "MP"),
            ("IR",),
            "2D",
            "*tir2d1_16",
            16,
        ),
        SeriesDef(
            "dwi",
            5,
            "ep2d_diff_b0_1000_tra",
            "DWI",
            "MR",
            ("ORIGINAL", "PRIMARY", "DIFFUSION", "NONE"),
            ("EP",),
            ("SK", "SP"),
            ("PFP", "FS"),
            "2D",
            "*ep_b0",
            1,
        ),
        SeriesDef(
            "adc",
            6,
            "ep2d_diff_b0_1000_tra_ADC",
            "ADC",
            "MR",
            ("DERIVED", "PRIMARY", "DIFFUSION", "ADC"),
            ("EP",),
            ("SK", "SP"),
            ("PFP", "FS"),
            "2D",
            "*ep_b0_1000",
            1,
        ),
        SeriesDef(
            "swi",
            7,
            "swi_tra_5mm",
            "SWI",
            "MR",
            ("DERIVED", "PRIMARY", "SWI", "NORM", "DIS2D"),
            ("GR",),
            ("SP", "OSP"),
            (),
            "3D",
            "*swi3d1r",
        ),
        SeriesDef(
            "t1",
            8,
            "t1_se_tra_5mm",
            "T1",
            "MR",
            ("ORIGINAL", "PRIMARY", "M", "ND", "NORM"),
            ("SE",),
            ("SK", "SP"),
            ("SAT1",),
            "2D",
            "*se2d1",
        ),
        SeriesDef(
            "t1c",
            9,
            "t1_se_tra_5mm_post",
            "T1C",
            "MR",
            ("ORIGINAL", "PRIMARY", "M", "ND", "NORM"),
            ("SE",),
            ("SK", "SP"),
            ("SAT1",),
            "2D",
            "*se2d1",
        ),
        SeriesDef("ct", 2, "Head 5.0 non-contrast", "CT", "CT", ("ORIGINAL", "PRIMARY", "AXIAL")),
    )
}


@dataclass(frozen=True)
class StudyHeader:
    """Patient and study attributes shared by every file of one study."""

    seed: int
    case_id: str
    modality: str  # "MR" or "CT": one study per modality
    charset: str
    patient_name: str
    patient_id: str
    other_patient_id: str
    birth_date: dt.date
    sex: str
    age_years: int
    address: str
    phone: str
    referring: str
    institution: str
    accession: str
    when: dt.datetime
    field_t: float = 3.0

    @property
    def study_uid(self) -> str:
        return uid(self.seed, self.case_id, self.modality, "study")

    @property
    def frame_uid(self) -> str:
        return uid(self.seed, self.case_id, self.modality, "frame-of-reference")

    def series_uid(self, role: str) -> str:
        return uid(self.seed, self.case_id, self.modality, role, "series")


def _ds(h: StudyHeader) -> Dataset:
    ds = Dataset()
    ds.SpecificCharacterSet = h.charset
    ds.InstanceCreationDate = h.when.strftime("%Y%m%d")
    ds.StudyDate = h.when.strftime("%Y%m%d")
    ds.StudyTime = h.when.strftime("%H%M%S")
    ds.AccessionNumber = h.accession
    ds.Modality = h.modality
    ds.Manufacturer = "NeuroSandbox"
    ds.InstitutionName = h.institution
    ds.ReferringPhysicianName = h.referring
    ds.StudyDescription = "MRI HEAD" if h.modality == "MR" else "CT HEAD"
    ds.ManufacturerModelName = (
        "synthetic phantom MR" if h.modality == "MR" else "synthetic phantom CT"
    )
    ds.PatientName = h.patient_name
    ds.PatientID = h.patient_id
    ds.PatientBirthDate = h.birth_date.strftime("%Y%m%d")
    ds.PatientSex = h.sex
    ds.OtherPatientIDs = h.other_patient_id
    ds.PatientAge = f"{h.age_years:03d}Y"
    ds.PatientAddress = h.address
    ds.PatientTelephoneNumbers = h.phone
    ds.BodyPartExamined = "HEAD"
    ds.SoftwareVersions = f"{GENERATOR} {GENERATOR_VERSION}"
    ds.PatientPosition = "HFS"
    ds.StudyInstanceUID = h.study_uid
    ds.StudyID = "1"
    ds.FrameOfReferenceUID = h.frame_uid
    ds.PositionReferenceIndicator = ""
    ds.BurnedInAnnotation = "NO"
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated = 16
    ds.BitsStored = 12
    ds.HighBit = 11
    ds.PixelRepresentation = 0
    return ds


def _lps(v: np.ndarray) -> list[float]:
    return [round(float(-v[0]), 4), round(float(-v[1]), 4), round(float(v[2]), 4)]


def _geometry(grid: Grid) -> tuple[list[float], list[float], np.ndarray, np.ndarray]:
    """ImageOrientationPatient, PixelSpacing, RAS of voxel (0,0,k) per k, slice normal (LPS)."""
    a = grid.affine
    row = a[:3, 0] / np.linalg.norm(a[:3, 0])  # direction of increasing column index i
    col = a[:3, 1] / np.linalg.norm(a[:3, 1])
    iop = [*_lps(row), *_lps(col)]
    spacing = [abs(grid.steps[1]), abs(grid.steps[0])]  # row spacing, column spacing
    origins = np.array([a[:3, 3] + k * a[:3, 2] for k in range(grid.shape[2])])
    normal = np.cross(np.array(iop[:3]), np.array(iop[3:]))
    return iop, spacing, origins, normal


def series_header(h: StudyHeader, acq: Acquired, series_time: dt.datetime) -> Dataset:
    sd = SERIES[acq.role]
    ds = _ds(h)
    ds.SOPClassUID = MR_STORAGE if sd.modality == "MR" else CT_STORAGE
    ds.ImageType = list(sd.image_type)
    ds.SeriesDate = series_time.strftime("%Y%m%d")
    ds.SeriesTime = series_time.strftime("%H%M%S")
    ds.AcquisitionDate = ds.SeriesDate
    ds.AcquisitionTime = ds.SeriesTime
    ds.ContentDate = ds.SeriesDate
    ds.ContentTime = ds.SeriesTime
    ds.SeriesDescription = sd.description
    ds.ProtocolName = sd.description
    ds.SeriesInstanceUID = h.series_uid(acq.role)
    ds.SeriesNumber = sd.number
    ds.AcquisitionNumber = 1
    iop, spacing, _, _ = _geometry(acq.grid)
    ds.ImageOrientationPatient = iop
    ds.PixelSpacing = [round(v, 4) for v in spacing]
    ds.SliceThickness = round(acq.grid.thickness, 3)
    ds.Rows = acq.grid.shape[1]
    ds.Columns = acq.grid.shape[0]
    ds.WindowCenter = acq.window[0]
    ds.WindowWidth = acq.window[1]
    p = acq.protocol
    if sd.modality == "CT":
        ds.KVP = 120
        ds.XRayTubeCurrent = 280
        ds.ExposureTime = 1000
        ds.ConvolutionKernel = "H31s"
        ds.GantryDetectorTilt = 0
        ds.RescaleIntercept = -CT_OFFSET
        ds.RescaleSlope = 1
        ds.RescaleType = "HU"
        ds.WindowCenter = [40, 600]
        ds.WindowWidth = [80, 2800]
        ds.SpacingBetweenSlices = abs(acq.grid.steps[2])
        return ds
    ds.ScanningSequence = list(sd.scanning_sequence)
    ds.SequenceVariant = list(sd.sequence_variant)
    ds.ScanOptions = list(sd.scan_options) if sd.scan_options else ""
    ds.MRAcquisitionType = sd.acquisition
    ds.SpacingBetweenSlices = abs(acq.grid.steps[2])
    ds.RepetitionTime = p.tr
    ds.EchoTime = p.te
    if p.ti is not None:
        ds.InversionTime = p.ti
    ds.EchoTrainLength = sd.echo_train
    ds.FlipAngle = p.flip
    ds.MagneticFieldStrength = acq.field_t
    ds.ImagingFrequency = round(42.577478 * acq.field_t, 6)
    ds.ImagedNucleus = "1H"
    ds.EchoNumbers = 1
    ds.NumberOfAverages = 1
    ds.PixelBandwidth = 130 if sd.role == "t1_3d" else 200
    if acq.role not in ("dwi",):
        ds.SequenceName = sd.sequence_name
    if p.contrast:
        ds.ContrastBolusAgent = CONTRAST_AGENT
        ds.ContrastBolusRoute = "IV"
        ds.ContrastBolusVolume = 15
        ds.ContrastBolusIngredient = "GADOLINIUM"
    return ds


def series_instances(
    h: StudyHeader, acq: Acquired, series_time: dt.datetime
) -> tuple[Dataset, list[tuple[Dataset, bytes]]]:
    """The fixed header and, per image, its varying elements and pixel bytes."""
    fixed = series_header(h, acq, series_time)
    _, _, origins, normal = _geometry(acq.grid)
    out = []
    n = 0
    for vi, vol in enumerate(acq.volumes):
        # (k, j, i) order once, so each slice's rows x columns are contiguous bytes.
        kji = np.ascontiguousarray(vol.data.transpose(2, 1, 0)).astype("<u2", copy=False)
        for k in range(acq.grid.shape[2]):
            n += 1
            var = Dataset()
            var.SOPInstanceUID = uid(h.seed, h.case_id, h.modality, acq.role, vi, k)
            var.InstanceNumber = n
            pos = _lps(origins[k])
            var.ImagePositionPatient = pos
            var.SliceLocation = round(float(np.dot(pos, normal)), 4)
            for key, value in sorted(vol.attrs.items()):
                setattr(var, key, value)
            out.append((var, kji[k].tobytes()))
    return fixed, out


def write_series(
    h: StudyHeader, acq: Acquired, folder: Path, series_time: dt.datetime
) -> list[Path]:
    """Write every slice of every volume of ``acq`` into ``folder``; return the paths."""
    fixed, instances = series_instances(h, acq, series_time)
    writer = SeriesWriter(fixed, [e.tag for e in instances[0][0]])
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for n, (var, pixels) in enumerate(instances, start=1):
        path = folder / f"IM{n:04d}.dcm"
        writer.write(path, var, pixels)
        paths.append(path)
    return paths
