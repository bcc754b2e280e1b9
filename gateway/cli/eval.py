"""``neurosandbox eval``: run models on a dataset (the engine is evaluation.engine)."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from evaluation import EvaluationError
from evaluation.robustness import expand_dataset, parse_kinds
from gateway.cli.console import (
    EXIT_CODES,
    ExitCode,
    ProgressBar,
    console,
    csv_list,
    fail,
    note,
    print_run,
    shard_option,
)

if TYPE_CHECKING:
    from evaluation import RunConfig
    from gateway.settings import Settings


def eval_command(
    suite: Annotated[
        Path,
        typer.Option(
            "--suite", help="dataset: suite folder, manifest, Neural-MedBench file or NeuroVLM CSV"
        ),
    ],
    out: Annotated[Path, typer.Option("--out", help="run folder to create (holds run.sqlite)")],
    model: Annotated[
        list[str] | None,
        typer.Option(
            "--model",
            help="model name (repeat); litellm name, reference/text-prior, reference/image-rules or replay:FILE",
        ),
    ] = None,
    grader: Annotated[
        list[str] | None,
        typer.Option(
            "--grader",
            help="rubric grader model (repeat for a jury: the rubric is the graders' median; "
            "each also grades a canary once, and one that obeys it is left out); resolved like "
            "--model",
        ),
    ] = None,
    api_base: Annotated[
        str | None, typer.Option("--api-base", help="endpoint for litellm models named here")
    ] = None,
    api_key_env: Annotated[
        str | None, typer.Option("--api-key-env", help="environment variable holding the API key")
    ] = None,
    models_file: Annotated[
        Path | None, typer.Option("--models-file", help="YAML/JSON model specs")
    ] = None,
    tasks: Annotated[
        list[str] | None,
        typer.Option(
            "--tasks",
            help="task families (comma list or repeat): differential, lesion, rationale, classification, multiturn",
        ),
    ] = None,
    samples: Annotated[
        int, typer.Option("--samples", help="independent samples per task (for pass@k)")
    ] = 1,
    concurrency: Annotated[
        int | None, typer.Option("--concurrency", help="calls in flight per model")
    ] = None,
    processes: Annotated[
        int | None,
        typer.Option("--processes", help="litellm calls in N worker processes (CPU-bound runs)"),
    ] = None,
    ablation: Annotated[str, typer.Option("--ablation", help="both, images or text")] = "both",
    robustness: Annotated[
        str,
        typer.Option(
            "--robustness",
            help="the audit's variants beside each case: kinds or all, ablations, mirrors, "
            "attacks (comma-separated; multiplies the calls)",
        ),
    ] = "",
    shard: Annotated[
        str | None,
        typer.Option(
            "--shard",
            metavar="<I/N>",
            help="start the run as worker I of N (PostgreSQL run log): this process takes the "
            "cases whose id hashes to I; the others join with `runs resume RUN --shard J/N`",
        ),
    ] = None,
    queue: Annotated[
        int | None,
        typer.Option(
            "--queue",
            min=1,
            max=1000,
            metavar="<N>",
            help="put the run on the queue as N shard jobs (PostgreSQL run log) for "
            "`neurosandbox worker` processes on any host, instead of running it here",
        ),
    ] = None,
    temperature: Annotated[float, typer.Option(help="decoding temperature")] = 0.7,
    top_p: Annotated[float, typer.Option("--top-p", help="nucleus sampling")] = 0.95,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", help="most tokens an answer may take")
    ] = 2048,
    seed: Annotated[int | None, typer.Option("--seed", help="sample i uses seed+i")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds per call")] = 120.0,
    max_images: Annotated[int, typer.Option("--max-images", help="images per request")] = 8,
    kind: Annotated[
        str, typer.Option("--kind", help="auto, suite, manifest, neural-medbench, neurovlm")
    ] = "auto",
    answers: Annotated[
        Path | None, typer.Option("--answers", help="Neural-MedBench answers file")
    ] = None,
    columns: Annotated[
        str | None,
        typer.Option("--columns", help="Neural-MedBench column map, e.g. case_id=id,text=history"),
    ] = None,
    image_root: Annotated[
        Path | None, typer.Option("--image-root", help="NeuroVLM-Bench image folder")
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", help="first N cases only")] = None,
    trust: Annotated[
        list[str] | None,
        typer.Option(
            "--phi-trust", help="host/CIDR allowed identified content (default: settings, loopback)"
        ),
    ] = None,
    bertscore: Annotated[
        bool,
        typer.Option("--bertscore/--no-bertscore", help="also score answers with BERTScore"),
    ] = True,
    bertscore_model: Annotated[
        Path | None,
        typer.Option(
            "--bertscore-model",
            help="local folder of another BERTScore model (default: all-MiniLM-L6-v2, offline)",
        ),
    ] = None,
    bertscore_layer: Annotated[
        int | None, typer.Option("--bertscore-layer", help="its layer (default: 6 for MiniLM)")
    ] = None,
    durable: Annotated[bool, typer.Option("--durable", help="fsync every commit")] = False,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="exit 3 when any case of the dataset was skipped (the run still runs and "
            "records them)",
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="print per model the calls, images, input tokens, expected cost and wall "
            "time; send nothing, create nothing",
        ),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="with --dry-run: the estimate as JSON")
    ] = False,
    max_cost: Annotated[
        float | None,
        typer.Option(
            "--max-cost",
            min=0.0,
            help="budget in USD: no call is sent once the recorded cost plus the calls in "
            "flight could pass it; the run stops resumable (exit 5)",
        ),
    ] = None,
    allow_unknown_cost: Annotated[
        bool,
        typer.Option(
            "--allow-unknown-cost",
            help="with --max-cost: run models litellm's price map cannot price (their calls "
            "count as $0)",
        ),
    ] = False,
) -> None:
    """Run models on a dataset: every response is stored before it is scored; resumable.

    Cases the dataset lists but that cannot be loaded (or have no task to run) are listed with
    the reason as the run starts and again at the end ("n of m cases evaluated"), and recorded
    in the run; samples whose calls failed are counted per model with the first reason.
    """
    from evaluation import (
        Ablation,
        DatasetSpec,
        GenerateConfig,
        RunConfig,
        TaskFamily,
        start_run,
    )
    from gateway.pacs.cohort import pacs_fetcher
    from gateway.settings import get_settings

    settings = get_settings()
    if max_cost is not None and not 0 < max_cost < float("inf"):
        raise fail(f"--max-cost {max_cost}: a budget is a finite amount above $0", ExitCode.USAGE)
    try:
        families = [TaskFamily(t) for t in csv_list(tasks)] or None
        if bertscore_model is not None and not (bertscore_model / "config.json").is_file():
            raise EvaluationError(
                f"--bertscore-model {bertscore_model}: not a local model folder (no config.json)"
            )
        config = RunConfig.from_settings(
            settings,
            DatasetSpec(
                path=str(suite),
                kind=kind,
                answers=str(answers) if answers else None,
                columns=dict(p.split("=", 1) for p in columns.split(",")) if columns else None,
                image_root=str(image_root) if image_root else None,
                limit=limit,
            ),
            models=model or None,
            graders=grader or None,
            models_file=models_file,
            api_base=api_base,
            api_key_env=api_key_env,
            concurrency=concurrency,
            processes=processes,
            trusted_hosts=trust or None,
            tasks=families,
            samples=samples,
            ablation=Ablation(ablation),
            robustness=list(parse_kinds(robustness)),
            generate=GenerateConfig(
                temperature=temperature, top_p=top_p, max_tokens=max_tokens, timeout_s=timeout
            ),
            seed=seed,
            max_images=max_images,
            bertscore=bertscore,
            bertscore_model=str(bertscore_model.absolute()) if bertscore_model else None,
            bertscore_layer=bertscore_layer,
            durable=durable,
            max_cost_usd=max_cost,
            allow_unknown_cost=allow_unknown_cost,
        )
    except (EvaluationError, ValueError) as exc:
        raise fail(str(exc), ExitCode.USAGE) from None
    if dry_run:
        _dry_run(config, out, settings, as_json=as_json)
        return
    if queue is not None:
        _enqueue(settings, out, queue, shard=shard)
        return
    console.print(f"loading dataset {escape(str(suite))} ...")
    part = shard_option(shard) if shard is not None else None
    if part is not None and settings.database_url is None:
        raise fail("--shard needs the PostgreSQL run log (NEUROSANDBOX_DATABASE_URL)",
                   ExitCode.USAGE)  # fmt: skip
    try:
        with ProgressBar() as bar:
            stats = asyncio.run(
                start_run(
                    config,
                    out,
                    on_progress=bar,
                    database_url=settings.database_url,
                    fetch_study=pacs_fetcher(settings),
                    shard=part,
                    lease_s=settings.call_lease_s,
                )
            )
    except EvaluationError as exc:  # the dataset, the models or the run folder
        raise fail(str(exc), ExitCode.USAGE) from None
    code = print_run(stats, out).exit_code(strict=strict)
    if code is ExitCode.SKIPPED_STRICT:
        note(f"[red]--strict: {len(stats.skipped)} skipped case(s); exit {int(code)}[/red]")
    raise typer.Exit(int(code))


# The exit codes are part of the command's help (typer shows the docstring's paragraphs).
eval_command.__doc__ = f"{inspect.cleandoc(eval_command.__doc__ or '')}\n\n{EXIT_CODES}"


# options naming a file or folder: made absolute for a worker that runs in another folder
_PATH_OPTIONS = (
    "--suite",
    "--out",
    "--models-file",
    "--answers",
    "--image-root",
    "--bertscore-model",
)


def _enqueue(settings: Settings, out: Path, shards: int, *, shard: str | None) -> None:
    """``eval --queue N``: the command as it was typed, as N shard jobs in the outbox, then
    drained into the queue (a worker drains whatever a killed enqueuer left)."""
    import sys

    import sqlalchemy as sa

    from gateway.jobs import QueueError, drain, enqueue, schema_ready, shard_jobs

    if settings.database_url is None:
        raise fail("--queue needs the PostgreSQL run log (NEUROSANDBOX_DATABASE_URL)",
                   ExitCode.USAGE)  # fmt: skip
    if shard is not None:
        raise fail("--queue makes the shards itself: leave out --shard", ExitCode.USAGE)
    argv, args = ["eval"], sys.argv[sys.argv.index("eval") + 1 :]
    while args:
        arg = args.pop(0)
        name, eq, value = arg.partition("=")
        if name == "--queue":
            if not eq:
                args.pop(0)
            continue
        if name in _PATH_OPTIONS:
            value = value if eq else args.pop(0)
            argv += [name, str(Path(value).absolute())]
            continue
        argv.append(arg)
    try:
        if not schema_ready(settings.database_url):
            raise QueueError("the queue's tables are missing: run `neurosandbox db upgrade`")
        engine = sa.create_engine(settings.database_url, poolclass=sa.pool.NullPool)
        try:
            with engine.begin() as conn:  # all the shards, or none
                for job in shard_jobs(argv, out, shards):
                    enqueue(conn, job)
        finally:
            engine.dispose()
        queued = drain(settings.database_url)
    except (QueueError, sa.exc.SQLAlchemyError) as exc:
        raise fail(f"--queue: {exc}", ExitCode.USAGE) from None
    console.print(
        f"queued {shards} shard job(s) of {escape(str(out.absolute()))} "
        f"({len(queued.queued)} new, {queued.merged} already waiting); "
        "`neurosandbox worker` runs them, `neurosandbox runs show` follows the run"
    )


def _dry_run(config: RunConfig, out: Path, settings: Settings, *, as_json: bool) -> None:
    """The estimate of the run, printed; nothing is sent and no folder is made."""
    from evaluation.budget import check_prices, estimate_run, history_of_runs
    from evaluation.datasets import load_dataset
    from gateway.cli.estimate import earlier_runs, print_estimate
    from gateway.pacs.cohort import pacs_fetcher

    try:
        check_prices(config)  # the run itself would refuse: say so now
        cache = Path(config.cache_dir or "out/cache")
        dataset = expand_dataset(
            load_dataset(config.dataset, cache, pacs_fetcher(settings)),
            config.robustness,
            cache,
            config.seed,
        )
        names = [s.name for s in [*config.models, *config.graders]]
        history = history_of_runs(earlier_runs(settings, names, out), settings.database_url)
        busy = f"estimating {len(dataset.cases)} cases (as the run would: the PHI gate reads "
        busy += "the text in each image bound for an endpoint it does not trust)"
        with console.status(busy):
            estimate = estimate_run(config, dataset, history=history)
    except EvaluationError as exc:
        raise fail(str(exc), ExitCode.USAGE) from None
    if as_json:
        typer.echo(estimate.model_dump_json(indent=2))
        return
    print_estimate(estimate)
