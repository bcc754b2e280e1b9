"""Benchmark: one study received by Orthanc on PostgreSQL against the default Orthanc (SQLite
index, files on disk), for the sizing in deploy/SCALING.md.

Both are Debian's Orthanc on loopback, configured by `neurosandbox pacs config` (with and
without `--postgresql`); the PostgreSQL server is a throwaway Debian one with fsync on
(gateway/pg_local.py), as a real install has it. A real study of the corpus (BRAINIX: T1, T2,
FLAIR and a mask, 88 files, 26 MB; or --study FOLDER) is copied --copies times under new UIDs and
each copy is sent with dcmtk's storescu to the two Orthancs in turn (interleaved, so both see the
same machine load); then --parallel more copies are sent at once (one association each) to
each Orthanc in turn, as several modalities would. Prints, as medians over the copies:
  - seconds per study and instances per second, storescu start to finish, per Orthanc, and the
    instances per second of the copies sent at once;
  - bytes kept per study: the PostgreSQL database's growth (pg_database_size), and the
    default Orthanc's storage and index folder's growth, each beside the study's own bytes.
Run: .venv/bin/python bench/orthanc_pg.py [--copies 5] [--parallel 3] [--study FOLDER]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psycopg
import pydicom
from pydicom.uid import generate_uid
from sqlalchemy.engine import make_url

from gateway.pacs_local import dcmtk_env, free_port
from gateway.pg_local import create_database, throwaway_postgres
from gateway.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
CORPUS = Settings().corpus / "brainix"
NEUROSANDBOX = str(Path(sys.executable).with_name("neurosandbox"))
PASSWORD = "bench-rest-password"


def copy_with_new_uids(src: Path, dst: Path) -> int:
    """Every DICOM file of ``src`` into ``dst`` under new study/series/instance UIDs."""
    dst.mkdir(parents=True)
    new: dict[str, str] = {}
    n = 0
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        try:
            ds = pydicom.dcmread(path)
        except pydicom.errors.InvalidDicomError:
            continue
        for key in ("StudyInstanceUID", "SeriesInstanceUID", "SOPInstanceUID"):
            if key in ds:
                ds[key].value = new.setdefault(ds[key].value, generate_uid())
        if "MediaStorageSOPInstanceUID" in ds.file_meta:
            ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
        ds.save_as(dst / f"{n:05d}.dcm")
        n += 1
    return n


class Orthanc:
    def __init__(self, work: Path, name: str, postgresql: str | None) -> None:
        self.http, self.dicom = free_port(), free_port()
        self.dir = work / name
        self.storage = self.dir / "storage"
        self.storage.mkdir(parents=True)
        self.config = self.dir / "orthanc.json"
        argv = ["--out", str(self.config), "--storage", str(self.storage)]
        if postgresql:
            argv += ["--postgresql", postgresql]
        env = {
            **os.environ,
            "NEUROSANDBOX_DATA_DIR": str(self.dir / "data"),
            "NEUROSANDBOX_ORTHANC_PASSWORD": PASSWORD,
            "NEUROSANDBOX_ORTHANC_HTTP_PORT": str(self.http),
            "NEUROSANDBOX_ORTHANC_DICOM_PORT": str(self.dicom),
            "NEUROSANDBOX_GATEWAY_DICOM_PORT": str(free_port()),
        }
        subprocess.run([NEUROSANDBOX, "pacs", "config", *argv], env=env, check=True,
                       capture_output=True)  # fmt: skip
        log = open(self.dir / "orthanc.log", "wb")  # noqa: SIM115 (open while Orthanc runs)
        self.proc = subprocess.Popen(
            ["Orthanc", str(self.config)],
            env=dcmtk_env() | {"ORTHANC_POSTGRESQL_PASSWORD": "trust-authentication"},
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                url = f"http://127.0.0.1:{self.http}/system"
                if httpx.get(url, auth=("neurosandbox", PASSWORD), timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"Orthanc {name} did not start: see {self.dir / 'orthanc.log'}")

    def store(self, folder: Path) -> float:
        t0 = time.perf_counter()
        subprocess.run(
            ["/usr/bin/storescu", "-aet", "NEUROSANDBOX", "-aec", "ORTHANC", "+sd", "+r", "-q",
             "127.0.0.1", str(self.dicom), str(folder)],
            env=dcmtk_env(), check=True, timeout=600,
        )  # fmt: skip
        return time.perf_counter() - t0

    def store_together(self, folders: list[Path]) -> float:
        """Send every folder at once, one storescu (association) each; the wall time."""
        t0 = time.perf_counter()
        argv = ["/usr/bin/storescu", "-aet", "NEUROSANDBOX", "-aec", "ORTHANC", "+sd", "+r",
                "-q", "127.0.0.1", str(self.dicom)]  # fmt: skip
        procs = [subprocess.Popen([*argv, str(f)], env=dcmtk_env()) for f in folders]
        if any(p.wait(timeout=600) != 0 for p in procs):
            raise RuntimeError("storescu failed")
        return time.perf_counter() - t0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--copies", type=int, default=5)
    ap.add_argument("--study", type=Path, default=CORPUS)
    ap.add_argument("--parallel", type=int, default=3, help="associations at once (phase 2)")
    args = ap.parse_args()
    if not args.study.is_dir():
        sys.exit(f"{args.study} is not a folder (the corpus is in ../shared/data)")
    with (
        tempfile.TemporaryDirectory(prefix="nsbx-bench-opg-") as tmp,
        throwaway_postgres(fsync=True) as pg,
    ):
        work = Path(tmp)
        db = make_url(create_database(pg.url, "orthanc"))
        pg_url = f"postgresql://{db.username}@{db.host}:{db.port}/{db.database}"
        copies = []
        for k in range(args.copies + 2 * args.parallel):
            n = copy_with_new_uids(args.study, work / f"copy{k}")
            copies.append((work / f"copy{k}", n, folder_bytes(work / f"copy{k}")))
        on_pg = Orthanc(work, "postgresql", pg_url)
        default = Orthanc(work, "sqlite", None)

        def db_size() -> int:
            with psycopg.connect(host=db.host, port=db.port, user=db.username,
                                 dbname=db.database) as c:  # fmt: skip
                row = c.execute("SELECT pg_database_size(current_database())").fetchone()
            return int(row[0]) if row else 0

        times: dict[str, list[float]] = {"postgresql": [], "sqlite": []}
        grow: dict[str, list[int]] = {"postgresql": [], "sqlite": []}
        try:
            for folder, _n, _size in copies[: args.copies]:
                before = db_size()
                times["postgresql"].append(on_pg.store(folder))
                grow["postgresql"].append(db_size() - before)
                before = folder_bytes(default.storage)
                times["sqlite"].append(default.store(folder))
                grow["sqlite"].append(folder_bytes(default.storage) - before)
            rest = [c[0] for c in copies[args.copies :]]
            together = {
                "postgresql": on_pg.store_together(rest[: args.parallel]),
                "sqlite": default.store_together(rest[args.parallel :]),
            }
        finally:
            on_pg.stop()
            default.stop()
        n, size = copies[0][1], copies[0][2]
        out = {
            "study": str(args.study),
            "instances": n,
            "study_bytes": size,
            "copies": args.copies,
            "load_1min": os.getloadavg()[0],
        }
        for name in times:
            s = statistics.median(times[name])
            out[name] = {
                "s_per_study": round(s, 2),
                "instances_per_s": round(n / s, 1),
                "bytes_per_study": int(statistics.median(grow[name])),
                "bytes_ratio_to_study": round(statistics.median(grow[name]) / size, 2),
                f"instances_per_s_{args.parallel}_at_once": round(
                    args.parallel * n / together[name], 1
                ),
            }
        print(json.dumps(out, indent=2))
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
