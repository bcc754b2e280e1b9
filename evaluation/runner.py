"""The async runner: every (case, task, model, sample) through prompt, PHI gate, model, store, score.

Per model a pool of workers takes units from its queue; the model adapter's own limiter caps the
calls in flight (and backs off on 429s). Each call is keyed by a hash of what is sent (model
identity, decoding, sample index, turn, text and image hashes); a key whose response is in the
store is never called again, which is what makes resume free and re-scoring model-free. The
order of events for one call: request + audit committed -> call -> response committed ->
(later, off the event loop, in the finisher thread) parse, score, and the sample's row with its
scores and error label committed in one record. ``run`` returns once all of it is committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

from evaluation.budget.gate import BudgetGate, BudgetReached, CallSizer
from evaluation.call_keys import cache_key, prompt_hash, request_record
from evaluation.case import Case, TaskFamily
from evaluation.coverage import SkippedCase
from evaluation.datasets import Dataset, ImageStore
from evaluation.errors import StoreError
from evaluation.log.claims import DEFAULT_LEASE_S, Coordination
from evaluation.log.passport import (
    ModelPassport,
    api_host,
    passport_changes,
    replay_name,
    sent_decoding,
)
from evaluation.log.records import GraderCall, SampleTurn
from evaluation.log.store import RunStore
from evaluation.log.writes import (
    Statements,
    claimed_response_statements,
    failure_statements,
    now,
    request_statements,
    response_statements,
    sample_statements,
    score_statements,
)
from evaluation.modelio import (
    GenerateConfig,
    ImagePart,
    Message,
    ModelAdapter,
    ModelOutput,
    TextPart,
)
from evaluation.models import create_model
from evaluation.models.context import RequestContext, current_request
from evaluation.models.litellm_adapter import LiteLLMAdapter
from evaluation.models.replay import ReplayModel
from evaluation.models.spec import ModelSpec
from evaluation.parsing import ParsedAnswer, parse_answer
from evaluation.phi import GateResult, PHIGate, audit_record
from evaluation.prompts import PromptSet, default_prompts, inert
from evaluation.robustness.delivery import planted_pixels
from evaluation.robustness.records import variant_of
from evaluation.robustness.runlog import recorded_variants
from evaluation.runconfig import RunConfig, package_versions
from evaluation.scores import ParseStatus, Score
from evaluation.scoring_bridge import ScoreRecord, ScoringBridge, parsed_record, total_output
from evaluation.tasks import Turns, build_turns, plan_tasks
from evaluation.units import Call, RunStats, Unit, graded, plan_units, shown_case

log = logging.getLogger(__name__)


class _HeldElsewhere(Exception):
    """A call of the unit is claimed by another live worker: the unit goes back to the end of
    this worker's queue once, so that workers sharing a share split it rather than trail each
    other (each waiting, in the same order, on the call the other one holds)."""


_DONE = {ParseStatus.OK.value, ParseStatus.FORMAT_FAILURE.value, ParseStatus.REFUSAL.value}


def _score_executor(config: RunConfig) -> Executor:
    """Scoring off the event loop: a thread, or a process when litellm calls run in processes
    and BERTScore is on (a model per sample: worth a core of its own). Without BERTScore a
    sample scores in about half a millisecond, less than shipping it to a process costs (the
    case, answer and output pickled both ways, plus a feeder and a manager thread here)."""
    if config.bertscore and any(s.processes for s in config.models):
        import multiprocessing as mp

        return ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"))
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="score")


class Runner:
    def __init__(
        self,
        config: RunConfig,
        dataset: Dataset,
        store: RunStore,
        *,
        adapters: dict[str, ModelAdapter] | None = None,
        prompts: PromptSet | None = None,
        on_progress: Callable[[RunStats], None] | None = None,
        score: bool = True,
        shard: tuple[int, int] | None = None,
        lease_s: float = DEFAULT_LEASE_S,
    ) -> None:
        self.config = config
        # this worker's share of the run's cases (index, count): several workers on one run
        self.shard = check_shard(shard)
        self.dataset = dataset
        self.store = store
        self.prompts = prompts or default_prompts()
        self._owns_adapters = adapters is None
        self.adapters = adapters or {s.name: create_model(s) for s in config.models}
        self.graders = {s.name: create_model(s) for s in config.graders}
        self.gate = PHIGate(config.phi)
        # text the audit planted in pixels is recorded as planted, not read as a person's data
        self.gate.expect_planted(planted_pixels(recorded_variants(store).values()))
        self.images = ImageStore()
        self.stats = RunStats()
        self.on_progress = on_progress
        self.scoring = (
            ScoringBridge(
                bertscore=config.bertscore,
                bertscore_model=config.bertscore_model,
                bertscore_layer=config.bertscore_layer,
            )
            if score
            else None
        )
        self._cached: dict[str, ModelOutput] = {}
        # Calls in flight by cache key: an identical call made meanwhile waits for this one
        # instead of being sent again (e.g. two identical grader prompts), whatever the timing.
        self._in_flight: dict[str, asyncio.Future[ModelOutput]] = {}
        self._turns: OrderedDict[tuple[str, str], Turns] = OrderedDict()
        self._score_pool: Executor = _score_executor(config)
        # answered units are parsed, scored and recorded here, off the event loop (``_settle``)
        self._finisher: Executor = (
            self._score_pool
            if isinstance(self._score_pool, ThreadPoolExecutor)
            else ThreadPoolExecutor(max_workers=1, thread_name_prefix="finish")
        )
        self._settling = 0  # finisher jobs not yet committed
        self._settled_all = threading.Condition()
        self._failure: BaseException | None = None  # the first failed finisher job or commit
        self._committer = store.committer()
        self._commit = self._committer.submit
        self._generate: dict[int, GenerateConfig] = {}
        self._left: dict[str, int] = {}  # units not yet done, per case
        # units put back once because another worker held one of their calls
        self._deferred: set[tuple[str, str, str, int]] = set()
        # the budget: one gate for every call of the run (models and graders)
        self.budget = BudgetGate(config.max_cost_usd) if config.max_cost_usd else None
        self._sizers: dict[str, CallSizer] = {}
        # on the PostgreSQL run log other workers may share the run: each call is claimed
        # before it is sent, and the providers' shared limits are held across workers
        self.coord: Coordination | None = None
        if store.database_url is not None and coordinated(config, store, self.shard):
            self.coord = Coordination(store.database_url, store.run_id, lease_s=lease_s)
            for spec in [*config.models, *config.graders]:
                adapter = self.adapters.get(spec.name) or self.graders.get(spec.name)
                if isinstance(adapter, LiteLLMAdapter) and (
                    spec.shared_concurrency or spec.shared_rpm
                ):
                    adapter.shared = _Shared(self.coord, spec)

    # ------------------------------------------------------------------ plan

    def units(self) -> list[Unit]:
        units = plan_units(self.config, self.dataset)
        if self.shard is None:
            return units
        return [u for u in units if in_shard(u.case.case_id, self.shard)]

    def unplanned(self, units: list[Unit]) -> list[SkippedCase]:
        """The dataset's cases that got no unit, each with the reason."""
        planned = {u.case.case_id for u in units}
        wanted = sorted(f.value for f in self.config.tasks) if self.config.tasks else None
        out = []
        for case in self.dataset.cases:
            if case.case_id in planned:
                continue
            own = sorted({i.family.value for i in plan_tasks(case)})
            if own and wanted:
                reason = (
                    f"none of its tasks ({', '.join(own)}) is among the run's tasks "
                    f"(--tasks {','.join(wanted)})"
                )
            elif TaskFamily.MULTITURN in case.tasks and not case.turns:
                reason = "no task to run: 'multiturn' is its only task and it has no turns"
            else:
                reason = "no task to run"
            out.append(SkippedCase(entry="case", case_id=case.case_id, reason=reason))
        return out

    def _progress(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.stats)

    # ------------------------------------------------------------------ run

    def record_passports(self) -> None:
        """Record each model's and grader's passport (what is known when the run starts), once:
        a resumed run keeps the passport of its start, and a difference is logged."""
        from dicom import renderer_version

        versions = package_versions()
        asks = [
            (s, self.adapters[s.name], self.config.generate, "model") for s in self.config.models
        ]
        asks += [
            (s, self.graders[s.name], self.config.grader_generate, "grader")
            for s in self.config.graders
            if s.name not in self.adapters
        ]
        for spec, adapter, generate, role in asks:
            # a model's sample i is sent seed + i; graders are sent their decoding as it is
            cfg = (
                generate.model_copy(update={"seed": self.config.seed_for(0)})
                if role == "model"
                else generate
            )
            passport = ModelPassport(
                model=spec.name,
                role="grader" if role == "grader" else "model",
                kind=spec.kind,
                prompt_version=self.prompts.version,
                renderer_version=renderer_version(),
                recorded_at=now(),
            )
            if isinstance(adapter, LiteLLMAdapter):
                passport = passport.model_copy(
                    update={
                        "litellm_model": spec.litellm_model,
                        "provider": adapter.provider(),
                        "api_host": api_host(spec.api_base),
                        "decoding": sent_decoding(adapter.sent_parameters(cfg)),
                        "litellm_version": versions.get("litellm"),
                    }
                )
            elif isinstance(adapter, ReplayModel):
                passport = passport.model_copy(
                    update={
                        "replay_file": replay_name(spec.replay_file),
                        "replay_sha256": adapter.sha256,
                    }
                )
            earlier = self.store.record_passport(passport)
            if earlier is not None:
                changed = [c.field for c in passport_changes(earlier, passport)]
                if changed:
                    log.warning(
                        "model %s: the run keeps the passport of its start; now %s differ",
                        spec.name,
                        ", ".join(changed),
                    )

    async def run(self) -> RunStats:
        with _heap_set_aside():
            return await self._run()

    async def _run(self) -> RunStats:
        self.record_passports()
        self._cached = self.store.responses()
        if self.budget is not None:  # what earlier sessions of the run spent counts too
            self.budget.spent_usd = sum(o.cost_usd or 0.0 for o in self._cached.values())
        done = {
            (r.case_id, r.task, r.model, r.sample)
            for r in self.store.samples(calls=False, scores=False)
            if r.status in _DONE
        }
        planned = plan_units(self.config, self.dataset)  # the whole run's (every worker's)
        units = self.units()  # this worker's share
        self.stats.units_total = len(units)
        self._left = {}
        self._deferred = set()
        for u in units:
            self._left[u.case.case_id] = self._left.get(u.case.case_id, 0) + 1
        self.stats.cases_total = len(self._left)
        self.stats.skipped = [*self.dataset.skipped, *self.unplanned(planned)]
        said = {str(s) for s in self.dataset.skipped}
        self.stats.warnings = [w for w in self.dataset.warnings if w not in said]
        # the cases as received: the audit's variants ('<case>~<kind>') are not cases
        received = {u.case.case_id for u in planned if variant_of(u.case.case_id)[1] is None}
        self.store.record_coverage(len(received), self.stats.skipped)
        queues: dict[str, asyncio.Queue[Unit]] = {
            s.name: asyncio.Queue() for s in self.config.models
        }
        for u in units:
            if (u.case.case_id, u.item.key, u.spec.name, u.sample) in done:
                self.stats.done_before += 1
                self._unit_done(u)
                continue
            queues[u.spec.name].put_nowait(u)
        self._progress()
        self.store.set_status("running")
        workers = []
        for spec in self.config.models:
            n = spec.concurrency + 2 if spec.kind == "litellm" else 2
            workers += [asyncio.create_task(self._worker(queues[spec.name])) for _ in range(n)]
        try:
            await asyncio.gather(*workers)
            await asyncio.to_thread(self._drain)
        finally:
            for w in workers:
                w.cancel()
            self._finisher.shutdown(wait=True, cancel_futures=False)
            self._score_pool.shutdown(wait=True, cancel_futures=False)
            if self._owns_adapters:
                for adapter in [*self.adapters.values(), *self.graders.values()]:
                    close = getattr(adapter, "close", None)
                    if callable(close):
                        close()
            if self.coord is not None:
                self.coord.close()
        counts = self.store.counts()
        if self.budget is not None and self.budget.reached is not None:
            self.stats.budget_reached = str(self.budget.reached)
            self.store.set_status("stopped")
        elif self.shard is None or self._whole_run_done():
            self.store.set_status("complete" if counts.of_status("error") == 0 else "incomplete")
        self._progress()
        return self.stats

    def _whole_run_done(self) -> bool:
        """Whether every unit of the run (every worker's share) has its sample recorded."""
        recorded = {(r.case_id, r.task, r.model, r.sample)
                    for r in self.store.samples(calls=False, scores=False)}  # fmt: skip
        planned = plan_units(self.config, self.dataset)
        return all((u.case.case_id, u.item.key, u.spec.name, u.sample) in recorded for u in planned)

    async def _worker(self, queue: asyncio.Queue[Unit]) -> None:
        while True:
            if self._failure is not None:
                raise self._failure  # a finisher's commit failed: the store is not usable
            if self.budget is not None and self.budget.reached is not None:
                return  # the budget stopped the run: no new unit (resume does the rest)
            try:
                unit = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            try:
                await self._unit(unit)
            except _HeldElsewhere:
                self._deferred.add(_unit_id(unit.case.case_id, unit.item.key, unit.spec.name,
                                            unit.sample))  # fmt: skip
                queue.put_nowait(unit)  # after the others; then waited on
                continue
            except BudgetReached:
                return  # not a failure of the unit: left undone for resume
            except StoreError:
                raise
            except Exception as exc:  # one bad unit must not stop the run
                log.exception("unit %s/%s failed", unit.case.case_id, unit.item.key)
                await self._record_error(unit, [], [], f"{type(exc).__name__}: {exc}")
            self._unit_done(unit)
            self._progress()

    def _unit_done(self, unit: Unit) -> None:
        self.stats.units_done += 1
        self._left[unit.case.case_id] -= 1
        if self._left[unit.case.case_id] == 0:
            self.stats.cases_done += 1

    def _turns_for(self, unit: Unit) -> Turns:
        key = (unit.case.case_id, unit.item.key)
        hit = self._turns.get(key)
        if hit is None:
            hit = build_turns(
                unit.case,
                unit.item,
                self.prompts,
                self.images,
                ablation=self.config.ablation,
                max_images=self.config.max_images,
            )
            self._turns[key] = hit
            if len(self._turns) > 64:
                self._turns.popitem(last=False)
        return hit

    async def _unit(self, unit: Unit) -> None:
        case, item, spec, s = unit.case, unit.item, unit.spec, unit.sample
        cfg = self._generate_for(s)
        turns = self._turns_for(unit)
        adapter = self.adapters[spec.name]
        messages: list[Message] = [turns.system]
        shown: list[str] = []
        answered: list[tuple[str, ModelOutput]] = []
        for t, user in enumerate(turns.turns, start=1):
            messages.append(user)
            shown += [h for h in turns.images_per_turn[t - 1] if h not in shown]
            call = Call(case, item.key, item.family.value, spec, s, t)
            key, output = await self._call(call, adapter, messages, cfg)
            if output.error:
                record, _ = self._parsed_turns(unit, answered)
                record.append(SampleTurn(turn=t, cache_key=key, status="error", error=output.error))
                await self._record_error(unit, record, shown, output.error)
                return
            answered.append((key, output))
            if t < len(turns.turns):
                # the model's answer goes back as it would go to a grader: made inert (a chat
                # token in it would open a turn on a server that renders messages through a
                # chat template); only when a turn follows
                echo = inert(output.text) or "(no answer)"
                messages.append(Message(role="assistant", content=[TextPart(text=echo)]))
        if self.scoring is not None and graded(unit, self.config):
            await self._finish_graded(unit, answered, shown)
        else:
            self._finish_later(unit, answered, shown)

    def _generate_for(self, sample: int) -> GenerateConfig:
        """The run's decoding for sample ``sample`` (its seed), made once per sample index."""
        cfg = self._generate.get(sample)
        if cfg is None:
            seed = self.config.seed_for(sample)
            cfg = self._generate[sample] = self.config.generate.model_copy(update={"seed": seed})
        return cfg

    async def _call(
        self, call: Call, adapter: ModelAdapter, messages: list[Message], cfg: GenerateConfig
    ) -> tuple[str, ModelOutput]:
        """One model call through the PHI gate, keyed, audited and stored (or reused)."""
        spec, case = call.spec, call.case
        if self.gate.trusts(spec.api_base, local=spec.is_local):
            # sent as it is: nothing to read, so no thread (a hop costs more than the check)
            outbound, gate = self.gate.prepare(messages, case, spec.api_base, local=spec.is_local)
        else:
            # in a thread: reading the text in images (remote endpoints) takes about a second each
            outbound, gate = await asyncio.to_thread(
                self.gate.prepare, messages, case, spec.api_base, local=spec.is_local
            )
        key = cache_key(spec, cfg, call.sample, call.turn, outbound)
        cached = self._cached.get(key)
        if cached is not None:
            self.stats.cached += 1
            return key, cached
        pending = self._in_flight.get(key)
        if pending is not None:
            self.stats.cached += 1
            return key, await asyncio.shield(pending)
        future: asyncio.Future[ModelOutput] = asyncio.get_running_loop().create_future()
        self._in_flight[key] = future
        try:
            output = await self._claimed(call, adapter, outbound, gate, key, cfg)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it, nobody else must
            raise
        else:
            future.set_result(output)
        finally:
            del self._in_flight[key]
        return key, output

    async def _claimed(
        self,
        call: Call,
        adapter: ModelAdapter,
        outbound: list[Message],
        gate: GateResult,
        key: str,
        cfg: GenerateConfig,
    ) -> ModelOutput:
        """``_send``, once this worker holds the call's claim when other workers may share the
        run: a call another worker answered is not sent (its answer is used), and a late
        answer of this worker's gives way to the committed one."""
        if self.coord is None:
            return await self._send(call, adapter, outbound, gate, key, cfg)
        unit = _unit_id(call.case.case_id, call.task, call.spec.name, call.sample)
        claim = await self.coord.acquire(key, wait_held=unit in self._deferred)
        if claim.held_by is not None:
            raise _HeldElsewhere(key)
        if claim.output is not None:
            self.stats.cached += 1
            self._cached[key] = claim.output
            return claim.output
        assert claim.token is not None
        try:
            output = await self._send(call, adapter, outbound, gate, key, cfg, claim.token)
        finally:  # the claim ends whatever happened (released when nothing was committed)
            committed = await asyncio.shield(asyncio.to_thread(self.coord.finish, key, claim.token))
        if committed is not None and not output.error:
            self._cached[key] = committed
            return committed
        return output

    async def _send(
        self,
        call: Call,
        adapter: ModelAdapter,
        outbound: list[Message],
        gate: GateResult,
        key: str,
        cfg: GenerateConfig,
        claim: str | None = None,
    ) -> ModelOutput:
        """Through the budget's gate when the run has one, then ``_send_now``."""
        spec = call.spec
        if self.budget is None:
            return await self._send_now(call, adapter, outbound, gate, key, cfg, claim)
        sizer = self._sizers.get(spec.name)
        if sizer is None:
            sizer = self._sizers[spec.name] = CallSizer(spec)
        # in the loop, as the adapter fits images: the fitting cache is not shared with threads
        most = sizer.most(outbound, cfg.max_tokens)
        await self.budget.reserve(most)  # raises BudgetReached: nothing is sent
        cost: float | None = None
        try:
            output = await self._send_now(call, adapter, outbound, gate, key, cfg, claim)
            cost = output.cost_usd
            return output
        finally:
            await self.budget.settle(most, cost)

    async def _send_now(
        self,
        call: Call,
        adapter: ModelAdapter,
        outbound: list[Message],
        gate: GateResult,
        key: str,
        cfg: GenerateConfig,
        claim: str | None = None,
    ) -> ModelOutput:
        """Audit, store the request, call the model, store the response (or the failure).
        ``claim``: the call's claim token (other workers may share the run): the response is stored
        only while it holds, never over another worker's."""
        spec, case = call.spec, call.case
        endpoint = spec.api_base or ("local" if spec.is_local else f"provider:{spec.litellm_model}")
        sent = [p.sha256 for m in outbound for p in m.content if isinstance(p, ImagePart)]
        audit = audit_record(
            outbound, gate, model=spec.name, endpoint=endpoint, case_id=case.case_id, cache_key=key
        )
        await self._commit(
            request_statements(
                key,
                case_id=case.case_id,
                task=call.task,
                family=call.family,
                model=spec.name,
                sample=call.sample,
                turn=call.turn,
                image_hashes=sent,
                prompt_hash=prompt_hash(outbound),
                request=request_record(outbound, spec, cfg),
                audit=audit,
            )
        )
        ctx = RequestContext(
            case_id=case.case_id,
            task=call.task,
            family=call.family,
            sample=call.sample,
            turn=call.turn,
            cache_key=key,
        )
        token = current_request.set(ctx)
        try:
            output = await adapter.generate(outbound, cfg)
        finally:
            current_request.reset(token)
        self.stats.calls += 1
        self.stats.retries += output.retries
        if output.error:
            await self._commit(failure_statements(key, spec.name, output))
            return output
        # Committed (on disk) before anything parses or scores it.
        if claim is not None and self.coord is not None:
            await self._commit(
                claimed_response_statements(key, spec.name, output, claim, self.coord.worker)
            )
        else:
            await self._commit(response_statements(key, spec.name, output))
        self._cached[key] = output
        if output.cost_usd is None:
            self.stats.cost_unknown += 1
        else:
            self.stats.cost_usd += output.cost_usd
        self.stats.prompt_tokens += output.prompt_tokens or 0
        self.stats.completion_tokens += output.completion_tokens or 0
        return output

    async def _grade(
        self, unit: Unit, case: Case, answer: str
    ) -> tuple[dict[str, str | None], dict[str, str | None], list[GraderCall]]:
        """Every grader's reply to one answer, and to the canary (asked once per grader per
        run: the same request every time, so later ones are the stored reply); stored like any
        call, so rescoring reuses them."""
        from evaluation.scoring.rubric import canary_messages, grader_messages

        messages = grader_messages(case, unit.item.family, answer)
        task = f"{unit.item.key}/grade:{unit.spec.name}"

        graders = self.config.graders
        # (grader, is canary, call): the answer's grading, then the canary (same request each time)
        asks = [(g, False, Call(case, task, "grader", g, unit.sample, 1)) for g in graders]
        asks += [(g, True, Call(case, "rubric-canary", "grader", g, 0, 1)) for g in graders]
        results = await asyncio.gather(
            *(
                self._call(
                    call,
                    self.graders[g.name],
                    canary_messages() if is_canary else messages,
                    self.config.grader_generate,
                )
                for g, is_canary, call in asks
            ),
            return_exceptions=True,  # every grader's call ends (and is stored) before a raise
        )
        answered: list[tuple[str, ModelOutput]] = []
        for r in results:
            if isinstance(r, BaseException):
                raise r
            answered.append(r)
        replies: dict[str, str | None] = {}
        checks: dict[str, str | None] = {}
        records: list[GraderCall] = []
        for (g, is_canary, _), (key, out) in zip(asks, answered, strict=True):
            (checks if is_canary else replies)[g.name] = None if out.error else out.text
            records.append(GraderCall(grader=g.name, canary=is_canary, cache_key=key))
        return replies, checks, records

    async def _record_error(
        self, unit: Unit, record: list[SampleTurn], shown: list[str], error: str
    ) -> None:
        self.stats.errors += 1
        await self._commit(self._error_statements(unit, record, shown, error))

    def _error_statements(
        self, unit: Unit, record: list[SampleTurn], shown: list[str], error: str
    ) -> Statements:
        _, statements = sample_statements(
            case_id=unit.case.case_id,
            task=unit.item.key,
            family=unit.item.family.value,
            model=unit.spec.name,
            sample=unit.sample,
            status=ParseStatus.ERROR.value,
            turns=record,
            parsed=None,
            parse_error=error[:2000],
            image_hashes=shown,
        )
        return statements

    def _parsed_turns(
        self, unit: Unit, answered: list[tuple[str, ModelOutput]]
    ) -> tuple[list[SampleTurn], ParsedAnswer | None]:
        """Each answered turn's record (its parse status) and the last turn's parsed answer."""
        record: list[SampleTurn] = []
        parsed: ParsedAnswer | None = None
        for t, (key, output) in enumerate(answered, start=1):
            parsed = parse_answer(
                output.text, unit.item.family, refusal=output.refusal, prompts=self.prompts
            )
            record.append(SampleTurn(turn=t, cache_key=key, status=parsed.status.value))
        return record, parsed

    async def _finish_graded(
        self, unit: Unit, answered: list[tuple[str, ModelOutput]], shown: list[str]
    ) -> None:
        """A unit whose answer the graders are asked about (when it parses): parsed here, the
        sample stored before the graders are asked, their replies stored like any call."""
        record, parsed = self._parsed_turns(unit, answered)
        assert parsed is not None
        if parsed.status is not ParseStatus.OK:
            self._finish_later(unit, answered, shown, ([*record], parsed, []))
            return
        output = total_output([o for _, o in answered])
        _, statements = self._sample_statements(unit, parsed, record, shown)
        await self._commit(statements)
        try:
            replies, checks, grader_records = await self._grade(
                unit, shown_case(unit.case, shown), output.text
            )
        except BudgetReached as exc:
            # answered but not graded: recorded as not done, so resume grades it (the
            # answer is stored: resume reuses it, only the graders are asked)
            await self._record_error(unit, record, shown, f"not graded: {exc}")
            raise
        from evaluation.scoring.rubric import rubric_from_outputs

        extra = [rubric_from_outputs(replies, output.text, checks)]
        self._finish_later(unit, answered, shown, ([*record, *grader_records], parsed, extra))

    def _finish_later(
        self,
        unit: Unit,
        answered: list[tuple[str, ModelOutput]],
        shown: list[str],
        done: tuple[list[SampleTurn | GraderCall], ParsedAnswer, list[Score]] | None = None,
    ) -> None:
        """Hand an answered unit to the finisher thread (``_settle``): its responses are
        committed already, so what is left (parse, score, the sample's row and its scores)
        is off the event loop, and nothing wakes the loop when it is done. ``run`` waits for
        all of it before it counts; a failed commit stops the run's workers."""
        with self._settled_all:
            self._settling += 1
        self._finisher.submit(self._settle, unit, answered, shown, done).add_done_callback(
            self._settled
        )

    def _settled(self, job: Future[Future[None]]) -> None:
        """A finisher job ended (any thread): its commit is awaited next, a failure kept."""
        exc = job.exception()
        if exc is None:
            job.result().add_done_callback(self._committed)
            return
        self._committed(job)

    def _committed(self, done: Future[Any]) -> None:
        """A finisher job's commit is done (the writer thread), or the job failed: the first
        failure is kept (the workers stop on it, ``run`` raises it)."""
        exc = done.exception()
        with self._settled_all:
            if exc is not None and self._failure is None:
                self._failure = exc
            self._settling -= 1
            if self._settling == 0:
                self._settled_all.notify_all()

    def _settle(
        self,
        unit: Unit,
        answered: list[tuple[str, ModelOutput]],
        shown: list[str],
        done: tuple[list[SampleTurn | GraderCall], ParsedAnswer, list[Score]] | None,
    ) -> Future[None]:
        """In the finisher thread: parse the answer (unless done), score it, and post the
        sample's row and its scores to the store's writer as one record."""
        try:
            if done is None:
                turns, parsed = self._parsed_turns(unit, answered)
                assert parsed is not None
                record: list[SampleTurn | GraderCall] = list(turns)
                extra: list[Score] = []
            else:
                record, parsed, extra = done
            sid, statements = self._sample_statements(unit, parsed, record, shown)
        except Exception as exc:  # one bad answer must not stop the run (as any unit's failure)
            log.exception("unit %s/%s failed", unit.case.case_id, unit.item.key)
            self.stats.errors += 1
            return self._committer.post(
                self._error_statements(unit, [], shown, f"{type(exc).__name__}: {exc}")
            )
        if parsed.status is ParseStatus.FORMAT_FAILURE:
            self.stats.format_failures += 1
        elif parsed.status is ParseStatus.REFUSAL:
            self.stats.refusals += 1
        scored = False
        if self.scoring is not None and unit.case.ground_truth is not None:
            try:
                score = self._score(
                    shown_case(unit.case, shown),
                    unit.item.family,
                    unit.spec.name,
                    parsed,
                    total_output([o for _, o in answered]),
                    unit.sample,
                    self.config.run_id,
                    extra,
                    len(shown),
                    unit.item.key,
                )
            except Exception as exc:
                self.stats.scoring_errors += 1
                if self.stats.scoring_errors == 1:
                    log.warning("scoring failed (run `runs rescore` later): %s", exc)
            else:
                statements += score_statements(
                    sid, score.scores, score.label, score.scored_json, score.scoring_version
                )
                scored = True
        commit = self._committer.post(statements)
        if scored:
            commit.add_done_callback(self._count_scored)
        return commit

    def _count_scored(self, commit: Future[None]) -> None:
        if commit.exception() is None:
            self.stats.scored += 1

    def _score(self, *args: Any) -> ScoreRecord:
        """``ScoringBridge.score`` here (the finisher thread), or in the scoring process."""
        assert self.scoring is not None
        if self._finisher is self._score_pool:
            return self.scoring.score(*args)
        return self._score_pool.submit(self.scoring.score, *args).result()

    def _drain(self) -> None:
        """Wait for every finisher job and its commit (raises the first failure)."""
        with self._settled_all:
            self._settled_all.wait_for(lambda: self._settling == 0)
        if self._failure is not None:
            raise self._failure

    def _sample_statements(
        self,
        unit: Unit,
        parsed: ParsedAnswer,
        record: list[SampleTurn] | list[SampleTurn | GraderCall],
        shown: list[str],
    ) -> tuple[str, Statements]:
        return sample_statements(
            case_id=unit.case.case_id,
            task=unit.item.key,
            family=unit.item.family.value,
            model=unit.spec.name,
            sample=unit.sample,
            status=parsed.status.value,
            turns=record,
            parsed=parsed_record(parsed),
            parse_error=parsed.error,
            image_hashes=shown,
        )


