"""Orthanc-driven mode: follow the /changes feed and evaluate studies that become stable.

No Orthanc plugin needed: the gateway polls ``/changes?since=N`` and hands every
``StableStudy`` to the pipeline (routing then decides, and studies whose instances were already
evaluated are skipped, including the change our own SR/PDF upload causes). The last sequence
number is kept on disk, so a restart neither repeats nor loses events; on first start the
backlog is skipped (only studies that become stable from now on).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from dicom import atomic_write
from gateway.orthanc import OrthancClient, OrthancError

log = logging.getLogger(__name__)


class ChangesFollower:
    def __init__(
        self,
        orthanc: OrthancClient,
        on_stable: Callable[[str], object],
        state_file: Path,
        poll_s: float = 2.0,
    ) -> None:
        self.orthanc = orthanc
        self.on_stable = on_stable
        self.state_file = state_file
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _load(self) -> int | None:
        try:
            return int(json.loads(self.state_file.read_text())["last"])
        except (OSError, ValueError, KeyError):
            return None

    def _save(self, last: int) -> None:
        with atomic_write(self.state_file, fsync=False) as fh:
            fh.write(json.dumps({"last": last}).encode())

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="orthanc-changes", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def poll_once(self, since: int) -> tuple[int, bool]:
        """Handle one page of changes after ``since``; returns (last, done)."""
        changes, last, done = self.orthanc.changes(since, limit=100)
        for ch in changes:
            if ch.get("ChangeType") == "StableStudy" and ch.get("ResourceType") == "Study":
                self.on_stable(str(ch["ID"]))
        if last != since:
            self._save(last)
        return last, done

    def _loop(self) -> None:
        since = self._load()
        while not self._stop.is_set():
            try:
                if since is None:
                    since = int(self.orthanc.get_json("/changes", {"last": ""}).get("Last", 0))
                    self._save(since)
                since, done = self.poll_once(since)
            except OrthancError as exc:
                log.warning("following Orthanc changes: %s", exc)
                done = True
            if done:
                self._stop.wait(self.poll_s)
