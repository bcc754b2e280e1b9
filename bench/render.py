"""Benchmark: files on disk -> rendered montage, against dcm2niix and a naive pydicom load.

For each series (the 819-file Siemens DWI unzipped to a temp dir, the 96-slice sagittal T1,
the BRAINIX study) it times, in the same run and interleaved:
  - neurosandbox (cold): index headers + decode what is rendered + write the labelled
    montage, with nothing kept from the previous repetition (in-process caches cleared, no
    persistent header cache);
  - neurosandbox (warm): the same with a persistent header cache filled by the untimed pass
    (what a second look at the same folder costs; reported separately);
  - dcm2niix: convert the same files to NIfTI (the usual first step of peer pipelines);
  - naive pydicom: dcmread every file with its pixels (what a script usually does first).
Median of N repetitions (default 5) of wall time, and the ratio neurosandbox / peer. The
machine may be shared: the CPU-time ratio (all threads and child processes) is printed too.
Run: make bench   (or .venv/bin/python bench/render.py --reps 7 --series dwi,t1)
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pydicom

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dicom.fastread import clear_caches  # noqa: E402
from dicom.index import index_path  # noqa: E402
from dicom.render import RenderOptions, render_path  # noqa: E402

CORPUS = ROOT.parent / "shared" / "data" / "dicom"
Runner = Callable[[Path, Path], None]


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
    clear_caches()  # cold: nothing kept in this process from the previous repetition
    manifest = render_path(folder, out, RenderOptions(n_slices=12))
    if not manifest.images:
        raise SystemExit(f"benchmark: nothing rendered from {folder}: {manifest.errors}")


def _ours_warm(cache: Path) -> Runner:
    def run(folder: Path, out: Path) -> None:
        shutil.rmtree(out, ignore_errors=True)
        clear_caches()  # only the persistent cache helps
        index = index_path(folder, cache_dir=cache)
        render_path(folder, out, RenderOptions(n_slices=12), index=index)

    return run


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


def _cpu() -> float:
    own, children = os.times(), os.times()
    return own.user + own.system + children.children_user + children.children_system


def _time(fn: Runner, folder: Path, out: Path) -> tuple[float, float]:
    """(wall, CPU) seconds; CPU counts this process's threads and its waited-for children."""
    c0, t0 = _cpu(), time.perf_counter()
    fn(folder, out)
    return time.perf_counter() - t0, _cpu() - c0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=5, help="repetitions per measurement (median)")
    parser.add_argument("--series", default="dwi,t1,brainix", help="subset: dwi,t1,brainix")
    args = parser.parse_args()
    if not CORPUS.exists():
        print(f"benchmark needs the shared corpus at {CORPUS}", file=sys.stderr)
        return 2
    if shutil.which("dcm2niix") is None:
        print("benchmark needs dcm2niix (make setup installs it)", file=sys.stderr)
        return 2
    wanted = set(args.series.split(","))
    with tempfile.TemporaryDirectory(prefix="ns-bench-") as tmp:
        t = Path(tmp)
        cases = [
            ("Siemens DWI, 819 files", "dwi", lambda: _unzip_dwi(t)),
            (
                "Siemens 3D T1, 96 files",
                "t1",
                lambda: CORPUS / "siemens_xa30/In/5001_anat-T1w_acq-tfl",
            ),
            ("BRAINIX, 88 files", "brainix", lambda: CORPUS / "brainix/BRAINIX/DICOM"),
        ]
        runners: list[tuple[str, Runner]] = [
            ("cold", _ours),
            ("warm", _ours_warm(t / "header-cache")),
            ("dcm2niix", _dcm2niix),
            ("pydicom", _naive),
        ]
        print(
            f"median of {args.reps} repetitions, interleaved; page cache warm after one untimed "
            "pass;\ncold = no header cache, nothing kept in the process between repetitions; "
            "warm = persistent header cache"
        )
        print(
            f"{'series':26} {'cold':>8} {'warm':>8} {'dcm2niix':>9} {'pydicom':>8} "
            f"{'cold/dcm2niix':>14} {'warm/dcm2niix':>14} {'cold/pydicom':>13} {'CPU cold/dcm2niix':>18}"
        )
        for name, key, make in cases:
            if key not in wanted:
                continue
            folder = make()
            for label, fn in runners:  # warm the page cache, imports and the header cache once
                fn(folder, t / "warm" / label)
            wall: dict[str, list[float]] = {label: [] for label, _ in runners}
            cpu: dict[str, list[float]] = {label: [] for label, _ in runners}
            for _ in range(args.reps):
                for label, fn in runners:
                    w, c = _time(fn, folder, t / "out" / label)
                    wall[label].append(w)
                    cpu[label].append(c)
            m = {k: statistics.median(v) for k, v in wall.items()}
            mc = {k: statistics.median(v) for k, v in cpu.items()}
            print(
                f"{name:26} {m['cold']:7.3f}s {m['warm']:7.3f}s {m['dcm2niix']:8.3f}s "
                f"{m['pydicom']:7.3f}s {m['cold'] / m['dcm2niix']:13.2f}x "
                f"{m['warm'] / m['dcm2niix']:13.2f}x {m['cold'] / m['pydicom']:12.2f}x "
                f"{mc['cold'] / mc['dcm2niix']:17.2f}x"
            )
    print("ratio < 1 means neurosandbox is faster than the peer (goal: <= 0.5x dcm2niix)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
