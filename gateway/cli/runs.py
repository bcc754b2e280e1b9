"""``neurosandbox runs list|show|compare|resume|rescore|judge|export``: look after evaluation
runs."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table
from sqlalchemy.exc import SQLAlchemyError

from evaluation import EvaluationError, TaskFamily
from evaluation.robustness import planted_deliveries
from gateway.cli.console import (
    ExitCode,
    ProgressBar,
    cli_console,
    fail,
    open_run,
    print_run,
    run_log_url,
    shard_option,
    show_run,
    shown,
    table_console,
)
from gateway.cli.worker import evaluate_study_command

runs_app = typer.Typer(
    help="Evaluation runs: list, show, compare, resume, rescore, judge and export.",
    no_args_is_help=True,
)
console = cli_console(stderr=True)


@runs_app.command("list")
def runs_list(
    folder: Annotated[
        Path | None, typer.Argument(help="folder holding run folders (default: settings runs_dir)")
    ] = None,
) -> None:
    """List the runs under a folder (default: every run of the install, as `runs index` finds
    them): id, status, dataset, models, samples."""
    from gateway.runs.index import install_runs
    from gateway.settings import get_settings

    settings = get_settings()
    entries = install_runs(settings, folder=folder)
    gateway = (settings.runs_root / "runs").resolve()
    where = str(folder or settings.runs_dir)
    if folder is None and settings.runs_dir.resolve() != gateway:
        where += f" and {gateway}"
    table = Table(title=f"runs in {where}")
    for col in ("folder", "run", "status", "created", "dataset", "models", "samples"):
        table.add_column(col, overflow="fold")
    for e in entries:
        label = Path(e.run_dir).name if e.run_dir else "(database)"
        run = e.run_id if e.dataset_hash else "-"  # "-": the engine never started it
        if e.source != "cli":  # DATA_DIR/runs/<run id>
            label = e.source if e.dataset_hash else f"{e.source} {e.run_id}"
        status = (e.error or "") if e.status == "unreadable" else e.status
        if e.error and e.status != "unreadable":
            status += f": {e.error}"
        table.add_row(
            escape(label),
            escape(run),
            escape(status),
            (e.created_at or "")[:19],
            escape(e.dataset_name or ""),
            escape(", ".join(e.models)),
            str(e.n_samples),
        )
    table_console().print(table)


@runs_app.command("index")
def runs_index(
    dataset: Annotated[
        str | None, typer.Option("--dataset", help="only runs of this dataset (name or hash)")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="only runs that asked this model")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the catalog as JSON")] = False,
) -> None:
    """Every run the install knows (CLI, demo, gateway; run folders and the PostgreSQL run log):
    date, dataset and hash, models, status, key metrics with 95% CIs, cost, scoring version,
    the canary's mark; under each model the one line of its passport."""
    from gateway.runs.index import install_runs
    from gateway.settings import get_settings

    entries = install_runs(get_settings(), dataset=dataset, model=model)
    if as_json:
        out = {"runs": [e.model_dump(mode="json") for e in entries]}
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return
    table = Table(title=f"{len(entries)} runs")
    table.add_column("run (source)", no_wrap=True)  # whole: to copy into `runs compare`
    for col in ("date", "status", "dataset", "models: key metrics (95% CI); passport", "cost",
                "scoring; canary"):  # fmt: skip
        table.add_column(col, overflow="fold")
    for e in entries:
        # every string here came from a run log or a note someone may have written by hand:
        # `shown` drops control characters (a terminal escape would reach the terminal through
        # rich), bounds it and escapes rich markup
        table.add_row(
            f"{shown(e.run_id, 80)}\n({e.source})",
            shown((e.created_at or "")[:16]),
            shown(f"{e.status} (why: below)" if e.error else e.status),
            shown(e.dataset_name or "-", 80)
            + (f" {shown(e.dataset_hash[:12])}" if e.dataset_hash else ""),
            "\n".join(_model_lines(e)),
            "-" if e.error else shown(e.cost.text),
            "; ".join(x for x in (shown(", ".join(e.scoring_versions)), _canary_text(e)) if x),
        )
    printer = table_console()
    printer.print(table)
    # why a run is unreadable, whole, one line each (a narrow table cell would fold it)
    for e in entries:
        if e.error:
            where = f" ({e.run_dir})" if e.run_dir else ""
            printer.print(f"{shown(e.run_id, 80)}{shown(where)}: {shown(e.error)}", soft_wrap=True)


