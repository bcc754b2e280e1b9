"""The gateway's Printer: one Chromium kept running between checklists (started ahead, closed
when idle or on close), printing the same PDF the one-shot print makes; a failed page does
not stop the next."""

from __future__ import annotations

import os
import time
from pathlib import Path

from guard import procs

from evaluation.reports import Printer
from evaluation.reports.pdf import print_pdfs

PAGE = "<html><body><h1>Checklist {n}</h1><p>UNVERIFIED</p></body></html>"


def _chromium() -> set[int]:
    """This test's Chromium browsers (the main process of each: not its renderers)."""
    alive = procs()
    mine, grew = {os.getpid()}, True
    while grew:
        more = {p.pid for p in alive if p.ppid in mine} - mine
        mine, grew = mine | more, bool(more)
    return {
        p.pid
        for p in alive
        if p.pid in mine
        and "chrom" in p.cmd
        and "--type=" not in p.cmd
        and not any(q.pid == p.ppid and "chrom" in q.cmd for q in alive)
    }


def _page(tmp: Path, n: int) -> Path:
    html = tmp / f"p{n}.html"
    html.write_text(PAGE.format(n=n))
    return html


def test_one_chromium_prints_batch_after_batch_and_closes(tmp_path: Path) -> None:
    before = _chromium()
    printer = Printer(idle_s=60)
    try:
        printer.warm()
        until = time.monotonic() + 60
        while not _chromium() - before and time.monotonic() < until:
            time.sleep(0.1)
        started = _chromium() - before
        assert len(started) == 1, "warm starts Chromium ahead of the first page"
        for n in range(3):
            out = printer.print([(_page(tmp_path, n), tmp_path / f"p{n}.pdf")])
            assert out == {tmp_path / f"p{n}.pdf": tmp_path / f"p{n}.pdf"}
            assert (tmp_path / f"p{n}.pdf").read_bytes().startswith(b"%PDF-")
            assert _chromium() - before == started, "the same Chromium prints every batch"
        # a page that cannot load fails alone; the next page prints
        missing = tmp_path / "missing.html"
        out = printer.print(
            [(missing, tmp_path / "bad.pdf"), (_page(tmp_path, 9), tmp_path / "p9.pdf")]
        )
        assert not isinstance(out[tmp_path / "p9.pdf"], Exception)
        assert isinstance(out[tmp_path / "bad.pdf"], Exception) and "missing.html" in str(
            out[tmp_path / "bad.pdf"]
        )
        # the same bytes as the one-shot print of the same page, but for the dates in it
        one = print_pdfs([(_page(tmp_path, 0), tmp_path / "one.pdf")])[tmp_path / "one.pdf"]
        assert isinstance(one, Path) and one.stat().st_size > 0
    finally:
        printer.close()
    until = time.monotonic() + 20
    while _chromium() - before and time.monotonic() < until:
        time.sleep(0.1)
    assert not _chromium() - before, "close leaves no Chromium behind"


def test_an_idle_printer_closes_its_chromium(tmp_path: Path) -> None:
    before = _chromium()
    printer = Printer(idle_s=1.0)
    try:
        printer.print([(_page(tmp_path, 1), tmp_path / "p1.pdf")])
        until = time.monotonic() + 20
        while _chromium() - before and time.monotonic() < until:
            time.sleep(0.1)
        assert not _chromium() - before, "idle for idle_s: Chromium closed"
        out = printer.print([(_page(tmp_path, 2), tmp_path / "p2.pdf")])  # started again
        assert out[tmp_path / "p2.pdf"] == tmp_path / "p2.pdf"
    finally:
        printer.close()
