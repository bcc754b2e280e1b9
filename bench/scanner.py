"""Benchmark: our header pass against GDCM's compiled header scanner, on the same files.

What bounds the cold render's first stage (the header pass over every file): here, our
byte-level scanner (``dicom.headers.read_headers``, serial, scan templates forgotten before each
repetition) and the whole index stage (``dicom.index.index_path``, serial: the headers read,
checked, grouped into stacks and classified) beside GDCM's ``gdcm.Scanner`` (C++; python-gdcm)
asked for the same elements (``dicom.headers.elements.NEEDED_TAGS``) of the same files. GDCM's
scanner only reads the values as text: no check, no conversion, no grouping.

Series: the 819-file Siemens DWI (unzipped to a temp dir once), the 96-slice 3D T1, BRAINIX.
Repetitions alternate ours and GDCM's, after one untimed pass of each (page cache); medians.
Each side times itself in its own process (GDCM's start-up and import are left out).

python-gdcm is not a dependency of the project: the peer runs in its own venv, --peer-python,
else .venv/peer-gdcm (created on first use with pip: python-gdcm==3.0.24.1).
Run: .venv/bin/python bench/scanner.py [--reps 7] [--series dwi,t1,brainix]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from peers import peer_python  # noqa: E402
from render import CORPUS, _unzip_dwi  # noqa: E402

from dicom.headers import read_headers  # noqa: E402
from dicom.headers.elements import NEEDED_TAGS  # noqa: E402
from dicom.index import index_path  # noqa: E402
from dicom.render import clear_caches  # noqa: E402
from dicom.sources import iter_sources  # noqa: E402

PEER = "python-gdcm==3.0.24.1"
# The peer's side: one untimed scan, then one timed; prints the seconds and what it found.
PEER_SCRIPT = """
import json, sys, time
import gdcm
spec = json.loads(sys.stdin.read())
def scan():
    s = gdcm.Scanner()
    for t in spec["tags"]:
        s.AddTag(gdcm.Tag(t >> 16, t & 0xFFFF))
    if not s.Scan(spec["files"]):
        raise SystemExit("gdcm.Scanner failed")
    return s
scan()
t0 = time.perf_counter()
s = scan()
dt = time.perf_counter() - t0
ipp = sum(1 for f in spec["files"] if s.GetValue(f, gdcm.Tag(0x0020, 0x0032)))
print(json.dumps({"seconds": dt, "with_position": ipp}))
"""


def gdcm_scan(py: str, files: list[str]) -> float:
    spec = json.dumps({"files": files, "tags": sorted(NEEDED_TAGS)})
    out = subprocess.run([py, "-c", PEER_SCRIPT], input=spec, capture_output=True, text=True,
                         check=True, timeout=300)  # fmt: skip
    found = json.loads(out.stdout.splitlines()[-1])
    if found["with_position"] == 0:
        raise SystemExit("benchmark: GDCM found no ImagePositionPatient: not the same work")
    return float(found["seconds"])


def ours_read(files: list[str]) -> float:
    clear_caches()
    t0 = time.perf_counter()
    frames, errors, _n = read_headers(files, workers=1, cache_dir=None)
    dt = time.perf_counter() - t0
    if errors or not frames:
        raise SystemExit(f"benchmark: our header pass failed: {errors[:3]}")
    return dt


def ours_index(folder: Path) -> float:
    clear_caches()
    t0 = time.perf_counter()
    index = index_path(folder, workers=1, cache_dir=None)
    dt = time.perf_counter() - t0
    if not index.series:
        raise SystemExit(f"benchmark: nothing indexed in {folder}")
    return dt


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--series", default="dwi,t1,brainix")
    parser.add_argument("--peer-python", help="a python with python-gdcm installed")
    args = parser.parse_args()
    py = peer_python(args.peer_python, "peer-gdcm", [PEER])
    want = args.series.split(",")
    os.environ.pop("NEUROSANDBOX_HEADER_CACHE", None)
    load = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        series = {
            "dwi": ("Siemens DWI", lambda: _unzip_dwi(Path(tmp))),
            "t1": ("Siemens 3D T1", lambda: CORPUS / "siemens_xa30/In/5001_anat-T1w_acq-tfl"),
            "brainix": ("BRAINIX", lambda: CORPUS / "brainix/BRAINIX/DICOM"),
        }
        for key in want:
            name, make = series[key]
            folder = make()
            files = [str(p) for p in iter_sources(folder)]
            ours_read(files), ours_index(folder), gdcm_scan(py, files)  # untimed pass
            read, index, peer = [], [], []
            for _ in range(args.reps):
                read.append(ours_read(files))
                index.append(ours_index(folder))
                peer.append(gdcm_scan(py, files))
            rows.append(
                (f"{name}, {len(files)} files", *map(statistics.median, (read, index, peer)))
            )
    print(
        f"median of {args.reps} alternated repetitions, wall clock, serial; load average {load:.1f} on {os.cpu_count()} CPUs at start"
    )
    print(
        f"{'series':28} {'our read':>9} {'our index':>10} {'gdcm scan':>10} {'read/gdcm':>10} {'index/gdcm':>11} {'per file (read, gdcm)':>24}"
    )
    for label, r, i, g in rows:
        n = int(label.split(", ")[1].split()[0])
        print(
            f"{label:28} {r * 1000:8.1f}ms {i * 1000:9.1f}ms {g * 1000:9.1f}ms {r / g:9.2f}x {i / g:10.2f}x {r / n * 1e6:10.0f} us {g / n * 1e6:8.0f} us"
        )
    print(
        "ratio < 1: our header pass is faster than GDCM's compiled scanner reading the same elements"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
