"""A gateway run read from its run log: the one way the review queue and pages, re-issue, the
API's ``/runs/{id}/report.json`` and ``runs rescore``'s rebuilt bundle get a run's ``RunData``.

The run log (the engine's store in ``DATA_DIR/runs/<run id>/``) is the run's one source. The
report bundle in the reports folder (``rundata.json``, the checklists as JSON, HTML and PDF) is
an export written from it (``gateway.runs.report``) and never read back here: a bundle deleted
or edited changes nothing a reader sees; ``runs rescore`` changes the log, and the next read
shows the new scores.

The run log is the folder's ``run.sqlite`` or, with ``NEUROSANDBOX_DATABASE_URL``, the install's
PostgreSQL (``StudyRunStore.database_url``; a run made before the install switched stays in its
file): the same reads on either. Reading a store costs tens of milliseconds (and the review
pages read a run several times per request), so the ``RunData`` is kept per run and read again
when the run's rows changed: keyed by the run's last-write stamp (``evaluation.log.write_stamp``,
one query: every committed write of the run replaces it, on either engine). A SQLite file not
written since stamps were kept is keyed by its and its write-ahead log's modification time and
size instead.

The gateway's own facts (trigger, report version, the UNVERIFIED SR per model, the checklist
PDF) come from its record of the run, ``RunRecord`` in the log, through ``gateway_facts``:
the one place that says where they are (``RunData.config["gateway"]``, as the exported
``rundata.json`` carries them).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from evaluation import EvaluationError
from evaluation.log import STORE_FILE, RunData, store_change_key
from evaluation.reports import RunLoadError, run_from_store
from evaluation.robustness import as_received
from gateway.runs.store import RunNotFoundError, RunRecord, RunStatus, StudyRunStore

GATEWAY_KEY = "gateway"  # RunData.config entry: the gateway's facts of the run
MAX_CACHED = 64  # runs kept read (a review page reads one run several times)
ChangeKey = tuple[object, ...]
_CacheKey = tuple[str | None, Path]  # the run log's URL (None: a file), the run's folder

_lock = threading.Lock()
_cache: OrderedDict[_CacheKey, tuple[ChangeKey, RunData]] = OrderedDict()


class RunNotReadableError(RunNotFoundError):
    """The run has a log, but no evaluation in it to read (not started, failed before the
    engine ran) or the log cannot be read; the message says which."""


def change_key(store_file: Path, database_url: str | None = None) -> ChangeKey | None:
    """What changes whenever the run whose store ``store_file`` names is written
    (``evaluation.log.store_change_key``). None: no store."""
    try:
        return store_change_key(store_file, database_url)
    except EvaluationError as exc:  # the database not reachable
        raise RunNotReadableError(f"run {store_file.parent.name}: {exc}") from None


def gateway_facts(rec: RunRecord) -> dict[str, Any]:
    """The gateway's facts of a run as its report carries them (``RunData.config["gateway"]``),
    from its record in the run log."""
    # the UNVERIFIED SR per model: ``sr_sop_uids`` when the record keys it by model (the run
    # log's GatewayRun), else ``unverified_sr`` beside the list (RunRecord before it)
    per_model = rec.sr_sop_uids
    if not isinstance(per_model, dict):
        per_model = getattr(rec, "unverified_sr", None) or {}
    return {
        "run_id": rec.run_id,
        "trigger": rec.trigger,
        "version": rec.version,
        "unverified_sr": dict(per_model),
        "checklist_pdf": rec.pdf_sop_uid,
    }


def gateway_info(run: RunData) -> dict[str, Any]:
    """What the gateway recorded about a run (empty for runs of `neurosandbox eval`)."""
    info = run.config.get(GATEWAY_KEY)
    return info if isinstance(info, dict) else {}


def _read(runs: StudyRunStore, run_id: str, store_file: Path) -> RunData:
    rec = runs.get(run_id)
    try:
        # the study as received: the audit's variants are read from the run's log, not here
        run = as_received(run_from_store(store_file, database_url=runs.database_url))
    except (EvaluationError, RunLoadError, OSError, ValueError) as exc:
        raise RunNotReadableError(f"run {run_id}: {exc}") from None
    run.config = {**run.config, GATEWAY_KEY: gateway_facts(rec)}
    if rec.route is not None:
        run.title = f"PACS study, routing rule {rec.route.rule}"
    return run


def read_run(runs: StudyRunStore, run_id: str) -> RunData:
    """The run ``run_id`` as its log holds it now (``RunNotFoundError``: no such run;
    ``RunNotReadableError``: nothing evaluated to read). Callers share the object: do not
    change it (``model_copy`` first)."""
    store_file = runs.store_path(run_id)
    key = change_key(store_file, runs.database_url)
    if key is None:
        raise RunNotFoundError(run_id)
    where = (runs.database_url if store_file.name != STORE_FILE else None, store_file.parent)
    with _lock:
        hit = _cache.get(where)
        if hit is not None and hit[0] == key:
            _cache.move_to_end(where)
            return hit[1]
    run = _read(runs, run_id, store_file)
    if change_key(store_file, runs.database_url) != key:  # written while read: not kept
        return run
    with _lock:
        _cache[where] = (key, run)
        _cache.move_to_end(where)
        while len(_cache) > MAX_CACHED:
            _cache.popitem(last=False)
    return run


def evaluated_runs(runs: StudyRunStore, limit: int = 1000) -> list[RunRecord]:
    """The gateway's runs that were evaluated and written back (a report to review), newest
    first."""
    return [r for r in runs.list(limit=limit) if r.status is RunStatus.DONE]
