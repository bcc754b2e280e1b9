"""PDFs printed by the real headless Chromium, rendered back to PNG with pdftoppm and read with
pdftotext: not blank, the case id and the hostile strings present as text."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from report_fixtures import build_run

from evaluation.reports import write_report
from evaluation.reports.pdf import PdfError, html_to_pdf

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]
needs = pytest.mark.skipif(
    not (
        Path("/usr/bin/chromium").exists()
        and shutil.which("pdftoppm")
        and shutil.which("pdftotext")
    ),
    reason="needs chromium and poppler-utils (apt-get install chromium poppler-utils)",
)


def _text(pdf: Path) -> str:
    return subprocess.run(
        ["pdftotext", "-layout", str(pdf), "-"], capture_output=True, text=True, check=True
    ).stdout


def _ink(pdf: Path, tmp: Path, page: int = 1) -> float:
    """Fraction of non-white pixels of one page rendered at 40 dpi."""
    out = tmp / f"{pdf.stem}-p{page}"
    subprocess.run(
        [
            "pdftoppm",
            "-r",
            "40",
            "-f",
            str(page),
            "-l",
            str(page),
            "-png",
            "-singlefile",
            str(pdf),
            str(out),
        ],
        check=True,
    )
    px = np.asarray(Image.open(f"{out}.png").convert("L"))
    return float((px < 235).mean())


@needs
def test_checklist_and_summary_pdfs_have_real_content(tmp_path: Path) -> None:
    run = build_run(tmp_path / "src")
    index = write_report(run, tmp_path / "report", pdf=True)
    assert not index.warnings and len(index.pdfs) == 4
    case_pdf = tmp_path / "report" / "cases" / "ms-1.pdf"
    text = _text(case_pdf)
    assert "Case ms-1" in text and "UNVERIFIED" in text
    assert '<script>alert("model")</script>' in text.replace("\n", " ")  # hostile text, as text
    assert "Multiple sclerosis" in text and "missed" in text
    assert _ink(case_pdf, tmp_path) > 0.03  # header, banner, thumbnails: far from blank
    summary = tmp_path / "report" / "summary.pdf"
    stext = _text(summary)
    assert "Run summary" in stext and "PUBLISHED, NOT MEASURED HERE" in stext.upper()
    assert "Leaderboard" in stext and "test-run" in stext
    info = subprocess.run(["pdfinfo", str(summary)], capture_output=True, text=True).stdout
    pages = int(re.search(r"^Pages:\s+(\d+)", info, re.M).group(1))  # type: ignore[union-attr]
    assert pages >= 3 and _ink(summary, tmp_path, 2) > 0.03  # plots, not just text
    artifacts = Path(__file__).parent / "artifacts"
    artifacts.mkdir(exist_ok=True)
    shutil.copyfile(case_pdf, artifacts / "checklist-ms-1.pdf")


@needs
def test_chromium_that_overruns_is_killed(tmp_path: Path) -> None:
    with pytest.raises(PdfError, match="did not finish"):
        html_to_pdf("<p>x</p>", tmp_path / "x.pdf", timeout_s=0.05)
    assert not (tmp_path / "x.pdf").exists()
