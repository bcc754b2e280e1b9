"""PDF from the report HTML with the real headless Chromium (``--print-to-pdf``), so the PDF is
the same page a clinician sees. Chromium runs in its own process group with a fresh profile,
no network features, and is killed by PID when it overruns."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--no-pdf-header-footer",
    "--hide-scrollbars",
)
DEFAULT_TIMEOUT_S = 90.0


class PdfError(RuntimeError):
    """Chromium is missing, failed, or produced no PDF."""


def chromium_path() -> str:
    """The Chromium binary: NEUROSANDBOX_CHROMIUM, else the Debian package's."""
    env = os.environ.get("NEUROSANDBOX_CHROMIUM")
    for cand in (env, *CHROMIUM_CANDIDATES, shutil.which("chromium")):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    raise PdfError("Chromium not found: apt-get install chromium (or set NEUROSANDBOX_CHROMIUM)")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the group we created: Chromium and its children
    proc.wait(timeout=10)


def html_file_to_pdf(html: Path, pdf: Path, timeout_s: float = DEFAULT_TIMEOUT_S) -> Path:
    """Print one HTML file to ``pdf`` (A4, backgrounds as the page's @page rules say)."""
    pdf.parent.mkdir(parents=True, exist_ok=True)
    tmp_pdf = pdf.with_name(pdf.name + ".part")
    tmp_pdf.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="nsbx-chromium-") as profile:
        cmd = [
            chromium_path(),
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--crash-dumps-dir={profile}",
            f"--print-to-pdf={tmp_pdf}",
            html.resolve().as_uri(),
        ]
        env = {**os.environ, "HOME": profile}
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            tmp_pdf.unlink(missing_ok=True)
            raise PdfError(
                f"Chromium did not finish {html.name} within {timeout_s:.0f} s"
            ) from None
        finally:
            if proc.poll() is None:
                _kill_group(proc)
    if not tmp_pdf.is_file() or tmp_pdf.read_bytes()[:5] != b"%PDF-":
        tail = err.decode(errors="replace")[-500:] if err else ""
        tmp_pdf.unlink(missing_ok=True)
        raise PdfError(f"Chromium made no PDF of {html.name} (exit {proc.returncode}): {tail}")
    tmp_pdf.replace(pdf)
    return pdf


def html_to_pdf(html: str, pdf: Path, timeout_s: float = DEFAULT_TIMEOUT_S) -> Path:
    """Print an HTML string (self-contained: inline CSS, data: images) to ``pdf``."""
    with tempfile.TemporaryDirectory(prefix="nsbx-print-") as d:
        src = Path(d) / "page.html"
        src.write_text(html, encoding="utf-8")
        return html_file_to_pdf(src, pdf, timeout_s)


def pdf_bytes(html: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bytes:
    with tempfile.TemporaryDirectory(prefix="nsbx-print-") as d:
        return html_to_pdf(html, Path(d) / "out.pdf", timeout_s).read_bytes()
