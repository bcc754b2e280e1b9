"""What a run will send and cost before it starts (``neurosandbox eval --dry-run``): nothing is
sent, nothing is written.

The estimate walks the units the runner would queue (:func:`evaluation.units.plan_units`:
every case, task, sample and model, after the dataset's coverage skips), builds each call's
messages as the runner does (prompts, images, the PHI gate for the model's endpoint, the cache
key that makes identical calls one call), fits the images to the provider's limits as the
adapter does (:mod:`evaluation.models.fitting`: montages, downscaling), and counts:

- calls: exact for single-turn tasks; a multi-turn task's later turns are counted as distinct
  calls (they carry the model's own earlier answers); rubric grader calls apart, one per
  grader per graded answer, counting every answer as parsed (a format failure is not graded),
  plus each grader's canary, once per run;
- input tokens: text by litellm's token counter, images by the provider's image-token rule
  (:mod:`evaluation.models.tokens`); a multi-turn call also carries the expected length of the
  model's earlier answers;
- output tokens, expected: the median of the model's recorded calls in earlier runs when there
  are any (``history``), else :data:`DEFAULT_OUTPUT_TOKENS` (graders
  :data:`DEFAULT_GRADER_OUTPUT_TOKENS`), never more than the run's ``max_tokens``;
- cost: litellm's price map per call (:func:`evaluation.models.cost.call_cost`); ``None``
  (unknown) for a model the map does not price; the built-in reference models and a replay
  cost a known 0;
- wall time: each model's calls (and the grader calls its answers bring) over its concurrency,
  at the median latency of its recorded calls in earlier runs, else
  :data:`DEFAULT_LATENCY_S`; the models run side by side, so the run takes its slowest model.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, computed_field

from evaluation.budget.gate import CallSizer
from evaluation.call_keys import cache_key
from evaluation.case import Case, TaskFamily
from evaluation.datasets import Dataset, ImageStore
from evaluation.modelio import Message, ModelOutput, TextPart
from evaluation.models.cost import call_cost
from evaluation.models.spec import ModelSpec
from evaluation.phi import PHIGate
from evaluation.prompts import PromptSet, default_prompts
from evaluation.runconfig import RunConfig
from evaluation.tasks import Turns, build_turns
from evaluation.units import graded, plan_units, shown_case

# Stated defaults when no earlier run recorded the model (a structured answer of the Answer
# schema is a few hundred tokens; a rubric verdict is shorter).
DEFAULT_OUTPUT_TOKENS = 500
DEFAULT_GRADER_OUTPUT_TOKENS = 250
# Seconds per call: a remote vision-language model answering with images; the built-in
# reference models and a replay answer in process.
DEFAULT_LATENCY_S = {"litellm": 10.0, "reference": 0.5, "replay": 0.01}
LOCAL_WORKERS = 2  # the runner's workers for a model that is not a litellm model
HISTORY_RUNS = 20  # earlier runs read for a model's latency and answer length


class ModelHistory(BaseModel):
    """A model's recorded calls in earlier runs: what its estimate takes from them."""

    model: str
    calls: int
    latency_s: float  # median
    output_tokens: int | None  # median; None: no call reported it
    runs: list[str] = Field(default_factory=list)


class ModelEstimate(BaseModel):
    """What one model (or rubric grader) of the run would be sent, and cost."""

    model: str
    role: Literal["model", "grader"] = "model"
    litellm_model: str | None = None  # None: a built-in reference model or a replay
    calls: int = 0
    images: int = 0  # images sent, summed over calls (after fitting)
    input_tokens: int | None = None  # None: not a tokenised model (reference, replay)
    image_tokens: int | None = None  # the part of input_tokens that is images
    image_rule: str | None = None  # litellm, gemini or openai-tiles (evaluation.models.tokens)
    output_tokens: int | None = None  # expected
    output_rule: str = ""
    cost_usd: float | None = 0.0  # None: unknown (litellm's price map has no price)
    concurrency: int = 1
    latency_s: float = 0.0
    latency_rule: str = ""
    wall_s: float = 0.0  # this model's calls over its concurrency (graders: inside the model's)


class RunEstimate(BaseModel):
    """The dry run of a run: per model and grader, and the whole."""

    dataset_name: str
    dataset_hash: str
    cases: int  # cases with at least one unit
    cases_skipped: int  # listed by the dataset but not evaluated (coverage skips)
    units: int
    models: list[ModelEstimate]
    max_cost_usd: float | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def calls(self) -> int:
        return sum(m.calls for m in self.models)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def cost_usd(self) -> float | None:
        """The known part of the cost (None: nothing priced)."""
        known = [m.cost_usd for m in self.models if m.cost_usd is not None]
        return sum(known) if known else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def unpriced_calls(self) -> int:
        return sum(m.calls for m in self.models if m.cost_usd is None)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def wall_s(self) -> float:
        return max((m.wall_s for m in self.models if m.role == "model"), default=0.0)


