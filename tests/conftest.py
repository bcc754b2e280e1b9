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


# The modules that take longest (seconds of test time in CI's `--durations`, e.g. 58 s for the
# gateway's run deadline), heaviest first. `make test` runs `-n 2 --dist loadfile
# --no-loadscope-reorder`: xdist hands out modules in collection order, each worker holding up to
# three tests ahead. Its default order (most tests first) left these one-test modules for the
# end, two or three of them queued on one worker while the other ran out of work; started
# first, they are shared between the workers and the many short modules even out the end.
SLOWEST_FIRST = (
    "test_shared_run_workers.py",  # issue 40: worker processes, a network namespace
    "test_queue_workers.py",  # issue 40: worker processes
    "test_run_deadline.py",
    "test_study_run_resume.py",  # a worker process killed, a run resumed on PostgreSQL
    "test_gateway_queue_corpus.py",  # BRAINIX through the queue and a worker
    "test_gateway_queue.py",
    "test_demo.py",
    "test_gateway_corpus.py",
    "test_lint.py",
    "test_eval_honesty.py",
    "test_run_deadline_worker.py",
    "test_slowloris_dicom.py",
    "test_cases_from_pacs.py",  # issue 38: ~43 s on the loaded machine (not yet in a CI log)
    "test_hostile_inputs.py",
    "test_review_verified_e2e.py",
    "test_phi_names.py",
    "test_gateway_e2e.py",
    "test_one_path.py",
    "test_viewer_browser.py",
    "test_review_browser.py",
    "test_runs_index_gateway.py",
    "test_engine_resume.py",
    "test_budget.py",
    "test_nothing_lost.py",
    "test_writeback_pacs.py",  # issue 38: ~13 s on the loaded machine
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist only: the SLOWEST_FIRST modules first, then the others, most tests first
    (xdist's own order); the tests of a module keep their order."""
    if not hasattr(config, "workerinput"):
        return
    count: dict[str, int] = {}
    for item in items:
        count[item.path.name] = count.get(item.path.name, 0) + 1
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}

    def key(item: pytest.Item) -> tuple[int, int]:
        name = item.path.name
        return (rank.get(name, len(rank)), -count[name])

    items.sort(key=key)
