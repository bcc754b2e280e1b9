"""``neurosandbox canary FILE``: run a pinned set of cases again and say whether each model now
answers differently than in the canary's last run (gateway/canary.py)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from evaluation import EvaluationError
from gateway.cli.console import (
    CANARY_EXIT_CODES,
    ExitCode,
    ProgressBar,
    fail,
    note,
    print_run,
    shown,
)


def canary_command(
    file: Annotated[Path, typer.Argument(help="the canary file (YAML; docs/evaluation.md)")],
    as_json: Annotated[
        bool, typer.Option("--json", help="print the outcome (verdicts, comparison) as JSON")
    ] = False,
    n_boot: Annotated[int, typer.Option("--n-boot", min=100, help="bootstrap resamples")] = 2000,
) -> None:
    """Run the canary FILE names (its cases, models, samples) as a new run in the runs folder,
    compare each model with the canary's last run from the same file, and say ALARM when more
    than the file's share of cases flipped or a metric left the earlier run's 95% CI; quiet
    otherwise ("first" when there is no earlier run). The run is marked (the index shows it,
    the service's /metrics exposes it) and the passport fields that changed are listed. An
    earlier run scored with an older scoring version is rescored first."""
    from evaluation import RunConfig, start_run
    from gateway.canary import judge, read_canary, run_folder
    from gateway.pacs.cohort import pacs_fetcher
    from gateway.settings import get_settings

    settings = get_settings()
    try:
        canary = read_canary(file)
        spec = canary.spec
        config = RunConfig.from_settings(
            settings,
            canary.dataset(),
            models=canary.models(),
            models_file=Path(p) if (p := canary.near(spec.models_file)) else None,
            api_base=spec.api_base,
            tasks=spec.tasks,
            samples=spec.samples,
            generate=canary.generate(),
            seed=spec.decoding.seed,
            max_images=spec.max_images,
            bertscore=spec.bertscore,
        )
    except (EvaluationError, ValueError) as exc:
        raise fail(str(exc), ExitCode.USAGE) from None
    runs_dir = settings.runs_dir
    out = run_folder(runs_dir, spec.name)
    note(f"canary {escape(spec.name)}: run {escape(str(out))}")
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
        with ProgressBar() as bar:
            stats = asyncio.run(
                start_run(
                    config,
                    out,
                    on_progress=bar,
                    database_url=settings.database_url,
                    fetch_study=pacs_fetcher(settings),
                )
            )
    except (EvaluationError, OSError) as exc:
        raise fail(str(exc), ExitCode.USAGE) from None
    # with --json, stdout holds the outcome alone: the run's tables go to stderr
    with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
        ran = print_run(stats, out).exit_code()
    try:
        outcome = judge(canary, out, settings, n_boot=n_boot)
    except (EvaluationError, ValueError) as exc:
        raise fail(f"canary {spec.name}: the comparison failed: {exc}", ExitCode.USAGE) from None
    if as_json:
        sys.stdout.write(outcome.model_dump_json(indent=2) + "\n")
    for line in outcome.rescored:
        note(f"earlier run rescored first: {shown(line)}")
    if outcome.dataset_note:
        note(f"[yellow]{shown(outcome.dataset_note)}[/yellow]")
    if outcome.earlier is None:
        on = " on this dataset" if outcome.dataset_note else ""
        note(f"canary {escape(spec.name)}: FIRST run of this file{on} (nothing to compare yet)")
    else:
        e = outcome.earlier
        note(
            f"canary {escape(spec.name)} against run {shown(e.run_id, 64)} "
            f"({shown(e.created_at or '?', 40)}, {shown(e.run_dir)}):"
        )
        for m in outcome.models:
            colour = "red" if m.verdict == "alarm" else "green"
            share = "-" if m.flip_share is None else f"{100 * m.flip_share:.0f}%"
            note(
                f"  [{colour}]{m.verdict.upper()}[/{colour}] {shown(m.model, 120)}: "
                f"{m.flipped} of {m.n_shared_units} case questions flipped ({share})"
            )
            for r in m.reasons:
                note(f"    {shown(r)}")
            for c in outcome.passport_changes.get(m.model, []):
                note(
                    f"    passport {shown(c.field, 80)}: {shown(c.before or '-', 120)} -> "
                    f"{shown(c.after or '-', 120)}"
                )
        colour = "red" if outcome.verdict == "alarm" else "green"
        note(f"[{colour}]canary {escape(spec.name)}: {outcome.verdict.upper()}[/{colour}]")
    raise typer.Exit(int(ExitCode.CANARY_ALARM if outcome.verdict == "alarm" else ran))


canary_command.__doc__ = f"{inspect.cleandoc(canary_command.__doc__ or '')}\n\n{CANARY_EXIT_CODES}"
