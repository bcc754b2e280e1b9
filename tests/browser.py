"""What every browser test launches: Debian's Chromium, headless, with the flags this machine
needs (no sandbox as root; no background networking: the network is closed)."""

from __future__ import annotations

from typing import Any

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip


def launch(p: Any, *extra: str) -> Any:
    """Headless Chromium from playwright ``p`` with FLAGS and ``extra`` flags."""
    return p.chromium.launch(executable_path=CHROMIUM, args=[*FLAGS, *extra], headless=True)


def sign_in(page: Any, base: str, token: str, goto: bool = True) -> None:
    """Sign in with ``token`` on the review sign-in page (``goto``: open it first; else the
    page is already there) and wait for the review queue."""
    if goto:
        page.goto(f"{base}/review/login")
    page.fill("#token", token)
    page.click("#login")
    page.wait_for_url(f"{base}/review")
