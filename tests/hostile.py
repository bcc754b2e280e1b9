"""Builders of hostile inputs shared by the bounds tests (issue 22): a zip member of zeros, a zip
whose central directory is broken, a gzip bomb; the memory cap the guarded commands run with;
and the good 4-slice FLAIR study they sit beside."""

from __future__ import annotations

import gzip
import zipfile
from pathlib import Path

import pytest

from tests.gateway_synth import make_study

CAP = 512 << 20  # the memory cap the guarded commands run with
MiB = 1 << 20


def zeros_member(zf: zipfile.ZipFile, name: str, size: int, head: bytes = b"") -> None:
    """A deflated member of ``size`` bytes: ``head``, then zeros (about 1 MB on disk per GiB)."""
    info = zipfile.ZipInfo(name)
    info.compress_type = zipfile.ZIP_DEFLATED
    with zf.open(info, "w", force_zip64=True) as w:
        w.write(head)
        chunk = bytes(MiB)
        left = size - len(head)
        while left > 0:
            w.write(chunk[: min(MiB, left)])
            left -= MiB


def break_zip_directory(path: Path) -> None:
    """Keep the end-of-directory record (is_zipfile stays true); break the directory it points
    to."""
    data = bytearray(path.read_bytes())
    cd = data.rfind(b"PK\x01\x02")
    data[cd : cd + 4] = b"XXXX"
    path.write_bytes(bytes(data))


def gzip_bomb(head: bytes) -> bytes:
    """``head`` gzipped, then 2 GiB of zeros as concatenated gzip members (about 2 MB)."""
    return gzip.compress(head) + gzip.compress(bytes(64 * MiB), compresslevel=9) * 32


@pytest.fixture(scope="module")
def good_study(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """A good 4-slice FLAIR series."""
    return make_study(tmp_path_factory.mktemp("good"), classes=("FLAIR",), n_slices=4).files