PASSPORT_SHOWN = 160  # characters of a model's passport line in the index table


def _model_lines(e: Any) -> list[str]:
    """A run's models in the index table: each with its key figures, its passport's one line
    under it (what was asked, the provider, what answered)."""
    from evaluation.log import figures_text

    lines = []
    figures = {m.model: figures_text(m) for m in e.metrics}
    for model in list(figures) + [m for m in e.models if m not in figures]:
        lines.append(shown(model, 80) + (f": {figures[model]}" if model in figures else ""))
        if passport := e.passport_lines.get(model):
            lines.append(f"  passport: {shown(passport, PASSPORT_SHOWN)}")
    return lines


def _canary_text(e: Any) -> str:
    return shown(f"{e.canary.verdict} {e.canary.name}".strip(), 80) if e.canary else ""


ReviewsOption = Annotated[
    Path | None,
    typer.Option(
        "--reviews",
        help="clinician review log (reviews.sqlite); default: settings review_db, else "
        "DATA_DIR/reviews.sqlite, if present",
    ),
]


@runs_app.command("show")
def runs_show(
    run_dir: Annotated[Path, typer.Argument(help="run folder")],
    as_json: Annotated[
        bool, typer.Option("--json", help="print the run record and summary as JSON")
    ] = False,
    reviews: ReviewsOption = None,
) -> None:
    """Status, counts per model and the leaderboard of a run, the cases it evaluated out of the
    dataset's (and why any were skipped), why samples failed (per model) and the retries; with
    clinician reviews, how well the rubric grader agrees with them."""
    from evaluation import ScoringUnavailable, summary

    try:
        log = _review_log(reviews)
        if as_json:
            store = open_run(run_dir)
            try:
                row = store.run_log()
                retries = store.retries()
                out: dict[str, Any] = {
                    "run": row.model_dump(mode="json"),
                    "counts": store.counts().flat(),
                    "coverage": store.coverage().model_dump(mode="json"),
                    "call_errors": [g.model_dump(mode="json") for g in store.call_errors(retries)],
                    "retries": retries,
                    "passports": {
                        m: p.model_dump(mode="json") for m, p in store.passports().items()
                    },
                    "writeback": _writeback_json(store),
                    # the audit's text planted in pixels: what each call sent in its place
                    "planted": [p.model_dump(mode="json") for p in planted_deliveries(store)],
                    "series_not_shown": {
                        c.case_id: c.provenance.series_not_shown.model_dump(mode="json")
                        for c in store.cases().values()
                        if c.provenance.series_not_shown is not None
                    },
                }
                try:
                    summ = summary(store)
                    out["summary"] = summ.model_dump(mode="json") if summ else None
                    out["subgroups"] = _subgroups(store) if summ else None
                except ScoringUnavailable as exc:
                    out["summary_error"] = str(exc)
            finally:
                store.close()
            try:
                stats = _review_stats(run_dir, row.run_id, log)
                out["reviews"] = stats.model_dump(mode="json") if stats else None
            except _REVIEW_ERRORS as exc:
                out["reviews_error"] = str(exc)
            json.dump(out, sys.stdout, indent=2, default=str)
            sys.stdout.write("\n")
            return
        show_run(run_dir)
        _show_writeback(run_dir)
        _show_planted(run_dir)
        _show_passports(run_dir)
        _show_calibration(run_dir, log)
    except EvaluationError as exc:
        raise fail(str(exc)) from None


def _subgroups(store: Any) -> dict[str, Any]:
    """Each figure of the run's cases as received by vendor, scanner, field strength, age band
    and sex (JSON)."""
    from evaluation.robustness import variant_of
    from evaluation.scoring import ScoredSample, subgroup_table

    stored = [ScoredSample.model_validate_json(j) for j in store.scored_samples()]
    samples = [s for s in stored if variant_of(s.case_id)[1] is None]
    cases = [c for c in store.cases().values() if variant_of(c.case_id)[1] is None]
    return subgroup_table(cases, samples).model_dump(mode="json")