@contextlib.contextmanager
def _heap_set_aside() -> Iterator[None]:
    """What the process holds when a run starts (litellm's import, the dataset: some 500,000
    objects) out of the cycle collector's sight while the run lasts, and given back to it
    after: each full collection walked all of it, about 0.3 ms of CPU per call on
    bench/engine.py's workload. A run allocates as before; only the walks are saved."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


SHARED_NOTE = "shared_by_workers"  # a worker took a share of the run (--shard I/N)


def coordinated(config: RunConfig, store: RunStore, shard: tuple[int, int] | None) -> bool:
    """Whether this worker claims each call and holds the providers' shared limits through
    the run log: when it takes a share of the run (recorded, so that every later worker of the
    run does too, a ``runs resume`` without ``--shard`` included), when a worker took one
    before, or when a model's limits are shared. A run one worker has to itself does without:
    a claim and its end are a transaction each per call (bench/engine.py --postgres, one
    worker: 7.1 -> 5.3 ms of our CPU per call, the server's 1.6 -> 1.1 ms)."""
    if any(s.shared_concurrency or s.shared_rpm for s in [*config.models, *config.graders]):
        return True
    if shard is not None:
        if store.note(SHARED_NOTE) is None:
            store.set_note(SHARED_NOTE, f"{shard[0]}/{shard[1]}")
        return True
    return store.note(SHARED_NOTE) is not None


def check_shard(shard: tuple[int, int] | None) -> tuple[int, int] | None:
    """A worker's share ``(index, count)`` of a run's cases, checked (``StoreError``)."""
    if shard is None:
        return None
    i, n = shard
    if not (1 <= n <= 1000 and 0 <= i < n):
        raise StoreError(f"shard {i}/{n}: the index must be 0 .. count-1, the count 1 .. 1000")
    return shard


def in_shard(case_id: str, shard: tuple[int, int]) -> bool:
    """Whether a case is in the share ``(index, count)``: by a hash of its id, the same on
    every host whatever the order of the dataset."""
    import hashlib

    i, n = shard
    return int.from_bytes(hashlib.sha256(case_id.encode()).digest()[:8], "big") % n == i


class _Shared:
    """A model's provider limits held through the run log (``SharedLimit``)."""

    def __init__(self, coord: Coordination, spec: ModelSpec) -> None:
        self.coord, self.spec = coord, spec
        self.provider = (
            f"{spec.litellm_model}@{spec.api_base}" if spec.api_base else spec.litellm_model
        )

    def slot(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self.coord.provider_slot(self.provider, self.spec.shared_concurrency,
                                        self.spec.shared_rpm)  # fmt: skip


def _unit_id(case_id: str, task: str, model: str, sample: int) -> tuple[str, str, str, int]:
    """A unit's identity as the run log keys its sample."""
    return (case_id, task, model, sample)
