"""Reports: per-case checklists, the run summary with plots, PDFs, and the clinician review log.

Build from a run (``load_run`` or a ``RunData`` made by hand), then ``write_report`` writes
everything; the gateway's review pages (``gateway.api.routers.review``) serve the same pages
with review controls. The pieces: ``build_checklist`` (one case), ``build_summary`` (the run,
with signed-off reviews fed back), ``render_checklist``/``render_summary`` (HTML),
``html_to_pdf`` (Chromium), ``ReviewStore`` (append-only log).
"""

from __future__ import annotations

import importlib
from typing import Any

# Public names -> the module defining them. Loaded on first use (PEP 562), so that importing
# a submodule (the CLI registers ``gateway.cli.report`` at start-up) does not pull in
# matplotlib, Jinja2 and the scorers.
_EXPORTS = {
    "ReportIndex": "bundle",
    "write_report": "bundle",
    "answer_key": "checklist",
    "build_checklist": "checklist",
    "RunLoadError": "loader",
    "load_run": "loader",
    "save_run": "loader",
    "CaseChecklist": "model",
    "checklist_schema": "model",
    "PdfError": "pdf",
    "html_to_pdf": "pdf",
    "ReviewEvent": "reviews",
    "ReviewStore": "reviews",
    "RunData": "rundata",
    "SampleResult": "rundata",
    "SummaryReport": "summary",
    "build_summary": "summary",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'evaluation.reports' has no attribute {name!r}")
    return getattr(importlib.import_module(f"evaluation.reports.{module}"), name)


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
