"""Benchmark: indexing a zip archive of many members, against the same files as a folder.

A zip of N small single-frame MR slices (default 20,000: 200 series of 100 slices, 32x32,
deflated) is written to a temp dir once, and its files extracted beside it. Columns, wall clock
per repetition, in this process with forked header workers as the CLI uses them:

  archive   index_path(archive.zip): list the members, read every member's header.
  folder    index_path(folder): the same files already on disk (the peer: no archive at all).
  unzip     zipfile.extractall to a fresh folder, then index_path(folder): what a user would
            do by hand before the archive could be read directly.

Repetitions run interleaved after one untimed pass (page cache); each column reports its
median and the ratio archive / folder (1.0 = an archive costs nothing extra). Before issue 22
every member re-read the archive's directory (quadratic: 4,000 members 86 s, 20,000 > 240 s).
Run: .venv/bin/python bench/archive.py [--members 20000] [--reps 3]
"""

from __future__ import annotations

import argparse
import io
import shutil
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np
from pydicom.dataset import FileDataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, MRImageStorage, generate_uid

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dicom.headers.fast import clear_caches  # noqa: E402
from dicom.index import index_path  # noqa: E402


def _slice(study: str, series: str, number: int, k: int) -> bytes:
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = MRImageStorage
    meta.MediaStorageSOPInstanceUID = sop = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = FileDataset("x", {}, file_meta=meta, preamble=b"\0" * 128)
    ds.SOPClassUID, ds.SOPInstanceUID = MRImageStorage, sop
    ds.StudyInstanceUID, ds.SeriesInstanceUID = study, series
    ds.PatientID, ds.Modality, ds.SeriesNumber, ds.InstanceNumber = "BENCH", "MR", number, k + 1
    ds.SeriesDescription = "AX T2"
    ds.ImageType = ["ORIGINAL", "PRIMARY", "M", "NONE"]
    ds.ScanningSequence, ds.RepetitionTime, ds.EchoTime = "SE", 4000.0, 100.0
    ds.PixelSpacing, ds.SliceThickness = [1.0, 1.0], 1.0
    ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
    ds.ImagePositionPatient = [0.0, 0.0, float(k)]
    ds.Rows = ds.Columns = 32
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
    ds.PixelData = (np.full((32, 32), k, dtype=np.uint16)).tobytes()
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    return buf.getvalue()


def _write(tmp: Path, members: int) -> tuple[Path, Path]:
    archive, folder = tmp / "study.zip", tmp / "folder"
    study = generate_uid()
    per_series = 100
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for k in range(members):
            if k % per_series == 0:
                series = generate_uid()
            name = f"s{k // per_series:04d}/{k % per_series:03d}.dcm"
            zf.writestr(name, _slice(study, series, k // per_series + 1, k % per_series))
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(folder)
    return archive, folder


def _timed(fn: object) -> float:
    clear_caches()
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--members", type=int, default=20_000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        t0 = time.perf_counter()
        archive, folder = _write(tmp, args.members)
        print(f"wrote {args.members} members ({archive.stat().st_size / 2**20:.1f} MiB zip) in "
              f"{time.perf_counter() - t0:.1f} s")  # fmt: skip
        expected = index_path(folder)  # untimed pass: page cache
        got = index_path(archive)
        n_frames = sum(len(v) for s in got.series for v in s.volumes)
        assert n_frames == sum(len(v) for s in expected.series for v in s.volumes) == args.members
        assert not got.errors, got.errors[:3]

        def unzip_then_index() -> None:
            out = tmp / "unzipped"
            shutil.rmtree(out, ignore_errors=True)
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(out)
            index_path(out)

        cols: dict[str, list[float]] = {"archive": [], "folder": [], "unzip": []}
        for _ in range(args.reps):
            cols["archive"].append(_timed(lambda: index_path(archive)))
            cols["folder"].append(_timed(lambda: index_path(folder)))
            cols["unzip"].append(_timed(unzip_then_index))
        med = {k: statistics.median(v) for k, v in cols.items()}
        print(f"{args.members} members, {len(got.series)} series, median of {args.reps}:")
        for k, v in med.items():
            print(f"  {k:8s} {v:7.2f} s   ({args.members / v:8.0f} files/s)")
        print(f"ratio archive / folder: {med['archive'] / med['folder']:.2f} "
              f"(1.0 = reading from the archive costs nothing extra); "
              f"archive / unzip-then-index: {med['archive'] / med['unzip']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
