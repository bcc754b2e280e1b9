"""Benchmark: files on disk -> rendered montage, against dcm2niix and a naive pydicom load.

For each series (the 819-file Siemens DWI unzipped to a temp dir, the 96-slice sagittal T1,
the BRAINIX study) it times, in the same run and interleaved:
  - neurosandbox: index headers + decode what is rendered + write the labelled montage;
  - dcm2niix: convert the same files to NIfTI (the usual first step of peer pipelines);
  - naive pydicom: dcmread every file with its pixels (what a script usually does first).
Median of N repetitions (default 5); prints times and the ratio neurosandbox / peer.
Run: make bench   (or .venv/bin/python bench/render.py --reps 7)
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pydicom

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dicom.render import RenderOptions, render_path  # noqa: E402

CORPUS = ROOT.parent / "shared" / "data" / "dicom"


def _unzip_dwi(dst: Path) -> Path:
    src = CORPUS / "siemens_xa30/In/11001_DWI_dir80_AP"
    out = dst / "dwi819"
    out.mkdir()
    for f in sorted(src.iterdir()):
        with gzip.open(f) as g:
            (out / f.name.removesuffix(".gz")).write_bytes(g.read())
    return out


def _ours(folder: Path, out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    manifest = render_path(folder, out, RenderOptions(n_slices=12))
    if not manifest.images:
        raise SystemExit(f"benchmark: nothing rendered from {folder}: {manifest.errors}")


def _dcm2niix(folder: Path, out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    subprocess.run(
        ["dcm2niix", "-z", "n", "-b", "n", "-o", str(out), "-f", "%s", str(folder)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _naive(folder: Path, _out: Path) -> None:
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        ds = pydicom.dcmread(f)
        _ = ds.pixel_array


def _time(fn, folder: Path, out: Path) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn(folder, out)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=5, help="repetitions per measurement (median)")
    args = parser.parse_args()
    if not CORPUS.exists():
        print(f"benchmark needs the shared corpus at {CORPUS}", file=sys.stderr)
        return 2
    if shutil.which("dcm2niix") is None:
        print("benchmark needs dcm2niix (make setup installs it)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ns-bench-") as tmp:
        t = Path(tmp)
        cases = [
            ("Siemens DWI, 819 files", _unzip_dwi(t)),
            ("Siemens 3D T1, 96 files", CORPUS / "siemens_xa30/In/5001_anat-T1w_acq-tfl"),
            ("BRAINIX, 88 files", CORPUS / "brainix/BRAINIX/DICOM"),
        ]
        runners = [("neurosandbox", _ours), ("dcm2niix", _dcm2niix), ("naive pydicom", _naive)]
        print(
            f"median of {args.reps} repetitions, interleaved; page cache warm after one untimed pass"
        )
        print(
            f"{'series':28} {'neurosandbox':>13} {'dcm2niix':>10} {'pydicom':>10} {'vs dcm2niix':>12} {'vs pydicom':>11}"
        )
        for name, folder in cases:
            for label, fn in runners:  # warm the page cache and imports once
                fn(folder, t / "warm" / label.replace(" ", "_"))
            times: dict[str, list[float]] = {label: [] for label, _ in runners}
            for _ in range(args.reps):
                for label, fn in runners:
                    times[label].append(_time(fn, folder, t / "out" / label.replace(" ", "_")))
            med = {k: statistics.median(v) for k, v in times.items()}
            print(
                f"{name:28} {med['neurosandbox']:12.3f}s {med['dcm2niix']:9.3f}s "
                f"{med['naive pydicom']:9.3f}s {med['neurosandbox'] / med['dcm2niix']:11.2f}x "
                f"{med['neurosandbox'] / med['naive pydicom']:10.2f}x"
            )
    print("ratio < 1 means neurosandbox is faster than the peer (goal: <= 0.5x dcm2niix)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
