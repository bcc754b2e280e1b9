"""A phantom study stored in the session's Orthanc for the web viewer tests, and where its
slices are (read from the files, not through the code under test)."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pydicom
import pytest
from PIL import Image

from gateway.orthanc import OrthancClient
from gateway.settings import Settings

VIEWER_DIST = Settings().viewer_dir
CASE = "gbm"  # the glioblastoma phantom: a ring-enhancing mass on axial T2
SERIES = "t2_tse_tra_5mm"


def needs_viewer() -> None:
    if not (VIEWER_DIST / "index.html").is_file():
        pytest.skip(f"OHIF is not installed at {VIEWER_DIST} (run `make setup`)")


@dataclass
class Slice:
    sop_uid: str
    number: int  # InstanceNumber
    z_mm: float  # ImagePositionPatient[2] (axial, no obliquity: the slice centre's S coordinate)


@dataclass
class StoredStudy:
    study_uid: str
    series_uid: str
    series_dir: Path
    slices: list[Slice]  # ordered by z

    def nearest(self, z_mm: float) -> Slice:
        return min(self.slices, key=lambda s: abs(s.z_mm - z_mm))


def read_series(case_dir: Path, description: str = SERIES) -> StoredStudy:
    slices, study_uid, series_uid, folder = [], "", "", None
    for path in sorted((case_dir / "dicom").rglob("*")):
        if not path.is_file():
            continue
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        if ds.get("SeriesDescription") != description:
            continue
        study_uid, series_uid, folder = ds.StudyInstanceUID, ds.SeriesInstanceUID, path.parent
        slices.append(
            Slice(str(ds.SOPInstanceUID), int(ds.InstanceNumber), float(ds.ImagePositionPatient[2]))
        )
    assert slices and folder is not None, f"no series {description!r} in {case_dir}"
    return StoredStudy(
        str(study_uid), str(series_uid), folder, sorted(slices, key=lambda s: s.z_mm)
    )


@contextlib.contextmanager
def stored(orthanc: OrthancClient, case_dir: Path) -> Iterator[StoredStudy]:
    """The case's DICOM files in Orthanc for the block (removed after, unless stored before)."""
    study = read_series(case_dir)
    before = orthanc.find_study(study.study_uid)
    files = sorted(p for p in (case_dir / "dicom").rglob("*") if p.is_file())
    orthanc.upload_many(files)
    try:
        yield study
    finally:
        study_id = orthanc.find_study(study.study_uid)
        if before is None and study_id is not None:
            orthanc.api.delete(f"{orthanc.url}/studies/{study_id}")


def centre_std(page) -> float:  # type: ignore[no-untyped-def]
    """Grey-level spread of the middle half of the viewer's canvas, as it is on screen: a
    rendered slice is far from uniform (std >= 20), a blank or error viewport is not."""
    box = page.locator("canvas.cornerstone-canvas").first.bounding_box()
    assert box is not None
    clip = {"x": box["x"] + box["width"] / 4, "y": box["y"] + box["height"] / 4,
            "width": box["width"] / 2, "height": box["height"] / 2}  # fmt: skip
    grey = np.asarray(Image.open(io.BytesIO(page.screenshot(clip=clip))).convert("L"), float)
    return float(grey.std())
