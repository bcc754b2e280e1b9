"""Header values that make the pixels meaningless are a per-file error (issue 34).

A rescale that is not a finite number, or maps the stored range outside float32 or any real
intensity; BitsStored, HighBit or BitsAllocated that do not describe the stored bits; a
PixelRepresentation or PhotometricInterpretation the standard does not define; a pixel data
length that does not hold Rows x Columns x frames x samples x bits: each is reported for the
file that carries it, with the attribute and value named, and the rest of the series renders.
Before, RescaleSlope 1e308 rendered a blank montage and BitsStored > BitsAllocated noise, with
exit 0 and no word.

Every input is a real corpus file with one header value changed: BRAINIX's FLAIR (native, read
by the fast scanner), Comunix's JPEG 2000 head CT (read by pydicom) and Siemens' enhanced MR
(a rescale per frame in its functional groups).
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.dataelem import DataElement
from pydicom.dataset import Dataset

from dicom import RenderOptions, index_path, render_path
from tests.guard import CLI

Edit = Callable[[Dataset], None]


def _ds(tag: int, vr: str, value: object) -> Edit:
    def edit(ds: Dataset) -> None:
        ds[tag] = DataElement(tag, vr, value)

    return edit


def _set(**values: object) -> Edit:
    def edit(ds: Dataset) -> None:
        for keyword, value in values.items():
            setattr(ds, keyword, value)

    return edit


SLOPE, INTERCEPT = 0x00281053, 0x00281052

# file index in the 22-slice FLAIR -> (edit, words the error must contain)
FLAIR_DEFECTS: dict[int, tuple[Edit, tuple[str, ...]]] = {
    1: (_ds(SLOPE, "DS", "1e308"), ("RescaleSlope", "1e+308")),
    2: (_ds(SLOPE, "DS", "NaN"), ("RescaleSlope", "not a finite number")),
    3: (_ds(SLOPE, "DS", "0"), ("RescaleSlope", "0")),
    4: (_ds(INTERCEPT, "DS", "-inf"), ("RescaleIntercept", "not a finite number")),
    5: (_ds(INTERCEPT, "DS", "1e30"), ("RescaleIntercept",)),
    6: (_ds(SLOPE, "DS", "1e-300"), ("RescaleSlope",)),
    7: (_set(BitsStored=20), ("BitsStored 20", "BitsAllocated 16")),
    8: (_set(HighBit=15), ("HighBit 15", "BitsStored 12")),
    9: (_set(BitsAllocated=12), ("BitsAllocated 12",)),
    10: (_set(PixelRepresentation=2), ("PixelRepresentation 2",)),
    11: (_set(PhotometricInterpretation="RGB"), ("RGB", "SamplesPerPixel 1")),
    12: (_set(BitsAllocated=8, BitsStored=8, HighBit=7), ("pixel data",)),
    13: (_set(NumberOfFrames=40), ("pixel data", "40")),
    14: (_set(BitsStored=0), ("BitsStored 0",)),
    15: (_set(PhotometricInterpretation="BANANA"), ("PhotometricInterpretation",)),
    16: (_ds(SLOPE, "DS", "9.9"), ("RescaleSlope", "abc")),  # patched to 'abc' below
}


def _write(ds: Dataset, path: Path) -> None:
    buf = io.BytesIO()
    ds.save_as(buf)
    data = buf.getvalue()
    if b"9.9" in data and path.name.endswith("-0017.dcm"):
        data = data.replace(b"\x28\x00\x53\x10DS\x04\x009.9 ", b"\x28\x00\x53\x10DS\x04\x00abc ")
    path.write_bytes(data)


@pytest.fixture(scope="module")
def flair(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    """BRAINIX's FLAIR with one defect in each of 16 files; path -> defect number."""
    src = corpus / "brainix" / "BRAINIX" / "DICOM" / "FLAIR"
    folder = tmp_path_factory.mktemp("flair") / "FLAIR"
    shutil.copytree(src, folder)
    files = sorted(folder.iterdir())
    assert len(files) == 22
    bad: dict[str, int] = {}
    for k, (edit, _words) in FLAIR_DEFECTS.items():
        path = files[k]
        path.chmod(0o644)
        ds = pydicom.dcmread(path)
        edit(ds)
        _write(ds, path)
        bad[str(path)] = k
    return folder, bad


