"""Hostile input, class by class (issue 22): every adversarial file is answered (a result or a
specific per-file error) within 30 s, with peak RSS under the memory cap plus 300 MB, and the good
study beside it is still rendered.

Each class is one folder: a good 4-slice FLAIR series and the class's hostile inputs. The
folder goes through `neurosandbox inspect --json` (every file accounted for: in a series or a
per-file error) and `neurosandbox render` (the good series' montage written, nothing written
outside the output folder, no shell command run from a name), as guarded child processes.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import socket
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

import pydicom
import pytest
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence
from pydicom.uid import generate_uid

from dicom.sources import iter_sources
from tests import hostile
from tests.guard import ANSWER_S, CLI, RSS_MARGIN, run_guarded
from tests.hostile import CAP, MiB, break_zip_directory, gzip_bomb, zeros_member

Maker = Callable[[Path, Path], None]  # (folder to write into, a good slice to start from)

good_study = hostile.good_study  # the shared good study (a module-scoped fixture)


def _load(good: Path) -> Dataset:
    return pydicom.dcmread(good)


def _save(ds: Dataset, path: Path, *, new_uid: bool = True) -> bytes:
    if new_uid:
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


def _series(folder: Path, good: Path, name: str, edit: Callable[[Dataset, int], None]) -> None:
    """A 4-slice series of its own (geometry is judged per stack), each slice edited."""
    uid = generate_uid()
    for k in range(4):
        ds = _load(good)
        ds.SeriesInstanceUID = uid
        ds.SeriesNumber = 90
        ds.InstanceNumber = k + 1
        ds.ImagePositionPatient = [-94.5, -94.5, -20.0 + 5.0 * k]
        edit(ds, k)
        _save(ds, folder / f"{name}_{k}.dcm")


def _patch(data: bytes, marker: bytes, new: bytes, after: int = 0) -> bytes:
    at = data.index(marker) + len(marker) + after
    return data[:at] + new + data[at + len(new) :]


# --- archives ---------------------------------------------------------------------------------


def _zip_bomb(folder: Path, good: Path) -> None:
    with zipfile.ZipFile(folder / "bomb.zip", "w") as zf:
        zeros_member(zf, "bomb.dcm", 1 << 30, head=bytes(128) + b"DICM")  # about 1 MB deflated


def _gzip_bomb(folder: Path, good: Path) -> None:
    ds = _load(good)
    ds.SeriesInstanceUID = generate_uid()
    head = _save(ds, folder / "tmp.dcm")
    (folder / "tmp.dcm").unlink()
    (folder / "bomb.dcm.gz").write_bytes(gzip_bomb(head))


def _zip_swarm(folder: Path, good: Path) -> None:
    with zipfile.ZipFile(folder / "swarm.zip", "w", zipfile.ZIP_STORED) as zf:
        for k in range(3000):
            zf.writestr(f"m/{k:05d}.dcm", b"x" * 16)


def _zip_broken_directory(folder: Path, good: Path) -> None:
    path = folder / "broken.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("a.dcm", good.read_bytes())
    break_zip_directory(path)


def _zip_odd_members(folder: Path, good: Path) -> None:
    path = folder / "odd.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("../../../../tmp/escape.dcm", b"x" * 100)  # a name that climbs out
        zf.writestr("method.dcm", good.read_bytes())
        zf.writestr("nested.zip", b"PK\x03\x04" + b"\0" * 100)
    data = bytearray(path.read_bytes())
    # Mark "method.dcm" as compressed with an unknown method (99) in both headers.
    for sig, off in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):
        pos = 0
        while (pos := data.find(sig, pos)) >= 0:
            name_at = pos + (30 if sig == b"PK\x03\x04" else 46)
            if data[name_at : name_at + 10] == b"method.dcm":
                data[pos + off : pos + off + 2] = struct.pack("<H", 99)
            pos += 4
    path.write_bytes(bytes(data))


def _gzip_truncated(folder: Path, good: Path) -> None:
    data = gzip.compress(good.read_bytes())
    (folder / "cut.dcm.gz").write_bytes(data[: len(data) // 2])
    (folder / "notgzip.dcm.gz").write_bytes(b"this is not gzip at all")


# --- truncations ------------------------------------------------------------------------------


def _truncations(folder: Path, good: Path) -> None:
    data = good.read_bytes()
    ds = _load(good)
    pixel_at = data.index(b"\xe0\x7f\x10\x00")
    for name, n in (
        ("empty", 0),
        ("ten_bytes", 10),
        ("preamble_only", 132),
        ("in_meta", 150),
        ("in_dataset", 600),
        ("at_pixel_tag", pixel_at + 2),
        ("half_pixels", pixel_at + 12 + (len(data) - pixel_at) // 2),
        ("one_byte_short", len(data) - 1),
    ):
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
        buf = io.BytesIO()
        ds.save_as(buf, enforce_file_format=True)
        (folder / f"{name}.dcm").write_bytes(buf.getvalue()[:n])


# --- wrong VR lengths -------------------------------------------------------------------------


def _wrong_lengths(folder: Path, good: Path) -> None:
    def variant(name: str, fix: Callable[[bytes], bytes]) -> None:
        ds = _load(good)
        ds.SeriesInstanceUID = generate_uid()
        data = _save(ds, folder / f"{name}.dcm")
        (folder / f"{name}.dcm").write_bytes(fix(data))

    # SeriesDescription (0008,103E) LO: length 0xFFFF, then odd; Rows (0028,0010) US length 3;
    # PixelSpacing (0028,0030) DS length past the end of the file; an unknown VR.
    variant("lo_huge", lambda d: _patch(d, b"\x08\x00\x3e\x10LO", b"\xff\xff"))
    variant("lo_odd", lambda d: _patch(d, b"\x08\x00\x3e\x10LO", b"\x07\x00"))
    variant("us_three", lambda d: _patch(d, b"\x28\x00\x10\x00US", b"\x03\x00"))
    variant("ds_past_end", lambda d: _patch(d, b"\x28\x00\x30\x00DS", b"\xf0\xff"))
    variant("unknown_vr", lambda d: _patch(d, b"\x08\x00\x3e\x10", b"ZZ"))
    variant("pixel_len_4g", lambda d: _patch(d, b"\xe0\x7f\x10\x00OW\x00\x00", b"\xf0\xff\xff\xff"))
    # Columns (0028,0011) as an undefined-length (0xFFFF...) long-form element: VR UN.
    variant("us_as_un", lambda d: _patch(d, b"\x28\x00\x11\x00", b"UN\x00\x00\xff\xff\xff\xff"))


# --- allocation bombs -------------------------------------------------------------------------


def _allocation_bombs(folder: Path, good: Path) -> None:
    def one(name: str, edit: Callable[[Dataset], None]) -> None:
        ds = _load(good)
        ds.SeriesInstanceUID = generate_uid()
        edit(ds)
        _save(ds, folder / f"{name}.dcm")

    def huge_grid(ds: Dataset) -> None:
        ds.Rows = ds.Columns = 65535

    def frames(ds: Dataset) -> None:
        ds.NumberOfFrames = 2**31 - 1

    def wide(ds: Dataset) -> None:
        ds.BitsAllocated, ds.BitsStored, ds.HighBit = 64, 64, 63
        ds.SamplesPerPixel = 3
        ds.PhotometricInterpretation = "RGB"
        ds.Rows = ds.Columns = 30000

    def zero(ds: Dataset) -> None:
        ds.Rows = 0

    def many_frames(ds: Dataset) -> None:
        ds.NumberOfFrames = 100_000
        ds.Rows = ds.Columns = 512

    def private_blob(ds: Dataset) -> None:
        ds.add_new(0x00091010, "OB", bytes(32 * MiB))  # a large value before the pixels

    for name, edit in (("grid_65535", huge_grid), ("frames_2g", frames), ("rgb64", wide),
                       ("rows_0", zero), ("private_32m", private_blob),
                       ("frames_100k", many_frames)):  # fmt: skip
        one(name, edit)


# --- deep nesting -----------------------------------------------------------------------------


def _deep_nesting(folder: Path, good: Path) -> None:
    # Written by hand: pydicom itself runs out of memory writing a sequence 400 deep.
    for depth in (50, 400, 3000, 20_000, 200_000):
        _raw_nesting(folder / f"nested_{depth}.dcm", good, depth)
    ds = _load(good)
    ds.SeriesInstanceUID = generate_uid()
    ds.ReferencedImageSequence = Sequence([Dataset() for _ in range(100_000)])
    _save(ds, folder / "wide_sequence.dcm")


def _raw_nesting(path: Path, good: Path, depth: int) -> None:
    """Undefined-length sequences nested ``depth`` deep, written by hand after the file meta."""
    ds = _load(good)
    ds.SeriesInstanceUID = generate_uid()
    data = _save(ds, path)
    seq_open = b"\x40\x00\x30\xa7SQ\x00\x00\xff\xff\xff\xff" + b"\xfe\xff\x00\xe0\xff\xff\xff\xff"
    seq_close = b"\xfe\xff\x0d\xe0\x00\x00\x00\x00" + b"\xfe\xff\xdd\xe0\x00\x00\x00\x00"
    at = data.index(b"\x08\x00\x05\x00")  # SpecificCharacterSet: the dataset's first element
    path.write_bytes(data[:at] + seq_open * depth + seq_close * depth + data[at:])


# --- bad character sets -----------------------------------------------------------------------


def _bad_charsets(folder: Path, good: Path) -> None:
    def one(name: str, charset: str, description: bytes, pn: bytes) -> None:
        ds = _load(good)
        ds.SeriesInstanceUID = generate_uid()
        data = _save(ds, folder / f"{name}.dcm")
        ds = pydicom.dcmread(io.BytesIO(data))
        ds.SpecificCharacterSet = charset
        ds[0x0008103E].value = description
        ds[0x00100010].value = pn
        _save(ds, folder / f"{name}.dcm", new_uid=False)

    one("unknown_charset", "ISO 2022 IR 999", b"AX FLAIR", b"Doe^John")
    one("utf8_invalid", "ISO_IR 192", b"AX \xff\xfe FLAIR", b"Do\xc3e^J\xff")
    one("escapes", "ISO 2022 IR 87", b"\x1b$B\x1b(J\x1b$)C AX", b"\x1b$B\x30\x21\x1b(B")
    one("ansi_html", "ISO_IR 100", b"\x1b[2J<script>alert(1)</script>\x07", b"<b>x</b>^\x00y")
    one("two_charsets", "ISO 2022 IR 100\\ISO 2022 IR 999\\GARBAGE", b"T2 \xe9", b"=^=^=")
    one("thai_random", "ISO_IR 166", bytes(range(128, 256)), bytes(range(160, 200)))


# --- special files ----------------------------------------------------------------------------


def _special_files(folder: Path, good: Path) -> None:
    os.mkfifo(folder / "pipe.dcm")
    (folder / "zero.dcm").symlink_to("/dev/zero")
    (folder / "random.dcm").symlink_to("/dev/urandom")
    (folder / "dangling.dcm").symlink_to(folder / "nowhere")
    (folder / "loop.dcm").symlink_to(folder / "loop.dcm")
    (folder / "dirloop").mkdir()
    (folder / "dirloop" / "up").symlink_to(folder, target_is_directory=True)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(folder / "sock.dcm"))
    sock.close()


# --- broken geometry --------------------------------------------------------------------------


def _broken_geometry(folder: Path, good: Path) -> None:
    def spacing_zero(ds: Dataset, k: int) -> None:
        ds.PixelSpacing = [0, 0]

    def iop_zero(ds: Dataset, k: int) -> None:
        ds.ImageOrientationPatient = [0, 0, 0, 0, 0, 0]

    def iop_parallel(ds: Dataset, k: int) -> None:
        ds.ImageOrientationPatient = [1, 0, 0, 1, 0, 0]

    def ipp_nan(ds: Dataset, k: int) -> None:
        ds[0x00200032].value = ["nan", "0", str(k)] if k == 2 else ds.ImagePositionPatient

    def iop_short(ds: Dataset, k: int) -> None:
        ds[0x00200037].value = ["1", "0", "0", "0", "1"]

    def same_position(ds: Dataset, k: int) -> None:
        ds.ImagePositionPatient = [0.0, 0.0, 1e308]

    def spacing_huge(ds: Dataset, k: int) -> None:
        ds.PixelSpacing = [-1e300, 1e-300]

    for name, edit in (("spacing_zero", spacing_zero), ("iop_zero", iop_zero),
                       ("iop_parallel", iop_parallel), ("ipp_nan", ipp_nan),
                       ("iop_short", iop_short), ("same_position", same_position),
                       ("spacing_huge", spacing_huge)):  # fmt: skip
        _series(folder, good, name, edit)


# --- shell metacharacters in names ------------------------------------------------------------


def _shell_names(folder: Path, good: Path) -> None:
    names = ["$(touch PWNED).dcm", "`touch PWNED`.dcm", "a;touch PWNED;.dcm", "-rf --help.dcm",
             "line\nbreak.dcm", "quote'\"<x>.dcm", "sp ace & pipe |.dcm", ">redirect.dcm"]  # fmt: skip
    for k, name in enumerate(names):
        ds = _load(good)
        ds.SeriesInstanceUID = generate_uid()
        ds.SeriesNumber = 70 + k
        ds.SeriesDescription = ["../../../../tmp/PWNED", "$(touch PWNED)", "a/b\\c:d*?",
                                "`id`", "..", "x" * 64, "a|b&c>d", "~/.ssh/id"][k]  # fmt: skip
        _save(ds, folder / name)


CLASSES: dict[str, tuple[Maker, ...]] = {
    "archives": (
        _zip_bomb,
        _gzip_bomb,
        _zip_swarm,
        _zip_broken_directory,
        _zip_odd_members,
        _gzip_truncated,
    ),
    "truncations": (_truncations,),
    "wrong_vr_lengths": (_wrong_lengths,),
    "allocation_bombs": (_allocation_bombs,),
    "deep_nesting": (_deep_nesting,),
    "bad_charsets": (_bad_charsets,),
    "special_files": (_special_files,),
    "broken_geometry": (_broken_geometry,),
    "shell_names": (_shell_names,),
}


def _inputs(folder: Path) -> list[str]:
    return [s for s in iter_sources(folder) if "/good/" not in s]


def _env() -> dict[str, str]:
    return {"NEUROSANDBOX_MEMORY_CAP": str(CAP)}


TRIED: dict[str, int] = {}


@pytest.mark.parametrize("name", list(CLASSES))
def test_hostile_class_is_answered_within_bounds_and_the_good_study_renders(
    name: str, good_study: list[Path], tmp_path: Path
) -> None:
    root = tmp_path / "in"
    (root / "good").mkdir(parents=True)
    (root / "hostile").mkdir()
    for f in good_study:
        (root / "good" / f.name).write_bytes(f.read_bytes())
    for make in CLASSES[name]:
        make(root / "hostile", good_study[0])
    hostile = _inputs(root)
    assert len(hostile) >= 4, hostile
    TRIED[name] = len(hostile)
    work = tmp_path / "work"
    work.mkdir()

    got = run_guarded([CLI, "inspect", str(root), "--json"], env=_env())
    assert got.returncode in (0, 1), got.stderr[-3000:]
    assert got.seconds < ANSWER_S and got.peak_rss < CAP + RSS_MARGIN, (got.seconds, got.peak_rss)
    rows = json.loads(got.stdout)
    errors = {r["path"] for r in rows if r.get("class") == "ERROR"}
    in_series = sum(r["n_files"] for r in rows if r.get("class") != "ERROR")
    assert in_series + len(errors) == len(hostile) + len(good_study), (in_series, errors)
    for r in rows:
        if r.get("class") == "ERROR":
            assert r["errors"] and r["errors"][0].strip(), r  # a specific message, never empty

    out = tmp_path / "out"
    got = run_guarded([CLI, "render", str(root), "--out", str(out)], env=_env())
    assert got.returncode == 0, got.stderr[-3000:] + got.stdout[-3000:]
    assert got.seconds < ANSWER_S and got.peak_rss < CAP + RSS_MARGIN, (got.seconds, got.peak_rss)
    manifest = json.loads((out / "manifest.json").read_text())
    good_uid = pydicom.dcmread(good_study[0], stop_before_pixels=True).SeriesInstanceUID
    montage = [i for i in manifest["images"] if i["series_uid"] == good_uid]
    assert montage and (out / montage[0]["file"]).stat().st_size > 1000
    for written in out.rglob("*"):
        assert written.resolve().is_relative_to(out.resolve())
    for place in (Path.cwd(), tmp_path, root, root / "hostile", out, Path("/tmp")):
        assert not (place / "PWNED").exists(), f"a name ran as a shell command in {place}"
    assert not Path("/tmp/escape.dcm").exists()


def _count_inputs(folder: Path) -> int:
    """Top-level entries; a series of its own (NAME_k.dcm) counts once, an archive once."""
    return len({re.sub(r"_\d\.dcm$", "", p.name) for p in folder.iterdir()})


def test_at_least_sixty_hostile_inputs_four_per_class(
    good_study: list[Path], tmp_path: Path
) -> None:
    per_class = {}
    for name, makers in CLASSES.items():
        folder = tmp_path / name
        folder.mkdir()
        n = 0
        for make in makers:
            if make is _zip_bomb or make is _gzip_bomb:
                n += 1  # one input each; not written twice
                continue
            make(folder, good_study[0])
        per_class[name] = n + _count_inputs(folder)
    assert min(per_class.values()) >= 4, per_class
    assert sum(per_class.values()) >= 60, per_class
