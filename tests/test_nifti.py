"""NIfTI (+ BIDS sidecar) input: index_nifti gives the SeriesInfo a DICOM stack would give."""

import gzip
import hashlib
import json
import struct
import tracemalloc
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest
from conftest import corpus_path as _corpus

from dicom.errors import DecodeError
from dicom.index import index_path
from dicom.nifti import NIFTI_SOP_CLASS, index_nifti, load_nifti_volume
from dicom.records import Plane, SequenceClass, SeriesInfo

AXIAL = np.array(
    [
        [0.9, 0.0, 0.0, -9.0],
        [0.0, 1.1, 0.0, -13.2],
        [0.0, 0.0, 3.0, -15.0],
        [0.0, 0.0, 0.0, 1.0],
    ]
)
# i -> anterior, j -> superior, k -> left (slices stacked along x): a sagittal acquisition.
SAGITTAL = np.array(
    [
        [0.0, 0.0, -1.2, 6.0],
        [1.0, 0.0, 0.0, -10.0],
        [0.0, 1.0, 0.0, -12.0],
        [0.0, 0.0, 0.0, 1.0],
    ]
)

FLAIR_SIDECAR = {
    "Modality": "MR",
    "Manufacturer": "Siemens",
    "SeriesDescription": "t2_tirm_tra_dark-fluid",
    "ProtocolName": "t2_tirm_tra_dark-fluid",
    "SeriesNumber": 7,
    "ImageType": ["ORIGINAL", "PRIMARY", "M", "NORM"],
    "ScanningSequence": "IR",
    "SequenceVariant": "SK_SP_MP",
    "MRAcquisitionType": "2D",
    "RepetitionTime": 9.0,
    "EchoTime": 0.1,
    "InversionTime": 2.5,
}
T1_SIDECAR = {
    "Modality": "MR",
    "SeriesDescription": "t1_mprage_sag",
    "ScanningSequence": "GR_IR",
    "SequenceVariant": "SK_SP_MP",
    "MRAcquisitionType": "3D",
    "RepetitionTime": 1.8,
    "EchoTime": 0.0024,
    "InversionTime": 0.9,
}
DWI_SIDECAR = {
    "Modality": "MR",
    "SeriesDescription": "ep2d_diff_3scan_trace",
    "ScanningSequence": "EP",
    "SequenceVariant": "SK_SP",
    "MRAcquisitionType": "2D",
    "RepetitionTime": 5.2,
    "EchoTime": 0.089,
}