def history_of_runs(
    run_dirs: Iterable[Path], database_url: str | None = None
) -> dict[str, ModelHistory]:
    """Each model's recorded calls (latency, answer length) in the runs of ``run_dirs``, by the
    run's model name; an unreadable run is passed over."""
    from evaluation.errors import EvaluationError
    from evaluation.log.store import open_store, store_exists

    outputs: dict[str, list[ModelOutput]] = {}
    runs: dict[str, list[str]] = {}
    for run_dir in list(run_dirs)[:HISTORY_RUNS]:
        if not store_exists(run_dir, database_url):
            continue
        try:
            with open_store(run_dir, database_url=database_url, read_only=True) as store:
                if not store.has_run():
                    continue
                for model, outs in store.outputs_by_model().items():
                    outputs.setdefault(model, []).extend(outs)
                    runs.setdefault(model, []).append(store.run_id or str(run_dir))
        except (EvaluationError, OSError, ValueError):
            continue
    out = {}
    for model, outs in outputs.items():
        answered = [o for o in outs if not o.error and o.latency_s is not None]
        if not answered:
            continue
        tokens = [o.completion_tokens for o in answered if o.completion_tokens]
        out[model] = ModelHistory(
            model=model,
            calls=len(answered),
            latency_s=statistics.median(o.latency_s or 0.0 for o in answered),
            output_tokens=int(statistics.median(tokens)) if tokens else None,
            runs=runs[model],
        )
    return out


def _expected_output(
    spec: ModelSpec, max_tokens: int | None, history: dict[str, ModelHistory], default: int
) -> tuple[int, str]:
    cap = spec.max_tokens or max_tokens
    seen = history.get(spec.name)
    if seen is not None and seen.output_tokens:
        n, rule = seen.output_tokens, f"median of {seen.calls} recorded calls"
    else:
        n, rule = default, "default (no earlier run of this model)"
    if cap is not None and n > cap:
        n, rule = cap, f"{rule}, capped at max_tokens"
    return n, rule


def _latency(spec: ModelSpec, history: dict[str, ModelHistory]) -> tuple[float, str]:
    seen = history.get(spec.name)
    if seen is not None:
        return seen.latency_s, f"median of {seen.calls} recorded calls"
    kind = (
        "litellm" if spec.kind == "litellm" else "replay" if spec.kind == "replay" else "reference"
    )
    return DEFAULT_LATENCY_S[kind], "default (no earlier run of this model)"


def _start(spec: ModelSpec, role: Literal["model", "grader"], history: dict[str, ModelHistory],
           max_tokens: int | None, default_out: int) -> tuple[ModelEstimate, int]:  # fmt: skip
    """A model's empty estimate and the output tokens expected of each of its calls."""
    out_tokens, out_rule = _expected_output(spec, max_tokens, history, default_out)
    latency, latency_rule = _latency(spec, history)
    litellm = spec.kind == "litellm"
    est = ModelEstimate(
        model=spec.name,
        role=role,
        litellm_model=spec.litellm_model if litellm else None,
        input_tokens=0 if litellm else None,
        image_tokens=0 if litellm else None,
        output_tokens=0 if litellm else None,
        output_rule=out_rule if litellm else "",
        concurrency=spec.concurrency if litellm else LOCAL_WORKERS,
        latency_s=latency,
        latency_rule=latency_rule,
    )
    return est, out_tokens if litellm else 0


def _add_call(
    est: ModelEstimate,
    spec: ModelSpec,
    size: tuple[int, int, int, str | None],
    extra: int,
    per_call_out: int,
) -> None:
    """Count one call of ``size`` whose input also carries ``extra`` text tokens and whose
    answer is expected to take ``per_call_out`` tokens."""
    images, tokens, image_tokens, rule = size
    est.calls += 1
    est.images += images
    if est.input_tokens is None:  # a reference model or a replay: a known 0
        return
    est.input_tokens += tokens + extra
    est.image_tokens = (est.image_tokens or 0) + image_tokens
    est.image_rule = est.image_rule or rule
    est.output_tokens = (est.output_tokens or 0) + per_call_out
    if est.cost_usd is not None:
        cost = call_cost(spec.litellm_model, tokens + extra, per_call_out)
        est.cost_usd = None if cost is None else est.cost_usd + cost


