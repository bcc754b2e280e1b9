"""Read a run into ``RunData``: from the engine's run store (the run log), or, for a report
handed in without one, a report bundle's ``rundata.json`` (an export of the log).

This is the one module that knows the run store's layout; everything else takes ``RunData``.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from dicom import atomic_write
from evaluation.log.rundata import RunData

RUNDATA_FILE = "rundata.json"
MAX_RUNDATA_BYTES = 512 * 1024 * 1024


class RunLoadError(ValueError):
    """The folder holds no readable run (neither a report bundle nor an engine run store)."""


def save_run(run: RunData, path: Path) -> Path:
    """Write ``run`` as JSON (atomically: temp file, then rename)."""
    with atomic_write(path, "w", fsync=False) as fh:
        fh.write(run.model_dump_json())
    return path


def _read_rundata(path: Path) -> RunData:
    if path.stat().st_size > MAX_RUNDATA_BYTES:
        raise RunLoadError(f"{path} is larger than {MAX_RUNDATA_BYTES >> 20} MiB")
    try:
        return RunData.model_validate_json(path.read_bytes())
    except (ValidationError, json.JSONDecodeError) as exc:
        raise RunLoadError(f"{path}: not a NeuroSandbox run ({str(exc)[:300]})") from exc


def load_run(rundir: Path, database_url: str | None = None) -> RunData:
    """The run in ``rundir``: its run store (the run log, the run's source) when the folder has
    one, else a ``rundata.json`` (the file given, or the one in the folder).

    A ``rundata.json`` is an export (a report bundle's, ``runs export``): it is read only when
    it is all there is, a report the user hands in (an old folder, a bundle copied from another
    machine); beside a store it is ignored, because a ``rescore`` since it was written changed
    the store, not it."""
    rundir = Path(rundir)
    if rundir.is_file() and rundir.suffix == ".json":
        return _read_rundata(rundir)
    from evaluation.reports.storeread import find_store, run_from_store

    store = find_store(rundir, database_url)  # database_url: the PostgreSQL run log
    if store is not None:
        return run_from_store(store, database_url=database_url)
    if (rundir / RUNDATA_FILE).is_file():
        return _read_rundata(rundir / RUNDATA_FILE)
    raise RunLoadError(
        f"{rundir}: no {RUNDATA_FILE} and no evaluation run store found; "
        "give the folder of a run (`neurosandbox eval ... --out RUNDIR`) or of a report"
    )
