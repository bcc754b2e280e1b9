"""Pending write-backs stored when the PACS takes them: the gateway's retry loop.

An SR or PDF the destination did not store stays pending in its run's record (``WriteBack``:
attempts, the last error, when to try again) with its file kept under ``DATA_DIR/writeback/<run
id>/``; the folder is the index of what is pending, the run log the state. Every
``interval_s`` (and at start) ``WritebackRetrier`` tries each object that is due, with the
growing delay of ``gateway.writeback.retry_delay_s``; an object stored moves to the run's
``writebacks_done`` and its file goes. Runs still being evaluated are left to the pipeline.
A restart loses nothing: the record and the files are on disk.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gateway.audit import AuditLog
from gateway.metrics import METRICS
from gateway.pacs import PacsClient
from gateway.runs import RunNotFoundError, StudyRunStore
from gateway.writeback import deliver, due, load_kept

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 30.0


class WritebackRetrier:
    """Tries the pending write-backs again until the PACS stores them."""

    def __init__(
        self,
        runs: StudyRunStore,
        destination: Callable[[], PacsClient],
        kept_root: Path,
        audit: AuditLog | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        base_delay_s: float = 30.0,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.runs, self.destination, self.kept_root = runs, destination, kept_root
        self.audit = audit
        self.interval_s, self.base_delay_s, self.now = interval_s, base_delay_s, now
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one pass at a time

    def pending_runs(self) -> list[str]:
        """The runs with a kept object, oldest first."""
        if not self.kept_root.is_dir():
            return []
        return sorted(d.name for d in self.kept_root.iterdir() if d.is_dir() and any(d.iterdir()))

    def run_once(self) -> int:
        """One pass: each due object tried once; the number stored."""
        with self._lock:
            stored, pending = 0, 0
            for run_id in self.pending_runs():
                try:
                    stored_here, left = self._retry_run(run_id)
                except Exception:  # one run's trouble does not stop the others
                    log.exception("write-back retry of run %s failed", run_id)
                    continue
                stored += stored_here
                pending += left
            METRICS.set("writebacks_pending", pending)
            return stored

    def _retry_run(self, run_id: str) -> tuple[int, int]:
        try:
            rec = self.runs.get(run_id)
        except RunNotFoundError:
            log.warning("write-back: kept objects of run %s, which has no record", run_id)
            return 0, 0
        if not rec.final:  # the pipeline is still writing this run's record
            return 0, len(rec.writebacks_pending)
        now = self.now()
        items = []
        for wb in rec.writebacks_pending:
            if due(wb, now):
                ds = load_kept(wb)
                if ds is not None:
                    items.append((wb, ds))
        if not items:
            return 0, len(rec.writebacks_pending)
        got = deliver(self.destination(), items, lambda: now, quick_tries=1,
                      base_delay_s=self.base_delay_s)  # fmt: skip
        # still pending, in the order written back first (SRs before the PDF)
        retried = {wb.sop_instance_uid: wb for wb in got.pending}
        stored = {wb.sop_instance_uid for wb in got.done}
        left = [
            retried.get(wb.sop_instance_uid, wb)
            for wb in rec.writebacks_pending
            if wb.sop_instance_uid not in stored
        ]
        self.runs.update(
            run_id, writebacks_pending=left, writebacks_done=[*rec.writebacks_done, *got.done]
        )
        if got.done:
            METRICS.inc("reports_stored_total", len(got.done))
            log.info("write-back: %d object(s) of run %s stored", len(got.done), run_id)
        if got.pending:
            METRICS.inc("writeback_attempts_failed_total")
        if not left:
            folder = self.kept_root / run_id
            for p in folder.iterdir():  # files of objects no longer pending (stored)
                p.unlink(missing_ok=True)
            folder.rmdir()
            if self.audit is not None:
                self.audit.write("system", "writeback", f"run:{run_id}", "stored")
        return len(got.done), len(left)

    # ----------------------------------------------------------------- the loop

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="writeback-retry", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                self.run_once()
            except Exception:
                log.exception("write-back retry pass failed")
            if self._stop.wait(self.interval_s):
                return

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
