"""What the commands share: the console, errors, exit codes, the progress bar, a run's summary
(counts per model, the cases it skipped, the reasons its samples failed, the leaderboard)."""

from __future__ import annotations

import re
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

if TYPE_CHECKING:
    from evaluation import CaseCoverage, RunStats, SkippedCase
    from evaluation.log import CallErrors, RunStore


def cli_console(*, stderr: bool = False) -> Console:
    """A console for the commands' messages: wrapped at a terminal's width, never wrapped when
    the stream is not a terminal (a pipe, a log, `make demo | tee`), where rich would break
    lines at 80 columns and split a token, a run id or a path in two."""
    import sys

    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, soft_wrap=not stream.isatty())


console = cli_console(stderr=True)
MAX_SHOWN = 300  # characters of an untrusted message (a model's error, a loader's reason)


class ExitCode(IntEnum):
    """What ``neurosandbox eval`` (and ``runs resume``) exit with; docs/exit-codes.md."""

    OK = 0  # every sample answered (ok, format failure or refusal), no case skipped with --strict
    SAMPLES_FAILED = 1  # some samples ended in a call error (after retries): resume retries them
    USAGE = 2  # bad usage: an option, the dataset could not be loaded, the models, the run folder
    SKIPPED_STRICT = 3  # --strict and the dataset had cases the run skipped (listed)
    CANARY_ALARM = 4  # `neurosandbox canary`: a model answers differently than in its last run
    BUDGET_REACHED = 5  # --max-cost stopped the run before its end: resumable


EXIT_CODES = (
    "Exit codes (docs/exit-codes.md):\n\n"
    "0  every sample answered (ok, format failure or refusal; none ended in a call error)\n\n"
    "1  some samples ended in a call error after their retries (reasons printed per model; "
    "`runs resume` retries them)\n\n"
    "2  bad usage: an option, the models, the run folder, or the dataset could not be loaded\n\n"
    "3  --strict and some cases of the dataset were skipped (listed, with the reason)\n\n"
    "5  --max-cost: the budget stopped the run before its end (the amount spent is printed; "
    "`runs resume RUN --max-cost MORE` finishes it)"
)
CANARY_EXIT_CODES = (
    "Exit codes (docs/exit-codes.md):\n\n"
    "0  quiet (or the first run of this canary file): no model answers differently\n\n"
    "1  quiet, but some samples ended in a call error after their retries (not compared)\n\n"
    "2  bad usage: the canary file, its dataset or models, or the comparison failed\n\n"
    "4  ALARM: a model answers differently than in the canary's last run (the reasons, and the "
    "passport fields that changed, are printed)"
)


def table_console() -> Console:
    """Where tables go (stdout): a terminal's own width, else 132 columns, so that a piped or
    logged leaderboard (make demo | tee) keeps model names on one line."""
    import sys

    return Console() if sys.stdout.isatty() else Console(width=132)


def fail(message: str, code: int = 1) -> typer.Exit:
    console.print(f"[red]error:[/red] {escape(message)}")
    return typer.Exit(code)


def shown(text: str, limit: int = MAX_SHOWN) -> str:
    """Untrusted text made safe to print on one line: control characters and line breaks
    become spaces, the length is bounded, rich markup is escaped."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    if len(flat) > limit:
        flat = flat[: limit - 1] + "…"
    return escape(flat)


def note(line: str) -> None:
    """One line to stderr as it is: never wrapped, no emoji codes, no highlighting."""
    console.print(line, soft_wrap=True, emoji=False, highlight=False)


def list_skipped(skipped: list[SkippedCase], evaluated: int) -> None:
    """Every case the run does not evaluate, and why."""
    if not skipped:
        return
    total = evaluated + len(skipped)
    note(f"[yellow]skipped {len(skipped)} of {total} cases (not evaluated):[/yellow]")
    for s in skipped:
        note(f"  {shown(s.label, 120)}: {shown(s.reason)}")


def list_warnings(warnings: list[str], limit: int = 10) -> None:
    """The loader's notes on the dataset (a series it could not render, no answers file)."""
    if not warnings:
        return
    note(f"[yellow]dataset warnings ({len(warnings)}):[/yellow]")
    for w in warnings[:limit]:
        note(f"  {shown(w)}")
    if len(warnings) > limit:
        note(f"  ... and {len(warnings) - limit} more")


def show_coverage(coverage: CaseCoverage) -> None:
    """``n of m cases evaluated`` and the skipped cases, with why."""
    colour = "yellow" if coverage.skipped or not coverage.recorded else "green"
    note(f"[{colour}]{escape(coverage.headline())}[/{colour}]")
    list_skipped(coverage.skipped, coverage.evaluated)


