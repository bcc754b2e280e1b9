"""Broken geometry in one stack never stops its neighbours, and the sign of PixelSpacing never
decides orientation: a stack with PixelSpacing 0\\0 or an all-zero ImageOrientationPatient is a
per-stack error (the good series beside it render and are evaluated); a negative PixelSpacing
is read as its absolute value, with a warning, and the image is drawn the right way round
(checked by pixels: a marker on the patient's left-anterior is at the image's top right)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pydicom
import pytest
from gateway_synth import make_study
from PIL import Image
from pydicom.uid import generate_uid

from dicom import RenderOptions, index_path, render_path

BROKEN = {
    "zero_spacing": {"PixelSpacing": [0, 0]},
    "zero_orientation": {"ImageOrientationPatient": [0, 0, 0, 0, 0, 0]},
    "parallel_orientation": {"ImageOrientationPatient": [1, 0, 0, 1, 0, 0]},
    "scaled_orientation": {"ImageOrientationPatient": [0.1, 0, 0, 0, 0.1, 0]},
}


def _variant(files: list[Path], out: Path, marker: bool = False, **attrs: object) -> str:
    """A copy of one series with ``attrs`` set (no validation: as a scanner wrote it)."""
    out.mkdir(parents=True)
    uid = generate_uid()
    with pydicom.config.disable_value_validation():
        for i, p in enumerate(files):
            ds = pydicom.dcmread(p)
            ds.SeriesInstanceUID, ds.SOPInstanceUID = uid, generate_uid()
            ds.SeriesDescription, ds.SeriesNumber = out.name, 50 + i // 1000
            if marker:  # columns run to the patient's left, rows to posterior (IOP 1,0,0,0,1,0)
                px = ds.pixel_array.copy()
                px[:] = np.minimum(px, 600)
                px[4:12, -12:-4] = 3000  # left-anterior corner
                ds.PixelData = px.astype(np.uint16).tobytes()
            for k, v in attrs.items():
                setattr(ds, k, v)
            ds.save_as(out / f"{i:03d}.dcm", enforce_file_format=True)
    return uid


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_broken_stack_is_a_per_stack_error_and_its_neighbours_render(
    tmp_path: Path, kind: str
) -> None:
    study = make_study(tmp_path / "study" / "good", classes=("FLAIR", "T2"), n_slices=6)
    flair = [p for p in study.files if p.name.startswith("FLAIR")]
    bad = _variant(flair, tmp_path / "study" / kind, **BROKEN[kind])
    index = index_path(tmp_path / "study")
    broken = [s for s in index.series if s.series_uid == bad]
    assert broken and broken[0].errors and "geometry" in {e.kind for e in broken[0].errors}
    manifest = render_path(tmp_path / "study", tmp_path / "out", RenderOptions(n_slices=4))
    rendered = {i.series_uid for i in manifest.images}
    assert set(study.series_uids.values()) <= rendered  # the good series beside it
    assert bad not in rendered
    assert any(bad in e.message or kind in e.path for e in manifest.errors), manifest.errors


def _marker_at(png: Path) -> tuple[float, float]:
    """Where the bright marker is, as fractions of width and height (0,0 = top left)."""
    im = np.asarray(Image.open(io.BytesIO(png.read_bytes())).convert("L"), dtype=float)
    h, w = im.shape
    core = im[int(h * 0.08) : int(h * 0.92), int(w * 0.08) : int(w * 0.92)]  # not the labels
    ys, xs = np.nonzero(core >= core.max() - 1)
    return (xs.mean() + w * 0.08) / w, (ys.mean() + h * 0.08) / h


@pytest.mark.parametrize("spacing", [[3.0, 3.0], [-3.0, -3.0], [-3.0, 3.0]])
def test_orientation_comes_from_the_orientation_not_the_sign_of_the_spacing(
    tmp_path: Path, spacing: list[float]
) -> None:
    study = make_study(tmp_path / "src", classes=("T2",), n_slices=6, lesion=None)
    uid = _variant(study.files, tmp_path / "study" / "t2", marker=True, PixelSpacing=spacing)
    index = index_path(tmp_path / "study")
    (series,) = [s for s in index.series if s.series_uid == uid]
    assert not series.errors
    assert series.spacing[:2] == [3.0, 3.0]
    if min(spacing) < 0:
        assert any("PixelSpacing" in w for w in series.warnings), series.warnings
    # A window that keeps the marker (3000) above the tissue (at most 600): the brain window
    # would show both white, and this test is about where the marker is, not the window.
    options = RenderOptions(n_slices=1, montage=False, singles=True, window="1500/3000")
    manifest = render_path(tmp_path / "study", tmp_path / "out", options)
    (image,) = [i for i in manifest.images if i.series_uid == uid]
    assert "radiological" in image.orientation
    x, y = _marker_at(tmp_path / "out" / image.file)
    assert x > 0.6 and y < 0.4, (x, y)  # patient left on the image's right, anterior up
