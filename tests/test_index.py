"""Indexing the real corpus: classification conformance, stacks, bad input, archives."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from dicom.index import index_path
from dicom.pixels import load_volume
from dicom.records import IndexResult, SequenceClass
from dicom.sources import iter_sources


def _stacks_in(index: IndexResult, corpus: Path, folder: str) -> list:
    root = corpus / folder
    return [s for s in index.series if Path(s.path) == root or root in Path(s.path).parents]


def test_every_labelled_series_is_classified_as_labels_json_says(
    corpus: Path, corpus_index
) -> None:
    doc = json.loads((corpus / "labels.json").read_text())
    # Series the classifier now supports are checked like the rest (the shared file keeps them
    # under 'series_pending'): the UIH uMR 770 DTI (mosaics) and the inversion-prepared GRE T1.
    labels = {**doc["series"], **doc["series_pending"]}
    mismatches = []
    for folder, expected in labels.items():
        stacks = _stacks_in(corpus_index, corpus, folder)
        assert stacks, f"{folder}: no series found"
        for s in stacks:
            if s.series_class.value != expected["class"]:
                mismatches.append(f"{folder} stack {s.stack}: {s.series_class} ({s.reason})")
            if "plane" in expected and s.plane is not None and s.plane.value != expected["plane"]:
                mismatches.append(f"{folder}: plane {s.plane} != {expected['plane']}")
            if "plane" in expected and s.series_class is not SequenceClass.NON_IMAGE:
                assert s.plane is not None, f"{folder}: no plane"
            assert s.reason, f"{folder}: empty reason"
    assert not mismatches, "\n".join(mismatches)
    assert len(doc["series"]) == 23
    assert sorted(doc["series_pending"]) == [
        "uih_umr770/In/DTI_132225/dti_tra_dir16_PA_rot_SaveBySlc__134057",
        "uih_umr770/In/DTI_132225/t1_gre_fsp_3d_sag__132750",
    ]


def test_siemens_819_file_dwi_splits_into_b0_and_directions(corpus: Path, corpus_index) -> None:
    stacks = _stacks_in(corpus_index, corpus, "siemens_xa30/In/11001_DWI_dir80_AP")
    assert [s.b_values for s in stacks] == [[0.0], [2500.0]]
    b0, dw = stacks
    assert b0.shape == [72, 72, 39]
    assert dw.shape == [72, 72, 39, 20] and dw.n_directions == 20
    assert sum(len(v) for s in stacks for v in s.volumes) == 819
    assert all(s.series_class is SequenceClass.DWI for s in stacks)


def test_enhanced_philips_object_splits_by_echo_and_frame_type(corpus: Path, corpus_index) -> None:
    stacks = _stacks_in(corpus_index, corpus, "enhanced_mr/In/Philips")
    assert len(stacks) == 2
    assert {s.series_class for s in stacks} == {SequenceClass.FIELDMAP, SequenceClass.T1}
    assert all(s.shape == [64, 64, 32] for s in stacks)


def test_non_image_objects_are_reported_not_rendered(corpus: Path, corpus_index) -> None:
    raw = _stacks_in(corpus_index, corpus, "siemens_xa30/In/16_DWI_dir80_AP")
    assert raw and raw[0].series_class is SequenceClass.NON_IMAGE and not raw[0].renderable
    assert "Raw Data" in raw[0].reason
    sr = _stacks_in(corpus_index, corpus, "siemens_xa30/In/99_Phoenix_Document")
    assert sr[0].n_files == 7 and "SR" in sr[0].reason


def test_hostile_files_end_in_a_clear_error_or_a_result(corpus: Path) -> None:
    result = index_path(corpus / "hostile")
    by_name = {Path(e.path).name: e for e in result.errors}
    assert by_name["2026-05-26-oob-monochrome-46341.dcm"].kind == "too_large"
    assert by_name["2026-05-26-oob-monochrome-65535.dcm"].kind == "too_large"
    assert "memory cap" in by_name["2026-05-26-oob-monochrome-65535.dcm"].message
    assert by_name["2026-05-06-Deeply-Nested-Sequence.dcm"].kind == "unreadable"
    assert "nest" in by_name["2026-05-06-Deeply-Nested-Sequence.dcm"].message
    assert by_name["DummyCTInvalidRows.dcm"].kind == "invalid"
    # The rest of the folder is still indexed, and still decodes.
    ct = [s for s in result.series if s.path.endswith("Comunix/Ct")]
    assert ct and ct[0].series_class is SequenceClass.CT and ct[0].shape == [512, 512, 2]
    vol = load_volume(ct[0]).data
    assert vol.min() < -500 and vol.max() > 500  # Hounsfield units after the modality LUT
    # These Orthanc test objects carry no Pixel Data at all: a specific error, not a crash.
    for name in (
        "2017-06-27-XSSInjection.dcm",
        "DummyCT.dcm",
        "2020-09-12-ELSCINT1-PMSCT_RLE1.dcm",
    ):
        assert by_name[name].kind == "invalid" and "Pixel Data" in by_name[name].message
    assert len(result.errors) == 8


def test_memory_cap_is_configurable(corpus: Path) -> None:
    result = index_path(corpus / "brainix/BRAINIX/DICOM/T1", memory_cap=100_000)
    assert not result.series
    assert len(result.errors) == 22 and all(e.kind == "too_large" for e in result.errors)


def test_folder_with_a_non_dicom_file_reports_it_and_keeps_the_rest(
    corpus: Path, tmp_path: Path
) -> None:
    shutil.copytree(corpus / "brainix/BRAINIX/DICOM/FLAIR", tmp_path / "FLAIR")
    (tmp_path / "FLAIR" / "notes.bin").write_bytes(b"this is not dicom" * 10)
    truncated = tmp_path / "FLAIR" / "IM-0001-0003.dcm"
    truncated.write_bytes(truncated.read_bytes()[:2000])
    result = index_path(tmp_path)
    kinds = {Path(e.path).name: e.kind for e in result.errors}
    assert kinds["notes.bin"] == "not_dicom"
    assert "IM-0001-0003.dcm" in kinds
    assert result.series[0].series_class is SequenceClass.FLAIR
    assert result.series[0].shape == [288, 288, 21]


def test_zip_archive_and_single_file_inputs(corpus: Path, tmp_path: Path) -> None:
    archive = tmp_path / "study.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for f in sorted((corpus / "brainix/BRAINIX/DICOM/T2").iterdir()):
            zf.write(f, f"T2/{f.name}")
    from_zip = index_path(archive)
    from_dir = index_path(corpus / "brainix/BRAINIX/DICOM/T2")
    assert from_zip.series[0].affine == from_dir.series[0].affine
    assert from_zip.series[0].series_class is SequenceClass.T2
    a = load_volume(from_zip.series[0]).data
    b = load_volume(from_dir.series[0]).data
    assert np.array_equal(a, b)
    single = index_path(corpus / "brainix/BRAINIX/DICOM/T2/IM-0001-0005.dcm")
    assert single.series[0].shape == [512, 512, 1]


def test_every_transfer_syntax_decodes_to_the_uncompressed_pixels(corpus: Path) -> None:
    reference = None
    for i in range(1, 10):
        result = index_path(corpus / f"transfer_syntaxes/In/{i}.dcm")
        assert not result.errors, result.errors
        vol = load_volume(result.series[0]).data
        assert vol.shape == (64, 64, 35)  # a Siemens mosaic, cut into its 35 slices
        if reference is None:
            reference = vol
        assert np.array_equal(vol, reference), f"{i}.dcm decodes differently"


def test_parallel_and_serial_header_pass_agree(corpus: Path) -> None:
    # 819 files: enough for a forked worker to read half of them.
    folder = corpus / "siemens_xa30/In/11001_DWI_dir80_AP"
    serial = index_path(folder, workers=1)
    parallel = index_path(folder, workers=2)
    assert parallel == serial
    assert [s.shape for s in serial.series] == [[72, 72, 39], [72, 72, 39, 20]]


def test_folder_sources_are_named_as_pathlib_names_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # str(Path(folder) / name): "." and "./" vanish, a trailing slash goes, ".." stays.
    (tmp_path / "b" / "c").mkdir(parents=True)
    for name in ["a.dcm", "b/x", "b/c/y", "notes.txt", ".hidden", "LICENSE"]:
        (tmp_path / name).write_bytes(b"")
    with zipfile.ZipFile(tmp_path / "b" / "z.zip", "w") as zf:
        zf.writestr("m/1.dcm", b"")
    monkeypatch.chdir(tmp_path)
    inside = ["a.dcm", "b/x", "b/z.zip::m/1.dcm", "b/c/y"]
    cases = {
        str(tmp_path): [f"{tmp_path}/{n}" for n in inside],
        f"{tmp_path}/": [f"{tmp_path}/{n}" for n in inside],
        ".": inside,
        "./": inside,
        "./b/..": [f"b/../{n}" for n in inside],
        "b": ["b/x", "b/z.zip::m/1.dcm", "b/c/y"],
    }
    for root, want in cases.items():
        assert list(iter_sources(root)) == want, root
