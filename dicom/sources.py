"""Where input files come from: single files, folders (recursive), zip archives, gzipped files.

A source path is a string: a filesystem path, or ``archive.zip::member`` for a zip member
(``archive.zip::`` names an archive that cannot be listed: reading it gives its error).

Compressed content is hostile until inflated: it is inflated as a stream, and only as far as
needed (``prefix``) or allowed (``max_bytes``); an archive's directory is read once per process,
not once per member, and an archive with more members than ``MAX_MEMBERS`` is one error.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import threading
import zipfile
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Protocol

ZIP_SEP = "::"
MAX_MEMBERS = 100_000  # members one archive may hold (each is a file to read)
HEADER_PREFIX = 64 << 20  # the most of a compressed file a header read inflates
_CHUNK = 1 << 20
_OPEN_ARCHIVES = 4
# Files that are never DICOM and only slow a folder walk down.
_SKIP_SUFFIXES = {".nii", ".json", ".bval", ".bvec", ".txt", ".md", ".png", ".jpg", ".csv", ".py"}
_SKIP_NAMES = {"LICENSE", "DICOMDIR", ".DS_Store", "README"}


class NotRegularFileError(OSError):
    """A path that is not a regular file (a named pipe, a device, a socket): never read."""


class FileTooLargeError(OSError):
    """A file over the size its reader accepts (``size``: its size when known)."""

    def __init__(self, message: str, size: int | None = None) -> None:
        super().__init__(message)
        self.size = size


class SourceError(OSError):
    """A source that is not read: an archive or compressed file over a cap, or broken."""


_KINDS = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a folder"))  # fmt: skip


def check_regular(path: str | Path) -> None:
    """Raise ``NotRegularFileError`` unless ``path`` (symlinks followed) is a regular file:
    opening a named pipe blocks forever, reading /dev/zero never ends."""
    _check_mode(path, os.stat(path).st_mode)


def read_regular(path: str | Path, cap: int) -> bytes:
    """The bytes of ``path`` when it is a regular file of at most ``cap`` bytes. Anything else
    is refused unopened (``NotRegularFileError``: a stat first), opened without blocking and
    checked again once open (a named pipe swapped in after the stat is refused too), and never
    read past the cap (``FileTooLargeError``)."""
    check_regular(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        _check_mode(path, info.st_mode)
        if info.st_size > cap:
            raise FileTooLargeError(f"{path}: over the {cap}-byte cap", info.st_size)
        data = fh.read(cap + 1)
    if len(data) > cap:  # grew since the stat
        raise FileTooLargeError(f"{path}: over the {cap}-byte cap")
    return data


def _check_mode(path: str | Path, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    what = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    raise NotRegularFileError(f"{path} is {what}: only regular files are read")


def iter_sources(path: str | Path) -> Iterator[str]:
    """Yield every candidate DICOM source below ``path`` in a stable (sorted) order.

    Special files (named pipes, devices, sockets) are yielded too, so that reading them gives
    a per-file error (``open_source`` refuses them before opening) instead of a silent skip;
    so is an archive that cannot be listed, as ``archive.zip::``."""
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
            if _skipped(name):
                continue
            full = name if base == "." else os.path.join(base, name)
            if name.lower().endswith(".zip") and os.path.isfile(full) and zipfile.is_zipfile(full):
                yield from _zip_members(Path(full))
            else:
                yield full


def _skipped(name: str) -> bool:
    """Files a walk passes over, in a folder or an archive alike: hidden, DICOMDIR, sidecars."""
    if not name or name in _SKIP_NAMES or name.startswith("."):
        return True
    return os.path.splitext(name)[1].lower() in _SKIP_SUFFIXES or name.endswith(".nii.gz")


def _looks_like_dicom(p: Path) -> bool:
    with open(p, "rb") as f:
        head = f.read(132)
    return len(head) == 132 and head[128:132] == b"DICM"


def _zip_members(p: Path) -> Iterator[str]:
    try:
        infos = _archive_entry(str(p))[0].infolist()
    except OSError:
        yield f"{p}{ZIP_SEP}"  # reading it gives the archive's error
        return
    for info in sorted(infos, key=lambda i: i.filename):
        if info.is_dir():
            continue
        if _skipped(info.filename.rsplit("/", 1)[-1]):
            continue
        yield f"{p}{ZIP_SEP}{info.filename}"


# Archives open in this process: (path, pid) -> (stat key, archive, lock). The directory of an
# archive is parsed once, however many members are read; a forked worker opens its own.
_ARCHIVES: OrderedDict[tuple[str, int], tuple[tuple[int, int], zipfile.ZipFile, threading.Lock]]
_ARCHIVES = OrderedDict()
_ARCHIVES_LOCK = threading.Lock()


def _archive_entry(path: str) -> tuple[zipfile.ZipFile, threading.Lock]:
    st = os.stat(path)
    _check_mode(path, st.st_mode)
    key, stamp = (path, os.getpid()), (st.st_mtime_ns, st.st_size)
    with _ARCHIVES_LOCK:
        hit = _ARCHIVES.get(key)
        if hit is not None and hit[0] == stamp:
            _ARCHIVES.move_to_end(key)
            return hit[1], hit[2]
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as exc:
        raise SourceError(f"{path}: not a readable zip archive ({exc})") from exc
    n = len(zf.infolist())
    if n > MAX_MEMBERS:
        zf.close()
        raise SourceError(f"{path}: archive has {n} members, over the {MAX_MEMBERS} member cap")
    lock = threading.Lock()
    with _ARCHIVES_LOCK:
        _ARCHIVES[key] = (stamp, zf, lock)
        while len(_ARCHIVES) > _OPEN_ARCHIVES:
            (_, pid), (_, old, _) = _ARCHIVES.popitem(last=False)
            if pid == os.getpid():
                old.close()
    return zf, lock


def source_folder(source: str) -> str:
    """The folder a source sits in: a member's folder inside its archive (``a.zip::dir``)."""
    if ZIP_SEP in source:
        archive, member = source.split(ZIP_SEP, 1)
        inner = member.rsplit("/", 1)[0] if "/" in member else ""
        return f"{archive}{ZIP_SEP}{inner}" if inner else archive
    return str(Path(source).parent)