def test_each_meaningless_header_is_its_files_error_and_the_series_renders(
    flair: tuple[Path, dict[str, int]], tmp_path: Path
) -> None:
    folder, bad = flair
    index = index_path(folder)
    errors = {e.path: e for e in index.errors}
    wrong = []
    for path, k in bad.items():
        words = FLAIR_DEFECTS[k][1]
        err = errors.get(path)
        if err is None:
            wrong.append(f"defect {k}: not reported")
        elif err.kind != "invalid" or not all(w in err.message for w in words):
            wrong.append(f"defect {k}: {err.kind}: {err.message}")
    assert not wrong, "\n".join(wrong)
    assert set(errors) == set(bad), set(errors) - set(bad)
    (series,) = index.series
    assert series.n_files == 22 - len(bad)
    used = {r.path for vol in series.volumes for r in vol}
    assert not used & set(bad)

    manifest = render_path(folder, tmp_path, RenderOptions(n_slices=4))
    (montage,) = manifest.images
    assert {e.path for e in manifest.errors} == set(bad)
    grey = np.asarray(_png(tmp_path / montage.file))
    assert grey.std() > 20  # an image of a head, neither blank nor one grey


def _png(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as img:
        return np.asarray(img.convert("L"))


def test_the_fast_scanner_and_pydicom_give_the_same_error(
    flair: tuple[Path, dict[str, int]],
) -> None:
    from dicom.errors import InvalidImageError
    from dicom.headers import read_frames

    _folder, bad = flair
    for path in bad:
        messages = []
        for fast in (True, False):
            with pytest.raises(InvalidImageError) as info:
                read_frames(path, fast=fast)
            messages.append(str(info.value))
        assert messages[0] == messages[1]


def test_a_negative_or_zero_window_width_falls_back_to_the_data(
    corpus: Path, tmp_path: Path
) -> None:
    src = corpus / "brainix" / "BRAINIX" / "DICOM" / "FLAIR"
    folder = tmp_path / "FLAIR"
    shutil.copytree(src, folder)
    for path, width in zip(sorted(folder.iterdir())[:3], ("-400", "0", "NaN"), strict=True):
        path.chmod(0o644)
        ds = pydicom.dcmread(path)
        ds[0x00281051] = DataElement(0x00281051, "DS", width)
        _write(ds, path)
    from dicom.headers import read_frames

    for path in sorted(folder.iterdir())[:3]:
        for fast in (True, False):
            (frame,) = read_frames(str(path), fast=fast)
            assert frame.window is None, (path.name, fast, frame.window)
    index = index_path(folder)
    assert not index.errors and index.series[0].n_files == 22


@pytest.mark.parametrize(
    "edit, words",
    [
        (_ds(SLOPE, "DS", "NaN"), ("RescaleSlope", "not a finite number")),
        (_ds(SLOPE, "DS", "0.01"), ("RescaleSlope", "HU")),  # 41 HU from lowest to highest
        (_ds(SLOPE, "DS", "1000000"), ("RescaleSlope", "HU")),
        (_set(BitsStored=17), ("BitsStored 17", "BitsAllocated 16")),
    ],
    ids=["slope_nan", "slope_tiny", "slope_huge", "bits_stored"],
)
def test_a_compressed_ct_slice_with_a_meaningless_header_is_its_files_error(
    corpus: Path, tmp_path: Path, edit: Edit, words: tuple[str, ...]
) -> None:
    src = corpus / "hostile" / "Database" / "Comunix" / "Ct"
    folder = tmp_path / "Ct"
    shutil.copytree(src, folder)
    first, _second = sorted(folder.iterdir())
    first.chmod(0o644)
    ds = pydicom.dcmread(first)
    edit(ds)
    _write(ds, first)
    index = index_path(folder)
    (err,) = index.errors
    assert err.path == str(first) and err.kind == "invalid"
    assert all(w in err.message for w in words), err.message
    (series,) = index.series
    assert series.n_files == 1
    manifest = render_path(folder, tmp_path / "out", RenderOptions(n_slices=1))
    assert len(manifest.images) == 1


def test_an_enhanced_frame_with_a_meaningless_rescale_is_its_files_error(
    corpus: Path, tmp_path: Path
) -> None:
    src = corpus / "enhanced_mr" / "In" / "Siemens" / "XA10"
    folder = tmp_path / "XA10"
    shutil.copytree(src, folder)
    files = sorted(folder.iterdir())
    files[1].chmod(0o644)
    ds = pydicom.dcmread(files[1])
    item = ds.PerFrameFunctionalGroupsSequence[3].PixelValueTransformationSequence[0]
    item[SLOPE] = DataElement(SLOPE, "DS", "inf")
    _write(ds, files[1])
    index = index_path(folder)
    (err,) = index.errors
    assert err.path == str(files[1]) and "frame 4" in err.message, err.message
    assert "RescaleSlope" in err.message and "not a finite number" in err.message
    assert sum(s.n_files for s in index.series) == len(files) - 1


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )


