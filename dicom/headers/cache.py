"""A persistent cache of header reads, for the second look at the same folder.

Off unless asked for: ``index_path(cache_dir=...)``, or a default folder set once at start by
``configure_header_cache`` (the CLI and the service pass ``NEUROSANDBOX_HEADER_CACHE`` from the
settings; nothing here reads the environment).
One file per input folder holds, for each file, its size and modification time (ns) and the
frames read from it (or its error). An entry is used only while size and mtime are unchanged,
and the whole file only if it was written by the same code: the key covers the sources of
the header reader, the pydicom, nibabel, numpy and Python versions and the memory cap.

Entries are stored with ``marshal`` (plain tuples, lists, dicts, str, numbers): loading them
runs no code. The directory is created private (0700) and a cache file that is not owned by
this user, or is writable by others, is ignored.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import marshal
import os
import stat
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path
from typing import Any

from dicom.atomic import atomic_write
from dicom.defaults import configure_header_cache as configure_header_cache
from dicom.defaults import default_cache_dir as default_cache_dir
from dicom.headers.frame import FrameHeader
from dicom.records import FileError, PatientKey
from dicom.sources import ZIP_SEP

_FIELDS = tuple(f.name for f in fields(FrameHeader))
# The sources whose change invalidates the cache: this subpackage and the file walk.
_HERE = Path(__file__).resolve().parent
_CODE = (*sorted(f"headers/{p.name}" for p in _HERE.glob("*.py")), "sources.py")
ReadResult = tuple[str, list[FrameHeader] | None, FileError | None]


def _code_key(memory_cap: int) -> str:
    h = hashlib.sha256()
    for name in _CODE:
        h.update((_HERE.parent / name).read_bytes())
    libs = "|".join(_version(name) for name in ("pydicom", "nibabel", "numpy"))
    h.update(f"{libs}|{sys.version}|{memory_cap}|{_FIELDS}".encode())
    return h.hexdigest()[:32]


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def _stat_key(source: str) -> tuple[int, int] | None:
    try:
        st = os.stat(source.split(ZIP_SEP, 1)[0])
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


class HeaderCache:
    def __init__(self, root: Path, memory_cap: int) -> None:
        self.root = root
        self.version = _code_key(memory_cap)
        self._stats: dict[str, tuple[int, int] | None] = {}

    def _file(self, folder: str) -> Path:
        name = hashlib.sha256(f"{self.version}|{folder}".encode()).hexdigest()[:40]
        return self.root / f"{name}.marshal"

    def lookup(self, sources: list[str]) -> tuple[dict[str, ReadResult], list[str]]:
        """Cached results for unchanged sources, and the sources still to read."""
        hits: dict[str, ReadResult] = {}
        missing: list[str] = []
        for folder, group in _by_folder(sources).items():
            entries = self._load(self._file(folder))
            for source in group:
                key = self._stats[source] = _stat_key(source)
                entry = entries.get(source)
                if key is None or entry is None or tuple(entry[0]) != key:
                    missing.append(source)
                else:
                    hits[source] = _decode(source, entry[1])
        return hits, missing

    def store(self, results: Iterable[ReadResult]) -> None:
        """Add fresh results (of sources passed to lookup) to their folders' cache files."""
        by_folder: dict[str, list[ReadResult]] = defaultdict(list)
        for result in results:
            by_folder[_folder(result[0])].append(result)
        if not by_folder:
            return
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        for folder, group in by_folder.items():
            path = self._file(folder)
            entries = self._load(path)
            for source, frames, error in group:
                key = self._stats.get(source) or _stat_key(source)
                if key is not None:
                    value = _encode(frames, error)
                    try:
                        marshal.dumps(value)
                    except ValueError:  # a value of an unexpected type: do not cache it
                        continue
                    entries[source] = (key, value)
            self._save(path, entries)

    def _load(self, path: Path) -> dict[str, Any]:
        try:
            with open(path, "rb") as fp:
                st = os.fstat(fp.fileno())
                if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                    return {}
                data = marshal.load(fp)
        except (OSError, EOFError, ValueError, TypeError):
            return {}
        if not isinstance(data, dict) or data.get("version") != self.version:
            return {}
        entries = data.get("entries")
        return entries if isinstance(entries, dict) else {}

    def _save(self, path: Path, entries: dict[str, Any]) -> None:
        try:
            with atomic_write(path, perm=0o600, fsync=False, make_dirs=False) as fp:
                marshal.dump({"version": self.version, "entries": entries}, fp)
        except OSError:
            pass  # an unwritable cache costs a read next time


def _folder(source: str) -> str:
    return str(Path(source.split(ZIP_SEP, 1)[0]).parent)


def _by_folder(sources: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for source in sources:
        out[_folder(source)].append(source)
    return out


_PATIENT = _FIELDS.index("patient")


def _encode(frames: list[FrameHeader] | None, error: FileError | None) -> tuple[Any, ...]:
    if frames is not None:
        rows = []
        for f in frames:
            row = [getattr(f, name) for name in _FIELDS]
            p = row[_PATIENT]  # a record: marshal keeps its four strings
            row[_PATIENT] = (p.patient_id, p.issuer, p.name, p.birth_date)
            rows.append(tuple(row))
        return ("frames", rows)
    assert error is not None
    return ("error", error.kind, error.message)


def _decode(source: str, value: Any) -> ReadResult:
    if value[0] == "frames":
        frames = []
        for row in value[1]:
            row = list(row)
            row[_PATIENT] = _patient(tuple(row[_PATIENT]))
            frames.append(FrameHeader(*row))
        return source, frames, None
    return source, None, FileError(path=source, kind=value[1], message=value[2])


@functools.lru_cache(maxsize=256)
def _patient(values: tuple[str, ...]) -> PatientKey:
    """One key object for the frames that name the same patient (a fresh read shares one too,
    so the index finds a series' patients by object, not by hashing each frame's)."""
    patient_id, issuer, name, birth_date = values
    return PatientKey.model_construct(
        patient_id=patient_id, issuer=issuer, name=name, birth_date=birth_date
    )
