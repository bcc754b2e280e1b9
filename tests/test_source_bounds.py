"""Archives, compressed files and degenerate headers are bounded (issue 22, hostile input).

A compressed member is inflated as a stream and refused past the memory cap; a header read
inflates only the head of a member; an archive's directory is read once, however many members
it holds; and the work of parsing one header is bounded, so that a DICM preamble followed by
zeros is a per-file error, not minutes of parsing."""

from __future__ import annotations

import gzip
import io
import json
import zipfile
from pathlib import Path

import pydicom
import pytest
from pydicom.uid import generate_uid

from dicom import index_path
from dicom.headers.read import read_frames
from tests import hostile
from tests.gateway_synth import make_study
from tests.guard import ANSWER_S, CLI, RSS_MARGIN, run_guarded
from tests.hostile import CAP, MiB, break_zip_directory, gzip_bomb, zeros_member

good_study = hostile.good_study  # the shared good study (a module-scoped fixture)


def _inspect(path: Path) -> tuple[list[dict], float, int]:
    got = run_guarded(
        [CLI, "inspect", str(path), "--json"], env={"NEUROSANDBOX_MEMORY_CAP": str(CAP)}
    )
    assert got.returncode in (0, 1), got.stderr[-2000:]
    assert got.seconds < ANSWER_S
    assert got.peak_rss < CAP + RSS_MARGIN, f"peak RSS {got.peak_rss / MiB:.0f} MiB"
    return json.loads(got.stdout), got.seconds, got.peak_rss


def _errors(rows: list[dict]) -> dict[str, str]:
    return {r["path"]: " ".join(r["errors"]) for r in rows if r.get("class") == "ERROR"}


def test_zip_member_that_inflates_past_the_cap_is_a_per_file_error(
    tmp_path: Path, good_study: list[Path]
) -> None:
    archive = tmp_path / "bomb.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for f in good_study:
            zf.write(f, f"good/{f.name}")
        # A DICM preamble followed by 1 GiB of zeros: about 1 MB on disk.
        zeros_member(zf, "bomb.dcm", 1 << 30, head=bytes(128) + b"DICM")
    assert archive.stat().st_size < 4 * MiB
    rows, _, _ = _inspect(archive)
    errors = _errors(rows)
    assert list(errors) == [f"{archive}::bomb.dcm"], errors
    series = [r for r in rows if r.get("class") != "ERROR"]
    assert sum(r["n_files"] for r in series) == len(good_study)


def test_gzip_that_inflates_to_gigabytes_is_refused_at_the_cap(
    tmp_path: Path, good_study: list[Path]
) -> None:
    folder = tmp_path / "study"
    folder.mkdir()
    for f in good_study:
        (folder / f.name).write_bytes(f.read_bytes())
    # A valid header whose file goes on with 2 GiB of zeros: gzip members concatenated.
    ds = pydicom.dcmread(good_study[-1])
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.InstanceNumber = len(good_study) + 1
    ds.ImagePositionPatient = [*ds.ImagePositionPatient[:2], ds.ImagePositionPatient[2] + 5.0]
    raw = io.BytesIO()
    ds.save_as(raw, enforce_file_format=True)
    bomb = folder / "bomb.dcm.gz"
    bomb.write_bytes(gzip_bomb(raw.getvalue()))
    assert bomb.stat().st_size < 4 * MiB
    got = run_guarded(
        [CLI, "render", str(folder), "--out", str(tmp_path / "out")],
        env={"NEUROSANDBOX_MEMORY_CAP": str(CAP)},
    )
    assert got.seconds < ANSWER_S
    assert got.peak_rss < CAP + RSS_MARGIN, f"peak RSS {got.peak_rss / MiB:.0f} MiB"
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    text = json.dumps(manifest)
    assert "bomb.dcm.gz" in text and "cap" in text, text[:2000]
    assert list((tmp_path / "out").glob("*.png")), "the good series beside the bomb renders"


