"""Shared fixtures: the real DICOM corpus in ../shared/data (never copied into the repo)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# A session-wide real Orthanc (fixture ``orthanc_server``) for the gateway tests; a small
# phantom suite (fixture ``phantom_suite``) for the phantom tests; a session-wide PostgreSQL
# (fixture ``pg_url``, ``pg_server.fresh_pg_database``) for the store on PostgreSQL; dcmtk's
# dcmqrscp as a non-Orthanc archive (``dcmqrscp``); a hospital CA and a TLS Orthanc (``tls_pki``,
# ``tls_orthanc``, ``https_orthanc``).
pytest_plugins = [
    "orthanc_fixture",
    "phantom_fixture",
    "pg_server",
    "dcmqrscp_fixture",
    "tls_fixture",
]

CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "dicom"


def corpus_path() -> Path:
    """The corpus root; skip (or fail when NEUROSANDBOX_REQUIRE_CORPUS=1) when it is absent."""
    if not CORPUS.exists():
        if os.environ.get("NEUROSANDBOX_REQUIRE_CORPUS") == "1":
            pytest.fail(f"shared corpus missing at {CORPUS} and NEUROSANDBOX_REQUIRE_CORPUS=1")
        pytest.skip(f"shared corpus not found at {CORPUS} (set it up or unset the test)")
    return CORPUS


@pytest.fixture(scope="session")
def corpus() -> Path:
    return corpus_path()


@pytest.fixture(scope="session")
def corpus_index(corpus: Path):  # type: ignore[no-untyped-def]
    from dicom.index import index_path

    return index_path(corpus)
