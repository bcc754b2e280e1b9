"""A minimal checklist PDF (text pages + the images the model saw), written with matplotlib.

Interim until the reports issue (Chromium print-to-PDF of the review page). Every string from
a model or a DICOM header is hostile: mathtext parsing is off, lines are wrapped and cut.
"""

from __future__ import annotations

import io
import textwrap
from datetime import datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.image as mpimg
import matplotlib.pyplot as plt
from matplotlib.backends.backend_pdf import PdfPages

A4 = (8.27, 11.69)
MAX_LINES_PER_PAGE = 62
BANNER = "UNVERIFIED - AI output for research evaluation; a clinician must review and sign."


def _clean(text: Any, limit: int = 2000) -> str:
    s = "" if text is None else str(text)
    s = "".join(ch if ch.isprintable() or ch == "\n" else " " for ch in s)
    return s[:limit]


def _wrap(text: str, width: int = 95, indent: str = "") -> list[str]:
    out: list[str] = []
    for para in _clean(text).splitlines() or [""]:
        out += textwrap.wrap(para, width, initial_indent=indent, subsequent_indent=indent) or [""]
    return out


def checklist_lines(title: str, sections: list[tuple[str, list[str]]]) -> list[str]:
    lines = [title, BANNER, f"Generated {datetime.now():%Y-%m-%d %H:%M}", ""]
    for head, body in sections:
        lines.append(f"## {head}")
        for item in body:
            lines += _wrap(item, indent="  ")
        lines.append("")
    return lines


def render_pdf(title: str, sections: list[tuple[str, list[str]]], images: list[Path]) -> bytes:
    """Text pages (title, banner, sections) then one page per image; returns the PDF bytes."""
    lines = checklist_lines(_clean(title, 200), sections)
    buf = io.BytesIO()
    with (
        matplotlib.rc_context({"text.parse_math": False, "font.family": "DejaVu Sans"}),
        PdfPages(buf, metadata={"Title": _clean(title, 200), "Creator": "NeuroSandbox"}) as pdf,
    ):
        for start in range(0, len(lines), MAX_LINES_PER_PAGE):
            fig = plt.figure(figsize=A4)
            y = 0.96
            for n, line in enumerate(lines[start : start + MAX_LINES_PER_PAGE]):
                bold = line.startswith("## ") or (start == 0 and n == 0)
                colour = "#b00020" if line == BANNER else "black"
                fig.text(
                    0.06,
                    y,
                    line.removeprefix("## "),
                    fontsize=9 if not bold else 10.5,
                    fontweight="bold" if bold else "normal",
                    color=colour,
                    family="monospace" if not bold else "sans-serif",
                    parse_math=False,
                )
                y -= 0.0148
            pdf.savefig(fig)
            plt.close(fig)
        for path in images:
            fig = plt.figure(figsize=A4)
            ax = fig.add_axes((0.04, 0.08, 0.92, 0.84))
            ax.imshow(mpimg.imread(str(path)))
            ax.set_axis_off()
            fig.text(0.06, 0.95, _clean(path.stem, 80), fontsize=10, parse_math=False)
            fig.text(0.06, 0.03, BANNER, fontsize=8, color="#b00020", parse_math=False)
            pdf.savefig(fig)
            plt.close(fig)
    return buf.getvalue()