# The review log is unreadable, or the run cannot be loaded for it (e.g. its dataset is gone).
_REVIEW_ERRORS = (EvaluationError, ValueError, OSError, sqlite3.Error, SQLAlchemyError)


def _review_log(reviews: Path | None) -> Path | None:
    """The review log to read: the one given (which must exist), else the configured one."""
    from gateway.settings import get_settings

    if reviews is not None:
        if not reviews.is_file():
            raise EvaluationError(f"no review log at {reviews}")
        return reviews
    settings = get_settings()
    path = settings.review_log
    return path if path.is_file() else None


def _review_stats(run_dir: Path, run_id: str, log: Path | None) -> Any:
    """The run's ReviewStats, or None when there is no log or it holds nothing on this run."""
    from evaluation.reports import load_run
    from evaluation.review import ReviewStore, review_stats

    if log is None:
        return None
    feedback = ReviewStore(log)
    if feedback.version(run_id) == 0:
        return None
    return review_stats(load_run(run_dir, run_log_url()), feedback.reviews(run_id))


def _writeback_json(store: Any) -> dict[str, Any] | None:
    """A gateway run's write-back: what is stored in the PACS, and what is still pending."""
    g = store.gateway_run(evidence=False)
    if g is None:
        return None
    return {
        "pending": [w.model_dump(mode="json") for w in g.writebacks_pending],
        "done": [w.model_dump(mode="json") for w in g.writebacks_done],
    }


def _show_writeback(run_dir: Path) -> None:
    """A gateway run's SR and PDF: stored in the PACS, or pending (kept, tried again)."""
    with open_run(run_dir, read_only=True) as store:
        g = store.gateway_run(evidence=False)
    if g is None or not (g.writebacks_pending or g.writebacks_done):
        return
    where = {w.destination or "local" for w in [*g.writebacks_done, *g.writebacks_pending]}
    console.print(
        f"write-back to {escape(', '.join(sorted(where)))}: {len(g.writebacks_done)} stored, "
        f"{len(g.writebacks_pending)} pending",
        soft_wrap=True,
    )
    for w in g.writebacks_pending:
        console.print(
            f"  [yellow]pending[/yellow] {escape(w.kind)} {escape(w.sop_instance_uid)}: "
            f"{w.attempts} attempt(s), {escape((w.last_error or '')[:200])}; next try "
            f"{escape(w.next_at or 'at the next pass')}",
            soft_wrap=True,
        )


_FATE = {
    "sent": "sent as planted",
    "blacked_out": "sent blacked out",
    "withheld": "withheld",
    "not_in_prompt": "not in the prompt",
}


def _show_planted(run_dir: Path) -> None:
    """The robustness audit's text planted in pixels: per variant, image and model, what the
    calls sent in its place (by sha256) and why the PHI gate changed or withheld it."""
    with open_run(run_dir, read_only=True) as store:
        rows = planted_deliveries(store)
    if not rows:
        return
    console.print(f"text planted in pixels (robustness audit): {len(rows)} call(s)")
    groups: dict[tuple[str, int, str, str], list[Any]] = {}
    for r in rows:
        groups.setdefault((r.case_id, r.image_index, r.planted_sha256, r.model), []).append(r)
    for (case_id, index, sha, model), calls in groups.items():
        fates = sorted({f"{_FATE[c.fate]}{f' ({c.reason})' if c.reason else ''}" for c in calls})
        sent = sorted({(c.sent_sha256 or "none")[:12] for c in calls})
        console.print(
            f"  {shown(case_id)} image {index} ({sha[:12]}) to {shown(model)}: "
            f"{escape('; '.join(fates))}; sent {', '.join(sent)}; {len(calls)} call(s)",
            soft_wrap=True,
        )


def _show_passports(run_dir: Path) -> None:
    """Each model's passport (what answered, reached how, with which settings)."""
    from gateway.cli.passports import print_passports

    with open_run(run_dir, read_only=True) as store:
        print_passports(store.passports())


