"""The persistent header cache: same results as a fresh read, and only while files are unchanged."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from dicom.headers.cache import HeaderCache, configure_header_cache
from dicom.headers.fast import clear_caches
from dicom.index import index_path

BRAINIX_T1 = "brainix/BRAINIX/DICOM/T1"


def test_cached_index_equals_a_fresh_one_and_follows_file_changes(
    corpus: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "in"
    shutil.copytree(corpus / BRAINIX_T1, folder)
    (folder / "notes.bin").write_bytes(b"not dicom at all")
    cache = tmp_path / "cache"
    fresh = index_path(folder)
    first = index_path(folder, cache_dir=cache)
    assert list(cache.iterdir()), "the cache was not written"
    clear_caches()
    second = index_path(folder, cache_dir=cache)
    assert fresh == first == second
    assert [e.kind for e in second.errors] == ["not_dicom"]

    # A changed file is read again: here a slice removed from the series, the others cached.
    victim = sorted(folder.glob("*.dcm"))[0]
    victim.write_bytes(b"\0" * 10)
    third = index_path(folder, cache_dir=cache)
    assert third.series[0].shape[2] == fresh.series[0].shape[2] - 1
    assert {e.path for e in third.errors} >= {str(victim)}


def test_cache_from_other_code_or_other_owner_is_ignored(corpus: Path, tmp_path: Path) -> None:
    folder = corpus / BRAINIX_T1
    cache_dir = tmp_path / "cache"
    index_path(folder, cache_dir=cache_dir)
    paths = [str(p) for p in sorted(folder.iterdir())]
    cache = HeaderCache(cache_dir, 1 << 30)
    hits, missing = cache.lookup(paths)
    assert len(hits) == len(paths) and not missing
    # Another memory cap is another reader configuration: nothing is shared.
    hits, missing = HeaderCache(cache_dir, 1 << 20).lookup(paths)
    assert not hits and len(missing) == len(paths)
    # A cache file others may write to is not trusted.
    for f in cache_dir.iterdir():
        os.chmod(f, 0o666)
    hits, missing = HeaderCache(cache_dir, 1 << 30).lookup(paths)
    assert not hits


def test_cache_directory_from_the_environment(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NEUROSANDBOX_HEADER_CACHE still works, through the settings the CLI gives the library at
    start (the library reads no environment)."""
    from typer.testing import CliRunner

    from gateway.cli import app

    monkeypatch.setenv("NEUROSANDBOX_HEADER_CACHE", str(tmp_path / "envcache"))
    try:
        result = CliRunner().invoke(app, ["inspect", str(corpus / BRAINIX_T1)])
        assert result.exit_code == 0, result.output
        files = list((tmp_path / "envcache").iterdir())
        assert files and all(f.stat().st_mode & 0o077 == 0 for f in files)
        assert (tmp_path / "envcache").stat().st_mode & 0o077 == 0
        # the library itself never looks: unconfigured, a direct read writes no cache
        configure_header_cache(None)
        monkeypatch.setenv("NEUROSANDBOX_HEADER_CACHE", str(tmp_path / "other"))
        index_path(corpus / BRAINIX_T1)
        assert not (tmp_path / "other").exists()
    finally:
        configure_header_cache(None)
