"""Pixel bytes the header pass has already read, kept for the render that follows it.

A render of a folder (dicom.render.render_path) reads every header, then the pixels of the
stacks it shows: for small files (the 780 files of a DWI trace) the second open and read of each
file cost as much as the decoding. Inside ``keeping_pixels()`` the fast scanner reads a small
plain file whole, in one read, and keeps the bytes from its pixel data's offset to the end of
the file here; the pixel reader takes them (once) instead of opening the file again. Outside
it nothing is kept. The store belongs to the caller's context (a contextvar): other renders,
in other threads, neither see nor clear it. Bounded per file and in total; what is not kept is
read from the file as before, with the same checks.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

# A file is read whole only up to this size (a DWI slice is ~170 kB, a 3D T1 slice ~180 kB).
MAX_FILE_BYTES = 1 << 20
# What one render keeps at most, in pixel bytes (past it, files are read again as before).
MAX_KEPT_BYTES = 256 << 20


class _Store:
    __slots__ = ("data", "left")

    def __init__(self, budget: int) -> None:
        self.data: dict[tuple[str, int], bytes] = {}
        self.left = budget


_STORE: ContextVar[_Store | None] = ContextVar("dicom_kept_pixels", default=None)


@contextmanager
def keeping_pixels(budget: int = MAX_KEPT_BYTES) -> Iterator[None]:
    """Keep the pixel bytes the header pass reads in this context, up to ``budget`` bytes."""
    token = _STORE.set(_Store(budget))
    try:
        yield
    finally:
        _STORE.reset(token)


def keeping() -> bool:
    """Whether the header pass should keep the pixel bytes it reads (see the module)."""
    store = _STORE.get()
    return store is not None and store.left > 0


def keep(path: str, offset: int, data: bytes) -> None:
    """Keep ``data``: the bytes of ``path`` from ``offset`` to the end of the file."""
    store = _STORE.get()
    if store is not None and len(data) <= min(store.left, MAX_FILE_BYTES):
        store.data[(path, offset)] = data
        store.left -= len(data)


def take_kept_pixels(path: str, offset: int) -> bytes | None:
    """The kept bytes of ``path`` from ``offset`` to its end (forgotten once taken), or None."""
    store = _STORE.get()
    if store is None:
        return None
    return store.data.pop((path, offset), None)