def _show_calibration(run_dir: Path, log: Path | None) -> None:
    """Review progress and the grader's Pearson r with the clinicians' ratings, if any."""
    from evaluation.scoring import CalibrationDetails

    if log is None:
        return
    store = open_run(run_dir)
    try:
        run_id = store.run_log().run_id
    finally:
        store.close()
    try:
        stats = _review_stats(run_dir, run_id, log)
    except _REVIEW_ERRORS as exc:
        console.print(f"[yellow]clinician reviews not shown: {escape(str(exc))}[/yellow]")
        return
    if stats is None:
        return
    console.print(
        f"clinician reviews: {stats.n_signed_off} of {stats.n_cases} cases signed off "
        f"({', '.join(escape(r) for r in stats.reviewers) or 'none yet'}), "
        f"{stats.n_in_progress} in progress"
    )
    g = stats.grader_vs_clinician
    if g is None:
        console.print("grader calibration: no clinician ratings on signed-off cases yet")
        return
    line = escape(g.explanation)
    cal = g.details_as(CalibrationDetails)
    if g.value is not None and cal is not None and (ci := cal.ci95) is not None:
        line += f", 95% CI [{ci[0]:.2f}, {ci[1]:.2f}]"
    verdict = cal.meets_paper_bar if cal is not None else None
    if verdict is not None:
        line += ": [green]meets the bar[/green]" if verdict else ": [red]below the bar[/red]"
    cli_console().print(line)


@runs_app.command("compare")
def runs_compare(
    run_dir: Annotated[Path, typer.Argument(help="run folder (RUN_A: the earlier run)")],
    run_b: Annotated[
        Path | None,
        typer.Argument(help="a second run folder of the same dataset (the later run)"),
    ] = None,
    model_a: Annotated[
        str | None, typer.Option("--a", help="first model (default: the run's first of two)")
    ] = None,
    model_b: Annotated[
        str | None, typer.Option("--b", help="second model (default: the run's second of two)")
    ] = None,
    model: Annotated[
        list[str] | None,
        typer.Option("--model", help="two runs: this model only (repeat; default: every model)"),
    ] = None,
    rescore_first: Annotated[
        bool,
        typer.Option(
            "--rescore",
            help="two runs of different scoring versions: rescore them to the current one first "
            "(else refused, with the command)",
        ),
    ] = False,
    task: Annotated[
        str | None,
        typer.Option("--task", help="task family only: " + ", ".join(f.value for f in TaskFamily)),
    ] = None,
    n_boot: Annotated[int, typer.Option("--n-boot", min=100, help="bootstrap resamples")] = 2000,
    as_json: Annotated[bool, typer.Option("--json", help="print the comparison as JSON")] = False,
) -> None:
    """Two models of one run (--a, --b), or two runs of the same dataset (RUN_A RUN_B): on the
    shared cases, the paired difference with a bootstrap CI by patient and McNemar's test; across
    runs per model and metric, with the cases that flipped and those only one run has."""
    from evaluation import compare

    try:
        family = TaskFamily(task) if task else None
    except ValueError:
        raise fail(
            f"unknown task family {task!r}; one of {', '.join(f.value for f in TaskFamily)}"
        ) from None
    if run_b is not None:
        if model_a or model_b:
            raise fail("--a/--b compare two models of one run; with two runs, use --model")
        _compare_runs(run_dir, run_b, model or None, rescore_first, family, n_boot, as_json)
        return
    if model:
        raise fail("--model picks models of two runs; for two models of one run, use --a/--b")
    try:
        store = open_run(run_dir)
        try:
            models = sorted({r.model for r in store.samples(calls=False, scores=False)})
            if model_a is None and model_b is None and len(models) == 2:
                model_a, model_b = models
            if model_a is None or model_b is None:
                raise fail(f"give --a and --b: the run's models are {', '.join(models) or 'none'}")
            for m in (model_a, model_b):
                if m not in models:
                    raise fail(f"model {m!r} is not in this run ({', '.join(models)})")
            result = compare(store, model_a, model_b, family=family, n_boot=n_boot)
        finally:
            store.close()
    except (EvaluationError, ValueError) as exc:
        raise fail(str(exc)) from None
    if as_json:
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
        return
    _print_comparison(result, family)


