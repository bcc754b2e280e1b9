"""United Imaging (UIH) uMR 770 headers, as the vendor documents them (dcm2niix's UIH/README.md,
from UIH's answer in rordenlab/dcm2niix issue 225).

* DTI and fMRI may be stored one volume per file as a 'GRID' (ImageType ends VFRAME): the
  number of slices is (0065,1050), tiles run cols = ceil(sqrt(n)) across and
  rows = ceil(n / cols) down, there is no top-level ImagePositionPatient, and each tile's
  position is ImagePositionPatient in its item of the private sequence (0065,1051).
  The b-value is (0065,1009) (actual; (0065,100A) is the one chosen in the UI), the gradient
  direction (0065,1037).
* The 3D T1 is a fast spoiled gradient echo (sequence 'gre_fsp') with an inversion pulse:
  ScanningSequence GR\\IR, TI 750 ms, TE 3.1 ms. The 'gre' in its name is the readout.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pydicom
import pytest

from dicom.classify import classify
from dicom.headers import read_frames
from dicom.index import index_path
from dicom.pixels import load_volume
from dicom.records import Plane, SequenceClass

pytestmark = pytest.mark.corpus

DTI = "uih_umr770/In/DTI_132225/dti_tra_dir16_PA_rot_SaveBySlc__134057"
T1 = "uih_umr770/In/DTI_132225/t1_gre_fsp_3d_sag__132750"


def test_vframe_grid_is_cut_into_tiles_placed_by_the_private_sequence(corpus: Path) -> None:
    path = corpus / DTI / "00000002.dcm"
    ds = pydicom.dcmread(path, stop_before_pixels=True)
    assert "ImagePositionPatient" not in ds and list(ds.ImageType)[-1] == "VFRAME"
    frames = read_frames(str(path))
    n = int(ds[0x0065, 0x1050].value)
    assert n == 20 and len(frames) == n
    cols = math.ceil(math.sqrt(n))  # 5 tiles across 320 columns
    rows = math.ceil(n / cols)  # 4 tiles down 256 rows
    assert all((f.cols, f.rows) == (320 // cols, 256 // rows) == (64, 64) for f in frames)
    assert all(f.mosaic_slices == n for f in frames)
    items = ds[0x0065, 0x1051].value
    assert [f.position for f in frames] == [
        tuple(float(v) for v in item.ImagePositionPatient) for item in items
    ]
    assert all(f.b_value == pytest.approx(929.7501831337527) for f in frames)
    assert frames[0].direction == pytest.approx(
        (0.603651236341314, 0.0325546968722472, -0.796583568)
    )


def test_vframe_tiles_decode_from_their_place_in_the_grid(corpus: Path) -> None:
    stacks = index_path(corpus / DTI).series
    b0 = stacks[0]
    grid = pydicom.dcmread(corpus / DTI / "00000001.dcm").pixel_array
    volume = load_volume(b0).data  # (column, row, slice), slices in position order
    for k in range(20):  # tile k: row k // 5, column k % 5 of the grid
        tile = grid[(k // 5) * 64 : (k // 5 + 1) * 64, (k % 5) * 64 : (k % 5 + 1) * 64]
        assert np.array_equal(volume[:, :, k].T, tile), k


def test_vframe_without_its_frame_sequence_stays_one_image(corpus: Path, tmp_path: Path) -> None:
    """No per-tile positions, no slices: the grid is kept whole rather than misplaced."""
    ds = pydicom.dcmread(corpus / DTI / "00000001.dcm")
    del ds[0x0065, 0x1051]
    ds.save_as(tmp_path / "grid.dcm")
    frames = read_frames(str(tmp_path / "grid.dcm"))
    assert [(f.cols, f.rows, f.mosaic_slices) for f in frames] == [(320, 256, None)]
    s = index_path(tmp_path).series[0]
    assert s.shape == [320, 256, 1]
    assert any("ImagePositionPatient missing" in w for w in s.warnings)


def test_uih_dti_is_a_dwi_with_the_reason_stated(corpus: Path) -> None:
    stacks = index_path(corpus / DTI).series
    assert [s.stack_label for s in stacks] == ["b=1", "b=930"]
    for s in stacks:
        assert s.series_class is SequenceClass.DWI
        assert "diffusion b-values 1, 930 in the headers" in s.reason
        assert s.plane is Plane.AXIAL and s.affine is not None


def test_uih_inversion_prepared_gre_is_a_t1(corpus: Path) -> None:
    (s,) = index_path(corpus / T1).series
    assert s.series_class is SequenceClass.T1, s.reason
    assert s.detail == "3D inversion-prepared T1 (MPRAGE-type)"
    assert "ScanningSequence GR/IR" in s.reason and "TI 750 ms" in s.reason
    assert "SeriesDescription 't1_gre_fsp_3d_sag' agrees" in s.reason
    assert s.plane is Plane.SAGITTAL


def test_gre_in_a_description_names_the_readout_not_the_contrast(corpus: Path) -> None:
    """'gre' is how the image is read out, used by T1 and T2* sequences alike: it suggests T2*
    only when nothing else (the acquisition, a contrast in the name) says otherwise."""
    f = read_frames(str(corpus / T1 / "00000001.dcm"))[0]

    def cls(description: str, **physics: object) -> SequenceClass:
        return classify([replace(f, description=description, protocol="", **physics)]).series_class

    assert cls("gre_fsp_3d_sag") is SequenceClass.T1  # inversion-prepared: T1 whatever 'gre' says
    assert cls("t1_gre_fsp_3d_sag") is SequenceClass.T1
    t2star = {"inversion_time": None, "scanning_sequence": ("GR",), "echo_time": 20.0}
    assert cls("AX GRE", **t2star) is SequenceClass.T2STAR
    assert cls("AX T2 GRE", **t2star) is SequenceClass.T2STAR
    assert cls("AX GRE", inversion_time=None, scanning_sequence=(), echo_time=None) is (
        SequenceClass.T2STAR  # the name alone, acquisition inconclusive
    )
