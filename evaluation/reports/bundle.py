"""A report folder: per-case checklists (JSON, HTML, PDF) and the run summary (JSON, HTML, PDF).

Layout (what ``neurosandbox report`` writes and the gateway's review pages read)::

    rundata.json             the run as read (RunData): the summary is rebuilt from it
    checklist.schema.json    JSON Schema of the checklist files
    summary.json|html|pdf
    cases/<slug>.json|html|pdf
    images/<sha256>.png      the images the checklists show, by content hash
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pydantic import BaseModel, Field

from evaluation.log.catalog import CatalogEntry
from evaluation.log.rundata import RunData
from evaluation.reports.checklist import MAX_IMAGE_BYTES, image_path, run_checklists
from evaluation.reports.checklist_view import CaseChecklist, checklist_schema
from evaluation.reports.html import ImageLoader, render_checklist, render_summary
from evaluation.reports.loader import RUNDATA_FILE, save_run
from evaluation.reports.pdf import PdfError, Printer, html_file_to_pdf, print_pdfs
from evaluation.reports.summary import SummaryReport, build_summary, case_slug
from evaluation.review.review_log import CaseReview
from evaluation.robustness import VariantPair, as_received

_SHA = frozenset("0123456789abcdef")


class ReportIndex(BaseModel):
    out: str
    summary_html: str
    summary_pdf: str | None = None
    cases: dict[str, str] = Field(default_factory=dict)  # case id -> checklist HTML
    pdfs: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)


def bundle_images(out: Path) -> ImageLoaderFactory:
    """Image loaders that read a bundle's ``images/<sha256>.png`` copies."""

    def factory(cl: CaseChecklist) -> ImageLoader:
        def load(index: int) -> bytes | None:
            img = next((i for i in cl.images if i.index == index), None)
            h = img.file_sha256 if img else None
            if not h or len(h) != 64 or not set(h) <= _SHA:
                return None
            p = out / "images" / f"{h}.png"
            return p.read_bytes() if p.is_file() else None

        return load

    return factory


ImageLoaderFactory = Callable[[CaseChecklist], ImageLoader]


def case_images(run: RunData) -> ImageLoaderFactory:
    """Image loaders for checklists built from ``run`` (not read from a bundle): each image
    read where the run keeps it, and only while the file still hashes as the checklist found
    it (``file_sha256``)."""

    def factory(cl: CaseChecklist) -> ImageLoader:
        case = run.case(cl.case_id)
        root = run.case_roots.get(case.case_id)

        def load(index: int) -> bytes | None:
            img = next((i for i in cl.images if i.index == index), None)
            if img is None or img.file_sha256 is None:
                return None
            path = image_path(case, img.path, root)
            try:
                if not path.is_file() or path.stat().st_size > MAX_IMAGE_BYTES:
                    return None
                data = path.read_bytes()
            except OSError:
                return None
            return data if hashlib.sha256(data).hexdigest() == img.file_sha256 else None

        return load

    return factory


def load_checklist(out: Path, slug: str) -> CaseChecklist:
    return CaseChecklist.model_validate_json((out / "cases" / f"{slug}.json").read_bytes())


def load_checklists(out: Path, run: RunData) -> list[CaseChecklist]:
    return [load_checklist(out, case_slug(c.case_id)) for c in run.cases]


def _copy_images(run: RunData, checklists: list[CaseChecklist], out: Path) -> None:
    (out / "images").mkdir(parents=True, exist_ok=True)
    for case, cl in zip(run.cases, checklists, strict=True):
        for ref, item in zip(case.images, cl.images, strict=True):
            if item.file_sha256 is None:
                continue
            dst = out / "images" / f"{item.file_sha256}.png"
            if not dst.exists():
                shutil.copyfile(image_path(case, ref.path, run.case_roots.get(case.case_id)), dst)


