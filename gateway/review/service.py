"""What the review pages work on: the runs to review, the review log, live summaries, sessions.

A report is named by its folder in the reports root. A gateway run's is its run id, and it is
read from the run's log (``gateway.runs.reading``): its published bundle there is an export,
never read back (the checklists are built from the log, the images read from the run folder),
so a rescore shows at once and a bundle deleted or edited changes nothing here. A folder that
is no gateway run's (``neurosandbox report RUNDIR`` writes one, a bundle copied in by hand), or
whose run's log holds no evaluation (a record alone: the pipeline never publishes one), is a
report handed in: its ``rundata.json`` and checklists are what there is of it, and are read
(they change only when it is written again).
"""

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
    build_summary,
    bundle_images,
    case_images,
    case_slug,
    load_checklist,
    load_run,
    run_checklists,
)
from evaluation.review import ReviewStore
from evaluation.robustness import as_received
from gateway.report_versions import ReportVersions
from gateway.review.auth import SessionStore
from gateway.runs import RunNotFoundError, StudyRunStore
from gateway.runs.index import summary_catalog
from gateway.runs.reading import RunNotReadableError, evaluated_runs, read_run
from gateway.settings import Settings

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")
LIVE_BOOT = 1000  # bootstrap draws for summaries rebuilt on every review


_SummaryKey = tuple[RunData, int]


class ReportNotFoundError(KeyError):
    """No such report folder or case."""


def built_checklists(run: RunData) -> list[CaseChecklist]:
    """The case checklists of ``run`` as a report bundle holds them, built from the run."""
    return run_checklists(run)


class ReviewService:
    def __init__(self, settings: Settings, runs: StudyRunStore | None = None) -> None:
        self.settings = settings
        self.root = settings.reports_root
        self.runs = runs  # the gateway's runs (None: reports handed in only)
        # the gateway's runs: which report version supersedes which (None: reports only)
        self.versions = ReportVersions(runs) if runs is not None else None
        self.store = ReviewStore(settings.review_log)
        self.sessions = SessionStore(settings.review_session_hours)
        self._lock = threading.Lock()
        self._imported: dict[str, tuple[float, RunData]] = {}
        # report -> (the run it was built from, its checklists)
        self._checklists: dict[str, tuple[RunData, list[CaseChecklist]]] = {}
        # report -> ((the run, the review log's version), the summary, its plots)
        self._summaries: dict[str, tuple[_SummaryKey, SummaryReport, dict[str, bytes] | None]] = {}

    def is_gateway_run(self, report: str) -> bool:
        """Whether ``report`` names a gateway run (read from its run log)."""
        if self.runs is None or not _RUN_ID.match(report):
            return False
        return self.runs.store_path(report).is_file()

    def folder(self, report: str) -> Path:
        """The report's bundle folder: for a gateway run, where its export is published (it
        may be absent), else the report handed in (which must hold a ``rundata.json``)."""
        if not _NAME.match(report):
            raise ReportNotFoundError(report)
        path = self.root / report
        if not self.is_gateway_run(report) and not (path / RUNDATA_FILE).is_file():
            raise ReportNotFoundError(report)
        return path

    def reports(self) -> list[tuple[str, RunData]]:
        """Every report to review: the gateway's evaluated runs, then reports handed in."""
        out = []
        gateway: set[str] = set()
        if self.runs is not None:
            for rec in evaluated_runs(self.runs):
                gateway.add(rec.run_id)
                try:
                    out.append((rec.run_id, self.run(rec.run_id)))
                except ReportNotFoundError:
                    continue
        if self.root.is_dir():
            for d in sorted(self.root.iterdir()):
                if d.name in gateway or not _NAME.match(d.name):
                    continue
                if (d / RUNDATA_FILE).is_file():
                    try:
                        out.append((d.name, self.run(d.name)))
                    except (RunLoadError, OSError, ReportNotFoundError):
                        continue
        return out

    def _logged(self, report: str) -> RunData | None:
        """The gateway run ``report`` from its log; None when it is no gateway run, or its log
        holds no evaluation (a record alone, with a bundle put beside it by hand)."""
        if not self.is_gateway_run(report):
            return None
        assert self.runs is not None
        try:
            return read_run(self.runs, report)
        except RunNotReadableError:
            return None
        except RunNotFoundError:
            raise ReportNotFoundError(report) from None

    def run(self, report: str) -> RunData:
        logged = self._logged(report)
        if logged is not None:
            return logged
        path = self.folder(report) / RUNDATA_FILE
        if not path.is_file():
            raise ReportNotFoundError(report)
        mtime = path.stat().st_mtime
        with self._lock:
            hit = self._imported.get(report)
        if hit is not None and hit[0] == mtime:
            return hit[1]
        run = load_run(path)
        with self._lock:
            self._imported[report] = (mtime, run)
        return run

    def checklists(self, report: str) -> list[CaseChecklist]:
        """The case checklists of the report, in the order of its cases: a gateway run's built
        from its log (kept while the log is unchanged), a report handed in read from it."""
        run = self.run(report)
        with self._lock:
            hit = self._checklists.get(report)
        if hit is not None and hit[0] is run:
            return hit[1]
        if self._logged(report) is run:
            cls = built_checklists(run)
        else:
            folder = self.folder(report)
            cls = [load_checklist(folder, case_slug(c.case_id)) for c in as_received(run).cases]
        with self._lock:
            self._checklists[report] = (run, cls)
        return cls

    def case_id(self, report: str, slug: str) -> str:
        for c in as_received(self.run(report)).cases:  # the audit's variants are not cases
            if case_slug(c.case_id) == slug:
                return c.case_id
        raise ReportNotFoundError(slug)

    def checklist(self, report: str, slug: str) -> tuple[CaseChecklist, ImageLoader]:
        case_id = self.case_id(report, slug)  # only slugs of the run's cases reach the disk
        cl = next(c for c in self.checklists(report) if c.case_id == case_id)
        run = self._logged(report)
        if run is not None:
            return cl, case_images(run)(cl)
        return cl, bundle_images(self.folder(report))(cl)

    def summary(self, report: str) -> SummaryReport:
        """The summary with the review log as it is now (cached until either changes)."""
        return self._summary(report)[0]

    def summary_with_plots(self, report: str) -> tuple[SummaryReport, dict[str, bytes]]:
        summary, plots, key = self._summary(report)
        if plots is None:
            from evaluation.reports import all_plots  # matplotlib: when a summary is first shown

            plots = all_plots(summary)
            with self._lock:
                self._summaries[report] = (key, summary, plots)
        return summary, plots

    def _summary(self, report: str) -> tuple[SummaryReport, dict[str, bytes] | None, _SummaryKey]:
        run = self.run(report)
        key = (run, self.store.version(run.run_id))
        with self._lock:
            hit = self._summaries.get(report)
        if hit is not None and hit[0][0] is run and hit[0][1] == key[1]:
            return hit[1], hit[2], key
        checklists = self.checklists(report)
        summary = build_summary(
            run,
            self.store.reviews(run.run_id),
            checklists,
            n_boot=LIVE_BOOT,
            catalog=summary_catalog(self.settings),
        )
        with self._lock:
            self._summaries[report] = (key, summary, None)
        return summary, None, key
