"""One way to write a file so that no reader ever sees half of it: ``atomic_write``.

The content goes to a hidden temporary file beside the target (or in ``tmp_dir``, on the same
filesystem), which is renamed over the target when the block ends. On any error inside the
block, or while finishing, the temporary file is removed and the target is left as it was (the
old content, or nothing). It lives in the bottom layer so that every layer writes this way
(``tests/test_atomic_write.py`` finds any other module renaming a temporary file of its own).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import IO, Any, BinaryIO, Literal, TextIO, overload

_FLAGS = {"wb": os.O_WRONLY, "w": os.O_WRONLY, "w+b": os.O_RDWR}


@overload
def atomic_write(
    dest: Path,
    mode: Literal["wb", "w+b"] = "wb",
    *,
    fsync: bool = True,
    perm: int = 0o666,
    tmp_dir: Path | None = None,
    make_dirs: bool = True,
    encoding: str = "utf-8",
) -> AbstractContextManager[BinaryIO]: ...


@overload
def atomic_write(
    dest: Path,
    mode: Literal["w"],
    *,
    fsync: bool = True,
    perm: int = 0o666,
    tmp_dir: Path | None = None,
    make_dirs: bool = True,
    encoding: str = "utf-8",
) -> AbstractContextManager[TextIO]: ...


def atomic_write(
    dest: Path,
    mode: str = "wb",
    *,
    fsync: bool = True,
    perm: int = 0o666,
    tmp_dir: Path | None = None,
    make_dirs: bool = True,
    encoding: str = "utf-8",
) -> AbstractContextManager[Any]:
    """Write ``dest`` through a temporary file renamed into place when the block ends.

    ``mode``: ``"wb"`` (bytes), ``"w"`` (text in ``encoding``) or ``"w+b"`` (bytes that the
    block may read back before they are published, e.g. to test an archive). ``fsync``: the
    data is on disk before the rename (a full disk fails here, not later). ``perm``: the
    temporary file is created with these permission bits (0o600 for a secret: never wider,
    even for a moment). ``tmp_dir``: where the temporary file goes (default: beside ``dest``).
    ``make_dirs``: create the folders first.
    """
    if mode not in _FLAGS:
        raise ValueError(f"atomic_write: mode {mode!r} is not one of {sorted(_FLAGS)}")
    return _atomic_write(Path(dest), mode, fsync, perm, tmp_dir, make_dirs, encoding)


@contextmanager
def _atomic_write(
    dest: Path,
    mode: str,
    fsync: bool,
    perm: int,
    tmp_dir: Path | None,
    make_dirs: bool,
    encoding: str,
) -> Iterator[IO[Any]]:
    folder = Path(tmp_dir) if tmp_dir is not None else dest.parent
    if make_dirs:
        folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{dest.name}.{uuid.uuid4().hex}.part"
    flags = _FLAGS[mode] | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(tmp, flags, perm)
    try:
        fh: IO[Any] = os.fdopen(fd, mode, encoding=encoding if mode == "w" else None)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    try:
        yield fh
        fh.flush()
        if fsync:
            os.fsync(fh.fileno())
        fh.close()
        if make_dirs:
            dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, dest)
    except BaseException:
        fh.close()
        tmp.unlink(missing_ok=True)
        raise
