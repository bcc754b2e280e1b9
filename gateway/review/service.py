"""What the review pages work on: report folders, the review log, live summaries, sessions."""

from __future__ import annotations

import re
import threading
from pathlib import Path

from evaluation.log import RunData
from evaluation.reports import (
    RUNDATA_FILE,
    CaseChecklist,
    ImageLoader,
    RunLoadError,
    SummaryReport,
    all_plots,
    build_summary,
    bundle_images,
    case_slug,
    load_checklist,
    load_checklists,
    load_run,
)
from evaluation.review import ReviewStore
from gateway.report_versions import ReportVersions
from gateway.review.auth import SessionStore
from gateway.runs import StudyRunStore
from gateway.settings import Settings

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
LIVE_BOOT = 1000  # bootstrap draws for summaries rebuilt on every review


class ReportNotFoundError(KeyError):
    """No such report folder or case."""


class ReviewService:
    def __init__(self, settings: Settings, runs: StudyRunStore | None = None) -> None:
        self.settings = settings
        self.root = settings.reports_root
        # the gateway's runs: which report version supersedes which (None: reports only)
        self.versions = ReportVersions(runs) if runs is not None else None
        self.store = ReviewStore(settings.review_log)
        self.sessions = SessionStore(settings.review_session_hours)
        self._lock = threading.Lock()
        self._runs: dict[str, tuple[float, RunData]] = {}
        self._summaries: dict[
            str, tuple[tuple[float, int], SummaryReport, dict[str, bytes] | None]
        ] = {}

    def folder(self, report: str) -> Path:
        if not _NAME.match(report):
            raise ReportNotFoundError(report)
        path = self.root / report
        if not (path / RUNDATA_FILE).is_file():
            raise ReportNotFoundError(report)
        return path

    def reports(self) -> list[tuple[str, RunData]]:
        out = []
        if self.root.is_dir():
            for d in sorted(self.root.iterdir()):
                if _NAME.match(d.name) and (d / RUNDATA_FILE).is_file():
                    try:
                        out.append((d.name, self.run(d.name)))
                    except (RunLoadError, OSError):
                        continue
        return out

    def run(self, report: str) -> RunData:
        path = self.folder(report) / RUNDATA_FILE
        mtime = path.stat().st_mtime
        with self._lock:
            hit = self._runs.get(report)
        if hit is not None and hit[0] == mtime:
            return hit[1]
        run = load_run(path)
        with self._lock:
            self._runs[report] = (mtime, run)
        return run

    def case_id(self, report: str, slug: str) -> str:
        for c in self.run(report).cases:
            if case_slug(c.case_id) == slug:
                return c.case_id
        raise ReportNotFoundError(slug)

    def checklist(self, report: str, slug: str) -> tuple[CaseChecklist, ImageLoader]:
        self.case_id(report, slug)  # only slugs of the run's cases reach the file system
        folder = self.folder(report)
        cl = load_checklist(folder, slug)
        return cl, bundle_images(folder)(cl)

    def summary(self, report: str) -> SummaryReport:
        """The summary with the review log as it is now (cached until either changes)."""
        return self._summary(report)[0]

    def summary_with_plots(self, report: str) -> tuple[SummaryReport, dict[str, bytes]]:
        summary, plots, key = self._summary(report)
        if plots is None:
            plots = all_plots(summary)
            with self._lock:
                self._summaries[report] = (key, summary, plots)
        return summary, plots

    def _summary(
        self, report: str
    ) -> tuple[SummaryReport, dict[str, bytes] | None, tuple[float, int]]:
        run = self.run(report)
        key = (self._runs[report][0], self.store.version(run.run_id))
        with self._lock:
            hit = self._summaries.get(report)
        if hit is not None and hit[0] == key:
            return hit[1], hit[2], key
        checklists = load_checklists(self.folder(report), run)
        summary = build_summary(run, self.store.reviews(run.run_id), checklists, n_boot=LIVE_BOOT)
        with self._lock:
            self._summaries[report] = (key, summary, None)
        return summary, None, key
