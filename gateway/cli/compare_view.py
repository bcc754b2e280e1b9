"""How ``runs compare RUN_A RUN_B`` prints a comparison of two runs (tables on stdout)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from gateway.cli.console import note, shown, table_console

if TYPE_CHECKING:
    from evaluation.scoring import ModelDelta, RunComparison

MAX_PRINTED = 20  # flipped or one-run units printed per list (--json has them all)


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _ci(low: float | None, high: float | None) -> str:
    return "" if low is None or high is None else f" [{low:+.3f}, {high:+.3f}]"


def print_run_comparison(c: RunComparison) -> None:
    """The header (both runs, dataset, scoring version), then one table per model."""
    out = table_console()
    scope = f"{c.family} tasks" if c.family else "all tasks"
    note(
        f"A {shown(c.a.label or c.a.run_id, 200)} (run {shown(c.a.run_id, 64)}, "
        f"{shown(c.a.created_at or '?', 40)}) -> B {shown(c.b.label or c.b.run_id, 200)} "
        f"(run {shown(c.b.run_id, 64)}, {shown(c.b.created_at or '?', 40)})"
    )
    note(
        f"dataset {shown(c.a.dataset_name or '?', 120)} (hash {c.a.dataset_hash[:12]}), "
        f"scoring version {shown(c.scoring_version, 40)}, {scope}; differences are B - A, "
        f"95% CI by patient ({c.n_boot} resamples)"
    )
    for m in c.models:
        _print_model(m, out)
    for side, names in (("A", c.models_only_a), ("B", c.models_only_b)):
        if names:
            note(f"models only run {side} has: {', '.join(shown(n, 80) for n in names)}")
    if not c.models:
        note("[yellow]the runs share no model: nothing to compare[/yellow]")


def _print_model(m: ModelDelta, out: Console) -> None:
    table = Table(title=f"{shown(m.model, 120)}: {m.n_shared_units} shared case/question units")
    for col in ("metric", "n", "A", "B", "B - A [95% CI]", "p", "McNemar"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for d in m.metrics:
        mc = ""
        if d.mcnemar is not None:
            kind = "exact" if d.mcnemar.exact else "chi2"
            mc = f"{d.mcnemar.b} R->W, {d.mcnemar.c} W->R, p {d.mcnemar.p_value:.4f} ({kind})"
        diff = d.difference
        table.add_row(
            shown(d.metric, 60),
            str(d.n_units),
            _num(d.a.value),
            _num(d.b.value),
            (f"{diff.value:+.3f}" if diff.value is not None else "-") + _ci(diff.low, diff.high),
            f"{d.p_value:.4f}",
            mc,
        )
    out.print(table)
    _print_subgroups(m, out)
    for title, flips, n in (
        ("right -> wrong", m.right_to_wrong, m.n_right_to_wrong),
        ("wrong -> right", m.wrong_to_right, m.n_wrong_to_right),
    ):
        if not n:
            continue
        note(f"  {title}: {n} unit{'s' if n != 1 else ''}")
        for f in flips[:MAX_PRINTED]:
            note(
                f"    {shown(f.case_id, 80)} {shown(f.task, 60)}: A {shown(f.checklist_a or '-')}"
                f"  B {shown(f.checklist_b or '-')}"
            )
        if n > MAX_PRINTED:
            note(f"    ... and {n - MAX_PRINTED} more (--json lists them)")
    for side, units, n in (("A", m.only_a, m.n_only_a), ("B", m.only_b, m.n_only_b)):
        if n:
            listed = ", ".join(
                f"{shown(u.case_id, 80)} {shown(u.task, 60)}" for u in units[:MAX_PRINTED]
            )
            more = f" ... and {n - MAX_PRINTED} more" if n > MAX_PRINTED else ""
            note(f"  only run {side} has {n} unit{'s' if n != 1 else ''}: {listed}{more}")
    for side, units in (("A", m.samples_only_a), ("B", m.samples_only_b)):
        if units:
            listed = ", ".join(
                f"{shown(u.case_id, 80)} {shown(u.task, 60)} #{','.join(map(str, u.samples))}"
                for u in units[:MAX_PRINTED]
            )
            note(f"  samples only run {side} has: {listed}")


def _print_subgroups(m: ModelDelta, out: Console) -> None:
    """Accuracy by subgroup; an attribute no case records is one line, not a table of unknowns."""
    unknown = m.unrecorded_attributes()
    rows = m.recorded_subgroups()
    if rows:
        table = Table(title=f"{shown(m.model, 120)}: accuracy by subgroup (B - A, paired)")
        for col in ("attribute", "subgroup", "patients", "A", "B", "B - A [95% CI]"):
            table.add_column(col, justify="left" if col in ("attribute", "subgroup") else "right")
        for r in rows:
            diff = r.difference
            figure = (
                f"too small (n={r.n_patients})"
                if r.too_small
                else (f"{diff.value:+.3f}" if diff.value is not None else "-")
                + _ci(diff.low, diff.high)
            )
            table.add_row(
                r.attribute.replace("_", " "),
                shown(r.value, 60),
                str(r.n_patients),
                _num(r.a.value),
                _num(r.b.value),
                figure,
            )
        out.print(table)
    if unknown:
        note(f"  not recorded for any case: {', '.join(a.replace('_', ' ') for a in unknown)}")
