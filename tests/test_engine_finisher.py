"""The runner's finisher: answers are parsed, scored and recorded off the event loop (issue 41),
and a run still ends only once every sample and its scores are committed, and still stops on a
store that cannot take them."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import server_spec, write_nmb
from openai_server import OpenAIServer, Script

from evaluation.datasets import DatasetSpec
from evaluation.engine import start_run
from evaluation.errors import StoreError
from evaluation.log.store import RunStore
from evaluation.modelio import GenerateConfig
from evaluation.runconfig import RunConfig
from evaluation.runner import Runner
from evaluation.units import RunStats

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def _config(tmp: Path, url: str, n_cases: int, samples: int) -> RunConfig:
    data, answers = write_nmb(tmp / "data", n_cases)
    return RunConfig(
        dataset=DatasetSpec(path=str(data), answers=str(answers)),
        models=[server_spec(url, concurrency=4)],
        samples=samples,
        generate=GenerateConfig(temperature=0.7, max_tokens=300, timeout_s=10),
        bertscore=False,
        cache_dir=str(tmp / "cache"),
    )


def _is_sample_record(statements: list[tuple[str, dict[str, Any]]]) -> bool:
    return any(name == "sample" for name, _ in statements)


def test_a_run_ends_only_once_every_sample_and_its_scores_are_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the store's writer takes its time with the samples the finisher posts: the run must wait
    # for them, not return with the last ones still queued (status 'complete' on half a run)
    slow = RunStore.run_batch

    def run_batch(self: RunStore, records: list[Any]) -> list[BaseException | None]:
        if any(_is_sample_record(r) for r in records):
            time.sleep(0.15)
        return slow(self, records)

    monkeypatch.setattr(RunStore, "run_batch", run_batch)
    seen: dict[str, Any] = {}
    run = Runner.run

    async def run_then_look(self: Runner) -> RunStats:
        stats = await run(self)  # what the store holds when run returns (before it is closed)
        seen.update(scored=stats.scored, samples=len(self.store.samples()),
                    scored_rows=len(self.store.scored_samples()),
                    status=self.store.run_log().status)  # fmt: skip
        return stats

    monkeypatch.setattr(Runner, "run", run_then_look)
    with OpenAIServer(Script(latency_s=0.01)) as server:
        stats = asyncio.run(start_run(_config(tmp_path, server.url, 3, 2), tmp_path / "run"))
    assert stats.units_done == 6 and stats.errors == 0
    assert seen == {"scored": 6, "samples": 6, "scored_rows": 6, "status": "complete"}


def test_answers_are_recorded_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the sample rows and their scores are built and posted by the finisher thread, never by
    # the thread running the event loop (which only awaits the request and response commits)
    from evaluation.log.writes import GroupCommitter

    loop_threads: set[int] = set()
    posted_from: set[int] = set()

    submit, post = GroupCommitter.submit, getattr(GroupCommitter, "post", None)

    async def submit_(self: GroupCommitter, statements: list[Any]) -> None:
        loop_threads.add(threading.get_ident())
        if _is_sample_record(statements):
            posted_from.add(threading.get_ident())
        await submit(self, statements)

    def post_(self: GroupCommitter, statements: list[Any]) -> Any:
        if _is_sample_record(statements):
            posted_from.add(threading.get_ident())
        assert post is not None
        return post(self, statements)

    monkeypatch.setattr(GroupCommitter, "submit", submit_)
    if post is not None:
        monkeypatch.setattr(GroupCommitter, "post", post_)
    with OpenAIServer(Script(latency_s=0.01)) as server:
        stats = asyncio.run(start_run(_config(tmp_path, server.url, 2, 2), tmp_path / "run"))
    assert stats.scored == 4 and loop_threads and posted_from
    assert not posted_from & loop_threads


# the workers' calls in flight when the run stops are cancelled inside litellm
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
def test_a_store_that_cannot_take_the_samples_stops_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = RunStore.run_batch

    def run_batch(self: RunStore, records: list[Any]) -> list[BaseException | None]:
        if any(_is_sample_record(r) for r in records):
            raise StoreError("disk full (test)")
        return slow(self, records)

    monkeypatch.setattr(RunStore, "run_batch", run_batch)
    with OpenAIServer(Script(latency_s=0.05)) as server:
        with pytest.raises(StoreError, match="disk full"):
            asyncio.run(start_run(_config(tmp_path, server.url, 6, 2), tmp_path / "run"))
        # the workers stopped on the first failure: not every unit was sent
        assert server.stats.calls < 12
