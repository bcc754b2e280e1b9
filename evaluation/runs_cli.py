"""``neurosandbox runs list|show|resume|rescore|export``: look after evaluation runs."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from evaluation.engine_cli import ProgressBar, _fail, _show, print_run
from evaluation.errors import EvaluationError

runs_app = typer.Typer(
    help="List, show, resume, re-score and export evaluation runs.", no_args_is_help=True
)
console = Console(stderr=True)


@runs_app.command("list")
def runs_list(
    folder: Annotated[
        Path | None, typer.Argument(help="folder holding run folders (default: settings runs_dir)")
    ] = None,
) -> None:
    """List the runs under a folder: id, status, dataset, models, samples."""
    from evaluation.store import STORE_FILE, RunStore
    from gateway.settings import get_settings

    root = folder or get_settings().runs_dir
    table = Table(title=f"runs in {root}")
    for col in ("folder", "run", "status", "created", "dataset", "models", "samples"):
        table.add_column(col, overflow="fold")
    for path in sorted(root.glob(f"*/{STORE_FILE}")) if root.exists() else []:
        try:
            store = RunStore(path.parent)
            row = store.run_row()
            n = store.counts()["samples"]
            store.close()
        except EvaluationError as exc:
            table.add_row(
                escape(path.parent.name), "-", f"unreadable: {escape(str(exc))}", "", "", "", ""
            )
            continue
        models = ", ".join(m["name"] for m in row["config"]["models"])
        table.add_row(
            escape(path.parent.name),
            row["run_id"],
            row["status"],
            row["created_at"][:19],
            escape(str(row["dataset_name"])),
            escape(models),
            str(n),
        )
    Console().print(table)


@runs_app.command("show")
def runs_show(
    run_dir: Annotated[Path, typer.Argument(help="run folder")],
    as_json: Annotated[
        bool, typer.Option("--json", help="print the run record and summary as JSON")
    ] = False,
) -> None:
    """Status, counts per model and the leaderboard of a run."""
    from evaluation.scoring_bridge import ScoringUnavailable, summary
    from evaluation.store import RunStore

    try:
        if as_json:
            store = RunStore(run_dir)
            try:
                out: dict[str, Any] = {"run": store.run_row(), "counts": store.counts()}
                try:
                    summ = summary(store)
                    out["summary"] = summ.model_dump(mode="json") if summ else None
                except ScoringUnavailable as exc:
                    out["summary_error"] = str(exc)
            finally:
                store.close()
            json.dump(out, sys.stdout, indent=2, default=str)
            sys.stdout.write("\n")
            return
        _show(run_dir)
    except EvaluationError as exc:
        raise _fail(str(exc)) from None


@runs_app.command("resume")
def runs_resume(
    run_dir: Annotated[Path, typer.Argument(help="run folder")],
    api_base: Annotated[
        str | None, typer.Option("--api-base", help="new endpoint for litellm models")
    ] = None,
    allow_changed_dataset: Annotated[bool, typer.Option("--allow-changed-dataset")] = False,
) -> None:
    """Continue a run: stored responses are reused; only missing or failed calls are made."""
    from evaluation.engine import resume_run

    try:
        with ProgressBar() as bar:
            stats = asyncio.run(
                resume_run(
                    run_dir,
                    api_base=api_base,
                    on_progress=bar,
                    allow_changed_dataset=allow_changed_dataset,
                )
            )
    except EvaluationError as exc:
        raise _fail(str(exc)) from None
    print_run(stats, run_dir)


@runs_app.command("rescore")
def runs_rescore(
    run_dir: Annotated[Path, typer.Argument(help="run folder")],
    bertscore: Annotated[bool | None, typer.Option("--bertscore/--no-bertscore")] = None,
) -> None:
    """Parse and score every stored response again. Never calls a model."""
    from evaluation.engine import rescore

    try:
        counts = rescore(run_dir, bertscore=bertscore)
    except EvaluationError as exc:
        raise _fail(str(exc)) from None
    console.print(", ".join(f"{k} {v}" for k, v in counts.items()))
    _show(run_dir)


@runs_app.command("judge")
def runs_judge(
    run_dir: Annotated[Path, typer.Argument(help="run folder")],
    model: Annotated[str, typer.Option("--model", help="the judge: a litellm model name")],
    models_file: Annotated[
        Path | None, typer.Option("--models-file", help="YAML/JSON model specs")
    ] = None,
    api_base: Annotated[str | None, typer.Option("--api-base", help="the judge's endpoint")] = None,
    api_key_env: Annotated[
        str | None, typer.Option("--api-key-env", help="variable holding the judge's key")
    ] = None,
) -> None:
    """Ask an LLM about diagnosis strings the lexicon does not know, then rescore.

    Verdicts go to RUNDIR/judge.json (asked once per distinct pair); judge matches are counted
    apart in the summary. Strings carrying the patient's identifiers never go to an untrusted
    endpoint.
    """
    from evaluation.engine import rescore
    from evaluation.judging import judge_run
    from evaluation.models import resolve_specs
    from gateway.settings import get_settings

    settings = get_settings()
    try:
        [spec] = resolve_specs(
            [model],
            models_file=models_file or settings.models_file,
            api_base=api_base or settings.api_base,
            api_key_env=api_key_env,
        )
        from rich.progress import Progress

        with Progress(console=console, transient=True) as bar:
            task = bar.add_task("judging", total=None)

            def progress(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            result = asyncio.run(judge_run(run_dir, spec, progress=progress))
        counts = rescore(run_dir)
    except EvaluationError as exc:
        raise _fail(str(exc)) from None
    console.print(
        f"{result.pairs} undecided pair(s): {result.asked} asked now, {result.equivalent} "
        f"equivalent, {result.not_equivalent} not, {result.unreadable} unreadable, "
        f"{result.withheld} withheld (identifiers, untrusted endpoint); verdicts in "
        f"{escape(result.cache)}"
    )
    console.print(", ".join(f"{k} {v}" for k, v in counts.items()))
    _show(run_dir)


@runs_app.command("export")
def runs_export(
    run_dir: Annotated[Path, typer.Argument(help="run folder")],
    out: Annotated[Path, typer.Option("--out", help="output file: .jsonl or .parquet")],
) -> None:
    """One record per case x task x model x sample, with the answer and its scores."""
    from evaluation.export import export_run
    from evaluation.store import RunStore

    try:
        store = RunStore(run_dir)
        try:
            n = export_run(store, out)
        finally:
            store.close()
    except EvaluationError as exc:
        raise _fail(str(exc)) from None
    console.print(f"wrote {n} records to {escape(str(out))}")
