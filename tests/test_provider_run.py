"""Real runs through the engine to provider servers: what the provider reports (usage, refusals,
overloads) and what the adapter changed (parameters, montages) end up in the run store."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from engine_helpers import phantom_subset
from openai_server import DEFAULT_REPLY
from providers import AnthropicServer, Fault, OpenAICompatServer
from providers.harness import FAMILIES, expected_cost

from evaluation.case import TaskFamily
from evaluation.datasets import DatasetSpec
from evaluation.engine import start_run
from evaluation.log.store import RunStore
from evaluation.modelio import GenerateConfig
from evaluation.runconfig import RunConfig

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
GEN = GenerateConfig(temperature=0.7, top_p=0.95, max_tokens=500, timeout_s=30)


def _config(suite: Path, spec: object, tmp: Path, **kw: object) -> RunConfig:
    return RunConfig(
        dataset=DatasetSpec(path=str(suite)),
        models=[spec],  # type: ignore[list-item]
        tasks=[TaskFamily.DIFFERENTIAL],
        generate=GEN,
        bertscore=False,
        cache_dir=str(tmp / "cache"),
        **kw,  # type: ignore[arg-type]
    )


def test_anthropic_run_samples_usage_cost_overload_and_refusal_in_the_store(
    phantom_suite, tmp_path: Path
) -> None:
    suite = phantom_subset(phantom_suite, ("ms",), tmp_path / "suite")
    fam = FAMILIES["anthropic"]
    faults = [Fault("529", times=1), Fault("refusal", times=1)]
    run = tmp_path / "run"
    with AnthropicServer(model="claude-sonnet-4-5", reply=DEFAULT_REPLY, faults=faults) as server:
        spec = fam.spec(server, name="claude", concurrency=2)
        stats = asyncio.run(start_run(_config(suite, spec, tmp_path, samples=3, seed=7), run))
        exchanges = list(server.exchanges)
    # Three samples are three calls (plus the one retried after 529 overloaded), never ``n``.
    assert [e.status for e in exchanges].count(529) == 1 and len(exchanges) == 4
    assert all(e.problems == [] and "n" not in e.body for e in exchanges)
    assert stats.errors == 0 and stats.refusals == 1
    store = RunStore(run)
    try:
        statuses = sorted(r.status for r in store.samples())
        assert statuses == ["ok", "ok", "refusal"]  # the refusal is recorded, not scored wrong
        outputs = list(store.responses().values())
        cost = expected_cost(fam.model, 1200, 80)
        assert len(outputs) == 3
        assert all(o.prompt_tokens == 1200 and o.completion_tokens == 80 for o in outputs)
        assert all(o.cost_usd == pytest.approx(cost) for o in outputs)
        assert stats.cost_usd == pytest.approx(3 * cost) and stats.prompt_tokens == 3600
        # Anthropic takes no seed: each sample's seed is recorded as not sent.
        seeds = sorted(
            a["value"] for o in outputs for a in o.adjustments if a.get("param") == "seed"
        )
        assert seeds == [7, 8, 9]
        assert sorted(o.retries for o in outputs) == [0, 0, 1]
    finally:
        store.close()


def test_vllm_run_records_the_montage_it_sent_for_the_servers_image_limit(
    phantom_suite, tmp_path: Path
) -> None:
    suite = phantom_subset(phantom_suite, ("ms",), tmp_path / "suite")
    run = tmp_path / "run"
    with OpenAICompatServer("vllm", limit_mm_per_prompt=1, reply=DEFAULT_REPLY) as server:
        spec = FAMILIES["vllm"].spec(server, name="medgemma", max_images_per_request=1)
        stats = asyncio.run(start_run(_config(suite, spec, tmp_path), run))
        assert server.problems() == [] and server.calls == 1
    assert stats.errors == 0
    store = RunStore(run)
    try:
        (row,) = store.samples()
        (output,) = store.responses().values()
        (montage,) = [a for a in output.adjustments if a["kind"] == "montage"]
        # The run records which images went into the montage: all the sample was shown.
        assert montage["images"] == row.image_hashes and len(montage["images"]) == 7
        assert row.status == "ok"
        stored = json.loads(
            store.connection.execute("SELECT output_json FROM responses").fetchone()[0]
        )
        assert stored["adjustments"][0]["reason"].startswith(
            "google/medgemma-27b-it takes at most 1"
        )
    finally:
        store.close()
