"""PDF from the report HTML with the real headless Chromium, so the PDF is the same page a
clinician sees. One Chromium (Debian's binary, driven by Playwright; never a downloaded browser)
prints a whole batch of pages: a browser start costs seconds, a page a fraction of one. It runs
with a fresh profile and no network features, in a thread of its own (Playwright's sync API
refuses to run inside an event loop), and is closed, or killed, when the batch ends or overruns
(``print_pdfs``), or kept running between batches for a service (``Printer``).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dicom import atomic_write

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
FLAGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
)
DEFAULT_TIMEOUT_S = 90.0
_log = logging.getLogger(__name__)


class PdfError(RuntimeError):
    """Chromium is missing, failed, or produced no PDF."""


_chromium: Path | None = None


def configure_chromium(binary: Path | None) -> None:
    """The Chromium binary to print with, tried before the Debian package's (None: only
    those). Set once at start by the CLI and the service from the settings
    (``NEUROSANDBOX_CHROMIUM``)."""
    global _chromium
    _chromium = binary


def chromium_path() -> str:
    """The Chromium binary: the configured one, else the Debian package's."""
    for cand in (_chromium, *CHROMIUM_CANDIDATES, shutil.which("chromium")):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return str(cand)
    raise PdfError("Chromium not found: apt-get install chromium (or set NEUROSANDBOX_CHROMIUM)")


def print_pdfs(
    jobs: list[tuple[Path, Path]],
    timeout_s: float = DEFAULT_TIMEOUT_S,
    printer: Printer | None = None,
) -> dict[Path, Path | PdfError]:
    """Print each (HTML file, PDF path) job with one Chromium; a failed page fails alone.

    ``timeout_s`` bounds the start of the browser and each page. Returns, per PDF path, the
    path written or the PdfError saying why not. With ``printer`` its running Chromium
    prints them; else one is started for the batch and closed after it.
    """
    if not jobs:
        return {}
    if printer is not None:
        return printer.print(jobs)
    once = Printer(timeout_s=timeout_s)  # one Chromium for this batch, closed after it
    try:
        return once.print(jobs)
    finally:
        once.close()


