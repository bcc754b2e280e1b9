"""A stack is resliced to axial only when its through-plane sampling supports it.

A reslice draws each axial image from one row of every acquired slice: from ten coronal slices
5 mm apart, an axial image is ten rows of 5 mm, a strip. Such stacks are shown in the plane
they were acquired in, and every label (the montage's bar, RenderedImage.orientation, the slice
positions) names the plane actually shown. Real corpus files where the corpus has them (the
Siemens XA30 sagittal scout, BRAINIX FLAIR re-labelled coronal), and a synthetic Siemens XA60
10-slice coronal DWI.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydicom
import pytest
from PIL import Image
from pydicom.dataset import FileDataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, MRImageStorage, generate_uid

from dicom.geometry import RESLICE_MAX_SPACING_RATIO, RESLICE_MIN_SLICES, reslice_problem
from dicom.index import index_path
from dicom.records import Plane, SequenceClass
from dicom.render import RenderOptions, render_path


def test_the_rule_names_why_a_reslice_is_meaningless() -> None:
    # 3D isotropic: resliced.
    assert reslice_problem([256, 256, 176], [1.0, 1.0, 1.0]) is None
    # Near-isotropic thin slab of many slices: resliced.
    assert reslice_problem([320, 320, 120], [0.8, 0.8, 1.5]) is None
    # Few slices, however thin.
    few = reslice_problem([128, 128, 10], [1.8, 1.8, 1.8])
    assert few is not None and "10 slices" in few and str(RESLICE_MIN_SLICES) in few
    # Many slices, but thick against the pixels.
    thick = reslice_problem([512, 512, 30], [0.45, 0.45, 4.0])
    assert thick is not None and "4 mm apart" in thick and "0.45 mm" in thick
    assert f"{RESLICE_MAX_SPACING_RATIO:g}" in thick
    # At the bound exactly: still resliced.
    assert reslice_problem([100, 100, RESLICE_MIN_SLICES], [1.0, 1.0, 2.0]) is None


def _coronal_dwi(
    folder: Path, *, slices: int = 10, spacing: float = 5.0, pixel: float = 1.8
) -> Path:
    """A Siemens XA60-style coronal DWI: b=0 and b=1000, ``slices`` slices ``spacing`` mm apart,
    128 x 128 pixels of ``pixel`` mm, an ellipse of 'brain' in a ring of 'scalp'."""
    folder.mkdir(parents=True, exist_ok=True)
    study, series = generate_uid(), generate_uid()
    n = 0
    yy, xx = np.mgrid[0:128, 0:128]
    r = np.hypot((xx - 64) / 50.0, (yy - 64) / 58.0)
    for b in (0, 1000):
        for k in range(slices):
            n += 1
            sop = generate_uid()
            meta = FileMetaDataset()
            meta.MediaStorageSOPClassUID = MRImageStorage
            meta.MediaStorageSOPInstanceUID = sop
            meta.TransferSyntaxUID = ExplicitVRLittleEndian
            path = folder / f"im{n:04d}.dcm"
            ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
            ds.SOPClassUID = MRImageStorage
            ds.SOPInstanceUID = sop
            ds.StudyInstanceUID = study
            ds.SeriesInstanceUID = series
            ds.Modality = "MR"
            ds.Manufacturer = "Siemens Healthineers"
            ds.ManufacturerModelName = "MAGNETOM Vida"
            ds.SoftwareVersions = "syngo MR XA60"
            ds.SeriesNumber = 8
            ds.InstanceNumber = n
            ds.SeriesDescription = "ep2d_diff_cor"
            ds.ProtocolName = "ep2d_diff_cor"
            ds.ImageType = ["ORIGINAL", "PRIMARY", "DIFFUSION", "NONE"]
            ds.ScanningSequence = ["EP"]
            ds.SequenceVariant = ["SK", "SP"]
            ds.SequenceName = f"*ep_b{b}t" if b else "*ep_b0"
            ds.MRAcquisitionType = "2D"
            ds.RepetitionTime = 4000.0
            ds.EchoTime = 70.0
            ds.DiffusionBValue = float(b)
            ds.SliceThickness = spacing
            ds.PixelSpacing = [pixel, pixel]
            # coronal: rows run patient left (LPS +x), columns run inferior (LPS -z)
            ds.ImageOrientationPatient = [1, 0, 0, 0, 0, -1]
            ds.ImagePositionPatient = [-115.0, -40.0 + spacing * k, 115.0]
            ds.Rows = ds.Columns = 128
            ds.SamplesPerPixel = 1
            ds.PhotometricInterpretation = "MONOCHROME2"
            ds.BitsAllocated = ds.BitsStored = 16
            ds.HighBit = 15
            ds.PixelRepresentation = 0
            img = np.where(r < 0.85, 300 - 100 * (b > 0), 0) + np.where(
                (r >= 0.9) & (r < 1.0), 900, 0
            )
            ds.PixelData = img.astype(np.uint16).tobytes()
            ds.save_as(path, enforce_file_format=True)
    return folder


def test_a_ten_slice_coronal_dwi_is_shown_coronal(tmp_path: Path) -> None:
    src = _coronal_dwi(tmp_path / "dwi")
    index = index_path(src)
    assert {s.plane for s in index.series} == {Plane.CORONAL}
    assert {s.series_class for s in index.series} == {SequenceClass.DWI}
    manifest = render_path(src, tmp_path / "out", RenderOptions(), index=index)
    assert manifest.errors == [], manifest.errors
    (img,) = manifest.images
    assert img.orientation.startswith("coronal"), img.orientation
    assert len(img.slice_indices) == len(img.slice_positions_mm) <= 10
    # positions along the acquired (anterior-posterior) axis: one per acquired slice, 5 mm apart
    steps = np.diff(sorted(img.slice_positions_mm))
    assert np.allclose(steps % 5.0, 0, atol=0.01) or np.allclose(steps % 5.0, 5.0, atol=0.01)
    assert any("coronal" in w and "10 slices" in w for w in manifest.warnings), manifest.warnings
    # a tile shows the head across most of its height, not a strip of ten rows
    sheet = np.asarray(Image.open(tmp_path / "out" / img.file).convert("L"))
    bar = max(24, 256 // 8)
    tile = sheet[bar : bar + 256, 0:256]
    rows_with_head = int(np.count_nonzero((tile > 20).sum(axis=1) > 10))
    assert rows_with_head > 150, rows_with_head


def test_a_thin_many_slice_coronal_stack_is_still_resliced_to_axial(tmp_path: Path) -> None:
    src = _coronal_dwi(tmp_path / "dwi", slices=40, spacing=1.8)
    manifest = render_path(src, tmp_path / "out", RenderOptions())
    (img,) = manifest.images
    assert img.orientation.startswith("axial"), img.orientation
    assert not any("acquired" in w for w in manifest.warnings)


@pytest.mark.corpus
def test_the_real_sagittal_scout_is_shown_sagittal(corpus: Path, tmp_path: Path) -> None:
    """The Siemens XA30 sagittal scout: two slices 100 mm apart (and a one-slice stack)."""
    src = corpus / "siemens_xa30/In/2001_AAHead_Scout"
    index = index_path(src)
    for s in index.series:
        assert s.plane is Plane.SAGITTAL
        manifest = render_path(
            src, tmp_path / s.key.replace("#", "_"), index=index, series_uid=s.key
        )
        assert manifest.images, manifest.errors
        for img in manifest.images:
            assert img.orientation.startswith("sagittal"), (s.key, img.orientation)


@pytest.mark.corpus
def test_brainix_flair_relabelled_coronal_is_shown_coronal(corpus: Path, tmp_path: Path) -> None:
    """Real pixels, orientation re-labelled with pydicom: 22 thick coronal slices."""
    dst = tmp_path / "cor"
    dst.mkdir()
    for n, f in enumerate(sorted((corpus / "brainix/BRAINIX/DICOM/FLAIR").iterdir())):
        ds = pydicom.dcmread(f)
        x, y, z = (float(v) for v in ds.ImagePositionPatient)
        ds.ImageOrientationPatient = [1, 0, 0, 0, 0, -1]
        ds.ImagePositionPatient = [x, z, -y]  # the axial slice stack turned about the x axis
        ds.save_as(dst / f"{n:03d}.dcm")
    index = index_path(dst)
    (s,) = index.series
    assert s.plane is Plane.CORONAL
    manifest = render_path(dst, tmp_path / "out", index=index)
    (img,) = manifest.images
    assert img.orientation.startswith("coronal"), img.orientation
    assert any("acquired coronal plane" in w for w in manifest.warnings)
    # the slices shown are acquired slices: their count is at most the stack's
    assert len(img.slice_indices) <= s.shape[2]


@pytest.mark.corpus
def test_the_3d_sagittal_t1_is_still_resliced(corpus: Path, tmp_path: Path) -> None:
    src = corpus / "siemens_xa30/In/5001_anat-T1w_acq-tfl"
    manifest = render_path(src, tmp_path / "ax", RenderOptions(n_slices=4))
    assert manifest.images[0].orientation.startswith("axial")
    assert not any("acquired" in w for w in manifest.warnings)


def test_the_prompt_label_names_the_plane_shown(tmp_path: Path) -> None:
    """What the model reads beside the image: 'coronal montage', positions lettered A/P."""
    from evaluation.datasets.rendering import _ref

    src = _coronal_dwi(tmp_path / "dwi")
    (img,) = render_path(src, tmp_path / "out", RenderOptions()).images
    ref = _ref(tmp_path / "out", img, {})
    assert ref.plane == "coronal"
    assert "coronal montage, " in ref.label, ref.label
    assert "axial" not in ref.label and " S " not in ref.label and " I " not in ref.label
    assert " A " in ref.label or " P " in ref.label
