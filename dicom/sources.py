"""Where input files come from: single files, folders (recursive), zip archives, gzipped files.

A source path is a string: a filesystem path, or ``archive.zip::member`` for a zip member.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

ZIP_SEP = "::"
# Files that are never DICOM and only slow a folder walk down.
_SKIP_SUFFIXES = {".nii", ".json", ".bval", ".bvec", ".txt", ".md", ".png", ".jpg", ".csv", ".py"}
_SKIP_NAMES = {"LICENSE", "DICOMDIR", ".DS_Store", "README"}


class NotRegularFileError(OSError):
    """A path that is not a regular file (a named pipe, a device, a socket): never read."""


_KINDS = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a folder"))  # fmt: skip


def check_regular(path: str | Path) -> None:
    """Raise ``NotRegularFileError`` unless ``path`` (symlinks followed) is a regular file:
    opening a named pipe blocks forever, reading /dev/zero never ends."""
    mode = os.stat(path).st_mode
    if stat.S_ISREG(mode):
        return
    what = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    raise NotRegularFileError(f"{path} is {what}: only regular files are read")


def iter_sources(path: str | Path) -> Iterator[str]:
    """Yield every candidate DICOM source below ``path`` in a stable (sorted) order.

    Special files (named pipes, devices, sockets) are yielded too, so that reading them gives
    a per-file error (``open_source`` refuses them before opening) instead of a silent skip."""
    p = Path(path)
    if p.exists() and not p.is_dir() and not p.is_file():
        yield str(p)  # a special file given directly: an error, not an empty result
        return
    if p.is_file():
        if zipfile.is_zipfile(p) and not _looks_like_dicom(p):
            yield from _zip_members(p)
        else:
            yield str(p)
        return
    if not p.exists():
        raise FileNotFoundError(f"no such file or folder: {p}")
    for root, dirs, files in os.walk(p):
        dirs.sort()
        # str(Path(root) / name), with the folder parsed once rather than once per file.
        base = str(Path(root))
        for name in sorted(files):
            if name in _SKIP_NAMES or name.startswith("."):
                continue
            if os.path.splitext(name)[1].lower() in _SKIP_SUFFIXES or name.endswith(".nii.gz"):
                continue
            full = name if base == "." else os.path.join(base, name)
            if name.lower().endswith(".zip") and os.path.isfile(full) and zipfile.is_zipfile(full):
                yield from _zip_members(Path(full))
            else:
                yield full


def _looks_like_dicom(p: Path) -> bool:
    with open(p, "rb") as f:
        head = f.read(132)
    return len(head) == 132 and head[128:132] == b"DICM"


def _zip_members(p: Path) -> Iterator[str]:
    with zipfile.ZipFile(p) as zf:
        for info in sorted(zf.infolist(), key=lambda i: i.filename):
            if info.is_dir():
                continue
            name = info.filename.rsplit("/", 1)[-1]
            if name in _SKIP_NAMES or name.startswith("."):
                continue
            yield f"{p}{ZIP_SEP}{info.filename}"


def is_plain_file(source: str) -> bool:
    """True when ``source`` can be opened and seeked directly (not a zip member, not gzipped)."""
    return ZIP_SEP not in source and not source.endswith(".gz")


def open_source(source: str, max_bytes: int | None = None) -> BinaryIO:
    """Open a source for reading; zip members and gzip files are read into memory.

    ``max_bytes`` bounds the in-memory size of a decompressed member (zip bombs).
    """
    check_regular(source.split(ZIP_SEP, 1)[0])
    if ZIP_SEP in source:
        archive, member = source.split(ZIP_SEP, 1)
        with zipfile.ZipFile(archive) as zf:
            info = zf.getinfo(member)
            if max_bytes is not None and info.file_size > max_bytes:
                raise OSError(
                    f"{source}: archive member is {info.file_size} bytes, over the {max_bytes} cap"
                )
            return io.BytesIO(zf.read(member))
    if source.endswith(".gz"):
        with gzip.open(source, "rb") as g:
            data = g.read(max_bytes + 1 if max_bytes is not None else -1)
        if max_bytes is not None and len(data) > max_bytes:
            raise OSError(f"{source}: decompressed size is over the {max_bytes} byte cap")
        return io.BytesIO(data)
    return open(source, "rb")
