"""A disk cache of DICOM instances, found by what identifies their content, written atomically.

An entry is named by the PACS's id of the instance (Orthanc's: a hash of PatientID, study,
series and SOP Instance UIDs, so the same SOP UID in another patient's or study's object is
another entry) and the id of the stored file (Orthanc's attachment UUID: a re-sent instance
that the PACS overwrote is another file, so the old bytes are never served for the new).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dicom import atomic_write, check_uid

_TOKEN = re.compile(r"^[0-9a-zA-Z-]{1,64}$")


class InvalidCacheKeyError(ValueError):
    """A PACS id that may not name a file."""


@dataclass(frozen=True)
class CacheKey:
    """One instance's content: the PACS's id of the instance and of its stored file."""

    instance_id: str  # e.g. Orthanc's instance id (patient, study, series and SOP UIDs)
    content_id: str  # e.g. Orthanc's attachment UUID (changes when the file is re-stored)
    sop_uid: str  # names the file in a task's view of the study

    def __post_init__(self) -> None:
        for v in (self.instance_id, self.content_id):
            if not _TOKEN.match(v):
                raise InvalidCacheKeyError(f"not a PACS id: {v[:80]!r}")
        check_uid(self.sop_uid)


class InstanceCache:
    """``root/<2 chars>/<instance id>.<content id>.dcm``; an entry exists only when complete."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, key: CacheKey) -> Path:
        return self.root / key.instance_id[:2] / f"{key.instance_id}.{key.content_id}.dcm"

    def has(self, key: CacheKey) -> bool:
        return self.path(key).exists()

    def put_stream(self, key: CacheKey, chunks: Iterable[bytes]) -> Path:
        """Store an instance from a stream of chunks (bounded memory)."""
        dest = self.path(key)
        with atomic_write(dest) as fh:
            for chunk in chunks:
                fh.write(chunk)
        return dest

    def put_bytes(self, key: CacheKey, data: bytes) -> Path:
        return self.put_stream(key, [data])

    def link_into(self, keys: Iterable[CacheKey], folder: Path) -> list[Path]:
        """Hard-link cached instances into ``folder`` as ``<SOPInstanceUID>.dcm`` (a task's
        view of a study); copy across devices. A file of the same name already there is
        replaced when it is not this content."""
        folder.mkdir(parents=True, exist_ok=True)
        out: list[Path] = []
        for key in keys:
            src = self.path(key)
            dest = folder / f"{key.sop_uid}.dcm"
            if dest.exists() and not os.path.samefile(src, dest):
                dest.unlink()
            if not dest.exists():
                try:
                    os.link(src, dest)
                except OSError:
                    shutil.copyfile(src, dest)
            out.append(dest)
        return out
