"""What the commands share: the console, errors, the progress bar, a run's summary table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from evaluation import RunStats

console = Console(stderr=True)


def table_console() -> Console:
    """Where tables go (stdout): a terminal's own width, else 132 columns, so that a piped or
    logged leaderboard (make demo | tee) keeps model names on one line."""
    import sys

    return Console() if sys.stdout.isatty() else Console(width=132)


def fail(message: str, code: int = 1) -> typer.Exit:
    console.print(f"[red]error:[/red] {escape(message)}")
    return typer.Exit(code)


class ProgressBar:
    """A rich progress bar fed by the runner: samples, calls, errors, cost so far."""

    def __init__(self) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=console,
            refresh_per_second=4,
        )
        self.task = self.progress.add_task("samples", total=None, info="")

    def __call__(self, s: RunStats) -> None:
        info = (
            f"cases {s.cases_done}/{s.cases_total} | calls {s.calls} cached {s.cached} | errors {s.errors} format {s.format_failures} "
            f"refusals {s.refusals} | ${s.cost_usd:.4f}"
        )
        self.progress.update(self.task, total=s.units_total, completed=s.units_done, info=info)

    def __enter__(self) -> ProgressBar:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()


def csv_list(values: list[str] | None) -> list[str]:
    out: list[str] = []
    for v in values or []:
        out.extend(x.strip() for x in v.split(",") if x.strip())
    return out


def print_run(stats: RunStats, run_dir: Path) -> None:
    console.print(
        f"{stats.units_done}/{stats.units_total} samples; {stats.calls} calls, {stats.cached} reused; "
        f"{stats.errors} errors, {stats.format_failures} format failures, {stats.refusals} refusals; "
        f"cost ${stats.cost_usd:.4f}"
    )
    if stats.scoring_errors:
        console.print(
            f"[yellow]scoring failed for {stats.scoring_errors} samples: run `neurosandbox runs rescore {run_dir}`[/yellow]"
        )
    if stats.errors:
        console.print(
            f"some calls failed: `neurosandbox runs resume {escape(str(run_dir))}` retries them"
        )
    show_run(run_dir)


def show_run(run_dir: Path) -> None:
    from evaluation import RunStore, ScoringUnavailable, summary

    store = RunStore(run_dir)
    try:
        row = store.run_row()
        counts = store.counts()
        table = Table(title=f"run {row.run_id} ({row.status})")
        table.add_column("model")
        for col in ("samples", "ok", "format", "refusal", "error"):
            table.add_column(col, justify="right")
        per: dict[str, dict[str, int]] = {}
        for r in store.samples():
            d = per.setdefault(r.model, {})
            d[r.status] = d.get(r.status, 0) + 1
        for m, d in per.items():
            table.add_row(
                escape(m),
                str(sum(d.values())),
                *(str(d.get(k, 0)) for k in ("ok", "format_failure", "refusal", "error")),
            )
        table_console().print(table)
        console.print(
            f"dataset {escape(str(row.dataset_name))} hash {row.dataset_hash[:12]}; "
            f"{counts.requests} requests, {counts.responses} responses, {counts.audit} audited payloads; "
            f"code {escape(str(row.code_version))}"
        )
        _scoring_versions(store.scoring_versions(), run_dir)
        try:
            summ = summary(store)
        except ScoringUnavailable as exc:
            console.print(f"[yellow]{escape(str(exc))}[/yellow]")
            return
        if summ is not None:
            _leaderboard(summ)
    finally:
        store.close()


def _scoring_versions(held: dict[str | None, int], run_dir: Path) -> None:
    from evaluation import SCORING_VERSION, version_name

    names = {version_name(v): n for v, n in held.items()}
    if len(names) > 1:
        mix = ", ".join(f"{escape(v)}: {n} samples" for v, n in sorted(names.items()))
        console.print(
            f"[yellow]scores mix scoring versions ({mix}); they are not comparable: run "
            f"`neurosandbox runs rescore {escape(str(run_dir))}`[/yellow]"
        )
    elif names:
        [v] = names
        stale = "" if v == SCORING_VERSION else f" (current {SCORING_VERSION}: rescore to update)"
        console.print(f"scoring version {escape(v)}{stale}")


def _est(value: Any) -> str:
    if value is None:
        return "-"
    v = getattr(value, "value", value)
    lo, hi = getattr(value, "low", None), getattr(value, "high", None)
    if not isinstance(v, (int, float)):
        return "-"
    return f"{v:.3f}" + (
        f" [{lo:.2f}, {hi:.2f}]" if isinstance(lo, float) and isinstance(hi, float) else ""
    )


def pass_at_cell(row: Any, k: int) -> str:
    """Sampled pass@k with the units it left out because samples went unscored."""
    cell = _est(row.sampled_pass_at.get(str(k)))
    left = row.sampled_pass_left_out.get(str(k), 0)
    return cell + (f" ({left} unit{'s' if left != 1 else ''} left out: unscored)" if left else "")


def _leaderboard(summ: Any) -> None:
    table = Table(title="leaderboard (bootstrap 95% CI over patients)")
    for col in ("model", "scored", "accuracy", "pass@1", "ranked top-5", "lesions P/R", "cost $"):
        table.add_column(col, overflow="fold")
    for r in summ.leaderboard:
        lesions = r.lesions
        lp = f"{lesions.precision or 0:.2f}/{lesions.recall or 0:.2f}" if lesions else "-"
        table.add_row(
            escape(r.model),
            f"{r.n_scored}/{r.n_samples}",
            _est(r.accuracy),
            pass_at_cell(r, 1),
            _est(r.ranked_pass_at.get("5")),
            lp,
            f"{r.cost.cost_total_usd or 0:.4f}",
        )
    table_console().print(table)
    for r in summ.leaderboard:
        if r.rubric_canary_failed:
            table_console().print(
                f"[yellow]{escape(r.model)}: rubric grader(s) "
                f"{escape(', '.join(r.rubric_canary_failed))} failed the canary (gave full marks "
                "to a wrong answer that asked for them) and are left out of the rubric[/yellow]"
            )
