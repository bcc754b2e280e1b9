"""What every browser test launches: Debian's Chromium, headless, with the flags this machine
needs (no sandbox as root; no background networking: the network is closed)."""

from __future__ import annotations

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
