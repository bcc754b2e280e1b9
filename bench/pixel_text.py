"""Benchmark: what reading the text in an image costs the PHI gate (evaluation.phi_pixels).

Renders the montages of the real corpus (../shared/data/dicom: BRAINIX T2/FLAIR/T1, Siemens
XA30 T1/DWI/ADC/TRACE, GE T1/DWI, UIH T1/DWI, Siemens enhanced T1, Comunix CT; 12 slices of
256 px in 4 columns, as the evaluator renders them) and screens each as the gate does for an
untrusted endpoint: prints the time to read each (cold: both tesseract passes), the median and
the maximum, the CPU time (a figure that a busy machine changes less than the wall time), the time of a second screen of the same image (the cache), and whether any
montage was changed (none should be: only the renderer's marks are in them).

Then the cost of a redaction: the BRAINIX FLAIR series with a name, an ID and a date burned
into its pixel data, rendered and screened (read, black out, read again).

Run: .venv/bin/python bench/pixel_text.py [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import pydicom
from PIL import Image, ImageDraw, ImageFont

from dicom import RenderOptions, render_path
from evaluation.phi import scrub_text
from evaluation.phi_pixels import PixelScreen, TextMatcher

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "dicom"
STUDIES = (
    "brainix/BRAINIX/DICOM",
    "siemens_xa30/In",
    "ge_pioneer",
    "uih_umr770",
    "enhanced_mr",
    "hostile/Database/Comunix",
)
FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"


def _montages(out: Path) -> list[Path]:
    opts = RenderOptions(n_slices=12, tile_size=256, columns=4, montage=True, singles=False)
    found = []
    for n, sub in enumerate(STUDIES):
        manifest = render_path(CORPUS / sub, out / str(n), opts)
        found += [out / str(n) / i.file for i in manifest.images]
    return found


def _burned_flair(out: Path) -> Path:
    src = CORPUS / "brainix/BRAINIX/DICOM/FLAIR"
    study = out / "burned"
    study.mkdir(parents=True)
    font = ImageFont.truetype(FONT, 12)
    for f in sorted(src.iterdir()):
        ds = pydicom.dcmread(f)
        pixels = ds.pixel_array.astype(np.int32)
        im = Image.fromarray(pixels, mode="I")
        draw = ImageDraw.Draw(im)
        for i, line in enumerate(("MARTINEZ GARCIA^JOSE", "ID 88213405", "03-Mar-1961")):
            draw.text((3, 3 + 15 * i), line, fill=int(pixels.max()), font=font)
        ds.PixelData = np.asarray(im).astype(ds.pixel_array.dtype).tobytes()
        ds.save_as(study / f.name)
    opts = RenderOptions(n_slices=12, tile_size=256, columns=4, montage=True, singles=False)
    manifest = render_path(study, out / "burned_png", opts)
    return out / "burned_png" / manifest.images[0].file


def _cpu() -> float:
    """CPU seconds of this process and its finished children (tesseract): unlike the wall
    time, about the same on a busy machine."""
    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    terms = {"Martinez": "name", "Garcia": "name", "Jose": "name", "88213405": "patient_id"}
    matcher = TextMatcher(terms, partial(scrub_text, terms=[]))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        montages = _montages(out)
        cold: dict[Path, list[float]] = {p: [] for p in montages}
        cpu: list[float] = []
        changed = 0
        cached = []
        for _ in range(args.reps):
            for path in montages:
                png = path.read_bytes()
                screen = PixelScreen()
                t, c = time.perf_counter(), _cpu()
                sent, action = screen.screen(png, matcher)
                cold[path].append(time.perf_counter() - t)
                cpu.append(_cpu() - c)
                changed += sent != png
                t = time.perf_counter()
                screen.screen(png, matcher)
                cached.append(time.perf_counter() - t)
        for path, times in cold.items():
            with Image.open(path) as im:
                size = f"{im.width}x{im.height}"
            print(
                f"{path.parent.name}/{path.name:32s} {size:>9s} {statistics.median(times):6.2f} s"
            )
        per_image = [statistics.median(t) for t in cold.values()]
        print(
            f"{len(montages)} montages: median {statistics.median(per_image):.2f} s, "
            f"max {max(per_image):.2f} s per image (cold, both passes; CPU "
            f"{statistics.median(cpu):.2f} s median, this process and tesseract); "
            f"cached {statistics.median(cached) * 1000:.1f} ms; changed {changed} "
            f"(load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
        )
        burned = _burned_flair(out).read_bytes()
        times = []
        for _ in range(args.reps):
            t = time.perf_counter()
            sent, action = PixelScreen().screen(burned, matcher)
            times.append(time.perf_counter() - t)
        assert action is not None
        print(
            f"BRAINIX FLAIR with burned-in text: {action.action} ({action.reason}, "
            f"{action.boxes} boxes, kinds {action.kinds}) in {statistics.median(times):.2f} s"
        )
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
