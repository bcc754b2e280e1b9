"""Pending write-backs stored when the PACS takes them: the gateway's retry loop.

An SR or PDF the destination did not store stays pending in its run's record (``WriteBack``:
attempts, the last error, when to try again) with its file kept under ``DATA_DIR/writeback/<run
id>/``; the folder is the index of what is pending, the run log the state. Every
``interval_s`` (and at start) ``WritebackRetrier`` tries each object that is due, with the
growing delay of ``gateway.writeback.retry_delay_s``; an object stored moves to the run's
``writebacks_done`` and its file goes. Runs still being evaluated are left to the pipeline.
A restart loses nothing: the record and the files are on disk.

A VERIFIED SR or PDF a sign-off could not store waits the same way in the gateway run it
reports on (``kind`` "verified-sr"/"verified-pdf", with the sign-off it carries:
``WriteBack.verified``); once stored, ``on_verified`` records it in the review log, as the
sign-off's own send would have. Every change of a run's pending list goes through ``record``
(one lock): the retry loop and a sign-off never overwrite each other's objects.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from evaluation.log import WriteBack
from gateway.audit import AuditLog
from gateway.metrics import METRICS
from gateway.pacs import PacsClient
from gateway.runs import RunNotFoundError, StudyRunStore
from gateway.writeback import Delivery, deliver, due, load_kept

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 30.0


_RECORD_LOCK = threading.Lock()  # every read-change-write of a run's pending write-backs


def record(
    runs: StudyRunStore,
    run_id: str,
    done: Iterable[WriteBack] = (),
    pending: Iterable[WriteBack] = (),
    drop: Callable[[WriteBack], bool] = lambda wb: False,
) -> list[WriteBack]:
    """Change the run's write-backs at once: ``done`` moves to the stored ones, ``pending``
    replaces the pending object of the same SOP Instance UID or is added after the others,
    ``drop`` removes pending objects (their kept files go). The pending list it leaves."""
    done, pending = list(done), list(pending)
    with _RECORD_LOCK:
        rec = runs.get(run_id)
        stored = {wb.sop_instance_uid for wb in done}
        changed = {wb.sop_instance_uid: wb for wb in pending}
        left: list[WriteBack] = []
        for wb in rec.writebacks_pending:
            if wb.sop_instance_uid in stored:
                continue
            if drop(wb):
                if wb.kept:
                    Path(wb.kept).unlink(missing_ok=True)
                continue
            left.append(changed.pop(wb.sop_instance_uid, wb))
        left += changed.values()  # new ones, in the order given
        runs.update(run_id, writebacks_pending=left, writebacks_done=[*rec.writebacks_done, *done])
        return left


def retry_pending(
    runs: StudyRunStore,
    run_id: str,
    dest: PacsClient,
    now: float,
    which: Callable[[WriteBack], bool] = lambda wb: True,
    base_delay_s: float = 30.0,
    quick_tries: int = 1,
) -> tuple[Delivery, list[WriteBack]]:
    """Try once more the run's pending objects ``which`` selects and that are due (all of them
    when ``now`` is ``math.inf``), in the order they were written back; the delivery and the
    pending list it leaves."""
    rec = runs.get(run_id)
    items = []
    for wb in rec.writebacks_pending:
        if which(wb) and due(wb, now):
            ds = load_kept(wb)
            if ds is not None:
                items.append((wb, ds))
    if not items:
        return Delivery(), list(rec.writebacks_pending)
    got = deliver(dest, items, lambda: min(now, time.time()), quick_tries=quick_tries,
                  base_delay_s=base_delay_s)  # fmt: skip
    return got, record(runs, run_id, done=got.done, pending=got.pending)


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
        on_verified: Callable[[WriteBack], None] = lambda wb: None,
    ) -> None:
        self.runs, self.destination, self.kept_root = runs, destination, kept_root
        self.audit = audit
        self.interval_s, self.base_delay_s, self.now = interval_s, base_delay_s, now
        self.on_verified = on_verified  # a VERIFIED object stored: the review log records it
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
        got, left = retry_pending(self.runs, run_id, self.destination(), self.now(),
                                  base_delay_s=self.base_delay_s)  # fmt: skip
        stored_verified(got.done, self.on_verified)
        if got.done:
            METRICS.inc("reports_stored_total", len(got.done))
            log.info("write-back: %d object(s) of run %s stored", len(got.done), run_id)
        if got.pending:
            METRICS.inc("writeback_attempts_failed_total")
        if not left:
            tidy(self.runs, self.kept_root, run_id)
            if self.audit is not None and got.done:
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


def stored_verified(done: Iterable[WriteBack], on_verified: Callable[[WriteBack], None]) -> None:
    """Tell ``on_verified`` of each VERIFIED object stored (one failing does not stop the rest)."""
    for wb in done:
        if wb.verified is not None:
            try:
                on_verified(wb)
            except Exception:
                log.exception("write-back: the review log did not record %s", wb.sop_instance_uid)


def tidy(runs: StudyRunStore, kept_root: Path, run_id: str) -> None:
    """Remove the kept files of the run's objects that are stored, and its folder once empty
    (a file kept for an object not recorded yet is left alone)."""
    folder = kept_root / run_id
    if not folder.is_dir():
        return
    with _RECORD_LOCK:
        stored = {wb.sop_instance_uid for wb in runs.get(run_id).writebacks_done}
        for p in folder.iterdir():
            if p.suffix == ".dcm" and p.stem in stored:
                p.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # not empty: something is still kept
            folder.rmdir()
