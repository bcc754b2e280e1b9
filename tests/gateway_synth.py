"""Small synthetic MR studies for the gateway tests (until evaluation/datasets/phantoms lands).

A head (ellipse), ventricles, and on FLAIR/T2 one bright lesion in the patient's left or right
hemisphere; headers classify as FLAIR/T2/T1 by their physics (TR/TE/TI, ScanningSequence).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydicom.dataset import Dataset, FileDataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, MRImageStorage, generate_uid

# class -> (description, ScanningSequence, SequenceVariant, TR, TE, TI)
PHYSICS: dict[str, tuple[str, str, str, float, float, float | None]] = {
    "FLAIR": ("AX FLAIR", "SE\\IR", "SK\\SP\\MP", 9000.0, 100.0, 2500.0),
    "T2": ("AX T2 TSE", "SE", "SK\\SP", 4452.0, 100.0, None),
    "T1": ("AX T1 SE", "SE", "NONE", 450.0, 10.0, None),
}


@dataclass
class SynthStudy:
    study_uid: str
    patient_id: str
    series_uids: dict[str, str] = field(default_factory=dict)  # class -> SeriesInstanceUID
    files: list[Path] = field(default_factory=list)


def _lesion_slice(k: int, n: int) -> bool:
    return abs(k - n // 2) <= 1  # the middle three slices


def _in_lesion(x: Any, y: Any, size: int, lesion: str) -> Any:
    # Columns run toward the patient's left (IOP row direction +x in LPS).
    c = (size - 1) / 2
    lx = c + (size * 0.22 if lesion == "left" else -size * 0.22)
    return ((x - lx) ** 2 + (y - c * 0.8) ** 2) <= (size * 0.07) ** 2


def in_lesion(header: Dataset, n_slices: int, col: float, row: float, lesion: str) -> bool:
    """Whether pixel centre (col, row) of a make_study slice (its header) is in the lesion."""
    k = int(header.InstanceNumber) - 1
    size = int(header.Columns)
    return _lesion_slice(k, n_slices) and bool(_in_lesion(col, row, size, lesion))


def _pixels(cls: str, k: int, n: int, size: int, lesion: str | None) -> np.ndarray:
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    c = (size - 1) / 2
    head = ((xx - c) / (size * 0.42)) ** 2 + ((yy - c) / (size * 0.47)) ** 2 <= 1
    vent = ((xx - c) / (size * 0.08)) ** 2 + ((yy - c) / (size * 0.15)) ** 2 <= 1
    brain = {"FLAIR": 500, "T2": 600, "T1": 700}[cls]
    csf = {"FLAIR": 80, "T2": 1500, "T1": 200}[cls]
    img = np.where(head, brain, 0).astype(np.float32)
    img[vent & head] = csf
    if lesion and cls in ("FLAIR", "T2") and _lesion_slice(k, n):
        img[_in_lesion(xx, yy, size, lesion)] = brain * 2.6
    rng = np.random.default_rng(k + 17 * n)
    img += rng.normal(0, 8, img.shape) * head
    return np.clip(img, 0, 4000).astype(np.uint16)


def make_study(
    folder: Path,
    classes: tuple[str, ...] = ("FLAIR", "T2"),
    n_slices: int = 6,
    size: int = 64,
    lesion: str | None = "left",
    patient_id: str = "NSBX-TEST-1",
    patient_name: str = "Test^Synthetic",
    study_uid: str | None = None,
    first_series_number: int = 1,
) -> SynthStudy:
    """Write one study (one series per class) under ``folder``; return its UIDs and files."""
    study = SynthStudy(study_uid=study_uid or generate_uid(), patient_id=patient_id)
    frame_uid = generate_uid()
    folder.mkdir(parents=True, exist_ok=True)
    for s_idx, cls in enumerate(classes):
        desc, seq, var, tr, te, ti = PHYSICS[cls]
        series_uid = generate_uid()
        study.series_uids[cls] = series_uid
        for k in range(n_slices):
            sop = generate_uid()
            meta = FileMetaDataset()
            meta.MediaStorageSOPClassUID = MRImageStorage
            meta.MediaStorageSOPInstanceUID = sop
            meta.TransferSyntaxUID = ExplicitVRLittleEndian
            path = folder / f"{cls}_{k:03d}.dcm"
            ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
            ds.SpecificCharacterSet = "ISO_IR 100"
            ds.SOPClassUID = MRImageStorage
            ds.SOPInstanceUID = sop
            ds.StudyInstanceUID = study.study_uid
            ds.SeriesInstanceUID = series_uid
            ds.FrameOfReferenceUID = frame_uid
            ds.PatientName = patient_name
            ds.PatientID = patient_id
            ds.PatientBirthDate = "19700101"
            ds.PatientSex = "F"
            ds.StudyDate = ds.SeriesDate = "20240102"
            ds.StudyTime = ds.SeriesTime = "101500"
            ds.AccessionNumber = "ACC" + study.study_uid[-6:]
            ds.StudyID = "1"
            ds.ReferringPhysicianName = ""
            ds.Modality = "MR"
            ds.Manufacturer = "SYNTH"
            ds.SeriesNumber = first_series_number + s_idx
            ds.InstanceNumber = k + 1
            ds.SeriesDescription = desc
            ds.ImageType = ["ORIGINAL", "PRIMARY", "M", "NONE"]
            ds.ScanningSequence = seq
            ds.SequenceVariant = var
            ds.ScanOptions = ""
            ds.MRAcquisitionType = "2D"
            ds.RepetitionTime = tr
            ds.EchoTime = te
            if ti is not None:
                ds.InversionTime = ti
            ds.MagneticFieldStrength = 1.5
            ds.SliceThickness = 5.0
            ds.SpacingBetweenSlices = 5.0
            ds.PixelSpacing = [3.0, 3.0]
            ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
            half = (size - 1) * 3.0 / 2
            ds.ImagePositionPatient = [-half, -half, -20.0 + 5.0 * k]
            ds.SliceLocation = -20.0 + 5.0 * k
            ds.PatientPosition = "HFS"
            ds.Rows = ds.Columns = size
            ds.SamplesPerPixel = 1
            ds.PhotometricInterpretation = "MONOCHROME2"
            ds.BitsAllocated = 16
            ds.BitsStored = 12
            ds.HighBit = 11
            ds.PixelRepresentation = 0
            ds.PixelData = _pixels(cls, k, n_slices, size, lesion).tobytes()
            ds.save_as(path, enforce_file_format=True)
            study.files.append(path)
    return study
