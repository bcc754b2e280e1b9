"""Two series of one study with the same SeriesNumber and class (Siemens XA30 writes its three
perfusion series as 19001) render to two files: one never overwrites the other, and every
recorded sha256 is the file's (a collision made the gateway's model call fail with 'image
changed since the dataset was loaded')."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pydicom
from gateway_synth import make_study
from pydicom.uid import generate_uid

from dicom import RenderOptions, render_path


def test_series_sharing_a_number_and_class_render_to_distinct_files(tmp_path: Path) -> None:
    study = make_study(tmp_path / "study" / "a", classes=("FLAIR",), n_slices=6)
    copy = tmp_path / "study" / "b"
    copy.mkdir()
    uid = generate_uid()
    for i, p in enumerate(study.files):  # same number and class, other pixels
        ds = pydicom.dcmread(p)
        ds.SeriesInstanceUID, ds.SOPInstanceUID = uid, generate_uid()
        ds.PixelData = bytes(b // 2 for b in ds.PixelData)
        ds.save_as(copy / f"{i}.dcm", enforce_file_format=True)
    manifest = render_path(tmp_path / "study", tmp_path / "out", RenderOptions(n_slices=4))
    files = [i.file for i in manifest.images]
    assert len(files) == 2 and len(set(files)) == 2, files
    for img in manifest.images:
        data = (tmp_path / "out" / img.file).read_bytes()
        assert hashlib.sha256(data).hexdigest() == img.sha256, img.file