def show_call_errors(groups: list[CallErrors], retries: dict[str, int]) -> None:
    """The samples that ended in an error, per model (count and first message), and the
    retries the calls took."""
    if groups:
        note("[red]samples that ended in an error, per model:[/red]")
        for g in groups:
            distinct = f"{g.reasons} distinct reason{'s' if g.reasons != 1 else ''}"
            note(
                f"  {shown(g.model, 80)}: {g.samples} sample{'s' if g.samples != 1 else ''} "
                f"failed ({distinct}, {_retries(g.retries)}); first: {shown(g.first_error)}"
            )
    total = sum(retries.values())
    if total:
        per = ", ".join(f"{shown(m, 80)}: {n}" for m, n in sorted(retries.items()))
        note(f"{_retries(total)} in all ({per})")


MAX_REASONS = 3  # distinct format-failure reasons shown per model


def show_format_failures(failed: list[tuple[str, str]]) -> None:
    """Why answers failed the answer format, per model: the commonest reasons (bounded, one
    line each) with how many answers each; the schema is docs/answer-format.md."""
    from collections import Counter

    from evaluation import format_reason

    if not failed:
        return
    note("[yellow]answers with no valid JSON answer, per model (docs/answer-format.md):[/yellow]")
    by_model: dict[str, Counter[str]] = {}
    for model, error in failed:
        by_model.setdefault(model, Counter())[format_reason(error) or "no reason recorded"] += 1
    for model, reasons in sorted(by_model.items()):
        n = sum(reasons.values())
        note(f"  {shown(model, 80)}: {n} answer{'s' if n != 1 else ''}")
        for reason, k in reasons.most_common(MAX_REASONS):
            note(f"    {k} x {escape(reason)}")
        if len(reasons) > MAX_REASONS:
            note(f"    and {len(reasons) - MAX_REASONS} more reasons (runs export has each)")


def _retries(n: int) -> str:
    return f"{n} {'retry' if n == 1 else 'retries'}"