def _data(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(-500, 3000, size=shape, dtype=np.int16)


def _write(
    path: Path,
    data: np.ndarray,
    affine: np.ndarray = AXIAL,
    sidecar: dict[str, Any] | str | None = None,
    bval: str | None = None,
) -> Path:
    img = nib.Nifti1Image(data, affine)
    img.header.set_xyzt_units("mm", "sec")
    nib.save(img, str(path))
    stem = path.name.removesuffix(".gz").removesuffix(".nii")
    if sidecar is not None:
        text = sidecar if isinstance(sidecar, str) else json.dumps(sidecar)
        (path.parent / f"{stem}.json").write_text(text)
    if bval is not None:
        (path.parent / f"{stem}.bval").write_text(bval)
    return path


def _one(path: Path) -> SeriesInfo:
    result = index_nifti(path)
    assert result.errors == [], result.errors
    assert len(result.series) == 1
    assert result.n_files == 1
    return result.series[0]


# --- geometry ----------------------------------------------------------------------------------


def test_axial_3d_geometry(tmp_path: Path) -> None:
    path = _write(tmp_path / "brain.nii", _data((20, 24, 10)))
    s = _one(path)
    assert s.path == str(path)
    assert s.shape == [20, 24, 10]
    assert s.affine is not None and np.allclose(s.affine, AXIAL)
    assert s.spacing == pytest.approx([0.9, 1.1, 3.0])
    assert s.plane is Plane.AXIAL
    assert s.obliquity_deg == pytest.approx(0.0)
    assert s.sop_class_uid == NIFTI_SOP_CLASS
    assert s.study_uid == ""
    digest = hashlib.sha1(str(path.absolute()).encode()).hexdigest()[:16]
    assert s.series_uid == f"nifti:{digest}"
    assert s.description == "brain"
    assert s.modality == "MR"
    assert s.n_files == 1
    assert len(s.volumes) == 1 and len(s.volumes[0]) == 10
    for k, ref in enumerate(s.volumes[0]):
        assert ref.path == str(path)
        assert ref.frame == k
        ras = AXIAL[:3, 3] + k * AXIAL[:3, 2]
        assert ref.position == pytest.approx((-ras[0], -ras[1], ras[2]))
    assert s.volume_labels == []


def test_sagittal_plane(tmp_path: Path) -> None:
    s = _one(_write(tmp_path / "sag.nii.gz", _data((20, 24, 10)), SAGITTAL))
    assert s.plane is Plane.SAGITTAL
    assert s.shape == [20, 24, 10]
    assert s.spacing == pytest.approx([1.0, 1.0, 1.2])
    assert s.affine is not None and np.allclose(s.affine, SAGITTAL)
    assert s.description == "sag"  # both suffixes of .nii.gz stripped
    # Slices march towards patient left: LPS x increases by 1.2 mm per slice.
    xs = [ref.position[0] for ref in s.volumes[0] if ref.position is not None]
    assert np.allclose(np.diff(xs), 1.2)


def test_4d_volumes_and_frames(tmp_path: Path) -> None:
    data = _data((20, 24, 10, 3))
    s = _one(_write(tmp_path / "run.nii", data))
    assert s.shape == [20, 24, 10, 3]
    assert len(s.volumes) == 3
    assert [len(v) for v in s.volumes] == [10, 10, 10]
    assert s.volumes[2][4].frame == 2 * 10 + 4
    assert s.volumes[1][0].position == s.volumes[0][0].position
    assert s.volume_labels == ["volume 1", "volume 2", "volume 3"]


def test_trailing_singleton_dims_dropped(tmp_path: Path) -> None:
    s = _one(_write(tmp_path / "one.nii", _data((20, 24, 10, 1))))
    assert s.shape == [20, 24, 10]
    assert len(s.volumes) == 1


# --- pixels --------------------------------------------------------------------------------------


def test_load_volume_1_of_4d_is_exact(tmp_path: Path) -> None:
    data = _data((20, 24, 10, 3), seed=3)
    s = _one(_write(tmp_path / "run.nii.gz", data))
    vol = load_nifti_volume(s, 1)
    assert vol.dtype == np.float32
    assert vol.shape == (20, 24, 10)
    assert np.array_equal(vol, data[..., 1].astype(np.float32))
    assert np.array_equal(load_nifti_volume(s), data[..., 0].astype(np.float32))


def test_load_applies_scl_slope_inter(tmp_path: Path) -> None:
    data = _data((20, 24, 10))
    img = nib.Nifti1Image(data, AXIAL)
    img.header.set_slope_inter(2.0, -5.0)
    path = tmp_path / "scaled.nii"
    nib.save(img, str(path))
    vol = load_nifti_volume(_one(path))
    assert np.allclose(vol, data.astype(np.float32) * 2.0 - 5.0)


def test_load_reads_one_volume_only(tmp_path: Path) -> None:
    data = _data((64, 64, 32, 40))  # 10 MiB as int16, 20 MiB as float32; 0.5 MiB per volume
    s = _one(_write(tmp_path / "long.nii", data))
    tracemalloc.start()
    try:
        vol = load_nifti_volume(s, 39)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert np.array_equal(vol, data[..., 39].astype(np.float32))
    assert peak < 4 * 2**20, f"peak {peak} bytes: more than one volume was read"


def test_load_errors_are_decode_errors(tmp_path: Path) -> None:
    path = _write(tmp_path / "gone.nii", _data((20, 24, 10, 3)))
    s = _one(path)
    with pytest.raises(DecodeError, match="out of range"):
        load_nifti_volume(s, 3)
    path.unlink()
    with pytest.raises(DecodeError, match=r"gone\.nii"):
        load_nifti_volume(s, 0)


def test_rgb_nifti(tmp_path: Path) -> None:
    rgb = np.zeros((20, 24, 10), dtype=[("R", "u1"), ("G", "u1"), ("B", "u1")])
    rgb["R"], rgb["G"], rgb["B"] = 10, 20, 30
    path = tmp_path / "colfa.nii"
    nib.save(nib.Nifti1Image(rgb, AXIAL), str(path))
    s = _one(path)
    assert s.samples_per_pixel == 3 and s.photometric == "RGB"
    vol = load_nifti_volume(s)
    assert vol.shape == (20, 24, 10, 3)
    assert vol[0, 0, 0].tolist() == [10.0, 20.0, 30.0]


# --- classification ----------------------------------------------------------------------------


def test_flair_from_sidecar(tmp_path: Path) -> None:
    s = _one(_write(tmp_path / "flair.nii.gz", _data((20, 24, 10)), sidecar=FLAIR_SIDECAR))
    assert s.series_class is SequenceClass.FLAIR
    assert "sidecar" in s.reason and "flair.json" in s.reason
    assert "TR 9000 ms" in s.reason and "TE 100 ms" in s.reason and "TI 2500 ms" in s.reason
    assert s.confidence > 0.5
    assert s.description == "t2_tirm_tra_dark-fluid"
    assert s.series_number == 7
    assert s.manufacturer == "Siemens"
    assert s.warnings == []


def test_t1_from_sidecar_gr_ir(tmp_path: Path) -> None:
    s = _one(_write(tmp_path / "t1.nii", _data((20, 24, 10)), SAGITTAL, sidecar=T1_SIDECAR))
    assert s.series_class is SequenceClass.T1
    assert "GR/IR" in s.reason and "TI 900 ms" in s.reason
    assert "sidecar" in s.reason
    assert s.acquisition_3d is True
    assert s.plane is Plane.SAGITTAL


def test_dwi_from_bval(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "dwi.nii", _data((20, 24, 10, 3)), sidecar=DWI_SIDECAR, bval="0 1000 1000\n"
    )
    (tmp_path / "dwi.bvec").write_text("0 1 0\n0 0 1\n0 0 0\n")
    s = _one(path)
    assert s.series_class is SequenceClass.DWI
    assert s.b_values == [0.0, 1000.0]
    assert s.n_directions == 2
    assert "sidecar" in s.reason and "dwi.bval" in s.reason
    assert s.volume_labels[0] == "b=0"
    assert s.volume_labels[1].startswith("b=1000 direction")


def test_dwi_from_bval_without_sidecar(tmp_path: Path) -> None:
    s = _one(_write(tmp_path / "scan.nii", _data((20, 24, 10, 3)), bval="0 1000 1000"))
    assert s.series_class is SequenceClass.DWI
    assert "no BIDS sidecar: from the file name" in s.reason
    assert s.confidence <= 0.5


def test_no_sidecar_class_from_file_name(tmp_path: Path) -> None:
    s = _one(_write(tmp_path / "sub-01_FLAIR.nii.gz", _data((20, 24, 10))))
    assert s.series_class is SequenceClass.FLAIR
    assert "no BIDS sidecar: from the file name" in s.reason
    assert 0.0 < s.confidence <= 0.5
    assert s.description == "sub-01_FLAIR"


def test_no_sidecar_uninformative_name_is_unknown(tmp_path: Path) -> None:
    s = _one(_write(tmp_path / "image.nii", _data((20, 24, 10))))
    assert s.series_class is SequenceClass.UNKNOWN
    assert "no BIDS sidecar: from the file name" in s.reason
    assert s.confidence == 0.0


def test_sidecar_uids_and_study(tmp_path: Path) -> None:
    sidecar = dict(FLAIR_SIDECAR, SeriesInstanceUID="1.2.3.4.5", StudyInstanceUID="1.2.3")
    s = _one(_write(tmp_path / "uids.nii", _data((20, 24, 10)), sidecar=sidecar))
    assert s.series_uid == "1.2.3.4.5"
    assert s.study_uid == "1.2.3"


# --- untrusted input ---------------------------------------------------------------------------


def test_sidecar_wrong_types_are_ignored_with_warnings(tmp_path: Path) -> None:
    sidecar = {
        "RepetitionTime": "9.0",
        "EchoTime": [0.1],
        "InversionTime": float("nan"),
        "SeriesDescription": "FLAIR\x00\x1b[31m" + "x" * 10_000,
        "ProtocolName": 42,
        "ImageType": 5,
        "ScanningSequence": {"a": 1},
        "SeriesNumber": True,
        "Modality": ["MR"],
        "SeriesInstanceUID": "not a uid; rm -rf /",
        "Manufacturer": None,
    }
    s = _one(_write(tmp_path / "odd.nii", _data((20, 24, 10)), sidecar=sidecar))
    text = "\n".join(s.warnings)
    for key in ("RepetitionTime", "EchoTime", "InversionTime", "ProtocolName", "ImageType"):
        assert key in text
    assert "SeriesInstanceUID" in text
    assert s.series_uid.startswith("nifti:")
    assert len(s.description) <= 256
    assert "\x00" not in s.description and "\x1b" not in s.description
    assert s.series_number is None
    assert s.modality == "MR"


def test_sidecar_not_json_or_not_object(tmp_path: Path) -> None:
    s = _one(_write(tmp_path / "bad.nii", _data((20, 24, 10)), sidecar="{not json"))
    assert any("bad.json" in w and "JSON" in w for w in s.warnings)
    assert "no BIDS sidecar" in s.reason
    s = _one(_write(tmp_path / "list.nii", _data((20, 24, 10)), sidecar="[1, 2]"))
    assert any("not a JSON object" in w for w in s.warnings)
    huge_int = '{"SeriesNumber": ' + "9" * 10_000 + "}"
    s = _one(_write(tmp_path / "int.nii", _data((20, 24, 10)), sidecar=huge_int))
    assert s.series_number is None


def test_timing_given_in_ms_is_flagged(tmp_path: Path) -> None:
    sidecar = dict(FLAIR_SIDECAR, RepetitionTime=9000, EchoTime=0.1, InversionTime=2.5)
    s = _one(_write(tmp_path / "ms.nii", _data((20, 24, 10)), sidecar=sidecar))
    assert any("RepetitionTime 9000" in w for w in s.warnings)
    assert s.series_class is SequenceClass.FLAIR


def test_bad_bval_is_ignored(tmp_path: Path) -> None:
    path = _write(tmp_path / "b.nii", _data((20, 24, 10, 3)), bval="0 abc 1000")
    s = _one(path)
    assert s.b_values == []
    assert any("b.bval" in w for w in s.warnings)


def test_corrupt_file_is_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.nii"
    path.write_bytes(np.random.default_rng(1).bytes(4096))
    result = index_nifti(path)
    assert result.series == []
    assert len(result.errors) == 1
    assert result.errors[0].kind == "unreadable"
    assert result.errors[0].path == str(path)
    gz = tmp_path / "corrupt.nii.gz"
    gz.write_bytes(gzip.compress(np.random.default_rng(2).bytes(4096))[:-20])
    result = index_nifti(gz)
    assert result.series == [] and result.errors[0].kind == "unreadable"


def test_missing_file_is_unreadable(tmp_path: Path) -> None:
    result = index_nifti(tmp_path / "absent.nii")
    assert result.series == [] and result.errors[0].kind == "unreadable"


def test_truncated_data_is_unreadable(tmp_path: Path) -> None:
    path = _write(tmp_path / "cut.nii", _data((20, 24, 10)))
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    result = index_nifti(path)
    assert result.series == []
    assert result.errors[0].kind == "unreadable"
    assert "truncated" in result.errors[0].message


def test_huge_header_is_too_large_without_allocating(tmp_path: Path) -> None:
    path = _write(tmp_path / "huge.nii", _data((2, 2, 2)))
    with path.open("r+b") as fp:  # header dim[0..7] at byte 40
        fp.seek(40)
        fp.write(struct.pack("<8h", 3, 30000, 30000, 2000, 1, 1, 1, 1))
    img = nib.load(str(path))
    assert isinstance(img, nib.Nifti1Image) and img.shape == (30000, 30000, 2000)
    tracemalloc.start()
    try:
        result = index_nifti(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.series == []
    assert len(result.errors) == 1
    assert result.errors[0].kind == "too_large"
    assert "GiB" in result.errors[0].message
    assert peak < 32 * 2**20


def test_memory_cap_is_per_volume(tmp_path: Path) -> None:
    path = _write(tmp_path / "cap.nii", _data((20, 24, 10, 3)))
    one_volume = 20 * 24 * 10 * 4
    assert index_nifti(path, memory_cap=2 * one_volume).errors == []
    result = index_nifti(path, memory_cap=one_volume - 1)
    assert result.errors[0].kind == "too_large"


def test_index_path_dispatches_to_nifti(tmp_path: Path) -> None:
    path = _write(tmp_path / "flair.nii", _data((20, 24, 10)), sidecar=FLAIR_SIDECAR)
    result = index_path(path)
    assert [s.series_class for s in result.series] == [SequenceClass.FLAIR]


# --- shared corpus -----------------------------------------------------------------------------


@pytest.mark.corpus
def test_corpus_siemens_t1_mprage() -> None:
    path = _corpus() / "siemens_xa30" / "Ref" / "5001_anat-T1w_acq-tfl.nii"
    s = _one(path)
    assert s.series_class is SequenceClass.T1
    assert "5001_anat-T1w_acq-tfl.json" in s.reason
    assert s.series_number == 5001
    assert s.acquisition_3d
    # Acquired sagittal (ImageOrientationPatientDICOM 0,1,0,0,0,-1), but dcm2niix reoriented
    # this 3D volume to RAS: the slices stored along k are axial, and volumes, positions and
    # rendering follow the stored slices. The sagittal acquisition is reported, not hidden.
    assert s.plane is Plane.AXIAL
    assert s.shape == [96, 128, 128]
    assert any("acquired as sagittal" in w for w in s.warnings)
    vol = load_nifti_volume(s)
    assert vol.shape == (96, 128, 128) and float(vol.max()) > 0


# labels.json keys (DICOM series) -> the dcm2niix conversion of that series in Ref/.
_CORPUS_REF = {
    "siemens_xa30/In/5001_anat-T1w_acq-tfl": "siemens_xa30/Ref/5001_anat-T1w_acq-tfl.nii",
    "siemens_xa30/In/11001_DWI_dir80_AP": "siemens_xa30/Ref/11001_DWI_dir80_AP.nii",
    "siemens_xa30/In/12001_DWI_dir80_AP": "siemens_xa30/Ref/12001_DWI_dir80_AP.nii",
    "siemens_xa30/In/13001_DWI_dir80_AP": "siemens_xa30/Ref/13001_DWI_dir80_AP.nii",
    "siemens_xa30/In/14001_DWI_dir80_AP": "siemens_xa30/Ref/14001_DWI_dir80_AP.nii",
    "siemens_xa30/In/15001_DWI_dir80_AP": "siemens_xa30/Ref/15001_DWI_dir80_AP.nii",
    "siemens_xa30/In/17001_DWI_dir80_AP": "siemens_xa30/Ref/17001_DWI_dir80_AP.nii",
    "siemens_xa30/In/9001_gre_field_mapping": "siemens_xa30/Ref/9001_gre_field_mapping_e1.nii",
    "siemens_xa30/In/18001_asl_2d_tra": "siemens_xa30/Ref/18001_asl_2d_tra.nii",
    "siemens_xa30/In/7001_func-bold_task-fa_run-1": (
        "siemens_xa30/Ref/7001_func-bold_task-fa_run-1.nii"
    ),
    "ge_pioneer/In/01_Ax_DWI_TENSOR_R2": "ge_pioneer/Ref/Ax_DWI_TENSOR_R2_1.nii",
    "uih_umr770/In/DTI_132225/dti_tra_dir16_PA_rot_SaveBySlc__134057": (
        "uih_umr770/Ref/dti_tra_dir16_PA_rot_12_132222.nii"
    ),
}


def _label(corpus: Path, key: str) -> dict[str, Any]:
    """labels.json entry of a series, supported ('series') or newly supported ('series_pending')."""
    doc = json.loads((corpus / "labels.json").read_text())
    return {**doc["series"], **doc["series_pending"]}[key]


@pytest.mark.corpus
@pytest.mark.parametrize("label_key", sorted(_CORPUS_REF))
def test_corpus_ref_matches_labels(label_key: str) -> None:
    corpus = _corpus()
    expected = _label(corpus, label_key)
    s = _one(corpus / _CORPUS_REF[label_key])
    assert s.series_class.value == expected["class"], s.reason
    assert "sidecar" in s.reason
    if "plane" in expected and s.plane is not None and s.plane.value != expected["plane"]:
        # Only a converter reorientation may change the stored plane, and it must be reported.
        assert any(f"acquired as {expected['plane']}" in w for w in s.warnings), s.warnings
    last = len(s.volumes) - 1
    vol = load_nifti_volume(s, last)
    assert vol.shape[:3] == tuple(s.shape[:3])


# dcm2niix's affines carry the float32 rounding of the written positions: the tolerance of
# tests/test_geometry.py (0.01 mm plus 1.1e-4 mm per slice).
def _affine_tolerance(n_slices: int) -> float:
    return 0.01 + 1.1e-4 * n_slices


@pytest.mark.corpus
def test_corpus_uih_dti_mosaics_match_dcm2niix() -> None:
    """UIH 'VFRAME' mosaics (ImageType ...\\VFRAME, 320x256 = 5x4 tiles of 64x64, no
    ImagePositionPatient) become a 64x64x20 DWI with 17 volumes: the voxels and the affine of
    dcm2niix's reference, the b-values of its .bval and the directions of its .bvec."""
    from dicom.pixels import load_volume

    corpus = _corpus()
    key = "uih_umr770/In/DTI_132225/dti_tra_dir16_PA_rot_SaveBySlc__134057"
    ref_path = corpus / _CORPUS_REF[key]
    ref = nib.as_closest_canonical(nib.load(ref_path))
    ref_data = ref.get_fdata(dtype=np.float32)
    assert ref_data.shape == (64, 64, 20, 17)
    stacks = index_path(corpus / key).series
    assert [s.series_class for s in stacks] == [SequenceClass.DWI] * 2, [s.reason for s in stacks]
    # As for every vendor, the b=0 volume and the 16 diffusion directions are two stacks of one
    # series (tests/test_index.py::test_siemens_819_file_dwi_splits_into_b0_and_directions).
    b0, dw = stacks
    assert b0.shape == [64, 64, 20] and dw.shape == [64, 64, 20, 16]
    assert b0.plane is Plane.AXIAL and dw.plane is Plane.AXIAL
    assert all(s.errors == [] and s.warnings == [] for s in stacks), [s.warnings for s in stacks]
    # dcm2niix writes the actual b-value UIH stores in (0065,1009), not the nominal 0 / 1000.
    bvals = np.loadtxt(ref_path.with_suffix(".bval"))
    assert b0.b_values == [round(bvals[0])] and dw.b_values == [round(bvals[1])]
    assert dw.n_directions == 16
    # UIH's (0065,1037) direction is in the image frame; dcm2niix negates its second component
    # for the flipped NIfTI rows.
    bvecs = np.loadtxt(ref_path.with_suffix(".bvec"))
    assert dw.volume_labels == [
        "direction (" + ", ".join(f"{v:.3f}" for v in (x, -y, z)) + ")" for x, y, z in bvecs.T[1:]
    ]
    ours = [(b0, 0)] + [(dw, v) for v in range(16)]  # acquisition order, as dcm2niix's
    worst = 0.0
    for v, (s, i) in enumerate(ours):
        canon = nib.as_closest_canonical(
            nib.Nifti1Image(load_volume(s, i).data, np.array(s.affine))
        )
        assert np.array_equal(np.asanyarray(canon.dataobj), ref_data[..., v]), f"volume {v}"
        worst = max(worst, float(np.abs(canon.affine - ref.affine).max()))
    assert worst <= _affine_tolerance(20), f"affine differs from dcm2niix's by {worst:.5f} mm"
