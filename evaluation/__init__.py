"""The benchmark's public face: the case vocabulary, datasets (phantoms included), running an
evaluation, opening a run, scoring, reports and the review log.

``evaluation`` imports ``dicom`` only. The gateway and the command line import these names
from ``evaluation`` only, never its modules (an import-linter contract in pyproject.toml).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evaluation.answers import Answer, ClassificationAnswer, DifferentialItem, Finding
    from evaluation.case import Case, ImageRef, Provenance, TaskFamily
    from evaluation.datasets import Dataset, DatasetSpec, dataset_hash
    from evaluation.datasets.phantoms.anatomy import AnatomyError
    from evaluation.datasets.phantoms.series import GENERATOR_VERSION
    from evaluation.datasets.phantoms.suite import SuiteManifest, generate_suite
    from evaluation.datasets.rendering import RenderPlan, render_study
    from evaluation.engine import rescore, resume_run, start_run
    from evaluation.errors import EvaluationError, ModelConfigError
    from evaluation.export import export_run
    from evaluation.judging import judge_run
    from evaluation.modelio import GenerateConfig
    from evaluation.models import load_models_file, resolve_specs
    from evaluation.models.check import check_model
    from evaluation.phi import PHIPolicy
    from evaluation.reports.agreement import review_stats
    from evaluation.reports.bundle import (
        ReportIndex,
        bundle_images,
        load_checklist,
        load_checklists,
        write_report,
    )
    from evaluation.reports.checklist import answer_key, reviewed_samples
    from evaluation.reports.html import (
        ImageLoader,
        ReviewView,
        csp,
        render_checklist,
        render_page,
        render_summary,
    )
    from evaluation.reports.loader import RUNDATA_FILE, RunLoadError, load_run, save_run
    from evaluation.reports.model import CaseChecklist
    from evaluation.reports.pdf import PdfError, pdf_bytes
    from evaluation.reports.plots import all_plots
    from evaluation.reports.reviews import (
        Action,
        CaseReview,
        ReviewError,
        ReviewEvent,
        ReviewStore,
        Verdict,
        export_csv,
        export_json,
    )
    from evaluation.reports.rundata import FULL_INPUT, RunData, SampleResult
    from evaluation.reports.storeread import run_from_store
    from evaluation.reports.summary import SummaryReport, build_summary, case_slug
    from evaluation.runconfig import RunConfig
    from evaluation.scores import ErrorCategory, ParseStatus, Score
    from evaluation.scoring_bridge import ScoringUnavailable, compare, summary
    from evaluation.store import STORE_FILE, RunStore
    from evaluation.tasks import Ablation
    from evaluation.units import RunStats

# Public name -> the module that defines it. Loaded on first use (PEP 562): importing one
# submodule (a worker process, a header read) must not import the whole package.
_EXPORTS: dict[str, str] = {
    "Ablation": "evaluation.tasks",
    "Action": "evaluation.reports.reviews",
    "AnatomyError": "evaluation.datasets.phantoms.anatomy",
    "Answer": "evaluation.answers",
    "Case": "evaluation.case",
    "CaseChecklist": "evaluation.reports.model",
    "CaseReview": "evaluation.reports.reviews",
    "ClassificationAnswer": "evaluation.answers",
    "Dataset": "evaluation.datasets",
    "DatasetSpec": "evaluation.datasets",
    "DifferentialItem": "evaluation.answers",
    "ErrorCategory": "evaluation.scores",
    "EvaluationError": "evaluation.errors",
    "FULL_INPUT": "evaluation.reports.rundata",
    "Finding": "evaluation.answers",
    "GENERATOR_VERSION": "evaluation.datasets.phantoms.series",
    "GenerateConfig": "evaluation.modelio",
    "ImageLoader": "evaluation.reports.html",
    "ImageRef": "evaluation.case",
    "ModelConfigError": "evaluation.errors",
    "PHIPolicy": "evaluation.phi",
    "ParseStatus": "evaluation.scores",
    "PdfError": "evaluation.reports.pdf",
    "Provenance": "evaluation.case",
    "RUNDATA_FILE": "evaluation.reports.loader",
    "RenderPlan": "evaluation.datasets.rendering",
    "ReportIndex": "evaluation.reports.bundle",
    "ReviewError": "evaluation.reports.reviews",
    "ReviewEvent": "evaluation.reports.reviews",
    "ReviewStore": "evaluation.reports.reviews",
    "ReviewView": "evaluation.reports.html",
    "RunConfig": "evaluation.runconfig",
    "RunData": "evaluation.reports.rundata",
    "RunLoadError": "evaluation.reports.loader",
    "RunStats": "evaluation.units",
    "RunStore": "evaluation.store",
    "STORE_FILE": "evaluation.store",
    "SampleResult": "evaluation.reports.rundata",
    "Score": "evaluation.scores",
    "ScoringUnavailable": "evaluation.scoring_bridge",
    "SuiteManifest": "evaluation.datasets.phantoms.suite",
    "SummaryReport": "evaluation.reports.summary",
    "TaskFamily": "evaluation.case",
    "Verdict": "evaluation.reports.reviews",
    "all_plots": "evaluation.reports.plots",
    "answer_key": "evaluation.reports.checklist",
    "build_summary": "evaluation.reports.summary",
    "bundle_images": "evaluation.reports.bundle",
    "case_slug": "evaluation.reports.summary",
    "check_model": "evaluation.models.check",
    "compare": "evaluation.scoring_bridge",
    "csp": "evaluation.reports.html",
    "dataset_hash": "evaluation.datasets",
    "export_csv": "evaluation.reports.reviews",
    "export_json": "evaluation.reports.reviews",
    "export_run": "evaluation.export",
    "generate_suite": "evaluation.datasets.phantoms.suite",
    "judge_run": "evaluation.judging",
    "load_checklist": "evaluation.reports.bundle",
    "load_checklists": "evaluation.reports.bundle",
    "load_models_file": "evaluation.models",
    "load_run": "evaluation.reports.loader",
    "pdf_bytes": "evaluation.reports.pdf",
    "render_checklist": "evaluation.reports.html",
    "render_page": "evaluation.reports.html",
    "render_study": "evaluation.datasets.rendering",
    "render_summary": "evaluation.reports.html",
    "rescore": "evaluation.engine",
    "resolve_specs": "evaluation.models",
    "resume_run": "evaluation.engine",
    "review_stats": "evaluation.reports.agreement",
    "reviewed_samples": "evaluation.reports.checklist",
    "run_from_store": "evaluation.reports.storeread",
    "save_run": "evaluation.reports.loader",
    "start_run": "evaluation.engine",
    "summary": "evaluation.scoring_bridge",
    "write_report": "evaluation.reports.bundle",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "FULL_INPUT",
    "GENERATOR_VERSION",
    "RUNDATA_FILE",
    "STORE_FILE",
    "Ablation",
    "Action",
    "AnatomyError",
    "Answer",
    "Case",
    "CaseChecklist",
    "CaseReview",
    "ClassificationAnswer",
    "Dataset",
    "DatasetSpec",
    "DifferentialItem",
    "ErrorCategory",
    "EvaluationError",
    "Finding",
    "GenerateConfig",
    "ImageLoader",
    "ImageRef",
    "ModelConfigError",
    "PHIPolicy",
    "ParseStatus",
    "PdfError",
    "Provenance",
    "RenderPlan",
    "ReportIndex",
    "ReviewError",
    "ReviewEvent",
    "ReviewStore",
    "ReviewView",
    "RunConfig",
    "RunData",
    "RunLoadError",
    "RunStats",
    "RunStore",
    "SampleResult",
    "Score",
    "ScoringUnavailable",
    "SuiteManifest",
    "SummaryReport",
    "TaskFamily",
    "Verdict",
    "all_plots",
    "answer_key",
    "build_summary",
    "bundle_images",
    "case_slug",
    "check_model",
    "compare",
    "csp",
    "dataset_hash",
    "export_csv",
    "export_json",
    "export_run",
    "generate_suite",
    "judge_run",
    "load_checklist",
    "load_checklists",
    "load_models_file",
    "load_run",
    "pdf_bytes",
    "render_checklist",
    "render_page",
    "render_study",
    "render_summary",
    "rescore",
    "resolve_specs",
    "resume_run",
    "review_stats",
    "reviewed_samples",
    "run_from_store",
    "save_run",
    "start_run",
    "summary",
    "write_report",
]
