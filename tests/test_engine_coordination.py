"""A run on the PostgreSQL run log claims its calls only where another worker can be at work
on it (issue 41): a claim and its end are a transaction each per call, which a run one worker
has to itself does without; a run a worker took a share of is claimed by every later worker."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import sqlalchemy as sa
from engine_helpers import server_spec, write_nmb
from openai_server import OpenAIServer, Script
from pg_server import fresh_pg_database

from evaluation.datasets import DatasetSpec
from evaluation.engine import resume_run, start_run
from evaluation.modelio import GenerateConfig
from evaluation.runconfig import RunConfig

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def _config(tmp: Path, url: str, n_cases: int) -> RunConfig:
    data, answers = write_nmb(tmp / "data", n_cases)
    return RunConfig(
        dataset=DatasetSpec(path=str(data), answers=str(answers)),
        models=[server_spec(url, concurrency=4)],
        samples=2,
        generate=GenerateConfig(temperature=0.7, max_tokens=300, timeout_s=10),
        bertscore=False,
        cache_dir=str(tmp / "cache"),
    )


def _count(url: str, table: str) -> int:
    eng = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with eng.connect() as c:
            return int(c.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one())
    finally:
        eng.dispose()


def test_a_run_one_worker_has_to_itself_claims_no_call(pg_url: str, tmp_path: Path) -> None:
    db = fresh_pg_database(pg_url)
    with OpenAIServer(Script(latency_s=0.01)) as server:
        stats = asyncio.run(
            start_run(_config(tmp_path, server.url, 3), tmp_path / "run", database_url=db)
        )
        assert server.stats.calls == 6
    assert stats.scored == 6 and _count(db, "responses") == 6
    assert _count(db, "call_claims") == 0  # fails on the old code: every call claimed


def test_a_run_a_worker_took_a_share_of_is_claimed_by_every_later_worker(
    pg_url: str, tmp_path: Path
) -> None:
    db = fresh_pg_database(pg_url)
    run = tmp_path / "run"
    with OpenAIServer(Script(latency_s=0.01)) as server:
        first = asyncio.run(
            start_run(_config(tmp_path, server.url, 4), run, database_url=db, shard=(0, 2))
        )
        claimed = _count(db, "call_claims")
        assert claimed == first.units_total * 1 > 0  # one turn per unit: a claim per call
        # the rest of the run by a worker that names no share: it claims its calls too
        asyncio.run(resume_run(run, database_url=db))
        assert server.stats.calls == 8
    assert _count(db, "responses") == 8 and _count(db, "call_claims") == 8