def is_plain_file(source: str) -> bool:
    """True when ``source`` can be opened and seeked directly (not a zip member, not gzipped)."""
    return ZIP_SEP not in source and not source.endswith(".gz")


def open_source(
    source: str, max_bytes: int | None = None, *, prefix: int | None = None
) -> BinaryIO:
    """Open a source for reading; zip members and gzip files are inflated into memory.

    ``max_bytes`` bounds the inflated size (a larger member is a ``SourceError``, found while
    inflating, never trusting the size an archive declares); ``prefix`` inflates only the first
    ``prefix`` bytes (enough for a header). Plain files are opened as they are.
    """
    if ZIP_SEP in source:  # the archive is checked as it is looked up
        archive, member = source.split(ZIP_SEP, 1)
        zf, lock = _archive_entry(archive)
        if not member:
            raise SourceError(f"{source}: the archive lists no member of that name")
        try:
            info = zf.getinfo(member)
        except KeyError as exc:
            raise SourceError(f"{source}: no such member in the archive") from exc
        if prefix is None and max_bytes is not None and info.file_size > max_bytes:
            raise SourceError(
                f"{source}: archive member is {info.file_size} bytes, over the {max_bytes} "
                "byte cap: not read"
            )
        with lock:  # the archive's one file handle is shared by its members
            try:
                with zf.open(info) as stream:
                    if member.endswith(".gz"):  # a gzipped file inside the archive
                        with gzip.GzipFile(fileobj=stream) as inner:
                            return _inflate(inner, source, max_bytes, prefix)
                    return _inflate(stream, source, max_bytes, prefix)
            except (zipfile.BadZipFile, gzip.BadGzipFile, zlib.error, EOFError, RuntimeError,
                    NotImplementedError) as exc:  # fmt: skip
                raise SourceError(f"{source}: archive member cannot be inflated ({exc})") from exc
    check_regular(source)
    if source.endswith(".gz"):
        try:
            with gzip.open(source, "rb") as stream:
                return _inflate(stream, source, max_bytes, prefix)
        except (gzip.BadGzipFile, zlib.error, EOFError) as exc:
            raise SourceError(f"{source}: cannot be inflated ({exc})") from exc
    return open(source, "rb")


class _Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


def _inflate(
    stream: _Readable, source: str, max_bytes: int | None, prefix: int | None
) -> io.BytesIO:
    """Read ``stream`` in chunks into memory: its first ``prefix`` bytes, or all of it unless
    it passes ``max_bytes``."""
    want = prefix if prefix is not None else (max_bytes + 1 if max_bytes is not None else None)
    out = io.BytesIO()
    got = 0
    while want is None or got < want:
        chunk = stream.read(_CHUNK if want is None else min(_CHUNK, want - got))
        if not chunk:
            break
        out.write(chunk)
        got += len(chunk)
    if prefix is None and max_bytes is not None and got > max_bytes:
        raise SourceError(
            f"{source}: inflates past the {max_bytes} byte cap (a compression bomb?): not read"
        )
    out.seek(0)
    return out
