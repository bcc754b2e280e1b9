"""The cost before a run and the budget during it, through litellm to the loopback server that
reports usage as OpenAI counts it (tests/openai_usage.py) for gpt-4o, a model litellm's price
map prices: the dry run's estimate against the run it estimates (calls exact, tokens and cost
within 10%), ``--max-cost`` stopping the run with no call sent past the budget and ``runs
resume`` finishing it, a model without a price refused, the command line's dry run and exit 5.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest
from engine_helpers import cli_env, neurosandbox_bin, phantom_subset, server_spec, write_nmb
from grader_helpers import grader_responder
from openai_server import OpenAIServer, Script
from openai_usage import openai_usage

from evaluation.budget import UnknownPriceError, estimate_run, history_of_runs
from evaluation.datasets import DatasetSpec
from evaluation.engine import open_dataset, resume_run, start_run
from evaluation.log.store import RunStore, store_exists
from evaluation.modelio import GenerateConfig
from evaluation.models.cost import call_cost
from evaluation.runconfig import RunConfig
from gateway.cli.estimate import earlier_runs
from gateway.settings import Settings

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
TOLERANCE = 0.10
GEN = GenerateConfig(temperature=0.7, top_p=0.95, max_tokens=500, timeout_s=10)


def _script() -> Script:
    # answers every model call with the default answer, every grading request with a verdict
    return Script(usage=openai_usage, responder=grader_responder({}, default=3))


def _config(suite: Path, url: str, tmp: Path, **kw: object) -> RunConfig:
    return RunConfig(
        dataset=DatasetSpec(path=str(suite), limit=kw.pop("limit", None)),  # type: ignore[arg-type]
        models=[server_spec(url, concurrency=4)],
        graders=[server_spec(url, name="grader", concurrency=4)],
        generate=GEN,
        bertscore=False,
        cache_dir=str(tmp / "cache"),
        samples=2,
        **kw,  # type: ignore[arg-type]
    )


def _recorded(run: Path) -> dict[str, tuple[int, int, int, float]]:
    """Per model: calls, prompt tokens, completion tokens, cost, as the run recorded them."""
    with RunStore(run, read_only=True) as store:
        return {
            m: (
                len(outs),
                sum(o.prompt_tokens or 0 for o in outs),
                sum(o.completion_tokens or 0 for o in outs),
                sum(o.cost_usd or 0.0 for o in outs),
            )
            for m, outs in store.outputs_by_model().items()
        }


def _near(estimate: float, actual: float) -> bool:
    return abs(estimate - actual) <= TOLERANCE * actual


def test_the_dry_run_estimates_the_run_it_precedes(phantom_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # an MS case (single turns, montages of several series) and the L3 case (three turns, CT
    # then MRI); two samples; a rubric grader on every graded answer, and its canary
    suite = phantom_subset(phantom_suite, ("ms", "l3"), tmp_path / "suite")
    with OpenAIServer(_script()) as server:
        # a pilot run of one case: the model's recorded answer length and latency
        asyncio.run(start_run(_config(suite, server.url, tmp_path, limit=1), tmp_path / "pilot"))
        history = history_of_runs([tmp_path / "pilot"])
        assert set(history) == {"test-model", "grader"}
        config = _config(suite, server.url, tmp_path)
        sent_before = server.stats.calls
        estimate = estimate_run(config, open_dataset(config), history=history)
        assert server.stats.calls == sent_before  # the estimate sent nothing
        assert not (tmp_path / "run").exists()
        asyncio.run(start_run(config, tmp_path / "run"))
        sent = server.stats.calls - sent_before
    recorded = _recorded(tmp_path / "run")
    by_model = {m.model: m for m in estimate.models}
    assert estimate.calls == sent == sum(r[0] for r in recorded.values())
    for name, (calls, prompt, completion, cost) in recorded.items():
        est = by_model[name]
        assert est.calls == calls, name  # exact, per model and per grader
        assert est.input_tokens is not None and _near(est.input_tokens, prompt), (name, est, prompt)
        assert est.output_tokens is not None and _near(est.output_tokens, completion), name
        assert est.cost_usd is not None and _near(est.cost_usd, cost), (name, est, cost)
    model = by_model["test-model"]
    assert model.images > 0 and model.image_tokens and model.image_rule == "litellm"
    assert by_model["grader"].images == 0  # graders read the answer, not the images
    assert "recorded calls" in model.output_rule and "recorded calls" in model.latency_rule


def test_max_cost_stops_before_passing_the_budget_then_resume_finishes(
    phantom_suite,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    suite = phantom_subset(phantom_suite, ("ms", "l3"), tmp_path / "suite")
    budget = 0.15  # the whole run costs about $0.40 here
    run = tmp_path / "run"
    with OpenAIServer(_script()) as server:
        config = _config(suite, server.url, tmp_path, max_cost_usd=budget)
        whole = estimate_run(config, open_dataset(config))
        stats = asyncio.run(start_run(config, run))
        assert stats.budget_reached and "budget reached" in stats.budget_reached
        stopped_at = server.stats.calls
        # what the server answered, priced as litellm prices it: never past the budget
        served = sum(call_cost("openai/gpt-4o", *openai_usage(b, _reply(server, b))) or 0.0
                     for b in server.stats.bodies)  # fmt: skip
        recorded = _recorded(run)
        assert sum(r[0] for r in recorded.values()) == stopped_at  # every call sent is stored
        assert served <= budget and sum(r[3] for r in recorded.values()) <= budget
        assert 0 < stopped_at < whole.calls
        with RunStore(run, read_only=True) as store:
            assert store.run_log().status == "stopped"
            assert store.run_log().config["max_cost_usd"] == budget
        # the budget is the run's: a resume without a new one stays within it (a call smaller
        # than the one that stopped the run may still fit: which calls were waiting depends on
        # the order they were prepared in, so the count is not fixed, the bound is)
        again = asyncio.run(resume_run(run))
        assert again.budget_reached
        assert sum(r[3] for r in _recorded(run).values()) <= budget
        assert sum(r[0] for r in _recorded(run).values()) == server.stats.calls < whole.calls
        # a larger budget finishes the run; no answered call is sent again
        done = asyncio.run(resume_run(run, max_cost_usd=5.0))
        assert done.budget_reached is None
        assert server.stats.calls == whole.calls  # as many as one run without a budget
    with RunStore(run, read_only=True) as store:
        assert store.run_log().status == "complete"
        assert store.run_log().config["max_cost_usd"] == 5.0  # kept for the next resume
        assert store.counts().of_status("error") == 0


def _reply(server: OpenAIServer, body: dict) -> str:  # type: ignore[type-arg]
    """The reply the script gives to ``body`` (its usage is counted on it)."""
    script = server.script
    computed = script.responder(body) if script.responder else None
    return computed if computed is not None else script.default_reply


def test_a_budget_refuses_a_model_without_a_price_unless_allowed(tmp_path: Path) -> None:
    data, answers = write_nmb(tmp_path / "data", 2)
    with OpenAIServer(Script(usage=openai_usage)) as server:
        spec = server_spec(server.url, model="openai/house-model-without-price")
        config = RunConfig(
            dataset=DatasetSpec(path=str(data), answers=str(answers)),
            models=[spec],
            generate=GEN,
            bertscore=False,
            cache_dir=str(tmp_path / "cache"),
            max_cost_usd=1.0,
        )
        with pytest.raises(UnknownPriceError, match=r"house-model-without-price.*allow-unknown"):
            asyncio.run(start_run(config, tmp_path / "refused"))
        assert not store_exists(tmp_path / "refused") and server.stats.calls == 0
        allowed = config.model_copy(update={"allow_unknown_cost": True})
        stats = asyncio.run(start_run(allowed, tmp_path / "allowed"))
        assert stats.calls == 2 and stats.cost_unknown == 2 and stats.budget_reached is None
        # the estimate says unknown, never $0
        estimate = estimate_run(allowed, open_dataset(allowed))
        assert estimate.models[0].cost_usd is None and estimate.cost_usd is None


def test_the_command_line_dry_run_and_the_budget_exit_code(tmp_path: Path) -> None:
    data, answers = write_nmb(tmp_path / "data", 3)
    env = cli_env(tmp_path / "cache")
    env["NEUROSANDBOX_DATA_DIR"] = str(tmp_path / "var")
    env["NEUROSANDBOX_RUNS_DIR"] = str(tmp_path / "runs")
    with OpenAIServer(Script(usage=openai_usage)) as server:
        base = [
            neurosandbox_bin(), "eval", "--suite", str(data), "--answers", str(answers),
            "--model", "openai/gpt-4o", "--api-base", server.url, "--no-bertscore",
            "--out", str(tmp_path / "runs" / "r1"),
        ]  # fmt: skip
        out = subprocess.run([*base, "--dry-run", "--json"], env=env, capture_output=True)
        assert out.returncode == 0, out.stderr.decode()[-2000:]
        estimate = json.loads(out.stdout)
        assert estimate["models"][0]["calls"] == 3 and estimate["models"][0]["images"] == 6
        assert estimate["calls"] == 3 and estimate["cost_usd"] > 0  # the totals are in the JSON
        assert estimate["models"][0]["output_rule"].startswith("default")  # no earlier run
        assert server.stats.calls == 0 and not (tmp_path / "runs" / "r1").exists()
        # a budget smaller than one call's most: stopped before the first, exit 5
        out = subprocess.run([*base, "--max-cost", "0.001"], env=env, capture_output=True)
        text = out.stdout.decode() + out.stderr.decode()
        assert out.returncode == 5, text[-2000:]
        assert "stopped at the budget" in text and "runs resume" in text
        assert server.stats.calls == 0
        # (`runs resume RUN --max-cost 1` passes the new budget to resume_run, as here)
        stats = asyncio.run(resume_run(tmp_path / "runs" / "r1", max_cost_usd=1.0))
        assert stats.budget_reached is None and server.stats.calls == 3
    # the next dry run finds r1 in the install's catalog: its answers' length and latency
    settings = Settings(data_dir=tmp_path / "var", runs_dir=tmp_path / "runs")
    found = earlier_runs(settings, ["openai/gpt-4o"], tmp_path / "elsewhere" / "r2")
    assert found == [(tmp_path / "runs" / "r1").absolute()]
    seen = history_of_runs(found)["openai/gpt-4o"]
    assert seen.calls == 3 and seen.output_tokens == openai_usage({}, Script().default_reply)[1]


@pytest.mark.parametrize("amount", ["0", "inf", "nan"])
def test_a_budget_is_a_finite_amount_above_zero(amount: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gateway.cli import app

    data, answers = write_nmb(tmp_path / "data", 1)
    args = ["eval", "--suite", str(data), "--answers", str(answers), "--model", "openai/gpt-4o",
            "--out", str(tmp_path / "run"), "--max-cost", amount]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert not (tmp_path / "run").exists()
    # (nan is refused by the option's own range check, with its message)
    assert amount == "nan" or "finite amount above $0" in result.output