def estimate_run(
    config: RunConfig,
    dataset: Dataset,
    *,
    history: dict[str, ModelHistory] | None = None,
    prompts: PromptSet | None = None,
) -> RunEstimate:
    """The calls, images, tokens, cost and wall time of ``config`` on ``dataset`` (see the
    module for each rule). Nothing is sent and nothing is written."""
    history = history or {}
    prompts = prompts or default_prompts()
    gate = PHIGate(config.phi)
    images = ImageStore()
    units = plan_units(config, dataset)
    started = {
        s.name: _start(s, "model", history, config.generate.max_tokens, DEFAULT_OUTPUT_TOKENS)
        for s in config.models
    }
    started_g = {
        g.name: _start(
            g, "grader", history, config.grader_generate.max_tokens, DEFAULT_GRADER_OUTPUT_TOKENS
        )
        for g in config.graders
    }
    models = {k: v[0] for k, v in started.items()}
    graders = {k: v[0] for k, v in started_g.items()}
    out_of = {k: v[1] for k, v in [*started.items(), *started_g.items()]}
    sizers = {s.name: CallSizer(s) for s in [*config.models, *config.graders]}
    seen: set[str] = set()
    turns_of: dict[tuple[str, str], Turns] = {}
    graded_units: dict[str, int] = {}
    first_graded: Case | None = None  # the runner asks the canary with the first graded case
    for unit in units:
        case, spec = unit.case, unit.spec
        est = models[spec.name]
        per_call_out = out_of[spec.name]
        key = (case.case_id, unit.item.key)
        turns = turns_of.get(key)
        if turns is None:
            turns = build_turns(
                case, unit.item, prompts, images,
                ablation=config.ablation, max_images=config.max_images,
            )  # fmt: skip
            turns_of[key] = turns
        cfg = config.generate.model_copy(update={"seed": config.seed_for(unit.sample)})
        messages: list[Message] = [turns.system]
        shown: list[str] = []
        for t, user in enumerate(turns.turns, start=1):
            messages.append(user)
            shown += [h for h in turns.images_per_turn[t - 1] if h not in shown]
            outbound, _ = gate.prepare(messages, case, spec.api_base, local=spec.is_local)
            if t == 1:  # later turns carry the model's own answers: never the same call
                call_key = cache_key(spec, cfg, unit.sample, t, outbound)
                if call_key in seen:
                    continue
                seen.add(call_key)
            size = sizers[spec.name].size(outbound)
            _add_call(est, spec, size, per_call_out * (t - 1), per_call_out)
            messages.append(Message(role="assistant", content=[TextPart(text="")]))
        if graded(unit, config):
            graded_units[spec.name] = graded_units.get(spec.name, 0) + 1
            first_graded = first_graded or case
            shown_to = shown_case(case, shown)
            for g in config.graders:
                _grade_call(
                    gate, graders[g.name], g, sizers[g.name], shown_to, unit.item.family,
                    per_call_out, out_of[g.name],
                )  # fmt: skip
    if first_graded is not None:
        from evaluation.scoring.rubric import canary_messages

        for g in config.graders:
            outbound, _ = gate.prepare(
                canary_messages(), first_graded, g.api_base, local=g.is_local
            )
            _add_call(graders[g.name], g, sizers[g.name].size(outbound), 0, out_of[g.name])
    _walls(config, models, graders, graded_units)
    planned = {u.case.case_id for u in units}
    return RunEstimate(
        dataset_name=dataset.name,
        dataset_hash=dataset.hash,
        cases=len(planned),
        cases_skipped=len(dataset.skipped) + sum(c.case_id not in planned for c in dataset.cases),
        units=len(units),
        models=[*models.values(), *graders.values()],
        max_cost_usd=config.max_cost_usd,
    )


def _grade_call(
    gate: PHIGate,
    est: ModelEstimate,
    grader: ModelSpec,
    sizer: CallSizer,
    case: Case,
    family: TaskFamily,
    answer_tokens: int,
    per_call_out: int,
) -> None:
    """One grader's call on an answer expected to be ``answer_tokens`` long."""
    from evaluation.scoring.rubric import grader_messages

    messages = grader_messages(case, family, "")
    outbound, _ = gate.prepare(messages, case, grader.api_base, local=grader.is_local)
    _add_call(est, grader, sizer.size(outbound), answer_tokens, per_call_out)


def _walls(
    config: RunConfig,
    models: dict[str, ModelEstimate],
    graders: dict[str, ModelEstimate],
    graded_units: dict[str, int],
) -> None:
    """Wall time per model: its calls, and the grader calls its answers wait for, over its
    workers (graders are asked side by side, so a graded answer waits for the slowest)."""
    slowest_grader = max((g.latency_s for g in graders.values()), default=0.0)
    for name, est in models.items():
        busy = est.calls * est.latency_s + graded_units.get(name, 0) * slowest_grader
        est.wall_s = busy / max(1, est.concurrency)
    for est in graders.values():
        est.wall_s = est.calls * est.latency_s / max(1, est.concurrency)