def _compare_runs(
    run_a: Path,
    run_b: Path,
    models: list[str] | None,
    rescore_first: bool,
    family: TaskFamily | None,
    n_boot: int,
    as_json: bool,
) -> None:
    from gateway.cli.compare_view import print_run_comparison
    from gateway.runs.comparing import compare_run_dirs

    def rescored(run: Path, message: str) -> None:
        console.print(f"rescored {escape(str(run))}: {escape(message)}")

    try:
        result = compare_run_dirs(
            run_a,
            run_b,
            database_url=run_log_url(),
            rescore_first=rescore_first,
            models=models,
            family=family,
            n_boot=n_boot,
            on_rescore=rescored,
        )
    except (EvaluationError, ValueError) as exc:
        raise fail(str(exc)) from None
    if as_json:
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
        return
    print_run_comparison(result)


def _print_comparison(c: Any, family: TaskFamily | None) -> None:
    a, b = escape(c.model_a), escape(c.model_b)
    scope = f"{family.value} tasks" if family else "all tasks"
    table = Table(title=f"{a} vs {b}: {c.n_units} shared case/task units ({scope})")
    table.add_column("")
    table.add_column("value", justify="right")
    table.add_row(f"accuracy {a}", _fmt(c.accuracy_a))
    table.add_row(f"accuracy {b}", _fmt(c.accuracy_b))
    table.add_row("both right (first sample)", str(c.both_right))
    table.add_row(f"{a} right only", str(c.a_only))
    table.add_row(f"{b} right only", str(c.b_only))
    table.add_row("both wrong", str(c.both_wrong))
    m = c.mcnemar
    test = "exact binomial" if m.exact else f"chi-square {m.statistic:.3f}, continuity-corrected"
    table.add_row(f"McNemar p ({test})", f"{m.p_value:.4f}")
    d = c.bootstrap.difference
    ci = f" [{d.low:.3f}, {d.high:.3f}]" if d.low is not None and d.high is not None else ""
    table.add_row(f"accuracy {a} - {b} (paired bootstrap, 95% CI)", _fmt(d.value) + ci)
    table.add_row("paired bootstrap p", f"{c.bootstrap.p_value:.4f}")
    table_console().print(table)


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


@runs_app.command("resume")
def runs_resume(
    run_dir: Annotated[Path, typer.Argument(help="run folder")],
    api_base: Annotated[
        str | None, typer.Option("--api-base", help="new endpoint for litellm models")
    ] = None,
    allow_changed_dataset: Annotated[
        bool,
        typer.Option(
            "--allow-changed-dataset",
            help="resume although the dataset's content hash changed since the run started",
        ),
    ] = False,
    max_cost: Annotated[
        float | None,
        typer.Option(
            "--max-cost",
            min=0.0,
            help="a new budget in USD for the whole run (spent so far included), kept with "
            "the run; default: the run's own",
        ),
    ] = None,
    allow_unknown_cost: Annotated[
        bool | None,
        typer.Option(
            "--allow-unknown-cost/--refuse-unknown-cost",
            help="with a budget: run models without a price (default: as the run was started)",
        ),
    ] = None,
    shard: Annotated[
        str | None,
        typer.Option(
            "--shard",
            metavar="<I/N>",
            help="several workers on one run (PostgreSQL run log): this worker takes the "
            "cases whose id hashes to I of N (0-based); each call is claimed first, so a "
            "call is answered once whichever worker asks",
        ),
    ] = None,
) -> None:
    """Continue a run: stored responses are reused; only missing or failed calls are made.

    A run keeps the budget it was started with (`eval --max-cost`); `--max-cost` here replaces
    it. Exits like `neurosandbox eval` (docs/exit-codes.md): 1 while samples still end in a call
    error, 2 when the run cannot be resumed, 4 when the budget stops it again."""
    from evaluation import resume_run
    from gateway.pacs.cohort import pacs_fetcher
    from gateway.settings import get_settings

    if max_cost is not None and not 0 < max_cost < float("inf"):
        raise fail(f"--max-cost {max_cost}: a budget is a finite amount above $0", ExitCode.USAGE)
    part = shard_option(shard) if shard is not None else None
    if part is not None and run_log_url() is None:
        raise fail("--shard needs the PostgreSQL run log (NEUROSANDBOX_DATABASE_URL)",
                   ExitCode.USAGE)  # fmt: skip
    try:
        with ProgressBar() as bar:
            stats = asyncio.run(
                resume_run(
                    run_dir,
                    api_base=api_base,
                    on_progress=bar,
                    allow_changed_dataset=allow_changed_dataset,
                    database_url=run_log_url(),
                    max_cost_usd=max_cost,
                    allow_unknown_cost=allow_unknown_cost,
                    fetch_study=pacs_fetcher(get_settings()),
                    shard=part,
                    lease_s=get_settings().call_lease_s,
                )
            )
    except EvaluationError as exc:
        raise fail(str(exc), ExitCode.USAGE) from None
    raise typer.Exit(int(print_run(stats, run_dir).exit_code()))


