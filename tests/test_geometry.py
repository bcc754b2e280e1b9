"""Geometry against the oracle: dcm2niix's reference NIfTI volumes in the shared corpus."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from dicom.index import index_path
from dicom.pixels import load_volume

# (reference folder, input folder)
CASES = [
    ("siemens_xa30/Ref", "siemens_xa30/In"),
    ("enhanced_mr/Ref", "enhanced_mr/In"),
    ("ge_pioneer/Ref", "ge_pioneer/In"),
    ("transfer_syntaxes/Ref", "transfer_syntaxes/In"),
]
# DS values are written to 4 decimals: dcm2niix takes the slice step from the first two
# positions, so its estimate may be off by up to ~1e-4 mm per slice across a long stack.
IPP_ROUNDING_MM = 1.1e-4


def _ref_volumes(nii: Path) -> tuple[list[np.ndarray], np.ndarray, bool]:
    img = nib.load(nii)
    raw = np.asanyarray(img.dataobj)
    if raw.dtype.names:  # RGB24
        rgb = np.stack([raw[n] for n in raw.dtype.names], -1).astype(np.float32)
        return [rgb], img.affine, True
    canon = nib.as_closest_canonical(img)
    data = canon.get_fdata(dtype=np.float32)
    vols = [data[..., v] for v in range(data.shape[3])] if data.ndim == 4 else [data]
    return vols, canon.affine, False


def _same_values(ours: np.ndarray, ref: np.ndarray) -> bool:
    if ours.shape != ref.shape:
        return False
    if np.array_equal(ours, ref):
        return True
    # dcm2niix may rescale (e.g. Philips private scale slope): equal up to a linear map.
    a = np.vstack([ours.ravel(), np.ones(ours.size)]).T
    coef, *_ = np.linalg.lstsq(a, ref.ravel(), rcond=None)
    resid = np.abs(a @ coef - ref.ravel()).max()
    return bool(resid <= 1e-3 * max(1.0, float(np.abs(ref).max())) and abs(coef[0]) > 0)


@pytest.mark.parametrize(("ref_dir", "in_dir"), CASES)
def test_volumes_and_affines_match_dcm2niix(corpus: Path, ref_dir: str, in_dir: str) -> None:
    index = index_path(corpus / in_dir)
    ours = []
    for s in index.series:
        for v in range(len(s.volumes)):
            data = load_volume(s, v).data
            if s.affine is None:
                ours.append((s, v, data, None))
            else:
                canon = nib.as_closest_canonical(nib.Nifti1Image(data, np.array(s.affine)))
                ours.append((s, v, np.asanyarray(canon.dataobj), canon.affine))
    refs = sorted((corpus / ref_dir).glob("*.nii"))
    assert refs
    for nii in refs:
        vols, ref_affine, no_geometry = _ref_volumes(nii)
        matched = 0
        for ref_vol in vols:
            for s, _v, data, affine in ours:
                if no_geometry:
                    # dcm2niix had no geometry either (secondary capture): it stores rows flipped.
                    if affine is None and np.array_equal(np.flip(data, 1), ref_vol):
                        matched += 1
                        break
                    continue
                if affine is None or not _same_values(data, ref_vol):
                    continue
                tol = 0.01 + IPP_ROUNDING_MM * data.shape[2]
                diff = np.abs(affine - ref_affine).max()
                assert diff <= tol, f"{nii.name} vs series {s.key}: affine differs by {diff:.4f} mm"
                matched += 1
                break
        # Several inputs hold only the first volume of a longer run; every input volume must match.
        assert matched >= 1, f"{nii.name}: no indexed volume equals the dcm2niix reference"
        if len(vols) > 1:
            n_ours = sum(
                1
                for s, *_ in ours
                if Path(s.path).name in nii.stem or nii.stem.startswith(Path(s.path).name)
            )
            assert matched == len(vols) or matched >= min(len(vols), n_ours), nii.name


def test_slice_order_follows_position_not_file_names(corpus: Path, tmp_path: Path) -> None:
    import shutil

    src = corpus / "brainix/BRAINIX/DICOM/T1"
    files = sorted(src.iterdir())
    for i, f in enumerate(reversed(files)):  # names now run against the anatomy
        shutil.copy(f, tmp_path / f"slice_{i:03d}.dcm")
    a = index_path(src).series[0]
    b = index_path(tmp_path).series[0]
    assert a.affine == b.affine
    assert np.array_equal(load_volume(a).data, load_volume(b).data)


def test_gap_in_slices_is_reported(corpus: Path, tmp_path: Path) -> None:
    import shutil

    files = sorted((corpus / "brainix/BRAINIX/DICOM/T2").iterdir())
    for f in files[:10] + files[12:]:
        shutil.copy(f, tmp_path / f.name)
    s = index_path(tmp_path).series[0]
    assert not s.slice_spacing_uniform
    assert len(s.slice_gaps) == 1 and "gap" in s.slice_gaps[0]
    assert s.shape[2] == 20