def test_the_cli_reports_each_file_and_its_exit_code_says_what_rendered(
    flair: tuple[Path, dict[str, int]], tmp_path: Path
) -> None:
    folder, bad = flair
    got = _cli("inspect", folder, "--json")
    assert got.returncode == 0, got.stderr  # some of PATH read: 0, as docs/imaging.md says
    rows = json.loads(got.stdout)
    reported = {r["path"]: r for r in rows if r["class"] == "ERROR"}
    assert set(reported) == set(bad)
    assert all(r["kind"] == "invalid" and r["errors"][0] for r in reported.values())
    got = _cli("render", folder, "--out", tmp_path / "out", "--slices", "2")
    assert got.returncode == 0, got.stdout + got.stderr
    flat = " ".join((got.stdout + got.stderr).split())  # rich prints to stderr off a terminal
    assert flat.count("skipped:") == len(bad) and "RescaleSlope" in flat

    only_bad = tmp_path / "only_bad"
    only_bad.mkdir()
    for path in bad:
        shutil.copy(path, only_bad)
    got = _cli("inspect", only_bad, "--json")
    assert got.returncode == 1  # nothing under PATH could be read
    got = _cli("render", only_bad, "--out", tmp_path / "out2")
    assert got.returncode == 1 and "0 image(s)" in got.stdout + got.stderr


def test_a_window_of_width_zero_is_refused_with_the_reason(corpus: Path, tmp_path: Path) -> None:
    src = corpus / "brainix" / "BRAINIX" / "DICOM" / "FLAIR"
    manifest = render_path(src, tmp_path, RenderOptions(n_slices=2, window="40/0"))
    assert not manifest.images  # was a montage of one grey: every value divided by 0
    assert "must be more than 0" in manifest.errors[0].message
    got = _cli("render", src, "--out", tmp_path / "cli", "--window", "40/0.0")
    assert got.returncode == 1 and "must be more than 0" in got.stdout + got.stderr


def test_a_file_laid_out_otherwise_than_its_series_is_a_stack_of_its_own(
    corpus: Path, tmp_path: Path
) -> None:
    """Each stack is decoded with one layout (its first file's): an 8-bit file among 16-bit
    ones read the others' bytes as 8-bit values (noise) when it came first, or was read as
    16-bit past its own data when it did not."""
    src = corpus / "brainix" / "BRAINIX" / "DICOM" / "FLAIR"
    folder = tmp_path / "FLAIR"
    shutil.copytree(src, folder)
    first = sorted(folder.iterdir())[0]
    first.chmod(0o644)
    ds = pydicom.dcmread(first)
    pixels = ds.pixel_array
    ds.PixelData = (pixels >> 4).astype(np.uint8).tobytes()
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = 8, 8, 7
    ds["PixelData"].VR = "OB"
    _write(ds, first)
    index = index_path(folder)
    assert not index.errors
    by_files = sorted(((s.n_files, s.bits_allocated) for s in index.series), reverse=True)
    assert by_files == [(21, 16), (1, 8)]
    manifest = render_path(folder, tmp_path / "out", RenderOptions(n_slices=4))
    main = next(i for i in manifest.images if i.kind == "montage" and "8 of 8" not in i.label)
    assert _png(tmp_path / "out" / main.file).std() > 20
