"""Memory of one study of many one-file series through the gateway's evaluation path.

Builds a synthetic study (``--series`` one-file series of ``--size`` px, MR, a mix of T2,
FLAIR, T1 and localizer descriptions, spool layout ``study/series/sop.dcm``) in a temporary
folder, then in this process: ``dicom.index_path(keep_headers=True)`` (as the pipeline does),
pickling the index (what ProcessEvaluator sends its worker), and ``DefaultEvaluator.evaluate``
(case building, rendering, the built-in reference model). Prints the peak Python allocations
(tracemalloc) and the process's maximum resident set size after each stage.

    .venv/bin/python bench/many_series.py --series 5000
"""

from __future__ import annotations

import argparse
import pickle
import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
from pydicom.dataset import FileDataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, MRImageStorage, generate_uid

# description, ScanningSequence, TR, TE, TI
KINDS = (
    ("AX T2 TSE", "SE", 4452.0, 100.0, None),
    ("AX FLAIR", "SE\\IR", 9000.0, 100.0, 2500.0),
    ("AX T1 SE", "SE", 450.0, 10.0, None),
    ("3-plane localizer", "GR", 8.0, 4.0, None),
)


def make_many_series(folder: Path, n_series: int, size: int = 16) -> tuple[str, list[str]]:
    """One study of ``n_series`` one-file series under ``folder``/study/series/sop.dcm."""
    study_uid, frame_uid = generate_uid(), generate_uid()
    rng = np.random.default_rng(0)
    uids = []
    for k in range(n_series):
        desc, seq, tr, te, ti = KINDS[k % len(KINDS)]
        series_uid, sop = generate_uid(), generate_uid()
        uids.append(series_uid)
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = MRImageStorage
        meta.MediaStorageSOPInstanceUID = sop
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        d = folder / study_uid / series_uid
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{sop}.dcm"
        ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
        ds.SpecificCharacterSet = "ISO_IR 100"
        ds.SOPClassUID, ds.SOPInstanceUID = MRImageStorage, sop
        ds.StudyInstanceUID, ds.SeriesInstanceUID = study_uid, series_uid
        ds.FrameOfReferenceUID = frame_uid
        ds.PatientName, ds.PatientID = "Many^Series", "NSBX-MANY-1"
        ds.PatientBirthDate, ds.PatientSex = "19700101", "F"
        ds.StudyDate = ds.SeriesDate = "20240102"
        ds.StudyTime = ds.SeriesTime = "101500"
        ds.AccessionNumber, ds.StudyID, ds.ReferringPhysicianName = "ACC1", "1", ""
        ds.Modality, ds.Manufacturer = "MR", "SYNTH"
        ds.SeriesNumber, ds.InstanceNumber = k + 1, 1
        ds.SeriesDescription = desc
        ds.ImageType = ["ORIGINAL", "PRIMARY", "M", "NONE"]
        ds.ScanningSequence, ds.SequenceVariant, ds.ScanOptions = seq, "SK", ""
        ds.MRAcquisitionType = "2D"
        ds.RepetitionTime, ds.EchoTime = tr, te
        if ti is not None:
            ds.InversionTime = ti
        ds.MagneticFieldStrength = 1.5
        ds.SliceThickness = 5.0
        ds.PixelSpacing = [12.0, 12.0]
        ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
        ds.ImagePositionPatient = [-90.0, -90.0, -40.0 + (k % 20) * 5.0]
        ds.PatientPosition = "HFS"
        ds.Rows = ds.Columns = size
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
        ds.PixelData = rng.integers(0, 4000, (size, size), dtype=np.uint16).tobytes()
        ds.save_as(path, enforce_file_format=True)
    return study_uid, uids


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--series", type=int, default=5000)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--no-evaluate", action="store_true", help="index and pickle only")
    ap.add_argument("--trace", action="store_true", help="also trace Python allocations (slow)")
    args = ap.parse_args(argv)

    from dicom import index_path
    from evaluation import TaskFamily
    from gateway.routing import Route
    from gateway.settings import Settings
    from gateway.study_run import DefaultEvaluator

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        study_uid, _ = make_many_series(root / "spool", args.series, args.size)
        folder = root / "spool" / study_uid
        print(f"wrote {args.series} one-file series in {time.perf_counter() - t0:.1f} s")
        print(f"baseline (imports, study written): maxrss {_maxrss_mb():.0f} MB")
        if args.trace:
            tracemalloc.start()
        t0 = time.perf_counter()
        index = index_path(folder, workers=1, keep_headers=True)
        print(
            f"index: {len(index.series)} stacks in {time.perf_counter() - t0:.1f} s; "
            f"{_traced()}maxrss {_maxrss_mb():.0f} MB"
        )
        blob = pickle.dumps(index)
        print(f"pickled index (sent to the worker): {len(blob) / 2**20:.1f} MB")
        del blob
        if not args.no_evaluate:
            route = Route(
                rule="bench",
                models=["reference/image-rules"],
                tasks=[TaskFamily.LESION],
                series_classes=["T2", "FLAIR", "T1"],
            )
            if args.trace:
                tracemalloc.reset_peak()
            t0 = time.perf_counter()
            result = DefaultEvaluator(Settings(data_dir=root)).evaluate(
                folder, route, root / "runs" / ("0" * 32), index
            )
            case = result.run.cases[0]
            shown = len({i.series_uid for i in case.images})
            print(
                f"evaluate: {shown} series shown in {time.perf_counter() - t0:.1f} s; "
                f"{_traced()}maxrss {_maxrss_mb():.0f} MB; "
                f"{len(result.evaluated_series_uids)} series cited by the SR"
            )
            unshown = getattr(case.provenance, "series_not_shown", None)
            if unshown is not None:
                print(f"not shown: {unshown.total} series ({unshown.counts_text()})")
        tracemalloc.stop()
    return 0


def _traced() -> str:
    if not tracemalloc.is_tracing():
        return ""
    now, peak = tracemalloc.get_traced_memory()
    return f"python heap {now / 2**20:.0f} MB (peak {peak / 2**20:.0f} MB); "


if __name__ == "__main__":
    sys.exit(main())