class Printer:
    """A Chromium kept running between batches, for a service that prints one page at a time
    (the gateway: a checklist per study). Starting Playwright and Chromium costs ~0.5 s, a page
    ~0.4 s; ``warm`` starts them ahead (while the study is evaluated), and the browser is
    closed after ``idle_s`` without a page, or by ``close``. One thread owns Playwright (its
    sync API is bound to the thread that started it); a browser that failed a page is closed
    and the next batch starts a new one."""

    def __init__(self, idle_s: float = 120.0, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.idle_s, self.timeout_s = idle_s, timeout_s
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="printer")
        self._pw: Any = None
        self._browser: Any = None
        self._profile: tempfile.TemporaryDirectory[str] | None = None
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._generation = 0  # the idle timer of an older batch closes nothing
        self._closed = False

    def warm(self) -> None:
        """Start Chromium in the background (returns at once; a failure shows at the print).
        Unused for ``idle_s``, it is closed again."""
        with self._lock:
            if self._closed:
                return
            self._thread.submit(self._warm)
        self._arm_timer()

    def print(self, jobs: list[tuple[Path, Path]]) -> dict[Path, Path | PdfError]:
        """Print the batch with the running Chromium (started when none is)."""
        with self._lock:
            if self._closed:  # the gateway stopping: no page, and said why
                return dict.fromkeys((pdf for _, pdf in jobs), PdfError("the printer is closed"))
            self._cancel_timer()
            future = self._thread.submit(self._print, jobs)
        try:
            return future.result()
        finally:
            self._arm_timer()

    def close(self) -> None:
        """Close Chromium and Playwright, and refuse further batches."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._cancel_timer()
        self._thread.submit(self._shut).result()
        self._thread.shutdown(wait=True)

    # the printer thread

    def _warm(self) -> None:
        try:
            self._launch()
        except Exception as exc:  # said again, with the reason, by the print that needs it
            self._shut()
            _log.debug("Chromium did not start ahead: %s", exc)

    def _launch(self) -> Any:
        if self._browser is not None and self._browser.is_connected():
            return self._browser
        self._shut()
        from playwright.sync_api import sync_playwright

        self._profile = tempfile.TemporaryDirectory(prefix="nsbx-chromium-")
        binary = chromium_path()
        self._pw = sync_playwright().start()
        self._browser = self._pw.chromium.launch(
            executable_path=binary,
            args=[*FLAGS, f"--crash-dumps-dir={self._profile.name}"],
            headless=True,
            timeout=max(1.0, self.timeout_s * 1000),
            env={**os.environ, "HOME": self._profile.name},
        )
        return self._browser

    def _print(self, jobs: list[tuple[Path, Path]]) -> dict[Path, Path | PdfError]:
        from playwright.sync_api import Error as PlaywrightError

        results: dict[Path, Path | PdfError] = {}
        ms = max(1.0, self.timeout_s * 1000)
        for html, pdf in jobs:
            try:
                browser = self._launch()
            except (PdfError, PlaywrightError) as exc:  # no Chromium: no page of the batch
                self._shut()
                failure = (
                    exc
                    if isinstance(exc, PdfError)
                    else _as_pdf_error(exc, "Chromium", self.timeout_s)
                )
                for _, rest in jobs:
                    results.setdefault(rest, failure)
                return results
            try:
                results[pdf] = _print_page(browser, html, pdf, ms, PlaywrightError)
            except PlaywrightError as exc:  # the browser itself failed (crashed, closed)
                results[pdf] = _as_pdf_error(exc, html.name, self.timeout_s)
            if isinstance(results[pdf], PdfError):
                self._shut()  # the next page (or batch) gets a new Chromium
        return results

    def _shut(self) -> None:
        browser, pw, profile = self._browser, self._pw, self._profile
        self._browser = self._pw = self._profile = None
        for step in (
            (lambda: browser.close()) if browser is not None else None,
            (lambda: pw.stop()) if pw is not None else None,
            (lambda: profile.cleanup()) if profile is not None else None,
        ):
            if step is not None:
                try:
                    step()
                except Exception as exc:  # a browser already gone
                    _log.debug("closing Chromium: %s", exc)

    # the idle timer (any thread)

    def _cancel_timer(self) -> None:
        self._generation += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm_timer(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._cancel_timer()
            generation = self._generation
            self._timer = threading.Timer(self.idle_s, self._idle, args=(generation,))
            self._timer.daemon = True
            self._timer.start()

    def _idle(self, generation: int) -> None:
        with self._lock:
            if self._closed or generation != self._generation:
                return
            self._timer = None
            self._thread.submit(self._shut)


def _print_page(
    browser: object, html: Path, pdf: Path, ms: float, error: type[Exception]
) -> Path | PdfError:
    page = browser.new_page()  # type: ignore[attr-defined]
    t0 = time.monotonic()
    try:
        page.goto(html.resolve().as_uri(), wait_until="load", timeout=ms)
        remaining = max(1.0, ms - (time.monotonic() - t0) * 1000)
        page.set_default_timeout(remaining)
        data = page.pdf(prefer_css_page_size=True, print_background=True)
    except error as exc:
        return _as_pdf_error(exc, html.name, ms / 1000)
    finally:
        page.close()
    if not isinstance(data, bytes) or data[:5] != b"%PDF-":
        return PdfError(f"Chromium made no PDF of {html.name}")
    with atomic_write(pdf, fsync=False) as fh:
        fh.write(data)
    return pdf


def _as_pdf_error(exc: Exception, what: str, timeout_s: float) -> PdfError:
    if "Timeout" in type(exc).__name__ or "Timeout" in str(exc)[:200]:
        return PdfError(f"Chromium did not finish {what} within {timeout_s:g} s")
    first = str(exc).strip().splitlines()[0][:400] if str(exc).strip() else type(exc).__name__
    return PdfError(f"Chromium failed on {what}: {first}")


def html_file_to_pdf(html: Path, pdf: Path, timeout_s: float = DEFAULT_TIMEOUT_S) -> Path:
    """Print one HTML file to ``pdf`` (A4, backgrounds as the page's @page rules say)."""
    result = print_pdfs([(html, pdf)], timeout_s)[pdf]
    if isinstance(result, PdfError):
        raise result
    return result


def html_to_pdf(html: str, pdf: Path, timeout_s: float = DEFAULT_TIMEOUT_S) -> Path:
    """Print an HTML string (self-contained: inline CSS, data: images) to ``pdf``."""
    with tempfile.TemporaryDirectory(prefix="nsbx-print-") as d:
        src = Path(d) / "page.html"
        src.write_text(html, encoding="utf-8")
        return html_file_to_pdf(src, pdf, timeout_s)


def pdf_bytes(html: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bytes:
    with tempfile.TemporaryDirectory(prefix="nsbx-print-") as d:
        return html_to_pdf(html, Path(d) / "out.pdf", timeout_s).read_bytes()