def write_summary(
    out: Path, report: SummaryReport, *, pdf: bool = True
) -> tuple[Path, Path | None]:
    """Write (or rewrite, e.g. after reviews) the summary files of a report folder."""
    from evaluation.reports.plots import all_plots  # matplotlib: only where a summary is drawn

    plots = all_plots(report)
    (out / "summary.json").write_text(report.model_dump_json(indent=2))
    html = out / "summary.html"
    html.write_text(render_summary(report, plots))
    if not pdf:
        return html, None
    printable = out / ".summary.print.html"
    printable.write_text(render_summary(report, plots, print_mode=True))
    try:
        return html, html_file_to_pdf(printable, out / "summary.pdf")
    finally:
        printable.unlink(missing_ok=True)


def write_report(
    run: RunData,
    out: Path,
    *,
    pdf: bool = True,
    reviews: list[CaseReview] | None = None,
    workers: int = 2,
    summary: bool = True,
    printer: Printer | None = None,
    catalog: Sequence[CatalogEntry] | None = None,
    audit: Sequence[VariantPair] | None = None,
) -> ReportIndex:
    """Write the checklists (one per case as received) and the summary of ``run`` into ``out``.
    ``audit``: the grounding audit's variant pairs of a run whose variants were set apart
    (``robustness.as_received``; None: read from ``run``).

    ``summary=False`` writes the checklists alone, their pages without a summary link (the
    gateway: its review pages build the live summary on request). ``printer``: a running
    Chromium to print with (``Printer``); else one is started for the batch. ``catalog``: the
    install's runs, for the summary's figures over the earlier runs of this dataset."""
    out = Path(out)
    (out / "cases").mkdir(parents=True, exist_ok=True)
    save_run(run, out / RUNDATA_FILE)
    (out / "checklist.schema.json").write_text(json.dumps(checklist_schema(), indent=2))
    checklists = run_checklists(run, audit)  # the cases as received, flagged by the audit
    _copy_images(as_received(run), checklists, out)
    loaders = bundle_images(out)
    index = ReportIndex(out=str(out), summary_html=str(out / "summary.html") if summary else "")
    summary_href = "../summary.html" if summary else None
    jobs: list[tuple[Path, Path]] = []

    def write_case(cl: CaseChecklist) -> tuple[Path, tuple[Path, Path] | None]:
        slug = case_slug(cl.case_id)
        (out / "cases" / f"{slug}.json").write_text(cl.model_dump_json(indent=2))
        html = out / "cases" / f"{slug}.html"
        html.write_text(render_checklist(cl, loaders(cl), summary_href=summary_href))
        if not pdf:
            return html, None
        printable = out / "cases" / f".{slug}.print.html"
        printable.write_text(render_checklist(cl, loaders(cl), print_mode=True))
        return html, (printable, out / "cases" / f"{slug}.pdf")

    # Thumbnails (Pillow decode, resize, encode) release the GIL: pages render in parallel.
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for cl, (html, job) in zip(checklists, pool.map(write_case, checklists), strict=True):
            index.cases[cl.case_id] = str(html)
            if job is not None:
                jobs.append(job)
    if summary:
        from evaluation.reports.plots import all_plots  # matplotlib: see write_summary

        report = build_summary(run, reviews or [], checklists, catalog=catalog)
        plots = all_plots(report)
        (out / "summary.json").write_text(report.model_dump_json(indent=2))
        (out / "summary.html").write_text(render_summary(report, plots))
    if pdf:
        if summary:
            printable = out / ".summary.print.html"
            printable.write_text(render_summary(report, plots, print_mode=True))
            jobs.append((printable, out / "summary.pdf"))
        try:
            printed = print_pdfs(jobs, printer=printer)
        finally:
            for src, _ in jobs:
                src.unlink(missing_ok=True)
        for _, dst in jobs:
            result = printed[dst]
            if isinstance(result, PdfError):
                index.warnings.append(f"{dst.name}: {result}")
            else:
                index.pdfs.append(str(result))
        if (out / "summary.pdf").exists():
            index.summary_pdf = str(out / "summary.pdf")
    return index
