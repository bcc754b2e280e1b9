"""Which report version supersedes which: a study that trickles in over several quiet times gets
one gateway run per version, each with its report in the review queue.

A study's versions are the gateway runs with the same study key (``RunRecord.study_key``, the
StudyInstanceUID with its patient; a record written before runs had a key falls back to its
StudyInstanceUID alone, and so only ever meets other such records). A version is superseded by
a later run of the same key that is done and has a higher version; the newest of those is the
one named. A run that failed, was held or was interrupted supersedes nothing, and another
patient's study under the same UID is another key.
"""

from __future__ import annotations

import threading

from gateway.runs import FINAL, RunNotFoundError, RunRecord, RunStatus, StudyRunStore


def study_of(rec: RunRecord) -> str | None:
    """The key a run's versions are grouped by (None: the run names no study)."""
    return rec.study_key or rec.study_uid


def newest_over(rec: RunRecord, runs: list[RunRecord]) -> RunRecord | None:
    """The newest version among ``runs`` that supersedes ``rec`` (None: none does)."""
    key = study_of(rec)
    if key is None or rec.version is None:
        return None
    newer = [
        r
        for r in runs
        if r.status is RunStatus.DONE
        and r.version is not None
        and r.version > rec.version
        and r.run_id > rec.run_id  # run ids are time-ordered: a later run
        and study_of(r) == key
    ]
    return max(newer, key=lambda r: (r.version or 0, r.run_id), default=None)


class ReportVersions:
    """The gateway's runs as versions of their studies, read from the run store. A finished
    run's record does not change, so it is read once; runs still queued or running are read
    again each time."""

    def __init__(self, runs: StudyRunStore) -> None:
        self.runs = runs
        self._lock = threading.Lock()
        self._final: dict[str, RunRecord] = {}

    def records(self) -> list[RunRecord]:
        """Every run with a record, newest first."""
        out = []
        for run_id in self.runs.ids():
            with self._lock:
                rec = self._final.get(run_id)
            if rec is None:
                try:
                    rec = self.runs.get(run_id)
                except RunNotFoundError:  # being created, or unreadable: no version of anything
                    continue
                if rec.status in FINAL:
                    with self._lock:
                        self._final[run_id] = rec
            out.append(rec)
        return out

    def superseding(self, run_id: str, records: list[RunRecord] | None = None) -> RunRecord | None:
        """The newest version that supersedes the gateway run ``run_id`` (None: none does, or
        ``run_id`` is not a gateway run). ``records``: from :meth:`records`, read once for many."""
        records = self.records() if records is None else records
        rec = next((r for r in records if r.run_id == run_id), None)
        return newest_over(rec, records) if rec is not None else None
