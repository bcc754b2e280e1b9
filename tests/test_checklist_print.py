"""The checklist PDF a clinician reads is 2 to 4 pages (issue 37): per model its review block,
its answers in a line each and its flags; the key images with legible side marks; whatever is
cut for paper says so with its digest, and the HTML page keeps every answer in full, collapsed.
Printed by the real Chromium and read back with poppler (pdfinfo, pdftotext)."""

from __future__ import annotations

import hashlib
import html as htmllib
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from print_fixtures import LONG, MODELS, worst_run
from report_fixtures import build_run

from evaluation.reports import write_report
from evaluation.reports.bundle import bundle_images, load_checklist
from evaluation.reports.checklist_view import FLAG_TITLES, CaseChecklist
from evaluation.reports.html import render_checklist
from evaluation.reports.pdf import html_to_pdf
from evaluation.reports.print_view import MAX_ITEMS, clip, print_view

needs = pytest.mark.skipif(
    not (Path("/usr/bin/chromium").exists() and shutil.which("pdftotext")),
    reason="needs chromium and poppler-utils (apt-get install chromium poppler-utils)",
)


def _pages(pdf: Path) -> int:
    info = subprocess.run(["pdfinfo", str(pdf)], capture_output=True, text=True).stdout
    return int(re.search(r"^Pages:\s+(\d+)", info, re.M).group(1))  # type: ignore[union-attr]


def _text(pdf: Path) -> str:
    out = subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True).stdout
    return re.sub(r"\s+", " ", out)


def _big_words(pdf: Path, min_pt: float) -> list[str]:
    """Words printed at least ``min_pt`` points high (pdftotext's word boxes)."""
    out = subprocess.run(
        ["pdftotext", "-bbox", str(pdf), "-"], capture_output=True, text=True
    ).stdout
    words = re.findall(
        r'<word xMin="[\d.]+" yMin="([\d.]+)" xMax="[\d.]+" yMax="([\d.]+)">([^<]*)</word>', out
    )
    return [w for y0, y1, w in words if float(y1) - float(y0) >= min_pt]


@pytest.fixture(scope="module")
def worst(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CaseChecklist]:
    folder = tmp_path_factory.mktemp("worst")
    index = write_report(worst_run(folder / "src"), folder / "report", pdf=True, summary=False)
    assert not index.warnings
    return folder / "report", load_checklist(folder / "report", "ms-worst")


@needs
@pytest.mark.browser
@pytest.mark.timeout(180)
def test_every_case_prints_in_at_most_four_pages(
    worst: tuple[Path, CaseChecklist], tmp_path: Path
) -> None:
    report, _ = worst
    small = write_report(build_run(tmp_path / "src"), tmp_path / "report", pdf=True)
    pdfs = [
        report / "cases" / "ms-worst.pdf",
        *sorted((tmp_path / "report" / "cases").glob("*.pdf")),
    ]
    assert len(pdfs) == 4 and not small.warnings
    pages = {p.name: _pages(p) for p in pdfs}
    # at most four pages; a small case may take fewer (the worst one fills its four)
    assert all(1 <= n <= 4 for n in pages.values()) and pages["ms-worst.pdf"] >= 2, pages


@needs
@pytest.mark.browser
@pytest.mark.timeout(180)
def test_every_model_block_and_flag_is_on_paper(worst: tuple[Path, CaseChecklist]) -> None:
    report, cl = worst
    pdf = report / "cases" / "ms-worst.pdf"
    text = _text(pdf)
    assert "Case ms-worst" in text and "UNVERIFIED" in text
    view = print_view(cl)
    assert [m.model for m in view.models] == list(MODELS)
    for block in cl.blocks:
        assert block.model in text
        mp = next(m for m in view.models if m.model == block.model)
        assert len(mp.items) == min(len(block.items), MAX_ITEMS)
        for it in block.items[:MAX_ITEMS]:  # each item's own words (what the SR says)
            assert clip(it.text, 100).text.removesuffix("…").split()[-1] in text
    flags = {(a.model, f.kind) for a in cl.answers for f in a.flags}
    assert {k for _, k in flags} >= {"suspected_hallucination", "format_failure", "low_confidence"}
    for _, kind in flags:
        assert FLAG_TITLES[kind] in text
    # each model's own flags in its own section of the printed page
    page = render_checklist(cl, lambda i: None, print_mode=True)
    for model in MODELS:
        section = re.search(
            rf'<section class="p-model" data-model="{re.escape(htmllib.escape(model))}">(.*?)</section>',
            page,
            re.S,
        )
        assert section, model
        for m, kind in flags:
            if m == model:
                assert f'data-flag="{kind.value}"' in section.group(1)
    # what is cut says so, with the digest of the whole text
    cut = next(it for it in cl.blocks[0].items if it.kind == "finding")
    assert len(cut.text) > 100
    assert "full text in the HTML" in text
    assert hashlib.sha256(cut.text.encode()).hexdigest()[:12] in text


