"""The public entry points of the evaluation engine: start, resume and re-score a run.

    config = RunConfig(dataset=DatasetSpec(path="suite"), models=resolve_specs(["reference/image-rules"]))
    stats = asyncio.run(start_run(config, Path("out/runs/r1"), cache_dir=Path("out/cache")))

A run folder holds ``run.sqlite`` (the store, the truth) and ``config.json`` (a readable copy of
the configuration). The store also keeps each case as the scorers see it (``scoring_snapshot``),
so ``rescore`` needs nothing but the run folder. Resume reloads the dataset the run recorded and
refuses one whose content hash changed; every stored response is reused, so only missing or
failed calls are made.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from evaluation.budget.gate import check_prices
from evaluation.case import Case
from evaluation.datasets import Dataset, StudyFetcher, load_dataset
from evaluation.errors import DatasetError, EvaluationError, StoreError, first_error
from evaluation.log.claims import DEFAULT_LEASE_S
from evaluation.log.records import RunLog
from evaluation.log.store import (
    DatasetChangedError,
    RunExistsError,
    RunStore,
    open_store,
    store_exists,
)
from evaluation.prompts import default_prompts
from evaluation.robustness.expand import expand_dataset, with_variants
from evaluation.robustness.records import variant_of
from evaluation.robustness.runlog import record_variants
from evaluation.runconfig import RunConfig, code_version, package_versions
from evaluation.runner import Runner
from evaluation.scoring_bridge import RescoreCounts, rescore_run, scoring_snapshot
from evaluation.units import RunStats

log = logging.getLogger(__name__)
Progress = Callable[[RunStats], None]


def _cache(config: RunConfig, cache_dir: Path | None) -> Path:
    return Path(config.cache_dir) if config.cache_dir else (cache_dir or Path("out/cache"))


def open_dataset(
    config: RunConfig, cache_dir: Path | None = None, fetch_study: StudyFetcher | None = None
) -> Dataset:
    dataset = load_dataset(config.dataset, _cache(config, cache_dir), fetch_study)
    return expand_dataset(dataset, config.robustness, _cache(config, cache_dir), config.seed)


def _record_variants(
    config: RunConfig, dataset: Dataset, store: RunStore, cache_dir: Path | None
) -> None:
    """What each of the run's variants was: the run note the audit reads (the variants are
    deterministic: made again from the sources, the same bytes; a resume checks they are)."""
    if not config.robustness:
        return
    sources = [c for c in dataset.cases if variant_of(c.case_id)[1] is None]
    made = with_variants(
        sources, config.robustness, _cache(config, cache_dir) / "variants", config.seed or 0
    )
    record_variants(store, made.variants)


async def start_run(
    config: RunConfig,
    run_dir: Path,
    *,
    cache_dir: Path | None = None,
    dataset: Dataset | None = None,
    on_progress: Progress | None = None,
    score: bool = True,
    database_url: str | None = None,
    fetch_study: StudyFetcher | None = None,
    shard: tuple[int, int] | None = None,
    lease_s: float = DEFAULT_LEASE_S,
) -> RunStats:
    """Create the run folder and store, record the configuration, and run every unit (of
    ``shard``, this worker's share, when several share the run: see ``resume_run``).
    ``database_url``: the PostgreSQL run log (None: the folder's own run.sqlite);
    ``fetch_study``: how a manifest's study on a configured PACS is fetched."""
    if store_exists(run_dir, database_url) and _holds_run(run_dir, database_url):
        raise RunExistsError(
            f"{run_dir} already holds a run: use `neurosandbox runs resume {run_dir}`"
        )
    check_prices(config)  # a budget the run could not keep refuses it before anything exists
    dataset = dataset or open_dataset(config, cache_dir, fetch_study)
    run_dir.mkdir(parents=True, exist_ok=True)
    # a store holding only notes (the gateway's record of a queued run) gets its run now
    store = open_store(
        run_dir,
        run_id=config.run_id,
        create=True,
        durable=config.durable,
        database_url=database_url,
    )
    try:
        prompts = default_prompts()
        store.init_run(
            config.run_id,
            config.model_dump(mode="json"),
            dataset_name=dataset.name,
            dataset_kind=dataset.kind,
            dataset_hash=dataset.hash,
            prompt_version=prompts.version,
            code_version=code_version(),
            packages=package_versions(),
        )
        store.record_cases([scoring_snapshot(c) for c in dataset.cases])
        _record_variants(config, dataset, store, cache_dir)
        (run_dir / "config.json").write_text(config.model_dump_json(indent=2))
        runner = Runner(config, dataset, store, prompts=prompts, on_progress=on_progress,
                        score=score, shard=shard, lease_s=lease_s)  # fmt: skip
        return await runner.run()
    finally:
        store.close()


def _holds_run(run_dir: Path, database_url: str | None = None) -> bool:
    with open_store(run_dir, database_url=database_url) as store:
        return store.has_run()


def load_config(run_dir: Path, database_url: str | None = None) -> tuple[RunConfig, RunLog]:
    store = open_store(run_dir, database_url=database_url)
    try:
        row = store.run_log()
    finally:
        store.close()
    return RunConfig.model_validate(row.config), row


async def resume_run(
    run_dir: Path,
    *,
    cache_dir: Path | None = None,
    api_base: str | None = None,
    on_progress: Progress | None = None,
    allow_changed_dataset: bool = False,
    score: bool = True,
    database_url: str | None = None,
    max_cost_usd: float | None = None,
    allow_unknown_cost: bool | None = None,
    fetch_study: StudyFetcher | None = None,
    shard: tuple[int, int] | None = None,
    lease_s: float = DEFAULT_LEASE_S,
    dataset: Dataset | None = None,
) -> RunStats:
    """Continue a run: stored responses are reused, missing and failed calls are made.

    The run keeps the budget it was started with; ``max_cost_usd`` (and
    ``allow_unknown_cost``) replace it in the run's recorded configuration. ``shard``: this
    worker's share ``(index, count)`` of the cases, when several workers share the run (the
    PostgreSQL run log: each call is claimed first, its lease ``lease_s``). ``dataset``: the
    run's dataset when it exists only in memory (the gateway's study), else it is loaded
    again as the run's configuration names it; either way it must be the dataset the run
    started with (its hash)."""
    config, row = load_config(run_dir, database_url)
    if api_base:
        for spec in config.models:
            if spec.kind == "litellm":
                spec.api_base = api_base
    budget: dict[str, object] = {}
    if max_cost_usd is not None:
        budget["max_cost_usd"] = max_cost_usd
    if allow_unknown_cost is not None:
        budget["allow_unknown_cost"] = allow_unknown_cost
    if budget:
        try:
            config = RunConfig.model_validate({**config.model_dump(mode="json"), **budget})
        except ValidationError as exc:
            raise EvaluationError(f"the new budget: {first_error(exc)}") from None
    check_prices(config)
    dataset = dataset or open_dataset(config, cache_dir, fetch_study)
    if dataset.hash != row.dataset_hash and not allow_changed_dataset:
        raise DatasetChangedError(
            f"the dataset changed since the run started (hash {row.dataset_hash[:12]} -> "
            f"{dataset.hash[:12]}); resume would mix two datasets"
        )
    store = open_store(run_dir, durable=config.durable, database_url=database_url)
    try:
        if budget:  # the new budget is the run's from now on (a later resume keeps it)
            store.set_config(config.model_dump(mode="json"))
        # Runs recorded before snapshots, or cases new to a changed dataset; kept ones stay.
        store.record_cases([scoring_snapshot(c) for c in dataset.cases])
        _record_variants(config, dataset, store, cache_dir)
        runner = Runner(config, dataset, store, on_progress=on_progress, score=score,
                        shard=shard, lease_s=lease_s)  # fmt: skip
        return await runner.run()
    finally:
        store.close()


def rescore(
    run_dir: Path,
    *,
    cache_dir: Path | None = None,
    bertscore: bool | None = None,
    database_url: str | None = None,
) -> RescoreCounts:
    """Re-parse and re-score every stored response (never calls a model).

    Cases come from the run's own snapshots; the dataset on disk is read only for cases a run
    recorded before snapshots existed, and to warn when it no longer matches the run.
    """
    config, row = load_config(run_dir, database_url)
    store = open_store(run_dir, database_url=database_url)
    try:
        snapshots = store.cases()
    finally:
        store.close()
    cases = _rescore_cases(config, row, snapshots, cache_dir)
    judge = None
    verdicts = Path(run_dir) / "judge.json"  # evaluation.judging.JUDGE_FILE
    if verdicts.exists():
        from evaluation.scoring import JudgeCache

        try:
            judge = JudgeCache(verdicts)
        except ValueError as exc:  # JSON or schema: say which file, keep the run untouched
            raise StoreError(
                f"{verdicts}: not a judge verdict file ({exc}); move it away "
                "to rescore without the judge"
            ) from exc
    store = open_store(run_dir, database_url=database_url)
    try:
        return rescore_run(
            store,
            cases,
            bertscore=config.bertscore if bertscore is None else bertscore,
            judge=judge,
            bertscore_model=config.bertscore_model,
            bertscore_layer=config.bertscore_layer,
        )
    finally:
        store.close()


def _rescore_cases(
    config: RunConfig,
    row: RunLog,
    snapshots: dict[str, Case],
    cache_dir: Path | None,
) -> dict[str, Case]:
    """The cases to rescore against: the run's snapshots, the dataset for any it lacks."""
    try:
        dataset = open_dataset(config, cache_dir)
    except (DatasetError, OSError) as exc:
        if not snapshots:
            raise StoreError(
                f"the run holds no case snapshots (recorded before they existed) and its "
                f"dataset cannot be loaded: {exc}"
            ) from exc
        log.info("dataset not loadable (%s): rescoring from the run's case snapshots", exc)
        return dict(snapshots)
    if dataset.hash != row.dataset_hash:
        log.warning(
            "the dataset on disk changed since the run (hash %s -> %s): %s",
            row.dataset_hash[:12],
            dataset.hash[:12],
            "scores use the run's own copy of each case"
            if snapshots
            else "scores use the current ground truth (the run holds no case snapshots)",
        )
    cases = {c.case_id: c for c in dataset.cases}
    cases.update(snapshots)  # the truth the run was scored against wins
    return cases
