"""``neurosandbox eval --dry-run``: what a run would send, cost and take, printed (nothing sent)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from gateway.cli.console import note, table_console
from gateway.settings import Settings

RECENT_RUNS = 20  # earlier runs read for each model's latency and answer length


def earlier_runs(settings: Settings, models: list[str], out: Path) -> list[Path]:
    """Where each model's recorded latency and answer length come from: its runs in the
    install's catalog (``runs index``: the runs folder, DATA_DIR/runs, the PostgreSQL run log),
    newest first, then the runs beside ``out``."""
    from gateway.runs.index import install_runs

    found: list[Path] = []
    for model in models:
        found += [Path(e.run_dir) for e in install_runs(settings, model=model) if e.run_dir]
    parent = out.absolute().parent
    try:
        beside = [p for p in parent.iterdir() if p.is_dir() and p != out.absolute()]
    except OSError:
        beside = []
    beside.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    return list(dict.fromkeys(p.absolute() for p in [*found, *beside]))[:RECENT_RUNS]


def duration(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    h, rest = divmod(s, 3600)
    return f"{h} h {rest // 60:02d} min" if h else f"{rest // 60} min {rest % 60:02d} s"


def _n(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def print_estimate(estimate: Any) -> None:
    """The dry run's table per model and grader, the totals, and the rules behind them."""
    from evaluation.models import cost_text

    table = Table(
        title=f"dry run: {escape(estimate.dataset_name)} ({estimate.cases} cases, "
        f"{estimate.units} samples to ask); nothing was sent"
    )
    for col in ("model", "role", "calls", "images", "input tokens", "output tokens (expected)"):
        table.add_column(col, justify="left" if col in ("model", "role") else "right")
    table.add_column("cost (expected)", justify="right")
    table.add_column("wall time", justify="right")
    for m in estimate.models:
        table.add_row(
            escape(m.model),
            m.role,
            _n(m.calls),
            _n(m.images),
            _n(m.input_tokens),
            _n(m.output_tokens),
            cost_text(m.cost_usd, unknown_calls=m.calls if m.cost_usd is None else 0),
            duration(m.wall_s) if m.role == "model" else "(in its model's)",
        )
    table_console().print(table)
    total = cost_text(estimate.cost_usd, unknown_calls=estimate.unpriced_calls)
    note(
        f"total: {estimate.calls:,} calls, expected cost {total}, about "
        f"{duration(estimate.wall_s)} (the models run side by side)"
    )
    if estimate.cases_skipped:
        note(f"{estimate.cases_skipped} case(s) of the dataset would be skipped (not counted)")
    for m in estimate.models:
        if m.litellm_model is None:
            note(f"{escape(m.model)}: runs in process, costs nothing")
            continue
        rule = {
            "litellm": "litellm's image-token rule for the model",
            "gemini": "Google's rule (258 per image, per 768 px tile when larger)",
            "openai-tiles": "no rule known for the model: OpenAI's tile rule (85 + 170 per tile)",
        }.get(m.image_rule or "", "no images")
        note(
            f"{escape(m.model)} ({escape(m.litellm_model)}): images by {rule}; answers "
            f"{escape(m.output_rule)}; latency {m.latency_s:.2f} s per call "
            f"({escape(m.latency_rule)}), {m.concurrency} in flight"
        )
    if estimate.max_cost_usd is not None:
        cost = estimate.cost_usd
        if cost is not None and cost > estimate.max_cost_usd:
            note(
                f"[yellow]--max-cost {estimate.max_cost_usd:g}: the expected cost is over the "
                "budget; the run would stop when the next call could pass it[/yellow]"
            )
        else:
            note(f"--max-cost {estimate.max_cost_usd:g}: the expected cost is within the budget")