@needs
@pytest.mark.browser
@pytest.mark.timeout(180)
def test_key_images_carry_legible_side_marks(worst: tuple[Path, CaseChecklist]) -> None:
    report, cl = worst
    view = print_view(cl)
    assert view.key_images and all(k.left == "R" and k.right == "L" for k in view.key_images)
    # the images the findings point at (FLAIR, T2, T1 montages), the rest named
    assert {k.series_class for k in view.key_images} == {"FLAIR", "T2", "T1"}
    assert len(view.other_images) == len(cl.images) - len(view.key_images)
    big = _big_words(report / "cases" / "ms-worst.pdf", min_pt=9.0)
    assert big.count("R") >= len(view.key_images) and big.count("L") >= len(view.key_images)


def test_the_html_keeps_every_answer_in_full_collapsed(worst: tuple[Path, CaseChecklist]) -> None:
    report, cl = worst
    page = (report / "cases" / "ms-worst.html").read_text()
    opened = re.findall(r'<details class="answer-detail"([^>]*)>', page)
    assert len(opened) == len(cl.answers) == 9  # 3 models x 3 tasks (pass@k draws summarised)
    assert all("open" not in attrs for attrs in opened)  # collapsed
    detail = htmllib.unescape(page[page.index('id="answers"') :])
    assert LONG in detail  # every description whole, never cut
    assert " ".join([LONG] * 25) in detail  # the whole rationale
    # the page's thumbnails carry side marks too
    assert page.count('data-side="R"') == len([i for i in cl.images if i.plane == "axial"])


def test_a_cut_names_the_whole_text() -> None:
    text = "word " * 100
    c = clip(text, 50)
    assert c.cut and len(c.text) <= 51 and c.chars == len(text)
    assert c.sha256 == hashlib.sha256(text.encode()).hexdigest()
    assert not clip("short", 50).cut and clip("short", 50).text == "short"


@needs
@pytest.mark.browser
@pytest.mark.timeout(180)
def test_a_flood_of_items_and_images_still_prints_in_four_pages(
    worst: tuple[Path, CaseChecklist], tmp_path: Path
) -> None:
    """Models that answer with 60 items each and a case of 45 images: the paper copy prints 25
    items a model and four images, and names what it left out."""
    report, cl = worst
    blocks = [
        b.model_copy(
            update={
                "items": [
                    it.model_copy(update={"item_id": f"{it.item_id}.{k}"})
                    for k in range(3)
                    for it in b.items
                ][:60]
            }
        )
        for b in cl.blocks
    ]
    images = [
        img.model_copy(update={"index": len(cl.images) * k + img.index})
        for k in range(3)
        for img in cl.images
    ]
    flood = cl.model_copy(update={"blocks": blocks, "images": images})
    view = print_view(flood)
    assert all(len(m.items) == MAX_ITEMS and len(m.left_out) == 60 - MAX_ITEMS for m in view.models)
    assert (
        len(view.key_images) <= 4
        and view.other_images[-1] == f"and {45 - len(view.key_images) - 12} more"
    )
    page = render_checklist(flood, bundle_images(report)(flood), print_mode=True)
    assert page.count("more item(s) of this block, reviewed on the HTML page") == 3
    pdf = html_to_pdf(page, tmp_path / "flood.pdf")
    assert _pages(pdf) <= 4
