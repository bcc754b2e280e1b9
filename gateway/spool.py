"""Writing received instances into the spool: atomically, with a chosen fsync policy.

Every instance is written to a temporary file and renamed into place, so no reader ever sees
a partial file, and a write that fails (disk full, file size limit, I/O error) raises before
the C-STORE is answered. What differs is when the data reaches the disk (``FsyncPolicy``):

- ``instance``: fsync before the rename, so before Success is answered. Nothing acknowledged
  is lost even on power loss; costs one disk flush per instance (~1-2 ms on ext4 here).
- ``association`` (default): a background thread fsyncs each file right after it is written,
  while the next instances arrive; the association's files enter the study folder only once
  all of them are on disk (and the folders are fsynced), so an evaluation never reads data a
  power loss could undo. A power loss (not a process crash) in the few milliseconds between
  Success and the fsync can lose an acknowledged instance. Disk full still answers 0xA700 on
  local filesystems that reserve space at write() time (ext4, xfs, btrfs); on network
  filesystems that report ENOSPC only at fsync, use ``instance``. If a background fsync
  fails, the association's later C-STOREs are refused and its files are quarantined.
- ``off``: no fsync at all (as dcmtk's storescp); for throwaway spools.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from dicom import atomic_write

log = logging.getLogger(__name__)

FsyncPolicy = Literal["instance", "association", "off"]
FSYNC_POLICIES: tuple[FsyncPolicy, ...] = ("instance", "association", "off")
MAX_PENDING_SYNCS = 256  # open files waiting for the syncer; C-STOREs wait beyond this


class SyncBatch:
    """The background fsyncs of one association's files."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending = 0
        self.error: OSError | None = None

    def _add(self) -> None:
        with self._cond:
            self._pending += 1

    def _done(self, error: OSError | None) -> None:
        with self._cond:
            self._pending -= 1
            if error is not None and self.error is None:
                self.error = error
            if self._pending == 0:
                self._cond.notify_all()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until every file of the batch is fsynced (or failed); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending == 0, timeout_s)


class Syncer:
    """One background thread that fsyncs and closes the files handed to it, in order."""

    def __init__(self, max_pending: int = MAX_PENDING_SYNCS) -> None:
        self._queue: queue.Queue[tuple[SyncBatch, int] | None] = queue.Queue(max_pending)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="spool-fsync", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=60)
            self._thread = None

    def submit(self, batch: SyncBatch, fd: int) -> None:
        """Hand over an open file descriptor: the syncer fsyncs and closes it."""
        batch._add()
        self._queue.put((batch, fd))

    @staticmethod
    def _fsync(fd: int) -> None:  # a seam for tests: a real disk fault cannot be staged
        os.fsync(fd)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            batch, fd = item
            error: OSError | None = None
            try:
                self._fsync(fd)
            except OSError as exc:
                error = exc
                log.error("background fsync failed: %s", exc.strerror or type(exc).__name__)
            finally:
                try:
                    os.close(fd)
                except OSError as exc:  # close can report a deferred write error too
                    error = error or exc
                batch._done(error)


def write_instance(
    dest: Path,
    tmp: Path,
    parts: Iterable[bytes | memoryview],
    policy: FsyncPolicy,
    syncer: Syncer | None = None,
    batch: SyncBatch | None = None,
) -> None:
    """Write ``parts`` to ``tmp``, then rename it to ``dest``; raise OSError on any failure.

    ``tmp`` must be in the folder of ``dest`` and unique among concurrent writers.
    """
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    handed_over = False
    try:
        for part in parts:
            view = memoryview(part)
            while view:  # os.write may write less than asked
                view = view[os.write(fd, view) :]
        if policy == "instance":
            os.fsync(fd)
        os.replace(tmp, dest)
        if policy == "association" and syncer is not None and batch is not None:
            syncer.submit(batch, fd)
            handed_over = True
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        if not handed_over:
            os.close(fd)


def fsync_dirs(folders: Iterable[Path]) -> None:
    """Make renames and new entries in ``folders`` durable (best effort where unsupported)."""
    for folder in folders:
        try:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            os.fsync(fd)
        except OSError as exc:  # e.g. a filesystem without directory fsync
            log.debug("fsync of a spool folder failed: %s", exc.strerror)
        finally:
            os.close(fd)


def quarantine(folder: Path, quarantine_dir: Path, why: str, n: int | None = None) -> int:
    """Move a staging folder out of the way (kept for inspection); return its instance count."""
    if not folder.exists():
        return 0
    dest = quarantine_dir / f"{time.strftime('%Y%m%dT%H%M%S')}-{folder.name}"
    try:
        os.replace(folder, dest)
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)
        dest = Path("(deleted)")
    count = n if n is not None else sum(1 for _ in dest.rglob("*.dcm")) if dest.exists() else 0
    log.warning("%s: %d partial instance(s) not evaluated, moved to %s", why, count, dest)
    return count


def read_received_info(study_folder: Path) -> dict[str, Any]:
    """The study's ``.received.json`` (calling AEs, first/last received), {} when unreadable."""
    try:
        return dict(json.loads((study_folder / ".received.json").read_text()))
    except (OSError, ValueError):
        return {}


def write_received_info(study_folder: Path, info: dict[str, Any]) -> None:
    with atomic_write(study_folder / ".received.json") as fh:
        fh.write(json.dumps(info).encode())