class ProgressBar:
    """A rich progress bar fed by the runner: samples, calls, retries, errors, cost so far; the
    cases the run skips are listed above it as the run starts."""

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
        self._listed = False

    def __call__(self, s: RunStats) -> None:
        from evaluation.models import cost_text

        if not self._listed:
            self._listed = True
            list_warnings(s.warnings)
            list_skipped(s.skipped, s.cases_total)
        info = (
            f"cases {s.cases_done}/{s.cases_total} | cost {cost_text(s.cost_usd, unknown_calls=s.cost_unknown)} "
            f"| calls {s.calls} cached {s.cached} retries {s.retries} | errors {s.errors} "
            f"format {s.format_failures} refusals {s.refusals}"
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


def print_run(stats: RunStats, run_dir: Path) -> RunOutcome:
    """The counts of this session, then the run as ``runs show`` shows it; what it came to."""
    from evaluation.models import cost_text

    note(
        f"{stats.units_done}/{stats.units_total} samples; {stats.calls} calls, {stats.cached} reused, "
        f"{_retries(stats.retries)}; {stats.errors} errors, {stats.format_failures} format "
        f"failures, {stats.refusals} refusals; cost {cost_text(stats.cost_usd, unknown_calls=stats.cost_unknown)}"
    )
    if stats.scoring_errors:
        note(
            f"[yellow]scoring failed for {stats.scoring_errors} samples: run "
            f"`neurosandbox runs rescore {escape(str(run_dir))}`[/yellow]"
        )
    outcome = show_run(run_dir)
    if stats.budget_reached:
        note(
            f"[yellow]stopped at the budget: {escape(stats.budget_reached)}; "
            f"{stats.units_done}/{stats.units_total} samples done. No call was sent past it; "
            f"`neurosandbox runs resume {escape(str(run_dir))} --max-cost USD` finishes the "
            "run with a larger budget (stored answers are reused)[/yellow]"
        )
        return outcome._replace(budget_reached=True)
    if outcome.errors:
        note(f"`neurosandbox runs resume {escape(str(run_dir))}` retries the failed samples")
    return outcome


class RunOutcome(NamedTuple):
    """What a run came to, for the exit code: samples in error, cases skipped."""

    errors: int
    skipped: int
    budget_reached: bool = False

    def exit_code(self, *, strict: bool = False) -> ExitCode:
        if self.budget_reached:  # the run is not over: that comes first
            return ExitCode.BUDGET_REACHED
        if self.errors:
            return ExitCode.SAMPLES_FAILED
        if strict and self.skipped:
            return ExitCode.SKIPPED_STRICT
        return ExitCode.OK


def run_log_url() -> str | None:
    """The install's PostgreSQL run log (``NEUROSANDBOX_DATABASE_URL``, read by the settings);
    None: each run keeps its own ``run.sqlite`` in its folder."""
    from gateway.settings import get_settings

    return get_settings().database_url


def open_run(run_dir: Path, *, read_only: bool = False) -> RunStore:
    """The run log of the run in ``run_dir``, in the store the settings name (every command
    that reads or writes a run opens it here)."""
    from evaluation.log import open_store

    return open_store(run_dir, database_url=run_log_url(), read_only=read_only)


def show_run(run_dir: Path) -> RunOutcome:
    """A run's status, counts per model and leaderboard, then the cases it evaluated out of the
    dataset's (and the skipped ones, with why), and the reasons its samples failed."""
    from evaluation import ScoringUnavailable, summary

    store = open_run(run_dir)
    try:
        row = store.run_log()
        counts = store.counts()
        table = Table(title=f"run {row.run_id} ({row.status})")
        table.add_column("model")
        for col in ("samples", "ok", "format", "refusal", "error"):
            table.add_column(col, justify="right")
        per: dict[str, dict[str, int]] = {}
        rows = store.samples(calls=False, scores=False)
        for r in rows:
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
        _scoring_versions(row.scoring_versions, run_dir)
        try:
            summ = summary(store)
        except ScoringUnavailable as exc:
            console.print(f"[yellow]{escape(str(exc))}[/yellow]")
            summ = None
        if summ is not None:
            print_leaderboard(summ)
        coverage = row.coverage
        retries = store.retries()
        groups = store.call_errors(retries)
        show_coverage(coverage)
        for case in store.cases().values():  # the series a model was not shown, and why
            ns = case.provenance.series_not_shown
            if ns is not None and ns.total:
                console.print(
                    f"case {escape(case.case_id)}: {ns.n_shown} of {ns.n_series} series shown; "
                    f"{escape(ns.counts_text())} (each with why: runs show --json)"
                )
        show_call_errors(groups, retries)
        show_format_failures(
            [(r.model, r.parse_error or "") for r in rows if r.status == "format_failure"]
        )
        return RunOutcome(sum(g.samples for g in groups), len(coverage.skipped))
    finally:
        store.close()


def _scoring_versions(held: dict[str | None, int], run_dir: Path) -> None:
    from evaluation.scoring import SCORING_VERSION, version_name

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
    note = getattr(value, "note", "")  # unscored samples, thin evidence (Estimate.note)
    return (
        f"{v:.3f}"
        + (f" [{lo:.2f}, {hi:.2f}]" if isinstance(lo, float) and isinstance(hi, float) else "")
        + (f" ({note})" if note else "")
    )


def pass_at_cell(row: Any, k: int) -> str:
    """Sampled pass@k with the units it left out because samples went unscored."""
    cell = _est(row.sampled_pass_at.get(str(k)))
    left = row.sampled_pass_left_out.get(str(k), 0)
    return cell + (
        f" ({left} unit{'s' if left != 1 else ''} left out: failed calls)" if left else ""
    )


def print_leaderboard(summ: Any) -> None:
    from evaluation.models import cost_text

    table = Table(title="leaderboard (bootstrap 95% CI over patients)")
    for col in ("model", "scored", "accuracy", "pass@1", "ranked top-5", "lesions P/R", "cost"):
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
            cost_text(r.cost.cost_total_usd),
        )
    table_console().print(table)
    for r in summ.leaderboard:
        if r.rubric_canary_failed:
            table_console().print(
                f"[yellow]{escape(r.model)}: rubric grader(s) "
                f"{escape(', '.join(r.rubric_canary_failed))} failed the canary (gave full marks "
                "to a wrong answer that asked for them) and are left out of the rubric[/yellow]"
            )


def shard_option(text: str) -> tuple[int, int]:
    """``I/N`` as (I, N), 0 <= I < N <= 1000; a usage error otherwise."""
    m = re.fullmatch(r"(\d{1,4})/(\d{1,4})", text.strip())
    if m is None or not 0 <= int(m[1]) < int(m[2]) <= 1000:
        raise fail(f"--shard {text[:40]!r}: give I/N with 0 <= I < N <= 1000 (e.g. 0/3)",
                   ExitCode.USAGE)  # fmt: skip
    return int(m[1]), int(m[2])
