"""The report of a gateway run: the same bundle `neurosandbox report` writes (evaluation.reports),
put where the review pages read it, so a case that came from PACS can be reviewed, signed off
and re-issued as a VERIFIED SR.

The bundle is written inside the run folder first; its case checklist, printed by Chromium, is
the Encapsulated PDF that goes back to PACS. Once the write-back succeeded, the UNVERIFIED SRs
stored are written into the bundle's ``rundata.json`` too and the folder is moved, atomically,
to ``<reports root>/<run id>``.

The bundle is an export: nothing of the gateway reads it back as the run (the review pages,
re-issue and the API read the run log, ``gateway.runs.reading``; the UNVERIFIED SRs are in the
run's record). ``republish`` writes it again from the log (``runs rescore`` does, so a download
shows the new scores); the checklist PDF in it stays the one written back to PACS. (The
evidence file, ``evidence.json``, is still kept in the bundle and read by re-issue until the
run log holds the evidence.)
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evaluation.log import RunData
from evaluation.reports import (
    RUNDATA_FILE,
    CaseChecklist,
    Printer,
    case_slug,
    save_run,
    write_report,
)
from gateway.runs.reading import GATEWAY_KEY, gateway_info, read_run
from gateway.runs.store import StudyRunStore
from gateway.writeback import EVIDENCE_FILE

__all__ = ["Checklist", "gateway_info", "publish", "republish", "write_checklist"]


@dataclass
class Checklist:
    """A gateway run's report bundle, not yet published."""

    folder: Path
    run: RunData
    html: str  # the case's checklist page (self-contained: inline CSS, data: images)
    pdf: bytes | None  # its print; None when Chromium failed (see warnings)
    warnings: list[str] = field(default_factory=list)


def write_checklist(run: RunData, folder: Path, printer: Printer | None = None) -> Checklist:
    """Write the bundle of a one-case run (the study) into ``folder``; ``printer``: the
    gateway's running Chromium (else one is started for the print)."""
    if len(run.cases) != 1:
        raise ValueError(f"a gateway run holds one case (the study), not {len(run.cases)}")
    shutil.rmtree(folder, ignore_errors=True)
    index = write_report(run, folder, pdf=True, workers=1, summary=False, printer=printer)
    slug = case_slug(run.cases[0].case_id)
    pdf = folder / "cases" / f"{slug}.pdf"
    return Checklist(
        folder=folder,
        run=run,
        html=Path(index.cases[run.cases[0].case_id]).read_text(),  # the page, no summary link
        pdf=pdf.read_bytes() if pdf.is_file() else None,
        warnings=[*index.warnings, *_missing_images(folder / "cases" / f"{slug}.json")],
    )


def _missing_images(checklist_json: Path) -> list[str]:
    """A checklist image whose file was not found (its tile and the PDF then show none) is
    said in the run's warnings, not only on the page."""
    cl = CaseChecklist.model_validate_json(checklist_json.read_bytes())
    gone = [i for i in cl.images if i.file_sha256 is None]
    if not gone:
        return []
    first = gone[0].path[-200:]
    return [
        f"{len(gone)} of {len(cl.images)} images the model saw were not found (or not readable) for the checklist "
        f"(first: {first}); its page and PDF show them as missing"
    ]


def publish(checklist: Checklist, root: Path, name: str, info: dict[str, Any]) -> Path:
    """Record ``info`` in the bundle, then move it to ``root/name`` (replacing an older one)."""
    run = checklist.run.model_copy(update={"config": {**checklist.run.config, GATEWAY_KEY: info}})
    save_run(run, checklist.folder / RUNDATA_FILE)
    root.mkdir(parents=True, exist_ok=True)
    # A hidden name first: the review pages list only names starting with a letter or digit.
    tmp = root / f".{name}.part"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.move(checklist.folder, tmp)
    final = root / name
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    checklist.folder = final
    return final


STALE_PDF_NOTE = "PDF-IS-AS-WRITTEN-BACK.txt"


def republish(runs: StudyRunStore, run_id: str) -> Path | None:
    """Write the published bundle of a gateway run again from its run log (after ``rescore``):
    ``rundata.json`` and the checklist (JSON, HTML). Returns the folder; None when the run was
    never published (not evaluated, or its bundle was removed). The checklist PDF is not
    printed again: it stays the copy of the one written back to PACS (a note in the bundle
    says its scores may be older), and the evidence file is kept."""
    final = runs.report_folder(run_id)
    if not final.is_dir():
        return None
    run = read_run(runs, run_id)
    tmp = final.with_name(f".{final.name}.rebuild")
    shutil.rmtree(tmp, ignore_errors=True)
    write_report(run, tmp, pdf=False, workers=1, summary=False)
    kept = [p for p in final.glob("cases/*.pdf") if not p.name.startswith(".")]
    if (final / EVIDENCE_FILE).is_file():
        shutil.copyfile(final / EVIDENCE_FILE, tmp / EVIDENCE_FILE)
    for pdf in kept:
        shutil.copyfile(pdf, tmp / "cases" / pdf.name)
    if kept:
        (tmp / STALE_PDF_NOTE).write_text(
            "The checklist PDF here is the one written back to PACS when the run finished. "
            "The run was rescored since: the JSON and HTML show the scores of its log now, "
            "the PDF those of the write-back.\n"
        )
    old = final.with_name(f".{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return final
