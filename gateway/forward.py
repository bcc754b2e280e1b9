"""Forward received instances to Orthanc while they arrive, not after the study is complete.

The DICOM node hands each instance it wrote to its spool (the encoded Part 10 bytes it already
holds in memory) to ``Forwarder.submit``; a few threads store them in Orthanc. By the time the
study is complete (the quiet time), its instances are in the PACS, and the pipeline's
write-back does not wait for an upload.

- Bounded: past ``max_bytes`` of instances not yet stored, ``submit`` declines, and the
  pipeline uploads that instance from the spool instead; an instance whose store failed is
  uploaded from the spool too (``settle``). Nothing is lost either way.
- An aborted association leaves nothing behind: ``discard`` deletes from Orthanc what its
  instances added (an instance Orthanc already held stays), as the spool quarantines them.
  So does one a crash interrupted: each instance new to Orthanc is journaled in the
  association's staging folder (``FORWARD_JOURNAL``: its Orthanc id and its staged file), and
  the node's next start deletes what the journal names whose staged file is still there (not
  committed into the spool) before it quarantines the folder.

Studies are found by an opaque key (the node's ``StudyKey.name``: UID and patient).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from gateway.metrics import METRICS

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 256 << 20
FORWARD_JOURNAL = ".forwarded"  # in a staging folder: Orthanc ids its association added
_MAX_JOURNAL = 64 << 20

# store(bytes) -> (Orthanc id, new to Orthanc); delete(Orthanc id)
Store = Callable[[bytes], tuple[str, bool]]


@dataclass
class _StudyForwards:
    pending: dict[str, Future[tuple[str, bool]]] = field(default_factory=dict)  # SOP UID ->
    stored: set[str] = field(default_factory=set)


class Forwarder:
    """Stores instances in Orthanc as they arrive, per association."""

    def __init__(
        self,
        store: Store,
        delete: Callable[[str], None],
        threads: int = 4,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self._store, self._delete = store, delete
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="forward")
        self._lock = threading.Lock()
        self._studies: dict[str, _StudyForwards] = {}
        self._assocs: dict[str, list[tuple[str, str, Future[tuple[str, bool]]]]] = {}
        self._in_flight = 0
        self.max_bytes = max_bytes

    def submit(
        self,
        assoc_id: str,
        study_uid: str,
        sop_uid: str,
        data: bytes,
        journal: tuple[Path, Path] | None = None,
    ) -> bool:
        """Queue one instance of an association for Orthanc; False (declined) past the bound.
        ``journal``: (staging folder, staged file): the folder's journal gets the Orthanc id of
        the instance, if it is new there, with the staged file's name."""
        size = len(data)
        with self._lock:
            if self._in_flight + size > self.max_bytes:
                return False
            try:
                fut = self._pool.submit(self._store, data)
            except RuntimeError:  # shut down
                return False
            self._in_flight += size
            self._studies.setdefault(study_uid, _StudyForwards()).pending[sop_uid] = fut
            self._assocs.setdefault(assoc_id, []).append((study_uid, sop_uid, fut))
        fut.add_done_callback(lambda f: self._done(study_uid, sop_uid, size, f, journal))
        return True

    def _done(
        self,
        study_uid: str,
        sop_uid: str,
        size: int,
        fut: Future[tuple[str, bool]],
        journal: tuple[Path, Path] | None = None,
    ) -> None:
        failed = fut.exception()
        if failed is None and journal is not None and fut.result()[1]:
            staging, staged = journal
            _journal(staging / FORWARD_JOURNAL, fut.result()[0], staged.relative_to(staging))
        with self._lock:
            self._in_flight -= size
            st = self._studies.get(study_uid)
            if st is not None and st.pending.get(sop_uid) is fut:
                del st.pending[sop_uid]
                if failed is None:
                    st.stored.add(sop_uid)
        if failed is None:
            METRICS.inc("instances_forwarded_total")
        else:
            METRICS.inc("instances_forward_failed_total")
            log.warning("forwarding an instance to Orthanc failed: %s", failed)

    def commit(self, assoc_id: str) -> None:
        """The association was released: its instances are the study's."""
        with self._lock:
            self._assocs.pop(assoc_id, None)

    def discard(self, assoc_id: str) -> int:
        """The association was aborted: delete from Orthanc what its instances added. Returns
        how many were deleted."""
        with self._lock:
            items = self._assocs.pop(assoc_id, [])
        n = 0
        for study_uid, sop_uid, fut in items:
            if fut.exception() is not None:  # waits
                continue
            orthanc_id, new = fut.result()
            with self._lock:
                st = self._studies.get(study_uid)
                if st is not None:
                    st.stored.discard(sop_uid)
            if new:
                try:
                    self._delete(orthanc_id)
                    n += 1
                except Exception as exc:
                    log.error("an aborted association's instance stays in Orthanc: %s", exc)
        return n

    def undo_journal(self, staging: Path) -> int:
        """Delete from Orthanc what an association a crash interrupted added (its staging
        folder's journal): each instance whose staged file is still in the folder, never one
        committed into the spool (moved out) before the crash. Returns how many were deleted."""
        path = staging / FORWARD_JOURNAL
        try:
            with open(path, "rb") as fh:
                text = fh.read(_MAX_JOURNAL).decode("utf-8", "replace")
        except OSError:
            return 0
        n = 0
        for line in dict.fromkeys(text.splitlines()):
            orthanc_id, _, staged = line.partition(" ")
            if len(orthanc_id) != 44 or orthanc_id.count("-") != 4 or not staged:
                continue  # not a whole line (a torn last line)
            file = (staging / staged).resolve()
            if not file.is_relative_to(staging.resolve()) or not file.is_file():
                continue  # committed (moved into the spool), or not a staged file of this folder
            try:
                self._delete(orthanc_id)
                n += 1
            except Exception as exc:
                log.error("an interrupted association's instance stays in Orthanc: %s", exc)
        if n:
            log.warning("deleted %d instance(s) an interrupted association left in Orthanc", n)
            METRICS.inc("instances_undone_total", n)
        return n

    def accepted(self, study_uid: str) -> set[str]:
        """SOP UIDs of the study stored or still being stored."""
        with self._lock:
            st = self._studies.get(study_uid)
            return set() if st is None else st.stored | set(st.pending)

    def settle(self, study_uid: str) -> set[str]:
        """Wait for the study's forwards still running; the SOP UIDs stored (the others failed
        or were declined: the caller uploads them from the spool). Forgets the study."""
        with self._lock:
            st = self._studies.get(study_uid)
            pending = list(st.pending.values()) if st else []
        for fut in pending:
            fut.exception()  # waits; failures are logged by _done
        with self._lock:
            st = self._studies.pop(study_uid, None)
            return set() if st is None else set(st.stored)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=False)


def _journal(path: Path, orthanc_id: str, staged: Path) -> None:
    """Append one line: the Orthanc id and the staged file (a crash loses at most the line
    being written: it is skipped as torn)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    except OSError:  # the staging folder is gone: committed or discarded meanwhile
        return
    try:
        os.write(fd, f"{orthanc_id} {staged.as_posix()}\n".encode())
    finally:
        os.close(fd)
