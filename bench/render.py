"""Benchmark: files on disk -> rendered montage, against dcm2niix and a naive pydicom load.

Series: the 819-file Siemens DWI (unzipped to a temp dir once), the 96-slice sagittal 3D T1,
the BRAINIX study (88 files, 4 series). What each column times, wall clock, per repetition:

  cold      in this process: render_path(folder, out, RenderOptions(n_slices=12)), the
            product's default render: read every header (no header cache), group, order and
            classify, decode the chosen stacks, window them, write one labelled montage PNG per
            clinical series (DWI: the trace of the b~1000 shell) and manifest.json. Before
            each call the process forgets what earlier calls left (scan templates, converted
            header values, fonts, rasterised labels); imported modules stay loaded, as in the
            running service (gateway) that renders studies as they arrive.
  warm      the same with a persistent header cache filled by the untimed first pass (what a
            second look at the same folder costs).
  cli       a new process: `neurosandbox render FOLDER --out DIR --slices 12`, i.e. the cold
            render plus Python start-up and imports (pydicom, numpy, pydantic, typer...).
  dcm2niix  a new process: `dcm2niix -z n -b n` writing every series of the folder as NIfTI.
  pydicom   in this process: dcmread + pixel_array of every file.

Repetitions run interleaved (cold, warm, cli, dcm2niix, pydicom, cold, ...) after one untimed
pass (page cache, header cache), and each column reports its median. The machine may be
shared: the CPU-time ratio is printed too (this process's threads by time.process_time, its
waited-for children by resource.getrusage: microseconds, not os.times()' 10 ms ticks).
The montages of the last cold repetition are kept in --keep DIR when given, to look at.
Run: make bench   (or .venv/bin/python bench/render.py --reps 7 --series dwi,t1 --no-cli)
"""

from __future__ import annotations

import argparse
import gzip
import os
import resource
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

from dicom.index import index_path  # noqa: E402
from dicom.render import RenderOptions, clear_caches, render_path  # noqa: E402

CORPUS = ROOT.parent / "shared" / "data" / "dicom"
CLI = Path(sys.executable).with_name("neurosandbox")
Runner = Callable[[Path, Path], None]


def _unzip_dwi(dst: Path) -> Path:
    src = CORPUS / "siemens_xa30/In/11001_DWI_dir80_AP"
    out = dst / "dwi819"
    out.mkdir()
    for f in sorted(src.iterdir()):
        with gzip.open(f) as g:
            (out / f.name.removesuffix(".gz")).write_bytes(g.read())
    return out


def _cold(folder: Path, out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    clear_caches()
    manifest = render_path(folder, out, RenderOptions(n_slices=12))
    if not manifest.images:
        raise SystemExit(f"benchmark: nothing rendered from {folder}: {manifest.errors}")


def _warm(cache: Path) -> Runner:
    def run(folder: Path, out: Path) -> None:
        shutil.rmtree(out, ignore_errors=True)
        clear_caches()  # only the persistent cache helps
        index = index_path(folder, cache_dir=cache)
        render_path(folder, out, RenderOptions(n_slices=12), index=index)

    return run


def _cli(folder: Path, out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k != "NEUROSANDBOX_HEADER_CACHE"}
    subprocess.run(
        [str(CLI), "render", str(folder), "--out", str(out), "--slices", "12"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )


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
    # process_time (this process's threads) and getrusage (waited-for children) count in
    # microseconds; os.times() counts 10 ms ticks, too coarse for a series of few files.
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


def _time(fn: Runner, folder: Path, out: Path) -> tuple[float, float]:
    """(wall, CPU) seconds; CPU counts this process's threads and its waited-for children."""
    c0, t0 = _cpu(), time.perf_counter()
    fn(folder, out)
    return time.perf_counter() - t0, _cpu() - c0


def _what(out: Path) -> str:
    names = sorted(p.name for p in out.glob("*.png"))
    return ", ".join(names)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=5, help="repetitions per measurement (median)")
    parser.add_argument("--series", default="dwi,t1,brainix", help="subset: dwi,t1,brainix")
    parser.add_argument("--no-cli", action="store_true", help="skip the CLI subprocess column")
    parser.add_argument("--keep", type=Path, help="copy the last cold montages here")
    args = parser.parse_args()
    if not CORPUS.exists():
        print(f"benchmark needs the shared corpus at {CORPUS}", file=sys.stderr)
        return 2
    if shutil.which("dcm2niix") is None:
        print("benchmark needs dcm2niix (make setup installs it)", file=sys.stderr)
        return 2
    os.environ.pop("NEUROSANDBOX_HEADER_CACHE", None)  # cold means no persistent header cache
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
            ("cold", _cold),
            ("warm", _warm(t / "header-cache")),
            *([] if args.no_cli or not CLI.exists() else [("cli", _cli)]),
            ("dcm2niix", _dcm2niix),
            ("pydicom", _naive),
        ]
        labels = [label for label, _ in runners]
        print(
            f"median of {args.reps} interleaved repetitions, wall clock; "
            f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs at start"
        )
        print("  ".join(f"{label:>9}" for label in ["series".ljust(24), *labels]), end="")
        print(
            "   cold/dcm2niix  warm/dcm2niix" + ("  cli/dcm2niix" if "cli" in labels else ""),
            end="",
        )
        print("  cold/pydicom  CPU cold/dcm2niix")
        for name, key, make in cases:
            if key not in wanted:
                continue
            folder = make()
            for label, fn in runners:  # page cache, imports and the header cache, untimed
                fn(folder, t / "warm" / label)
            wall: dict[str, list[float]] = {label: [] for label in labels}
            cpu: dict[str, list[float]] = {label: [] for label in labels}
            for _ in range(args.reps):
                for label, fn in runners:
                    w, c = _time(fn, folder, t / "out" / label)
                    wall[label].append(w)
                    cpu[label].append(c)
            m = {k: statistics.median(v) for k, v in wall.items()}
            mc = {k: statistics.median(v) for k, v in cpu.items()}
            cells = "  ".join(f"{m[label]:8.3f}s" for label in labels)
            ratios = f"{m['cold'] / m['dcm2niix']:14.2f}x {m['warm'] / m['dcm2niix']:13.2f}x"
            if "cli" in labels:
                ratios += f" {m['cli'] / m['dcm2niix']:12.2f}x"
            ratios += f" {m['cold'] / m['pydicom']:12.2f}x {mc['cold'] / mc['dcm2niix']:17.2f}x"
            print(f"{name.ljust(24)}  {cells}  {ratios}")
            print(f"{'':24}  rendered: {_what(t / 'out' / 'cold')}")
            if args.keep:
                dst = args.keep / key
                shutil.rmtree(dst, ignore_errors=True)
                shutil.copytree(t / "out" / "cold", dst)
    print("ratio < 1: neurosandbox is faster than the peer (goal: cold <= 0.5x dcm2niix)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
