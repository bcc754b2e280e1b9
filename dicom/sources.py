"""Where input files come from: single files, folders (recursive), zip archives, gzipped files.

A source path is a string: a filesystem path, or ``archive.zip::member`` for a zip member.
"""

from __future__ import annotations

import gzip
import io
import os
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

ZIP_SEP = "::"
# Files that are never DICOM and only slow a folder walk down.
_SKIP_SUFFIXES = {".nii", ".json", ".bval", ".bvec", ".txt", ".md", ".png", ".jpg", ".csv", ".py"}
_SKIP_NAMES = {"LICENSE", "DICOMDIR", ".DS_Store", "README"}


def iter_sources(path: str | Path) -> Iterator[str]:
    """Yield every candidate DICOM source below ``path`` in a stable (sorted) order."""
    p = Path(path)
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
            if name.lower().endswith(".zip") and zipfile.is_zipfile(full):
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
