"""What the imaging core uses when its caller passes nothing: the memory cap of one decoded
image or volume, and the header cache's folder (set once at start by the CLI and the service,
``configure_header_cache``). Nothing else here, and no pydicom: the settings and every command
of the CLI import this before they know whether they will read DICOM at all.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_MEMORY_CAP = 1 << 30  # 1 GiB

_default_dir: Path | None = None


def configure_header_cache(folder: Path | None) -> None:
    """The cache folder a read uses when its caller passes none (None: no persistent cache).
    Set once at start by the CLI and the service from the settings (``header_cache``)."""
    global _default_dir
    _default_dir = folder


def default_cache_dir() -> Path | None:
    """The folder ``configure_header_cache`` set, if any."""
    return _default_dir
