"""A disk cache of DICOM instances keyed by SOP Instance UID, written atomically."""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

_UID = re.compile(r"^[0-9]+(\.[0-9]+)*$")


class InvalidUIDError(ValueError):
    """A UID from a peer that is not a DICOM UID (and so may not name a file)."""


def check_uid(uid: str) -> str:
    """Return ``uid`` when it is a syntactically valid DICOM UID; peers' strings are hostile."""
    uid = uid.strip().rstrip("\0")
    if not uid or len(uid) > 64 or not _UID.match(uid):
        raise InvalidUIDError(f"not a DICOM UID: {uid[:80]!r}")
    return uid


@contextmanager
def atomic_writer(
    dest: Path, tmp_dir: Path | None = None, fsync: bool = True, make_dirs: bool = True
) -> Iterator[BinaryIO]:
    """Write to a temporary file next to ``dest`` (or in ``tmp_dir``), then rename it into place.

    Readers never see a partial file: either the old content, nothing, or the whole new file.
    With ``fsync`` the data is on disk before the rename (a full disk fails here, not later).
    On any error the temporary file is removed and the error propagates.
    """
    tmp_dir = tmp_dir or dest.parent
    if make_dirs:
        tmp_dir.mkdir(parents=True, exist_ok=True)
    tmp = tmp_dir / f".{dest.name}.{uuid.uuid4().hex}.part"
    fh = open(tmp, "wb")  # noqa: SIM115 (closed below before the rename)
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


class InstanceCache:
    """``root/<last 2 digits>/<SOPInstanceUID>.dcm``; an entry exists only when complete."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, sop_uid: str) -> Path:
        uid = check_uid(sop_uid)
        return self.root / uid[-2:] / f"{uid}.dcm"

    def has(self, sop_uid: str) -> bool:
        return self.path(sop_uid).exists()

    def put_stream(self, sop_uid: str, chunks: Iterable[bytes]) -> Path:
        """Store an instance from a stream of chunks (bounded memory)."""
        dest = self.path(sop_uid)
        with atomic_writer(dest) as fh:
            for chunk in chunks:
                fh.write(chunk)
        return dest

    def put_bytes(self, sop_uid: str, data: bytes) -> Path:
        return self.put_stream(sop_uid, [data])

    def link_into(self, sop_uids: Iterable[str], folder: Path) -> list[Path]:
        """Hard-link cached instances into ``folder`` (a task's view of a study); copy across devices."""
        folder.mkdir(parents=True, exist_ok=True)
        out: list[Path] = []
        for uid in sop_uids:
            src = self.path(uid)
            dest = folder / src.name
            if not dest.exists():
                try:
                    os.link(src, dest)
                except OSError:
                    shutil.copyfile(src, dest)
            out.append(dest)
        return out
