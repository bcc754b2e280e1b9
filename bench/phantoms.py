"""Benchmark: seconds per phantom case, and our DICOM writer against plain pydicom.

1. Per case (one case of each group by default, case indices 1..10): generate into a fresh
   temporary folder, median of N repetitions (default 3) of wall time and of CPU time (the
   machine may be shared with other work: CPU time is the steadier number). The head, atlas
   and grid caches are warmed by one untimed case first, as in any suite run.
2. Writer peer, same run, interleaved: the series of one full MR+contrast case written
   (a) by plain pydicom, one Dataset per slice + dcmwrite(enforce_file_format=True), and
   (b) by evaluation.datasets.phantoms.dicomio.SeriesWriter (header encoded once, per-slice parts spliced),
   byte-identical output; median of N, ratio ours / pydicom.
Run: .venv/bin/python bench/phantoms.py [--reps 3] [--cases 1,2,3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pydicom
from pydicom.dataset import Dataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evaluation.datasets.phantoms import case_spec, generate_case  # noqa: E402
from evaluation.datasets.phantoms.acquire import acquire_diffusion, acquire_mr  # noqa: E402
from evaluation.datasets.phantoms.anatomy import get_anatomy  # noqa: E402
from evaluation.datasets.phantoms.atlas import get_atlas  # noqa: E402
from evaluation.datasets.phantoms.dicomio import SeriesWriter, full_dataset  # noqa: E402
from evaluation.datasets.phantoms.grids import MR_AXIAL, SAG_T1, grid_tissues  # noqa: E402
from evaluation.datasets.phantoms.lesions import plan_lesions  # noqa: E402
from evaluation.datasets.phantoms.scene import build_scene  # noqa: E402
from evaluation.datasets.phantoms.series import StudyHeader, series_instances  # noqa: E402
from evaluation.datasets.phantoms.tissue import protocols  # noqa: E402


def _timed(fn: Callable[[], None]) -> tuple[float, float]:
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def bench_cases(indices: list[int], reps: int, tmp: Path) -> None:
    generate_case(tmp / "warm", 5, 0)  # caches: anatomy, atlas, the three grids
    generate_case(tmp / "warm", 3, 0)
    print(f"{'case':24} {'files':>5} {'wall s (median)':>16} {'cpu s (median)':>15}")
    walls, cpus = [], []
    for i in indices:
        w_runs, c_runs, n_files = [], [], 0
        for r in range(reps):
            out = tmp / f"rep{r}"
            res: list[int] = []
            w, c = _timed(
                lambda out=out, res=res, i=i, r=r: res.append(
                    len(generate_case(out, i, 100 + r).files)
                )
            )
            w_runs.append(w)
            c_runs.append(c)
            n_files = res[0]
            shutil.rmtree(out, ignore_errors=True)  # outside the timing: deletion is not generation
        walls.append(statistics.median(w_runs))
        cpus.append(statistics.median(c_runs))
        print(f"{case_spec(i).case_id:24} {n_files:5d} {walls[-1]:16.2f} {cpus[-1]:15.2f}")
    print(
        f"{'median over cases':24} {'':5} {statistics.median(walls):16.2f} {statistics.median(cpus):15.2f}"
    )
    print(f"{'worst case':24} {'':5} {max(walls):16.2f} {max(cpus):15.2f}")


def _series_of_one_case() -> list[tuple[Dataset, list[tuple[Dataset, bytes]]]]:
    anatomy, atlas = get_anatomy(), get_atlas()
    rng = np.random.default_rng(0)
    plan = plan_lesions("gbm", rng, atlas, "L1")
    protos = protocols(3.0)
    axial = build_scene(grid_tissues(anatomy, MR_AXIAL), plan.lesions, slab=3)
    sag = build_scene(grid_tissues(anatomy, SAG_T1), plan.lesions)
    acqs = [acquire_mr(sag, "t1_3d", protos["t1_3d"], 3.0, rng)]
    acqs += [acquire_mr(axial, r, protos[r], 3.0, rng) for r in ("t2", "flair", "swi", "t1", "t1c")]
    acqs += list(acquire_diffusion(axial, protos["dwi"], 3.0, rng))
    h = StudyHeader(
        seed=0,
        case_id="bench",
        modality="MR",
        charset="ISO_IR 192",
        patient_name="Yamada^Tarou=山田^太郎",
        patient_id="PH1",
        other_patient_id="X",
        birth_date=dt.date(1960, 1, 1),
        sex="M",
        age_years=64,
        address="1 Mill Street",
        phone="+44 20 7946 0000",
        referring="Rao^Priya^^Dr",
        institution="St. Elsewhere",
        accession="A1",
        when=dt.datetime(2024, 1, 1, 9, 0),
    )
    return [series_instances(h, a, h.when) for a in acqs]


def bench_writer(reps: int, tmp: Path) -> None:
    series = _series_of_one_case()
    n = sum(len(inst) for _, inst in series)

    def ours(out: Path) -> None:
        for s, (fixed, inst) in enumerate(series):
            writer = SeriesWriter(fixed, [e.tag for e in inst[0][0]])
            for k, (var, pix) in enumerate(inst):
                writer.write(out / f"{s}_{k}.dcm", var, pix)

    def naive(out: Path) -> None:
        for s, (fixed, inst) in enumerate(series):
            for k, (var, pix) in enumerate(inst):
                pydicom.dcmwrite(
                    out / f"{s}_{k}.dcm", full_dataset(fixed, var, pix), enforce_file_format=True
                )

    times: dict[str, list[float]] = {"ours": [], "pydicom": []}
    for r in range(reps):
        for name, fn in (("ours", ours), ("pydicom", naive)):  # interleaved
            out = tmp / f"{name}{r}"
            out.mkdir()
            times[name].append(_timed(lambda fn=fn, out=out: fn(out))[0])
    a, b = tmp / "ours0", tmp / "pydicom0"
    same = all((a / p.name).read_bytes() == p.read_bytes() for p in b.iterdir())
    mo, mp = statistics.median(times["ours"]), statistics.median(times["pydicom"])
    print(f"\nwriting one MR case ({len(series)} series, {n} files), median of {reps}:")
    print(f"  ours (SeriesWriter)        {mo:6.3f} s  ({1000 * mo / n:.2f} ms/file)")
    print(f"  plain pydicom dcmwrite     {mp:6.3f} s  ({1000 * mp / n:.2f} ms/file)")
    print(f"  ratio ours / pydicom       {mo / mp:6.2f}   byte-identical output: {same}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cases", default="1,2,3,4,5,6,7,8,9,10")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-phantoms-") as d:
        tmp = Path(d)
        t0 = time.perf_counter()
        get_anatomy()
        get_atlas()
        print(
            f"head + atlas ready in {time.perf_counter() - t0:.1f} s (disk cache; first run builds it)"
        )
        bench_cases([int(v) for v in args.cases.split(",")], args.reps, tmp)
        bench_writer(args.reps, tmp)


if __name__ == "__main__":
    main()
