"""The header pass over many files: per-file errors kept, forked workers for large folders,
and the persistent cache (dicom.headers.cache) for unchanged files."""

from __future__ import annotations

import dataclasses
import operator
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from dicom.errors import (
    ImagingError,
    InvalidImageError,
    NonImageError,
    NotDicomError,
    TooLargeError,
)
from dicom.headers.cache import HeaderCache, default_cache_dir
from dicom.headers.frame import DEFAULT_MEMORY_CAP, FrameHeader
from dicom.headers.read import read_frames, read_frames_and_header
from dicom.parallel import idle_cpus
from dicom.records import FileError
from dicom.sources import source_folder

ProgressFn = Callable[[int, int], None]
# Files per worker process below which forking (and pickling results) costs more than it
# saves, at the fast scanner's ~0.1-0.3 ms per file.
_FILES_PER_WORKER = 128


def _error_kind(exc: Exception) -> str:
    if isinstance(exc, NotDicomError):
        return "not_dicom"
    if isinstance(exc, NonImageError):
        return "non_image"
    if isinstance(exc, TooLargeError):
        return "too_large"
    if isinstance(exc, InvalidImageError):
        return "invalid"
    return "unreadable"


_ReadResult = tuple[str, list[FrameHeader] | None, FileError | None]


def _read_one(args: tuple[str, int]) -> _ReadResult:
    path, cap = args
    try:
        return path, read_frames(path, cap), None
    except Exception as exc:  # any bug or oddity in one file must not stop the folder
        return path, None, _file_error(path, exc)


def _file_error(path: str, exc: Exception) -> FileError:
    """One file that could not be used, and why."""
    if isinstance(exc, ImagingError):
        return FileError(path=path, kind=_error_kind(exc), message=str(exc))
    return FileError(path=path, kind="unreadable", message=f"{path}: {exc!r}")


def read_headers_keeping(
    sources: Iterable[str], memory_cap: int = DEFAULT_MEMORY_CAP
) -> tuple[list[FrameHeader], list[FileError], int, dict[str, Any]]:
    """``read_headers`` for one study, in this process, each file read once, keeping the whole
    header (pixels excepted) of the first file of each folder by its SeriesInstanceUID: what
    the study's identity, the PHI gate's names and a report's evidence need, without reading
    any file a second time. (A spool or PACS download holds one series per folder.)"""
    frames: list[FrameHeader] = []
    errors: list[FileError] = []
    headers: dict[str, Any] = {}
    folders: set[str] = set()
    n = 0
    for path in sources:
        n += 1
        folder = source_folder(path)
        try:
            if folder in folders:
                fr = read_frames(path, memory_cap)
            else:
                fr, ds = read_frames_and_header(path, memory_cap)
                folders.add(folder)
                if fr:
                    headers.setdefault(fr[0].series_uid, ds)
            frames.extend(fr)
        except Exception as exc:  # any bug or oddity in one file must not stop the study
            errors.append(_file_error(path, exc))
    return frames, errors, n, headers


def _read_many(paths: list[str], cap: int) -> list[_ReadResult]:
    return [_read_one((p, cap)) for p in paths]


# A worker sends its frames back as tuples of field values: a quarter of the cost of pickling
# and unpickling the dataclasses, which is most of what a second process costs here.
_FRAME_FIELDS = operator.attrgetter(*(f.name for f in dataclasses.fields(FrameHeader)))
_Packed = tuple[str, list[tuple[Any, ...]] | None, FileError | None]


def _read_packed(paths: list[str], cap: int) -> list[_Packed]:
    return [
        (path, None if frames is None else [_FRAME_FIELDS(f) for f in frames], err)
        for path, frames, err in _read_many(paths, cap)
    ]


def _unpack(packed: list[_Packed]) -> list[_ReadResult]:
    return [
        (path, None if rows is None else [FrameHeader(*row) for row in rows], err)
        for path, rows, err in packed
    ]


def read_headers(
    sources: Iterable[str],
    memory_cap: int = DEFAULT_MEMORY_CAP,
    workers: int | None = None,
    progress: ProgressFn | None = None,
    cache_dir: Path | None = None,
) -> tuple[list[FrameHeader], list[FileError], int]:
    """Read headers of all sources; returns frames, per-file errors and the file count.

    Large folders are split into contiguous chunks (siblings stay together, which the fast
    scanner's templates need): this process reads the first, forked workers the others.
    With a cache directory (or the one ``configure_header_cache`` set), unchanged files are
    not read again.
    """
    paths = list(sources)
    root = cache_dir if cache_dir is not None else default_cache_dir()
    cache = HeaderCache(root, memory_cap) if root is not None else None
    cached, todo = cache.lookup(paths) if cache is not None else ({}, paths)
    fresh = _read_all(todo, memory_cap, workers, progress, len(paths))
    if cache is not None:
        cache.store(fresh)
    by_path = {r[0]: r for r in fresh}
    frames: list[FrameHeader] = []
    errors: list[FileError] = []
    for path in paths:
        _path, fr, err = cached.get(path) or by_path[path]
        if fr is not None:
            frames.extend(fr)
        elif err is not None:
            errors.append(err)
    if progress:
        progress(len(paths), len(paths))
    return frames, errors, len(paths)


def _read_all(
    paths: list[str], cap: int, workers: int | None, progress: ProgressFn | None, total: int
) -> list[_ReadResult]:
    n_workers = workers if workers is not None else min(4, idle_cpus())
    n_workers = min(n_workers, len(paths) // _FILES_PER_WORKER)
    # Forking a process that runs other threads can deadlock the child: stay serial then.
    if n_workers < 2 or threading.active_count() > 1:
        return _read_serial(paths, cap, progress, total)
    size = -(-len(paths) // n_workers)
    chunks = [paths[i : i + size] for i in range(0, len(paths), size)]
    with ProcessPoolExecutor(len(chunks) - 1, mp_context=get_context("fork")) as pool:
        futures = [pool.submit(_read_packed, chunk, cap) for chunk in chunks[1:]]
        results = _read_serial(chunks[0], cap, progress, total)
        for fut in futures:
            results.extend(_unpack(fut.result()))
    return results


def _read_serial(
    paths: list[str], cap: int, progress: ProgressFn | None, total: int
) -> list[_ReadResult]:
    results = []
    for i, path in enumerate(paths):
        results.append(_read_one((path, cap)))
        if progress and i % 50 == 0:
            progress(i + 1, total)
    return results
