"""Reports: per-case checklists, the run summary with plots, PDFs, and the clinician review log.

Build from a run (``load_run`` or a ``RunData`` made by hand), then ``write_report`` writes
everything; the gateway's review pages (``gateway.api.routers.review``) serve the same pages
with review controls. The pieces: ``build_checklist`` (one case), ``build_summary`` (the run,
with signed-off reviews fed back), ``render_checklist``/``render_summary`` (HTML),
``html_to_pdf`` (Chromium), ``ReviewStore`` (append-only log).
"""

from evaluation.reports.bundle import ReportIndex, write_report
from evaluation.reports.checklist import answer_key, build_checklist
from evaluation.reports.loader import RunLoadError, load_run, save_run
from evaluation.reports.model import CaseChecklist, checklist_schema
from evaluation.reports.pdf import PdfError, html_to_pdf
from evaluation.reports.reviews import ReviewEvent, ReviewStore
from evaluation.reports.rundata import RunData, SampleResult
from evaluation.reports.summary import SummaryReport, build_summary

__all__ = [
    "CaseChecklist",
    "PdfError",
    "ReportIndex",
    "ReviewEvent",
    "ReviewStore",
    "RunData",
    "RunLoadError",
    "SampleResult",
    "SummaryReport",
    "answer_key",
    "build_checklist",
    "build_summary",
    "checklist_schema",
    "html_to_pdf",
    "load_run",
    "save_run",
    "write_report",
]