def test_an_archive_directory_is_read_once_for_all_members(
    tmp_path: Path, good_study: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "many.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as zf:
        for f in good_study:
            zf.write(f, f"good/{f.name}")
        for k in range(300):
            zf.writestr(f"junk/{k:05d}.txt.dcm", b"not dicom")
    opened: list[str] = []
    real_init = zipfile.ZipFile.__init__

    def counting_init(self: zipfile.ZipFile, file: object, *args: object, **kw: object) -> None:
        opened.append(str(file))
        real_init(self, file, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(zipfile.ZipFile, "__init__", counting_init)
    result = index_path(archive, workers=1)
    assert result.n_files == len(good_study) + 300
    assert sum(len(s.volumes[0]) for s in result.series if s.volumes) == len(good_study)
    assert len(opened) <= 2, f"the archive's directory was read {len(opened)} times"


def test_an_archive_with_too_many_members_is_one_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dicom import sources

    archive = tmp_path / "swarm.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as zf:
        for k in range(50):
            zf.writestr(f"{k:05d}.dcm", b"x")
    monkeypatch.setattr(sources, "MAX_MEMBERS", 20)
    srcs = list(sources.iter_sources(archive))
    assert len(srcs) == 1
    with pytest.raises(OSError, match="50 members, over the 20"):
        sources.open_source(srcs[0])


def test_a_corrupt_archive_in_a_folder_does_not_stop_the_walk(
    tmp_path: Path, good_study: list[Path]
) -> None:
    for f in good_study:
        (tmp_path / f.name).write_bytes(f.read_bytes())
    archive = tmp_path / "broken.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("a.dcm", b"x" * 1000)
    break_zip_directory(archive)
    result = index_path(tmp_path, workers=1)
    assert sum(len(s.volumes[0]) for s in result.series if s.volumes) == len(good_study)
    assert [e.path for e in result.errors] == [f"{archive}::"]
    assert "zip" in result.errors[0].message


def test_a_dicm_preamble_followed_by_zeros_is_a_bounded_per_file_error(tmp_path: Path) -> None:
    path = tmp_path / "zeros.dcm"
    path.write_bytes(bytes(128) + b"DICM" + bytes(64 * MiB))
    with pytest.raises(Exception, match="work bound") as err:
        read_frames(str(path))
    assert "elements" in str(err.value)


def test_an_archive_is_read_by_the_folder_rules_gzip_members_and_sidecars(
    tmp_path: Path, good_study: list[Path]
) -> None:
    """A zip of an export as it sits on disk (gzipped slices, NIfTI and JSON sidecars beside
    them, as in the corpus's XA30 study) indexes as the folder does: same slices, no errors."""
    folder = tmp_path / "export"
    folder.mkdir()
    for f in good_study:
        (folder / f"{f.name}.gz").write_bytes(gzip.compress(f.read_bytes()))
    (folder / "series.json").write_text("{}")
    (folder / "series.nii").write_bytes(b"\0" * 352)
    (folder / "dwi.bval").write_text("0 1000")
    archive = tmp_path / "export.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(folder.iterdir()):
            zf.write(f, f"export/{f.name}")
    from_folder, from_zip = index_path(folder, workers=1), index_path(archive, workers=1)
    assert not from_folder.errors and not from_zip.errors, from_zip.errors[:3]
    slices = [sum(len(v) for v in s.volumes) for s in from_zip.series]
    assert (
        slices == [sum(len(v) for v in s.volumes) for s in from_folder.series] == [len(good_study)]
    )


def test_a_members_folder_is_its_folder_inside_the_archive() -> None:
    from dicom.sources import source_folder

    assert source_folder("/d/a.zip::study/sr/1.dcm") == "/d/a.zip::study/sr"
    assert source_folder("/d/a.zip::1.dcm") == "/d/a.zip"
    assert source_folder("/d/study/1.dcm") == "/d/study"


def test_a_header_of_millions_of_tiny_elements_is_bounded_too(tmp_path: Path) -> None:
    """Another member of the class: valid, repeated private elements rather than zeros."""
    ds = pydicom.dcmread(make_study(tmp_path / "s", classes=("FLAIR",), n_slices=1).files[0])
    raw = io.BytesIO()
    del ds.PixelData
    ds.save_as(raw, enforce_file_format=True)
    path = tmp_path / "many.dcm"
    path.write_bytes(raw.getvalue() + b"\x09\x00\x10\x10LO\x02\x00ab" * 3_000_000)
    with pytest.raises(Exception, match="work bound"):
        read_frames(str(path))
