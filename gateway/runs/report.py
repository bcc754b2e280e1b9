"""The report of a gateway run: the same bundle `neurosandbox report` writes (evaluation.reports),
put where the review pages read it, so a case that came from PACS can be reviewed, signed off
and re-issued as a VERIFIED SR.

The bundle is written inside the run folder first; its case checklist, printed by Chromium, is
the Encapsulated PDF that goes back to PACS. Once the write-back succeeded, the UNVERIFIED SRs
stored are recorded in the bundle's ``rundata.json`` (re-issue names them as predecessors) and
the folder is moved, atomically, to ``<reports root>/<run id>``.
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

GATEWAY_KEY = "gateway"  # RunData.config entry written by the gateway


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


def gateway_info(run: RunData) -> dict[str, Any]:
    """What the gateway recorded about a run (empty for runs of `neurosandbox eval`)."""
    info = run.config.get(GATEWAY_KEY)
    return info if isinstance(info, dict) else {}


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