@runs_app.command("rescore")
def runs_rescore(
    run_dir: Annotated[Path, typer.Argument(help="run folder")],
    bertscore: Annotated[
        bool | None,
        typer.Option(
            "--bertscore/--no-bertscore",
            help="score with BERTScore or not (default: as the run was started)",
        ),
    ] = None,
) -> None:
    """Parse and score every stored response again. Never calls a model."""
    from evaluation import rescore

    try:
        counts = rescore(run_dir, bertscore=bertscore, database_url=run_log_url())
    except EvaluationError as exc:
        raise fail(str(exc)) from None
    _print_rescore(counts, run_dir)


def _print_rescore(counts: Any, run_dir: Path) -> None:
    """The counts of a rescore, what it changed (scoring version, scores, labels), the run;
    a gateway run's report bundle is written again from the rescored log."""
    console.print(", ".join(f"{k} {v}" for k, v in counts.items()))
    console.print(escape(counts.message()))
    _republish(run_dir)
    show_run(run_dir)


def _republish(run_dir: Path) -> None:
    """A gateway run (``DATA_DIR/runs/<run id>``): its published report bundle written again
    from its run log. (The review pages and the API read the log itself: they show the new
    scores either way; the bundle is what a download or a copy holds.)"""
    from gateway.runs import RunNotFoundError, StudyRunStore, record_of
    from gateway.runs.report import republish
    from gateway.settings import get_settings

    run_dir = run_dir.resolve()
    if run_dir.parent.name != "runs":
        return
    try:
        with open_run(run_dir) as store:
            if record_of(store) is None:  # a run of `neurosandbox eval`
                return
    except (EvaluationError, ValueError, OSError):
        return
    data = run_dir.parent.parent
    settings = get_settings()
    same = settings.runs_root.resolve() == data
    runs = StudyRunStore(
        data, settings.reports_root if same else data / "reports", settings.database_url
    )
    try:
        folder = republish(runs, run_dir.name)
    except (RunNotFoundError, EvaluationError, OSError) as exc:
        console.print(f"[yellow]report bundle not rebuilt: {escape(str(exc))}[/yellow]")
        return
    if folder is not None:
        console.print(
            f"report bundle rebuilt from the run log: {escape(str(folder))} (its checklist "
            "PDF stays the one written back to PACS, with the scores of then)"
        )


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
    from evaluation import judge_run, rescore
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

            result = asyncio.run(
                judge_run(run_dir, spec, progress=progress, database_url=run_log_url())
            )
        counts = rescore(run_dir, database_url=run_log_url())
    except EvaluationError as exc:
        raise fail(str(exc)) from None
    console.print(
        f"{result.pairs} undecided pair(s): {result.asked} asked now, {result.equivalent} "
        f"equivalent, {result.not_equivalent} not, {result.unreadable} unreadable, "
        f"{result.withheld} withheld (identifiers, untrusted endpoint); verdicts in "
        f"{escape(result.cache)}"
    )
    _print_rescore(counts, run_dir)


@runs_app.command("export")
def runs_export(
    run_dir: Annotated[Path, typer.Argument(help="run folder")],
    out: Annotated[Path, typer.Option("--out", help="output file: .jsonl or .parquet")],
) -> None:
    """One record per case x task x model x sample, with the answer and its scores."""
    from evaluation import export_run

    try:
        store = open_run(run_dir, read_only=True)
        try:
            n = export_run(store, out)
        finally:
            store.close()
    except EvaluationError as exc:
        raise fail(str(exc)) from None
    console.print(f"wrote {n} records to {escape(str(out))}")


# the job a `neurosandbox worker` runs for a study the gateway queued (gateway/study_queue.py)
runs_app.command("evaluate-study")(evaluate_study_command)
