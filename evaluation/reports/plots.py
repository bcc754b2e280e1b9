"""The summary's plots as PNG bytes (matplotlib, Agg, no pyplot state: safe in a server).

Every label may come from a model name or a dataset: mathtext is off, labels are shortened.
"""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Callable, Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter, date2num
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from evaluation.log.catalog import CatalogEntry
from evaluation.models.cost import cost_text
from evaluation.reports.over_time import no_history_text
from evaluation.reports.summary import SummaryReport
from evaluation.scoring.stats import Estimate

matplotlib.use("Agg")
RC: dict[str, Any] = {"text.parse_math": False, "font.family": "DejaVu Sans", "font.size": 9}
CATEGORY_COLOURS = {
    "perceptual": "#d95f02",
    "reasoning": "#7570b3",
    "knowledge_gap": "#e7298a",
    "grounding": "#66a61e",
    "visual_hallucination": "#e6ab02",
    "format_failure": "#666666",
    "refusal": "#a6761d",
}
PALETTE = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666"]


def _short(text: str, n: int = 28) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()


def _with_n(values: list[float], ns: list[int], upright: bool = False) -> list[str]:
    """A bar's label: its value and the n it rests on."""
    sep = " " if upright else "\n"
    return [f"{v:.2f}{sep}n={n}" for v, n in zip(values, ns, strict=True)]


def _err(e: Estimate | None) -> tuple[float, float, float] | None:
    if e is None or e.value is None:
        return None
    lo = e.low if e.low is not None else e.value
    hi = e.high if e.high is not None else e.value
    return e.value, max(0.0, e.value - lo), max(0.0, hi - e.value)


# ------------------------------------------------------------------ why a plot is not drawn
# One rule per plot: the plot draws nothing exactly when its rule gives a sentence, and the
# summary prints that sentence where the plot would be (never an empty frame, never silence).


def _unscored_reasons(r: SummaryReport) -> str:
    rows = r.summary.leaderboard
    parts = [
        (sum(x.format_failures for x in rows), "format failure"),
        (sum(x.refusals for x in rows), "refusal"),
        (sum(x.call_errors for x in rows), "failed call"),
    ]
    said = [f"{n} {what}{'s' if n != 1 else ''}" for n, what in parts if n]
    return f" ({', '.join(said)})" if said else ""


def _why_no_leaderboard(r: SummaryReport) -> str | None:
    rows = r.summary.leaderboard
    if not rows:
        return "No plot: the run has no answers yet."
    if not any(_err(e) for x in rows for _, get in _leaderboard_metrics(r) if (e := get(x))):
        return (
            f"No plot: none of the {sum(x.n_samples for x in rows)} answers could be scored"
            f"{_unscored_reasons(r)}, or no case has a truth to score against."
        )
    return None


def _why_no_breakdowns(r: SummaryReport) -> str | None:
    if not r.summary.leaderboard:
        return "No plot: the run has no answers yet."
    if not any(_err(x.accuracy) for x in r.summary.breakdowns):
        return (
            "No plot: no answer has its diagnosis scored, so there is no accuracy to break down "
            f"by task family, disease group, difficulty or modality{_unscored_reasons(r)}."
        )
    return None


def _why_no_errors(r: SummaryReport) -> str | None:
    if not r.summary.leaderboard:
        return "No plot: the run has no answers yet."
    if not any(v.get("categories") for v in r.summary.errors.values()):
        scored = sum(x.n_scored for x in r.summary.leaderboard)
        why = "every scored answer was right" if scored else "no answer was scored"
        return f"No plot: no answer has an error label ({why})."
    return None


def _why_no_reliability(r: SummaryReport) -> str | None:
    if not r.summary.leaderboard:
        return "No plot: the run has no answers yet."
    if not any(b.count for x in r.summary.leaderboard for b in x.reliability):
        return (
            "No plot: no scored answer stated a confidence, so there is nothing to calibrate "
            "(the reliability diagram needs answers with both)."
        )
    return None


def _why_no_cost(r: SummaryReport) -> str | None:
    rows = r.summary.leaderboard
    if not rows:
        return "No plot: the run has no answers yet."
    if not any(x.cost.prompt_tokens_mean or x.cost.latency_median_s for x in rows):
        return (
            "No plot: the provider reported no token counts and no latencies for this run's "
            "answers (cost: " + ", ".join(cost_text(x.cost.cost_total_usd) for x in rows) + ")."
        )
    return None


def _why_no_ablations(r: SummaryReport) -> str | None:
    if not r.ablation_rows:
        return "No ablations in this run (every answer saw images and text)."
    return None


def _why_no_robustness(r: SummaryReport) -> str | None:
    if r.robustness is None or r.robustness.empty:
        return (
            "The grounding audit was not run: no case was asked on its variants "
            "(neurosandbox eval --robustness KINDS)."
        )
    return None


WHY_EMPTY: dict[str, Callable[[SummaryReport], str | None]] = {
    "leaderboard": _why_no_leaderboard,
    "breakdowns": _why_no_breakdowns,
    "errors": _why_no_errors,
    "reliability": _why_no_reliability,
    "cost": _why_no_cost,
    "ablations": _why_no_ablations,
    "over_time": lambda r: no_history_text(r.history),
    "robustness": _why_no_robustness,
}


def plot_gaps(r: SummaryReport) -> dict[str, str]:
    """For each plot the summary has no data for, the sentence that says why."""
    return {name: why for name, rule in WHY_EMPTY.items() if (why := rule(r))}


# ------------------------------------------------------------------ the plots


def _forest(ax: Any, points: list[tuple[float, Estimate | None]], colour: str, label: str) -> None:
    """One series of a forest plot: each estimate at its height as a point with its 95% CI
    (horizontal bars) and its n beside it; an estimate with no value is left out."""
    ys, xs, lo, hi, ns = [], [], [], [], []
    for y, est in points:
        e = _err(est)
        if e is None or est is None:
            continue
        ys.append(y)
        xs.append(e[0])
        lo.append(e[1])
        hi.append(e[2])
        ns.append(est.n)
    ax.errorbar(xs, ys, xerr=[lo, hi], fmt="o", capsize=3, label=label, color=colour)
    for x, y, h, n in zip(xs, ys, hi, ns, strict=True):  # every figure with its n
        ax.annotate(f"n={n}", (min(x + h, 1.0), y), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize=6, color=colour)  # fmt: skip


def _leaderboard_metrics(r: SummaryReport) -> list[tuple[str, Callable[..., Estimate | None]]]:
    metrics: list[tuple[str, Callable[..., Estimate | None]]] = [
        ("accuracy", lambda x: x.accuracy),
        ("strict accuracy", lambda x: x.strict_accuracy),
    ]
    for k in r.summary.ks:
        metrics.append((f"sampled pass@{k}", lambda x, k=k: x.sampled_pass_at.get(str(k))))
        metrics.append((f"ranked pass@{k}", lambda x, k=k: x.ranked_pass_at.get(str(k))))
    metrics.append(("lesion F1", lambda x: x.lesions.f1_mean if x.lesions else None))
    return metrics


def leaderboard(r: SummaryReport) -> bytes | None:
    if _why_no_leaderboard(r):
        return None
    rows = r.summary.leaderboard
    metrics = [(n, g) for n, g in _leaderboard_metrics(r) if any(_err(g(x)) for x in rows)]
    fig = Figure(figsize=(7.5, 0.9 + 0.55 * len(rows) * max(1, len(metrics)) / 2.2))
    ax = fig.add_subplot()
    step = 0.8 / max(1, len(metrics))
    for j, (name, get) in enumerate(metrics):
        points = [(i - 0.4 + step * (j + 0.5), get(row)) for i, row in enumerate(rows)]
        _forest(ax, points, PALETTE[j % len(PALETTE)], name)
    ax.set_yticks(range(len(rows)), [_short(x.model) for x in rows])
    ax.invert_yaxis()
    ax.set_xlim(-0.02, 1.12)
    ax.set_xlabel("proportion (95% bootstrap CI over patients)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_title("Leaderboard")
    return _png(fig)


def breakdowns(r: SummaryReport) -> bytes | None:
    if _why_no_breakdowns(r):
        return None
    rows = r.summary.breakdowns
    dims = [
        d
        for d in ("family", "disease_group", "difficulty", "modality")
        if any(x.dimension == d for x in rows)
    ]
    if not dims:
        return None
    models = r.models
    fig = Figure(figsize=(9, 3.0 * ((len(dims) + 1) // 2)))
    for n, dim in enumerate(dims):
        ax = fig.add_subplot((len(dims) + 1) // 2, 2, n + 1)
        keys = sorted({x.key for x in rows if x.dimension == dim})
        width = 0.8 / max(1, len(models))
        crowded = len(keys) * len(models) > 8  # upright labels of narrow bars overlap
        for j, m in enumerate(models):
            xs, vals, lo, hi, ns = [], [], [], [], []
            for i, k in enumerate(keys):
                row = next(
                    (x for x in rows if x.dimension == dim and x.key == k and x.model == m), None
                )
                e = _err(row.accuracy) if row else None
                if e is None or row is None:
                    continue
                xs.append(i - 0.4 + width * (j + 0.5))
                vals.append(e[0])
                lo.append(e[1])
                hi.append(e[2])
                ns.append(row.accuracy.n)
            bars = ax.bar(
                xs, vals, width, yerr=[lo, hi], capsize=2, label=_short(m, 20), color=PALETTE[j % 8]
            )
            ax.bar_label(  # a 0.00 bar is still seen; every bar with its n
                bars, labels=_with_n(vals, ns, crowded), fontsize=6 if crowded else 7, padding=2,
                rotation=90 if crowded else 0,
            )  # fmt: skip
        ax.set_xticks(range(len(keys)), [_short(k, 16) for k in keys], rotation=20, ha="right")
        ax.set_ylim(0, 1.4 if crowded else 1.2)  # room for the labels
        ax.set_title(f"accuracy by {dim.replace('_', ' ')}")
        ax.grid(axis="y", alpha=0.3)
        if n == 0:
            ax.legend(fontsize=7)
    fig.tight_layout()
    return _png(fig)


def errors(r: SummaryReport) -> bytes | None:
    if _why_no_errors(r):
        return None
    data = {m: v.get("categories", {}) for m, v in r.summary.errors.items()}
    answers = {x.model: x.n_samples for x in r.summary.leaderboard}
    cats = [c for c in CATEGORY_COLOURS if any(c in v for v in data.values())]
    models = list(data)
    fig = Figure(figsize=(7.5, 0.8 + 0.45 * len(models)))
    ax = fig.add_subplot()
    left = np.zeros(len(models))
    for c in cats:
        vals = np.array([data[m].get(c, 0) for m in models], dtype=float)
        ax.barh(
            range(len(models)),
            vals,
            left=left,
            color=CATEGORY_COLOURS[c],
            label=c.replace("_", " "),
        )
        for i, v in enumerate(vals):
            if v:
                ax.text(left[i] + v / 2, i, str(int(v)), ha="center", va="center", fontsize=7)
        left += vals
    ax.set_yticks(
        range(len(models)), [f"{_short(m)}\n(n={answers.get(m, 0)} answers)" for m in models]
    )
    ax.invert_yaxis()
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("answers with an error (clinician labels replace automatic ones once signed off)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_title("Error taxonomy")
    return _png(fig)


def reliability(r: SummaryReport) -> bytes | None:
    if _why_no_reliability(r):
        return None
    rows = [x for x in r.summary.leaderboard if any(b.count for b in x.reliability)]
    fig = Figure(figsize=(5.2, 4.2))
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], ls="--", color="#999999", lw=1, label="perfect calibration")
    for j, row in enumerate(rows):
        bins = [
            b
            for b in row.reliability
            if b.count and b.confidence is not None and b.accuracy is not None
        ]
        xs = [float(b.confidence or 0.0) for b in bins]
        ys = [float(b.accuracy or 0.0) for b in bins]
        sizes = [20 + 8 * b.count for b in bins]
        ece = f", ECE {row.ece:.2f}" if row.ece is not None else ""
        ax.plot(xs, ys, "-", color=PALETTE[j % 8], lw=1)
        n = sum(b.count for b in bins)
        label = f"{_short(row.model, 22)} (n={n}){ece}"
        ax.scatter(xs, ys, s=sizes, color=PALETTE[j % 8], label=label)
        for x, y, b in zip(xs, ys, bins, strict=True):
            ax.annotate(str(b.count), (x, y), xytext=(0, 6), textcoords="offset points",
                        ha="center", fontsize=6, color=PALETTE[j % 8])  # fmt: skip
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("stated confidence (bin mean)")
    ax.set_ylabel("accuracy in bin")
    ax.set_title("Reliability diagram (marker size = answers)")
    ax.legend(fontsize=7)
    return _png(fig)


def cost(r: SummaryReport) -> bytes | None:
    if _why_no_cost(r):
        return None
    rows = r.summary.leaderboard
    names = [f"{_short(x.model, 18)}\nn={x.cost.n}" for x in rows]  # every bar with its n
    fig = Figure(figsize=(9, 2.8))
    ax1, ax2, ax3 = fig.subplots(1, 3)
    pt = [x.cost.prompt_tokens_mean or 0 for x in rows]
    ct = [x.cost.completion_tokens_mean or 0 for x in rows]
    ax1.bar(names, pt, color=PALETTE[0], label="prompt")
    ax1.bar(names, ct, bottom=pt, color=PALETTE[1], label="completion")
    ax1.set_title("tokens per answer (mean)")
    ax1.legend(fontsize=7)
    per = [x.cost.cost_per_task_usd for x in rows]
    bars = ax2.bar(names, [c or 0 for c in per], color=PALETTE[2])
    for bar, c in zip(bars, per, strict=True):
        if c is None:  # no price known: say so, a bar of height 0 would read as free
            ax2.annotate(cost_text(c), (bar.get_x() + bar.get_width() / 2, 0), ha="center",
                         va="bottom", fontsize=7, color="#a33")  # fmt: skip
    ax2.set_title("cost per answer (USD)")
    med = [x.cost.latency_median_s or 0 for x in rows]
    p90 = [max(0.0, (x.cost.latency_p90_s or 0) - m) for x, m in zip(rows, med, strict=True)]
    ax3.bar(names, med, yerr=[[0] * len(med), p90], capsize=3, color=PALETTE[4])
    ax3.set_title("latency, s (median, whisker p90)")
    for ax in (ax1, ax2, ax3):
        ax.tick_params(axis="x", rotation=20)
        for t in ax.get_xticklabels():
            t.set_ha("right")
    fig.tight_layout()
    return _png(fig)


def ablations(r: SummaryReport) -> bytes | None:
    if _why_no_ablations(r):
        return None
    rows = r.ablation_rows
    models = sorted({x.model for x in rows})
    abls = sorted({x.ablation for x in rows}, key=lambda a: (a != "both", a))
    fig = Figure(figsize=(6.5, 3))
    ax = fig.add_subplot()
    width = 0.8 / len(abls)
    for j, a in enumerate(abls):
        xs, vals, lo, hi, ns = [], [], [], [], []
        for i, m in enumerate(models):
            row = next((x for x in rows if x.model == m and x.ablation == a), None)
            e = _err(row.accuracy) if row else None
            if e is None or row is None:
                continue
            xs.append(i - 0.4 + width * (j + 0.5))
            vals.append(e[0])
            lo.append(e[1])
            hi.append(e[2])
            ns.append(row.accuracy.n)
        label = {"both": "images + text", "images": "images only", "text": "text only"}.get(a, a)
        bars = ax.bar(xs, vals, width, yerr=[lo, hi], capsize=2, label=label, color=PALETTE[j % 8])
        ax.bar_label(bars, labels=_with_n(vals, ns), fontsize=7, padding=1)
    ax.set_xticks(range(len(models)), [_short(m, 20) for m in models])
    ax.set_ylim(0, 1.2)
    ax.set_ylabel("accuracy")
    ax.set_title("Ablations: what the inputs contribute")
    ax.legend(fontsize=7)
    return _png(fig)


def published(r: SummaryReport) -> bytes | None:
    p = r.published
    if not p.rows:
        return None
    fig = Figure(figsize=(7.5, 3.0))
    ax = fig.add_subplot()
    width = 0.8 / len(p.rows)
    for j, row in enumerate(p.rows):
        xs = [i - 0.4 + width * (j + 0.5) for i in range(3)]
        vals = [v if v is not None else 0 for v in row.pass_at_1]
        ax.bar(
            xs,
            vals,
            width,
            color="#bbbbbb" if "clinician" not in row.model.lower() else "#888888",
            edgecolor=PALETTE[j % 8],
            hatch="//",
            label=row.model,
        )
    ax.set_xticks(range(3), list(p.levels))
    ax.set_ylabel("pass@1, %")
    ax.set_ylim(0, 50)
    ax.set_title(f"{p.source}: pass@1 — {p.label.upper()}", fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.text(0.01, 0.01, p.label.upper(), fontsize=7, color="#b00020")
    return _png(fig)


def _panel(
    ax: Any, title: str, rows: list[tuple[str, str, Estimate]], xlabel: str, models: list[str]
) -> None:
    """One panel of the audit's plot: per label (a kind) a point per model with its CI (a model
    keeps its colour across the panels)."""
    labels = sorted({label for label, _, _ in rows})
    step = 0.8 / max(1, len(models))
    for j, model in enumerate(models):
        points = [
            (
                i - 0.4 + step * (j + 0.5),
                next((e for lab, m, e in rows if (lab, m) == (label, model)), None),
            )
            for i, label in enumerate(labels)
        ]
        _forest(ax, points, PALETTE[j % len(PALETTE)], _short(model))
    ax.set_yticks(range(len(labels)), [_short(label, 30) for label in labels])
    ax.invert_yaxis()
    ax.set_xlim(-1.05 if "loss" in xlabel else -0.02, 1.15)
    ax.axvline(0, color="#999999", lw=0.6)
    ax.set_xlabel(xlabel, fontsize=7)
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title, fontsize=9)


def robustness(r: SummaryReport) -> bytes | None:
    """ "Does the model read the image?": per model, the score lost without the image evidence,
    the sides that follow the mirror, and the attack success per planted kind (95% CIs over
    patients); a panel is drawn only when the run has its pairs."""
    a = r.robustness
    if a is None or a.empty:
        return None
    panels = [
        (
            "Score lost without the image evidence",
            [
                (f"{x.kind.value}: {x.metric.replace('_', ' ')}", x.model, x.loss)
                for x in a.reliance
            ],
            "score with the images minus without (loss)",
        ),
        (
            "Sides that follow the mirror",
            [(x.kind.value, x.model, x.follows) for x in a.flips],
            "share of the answer's lefts and rights mirrored",
        ),
        (
            "Attack success per planted kind",
            [(x.kind.value, x.model, x.success) for x in a.attacks],
            "share of answers moved toward the planted instruction",
        ),
    ]
    panels = [p for p in panels if any(_err(e) for _, _, e in p[1])]
    if not panels:
        return None
    heights = [0.6 + 0.32 * len({lab for lab, _, _ in rows}) * max(1, len(a.models())) / 2
               for _, rows, _ in panels]  # fmt: skip
    fig = Figure(figsize=(7.5, sum(heights) + 0.6 * len(panels)))
    grid = fig.add_gridspec(len(panels), 1, height_ratios=heights)
    for n, (title, rows, xlabel) in enumerate(panels):
        ax = fig.add_subplot(grid[n])
        _panel(ax, title, rows, xlabel, a.models())
        if n == 0:
            ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    return _png(fig)


PLOTS: dict[str, Callable[[SummaryReport], bytes | None]] = {
    "leaderboard": leaderboard,
    "breakdowns": breakdowns,
    "errors": errors,
    "reliability": reliability,
    "cost": cost,
    "ablations": ablations,
    "published": published,
    "over_time": lambda r: over_time(r),
    "robustness": robustness,
}


def all_plots(r: SummaryReport) -> dict[str, bytes]:
    """Every plot the summary has data for, name -> PNG."""
    out = {}
    with matplotlib.rc_context(RC):  # type: ignore[arg-type]
        for name, fn in PLOTS.items():
            png = fn(r)
            if png is not None:
                out[name] = png
    return out


# --------------------------------------------------------------------------- over time
# Each model's key metrics across the runs of one dataset by date, with their 95% CIs (the runs
# page and the run summary; from the runs catalog, evaluation.log.catalog: each figure is its
# run's leaderboard's, computed from its stored scores).

METRICS = (("accuracy", "accuracy"), ("pass_at_1", "sampled pass@1"))


def runs_of_dataset(entries: Sequence[CatalogEntry], dataset_hash: str) -> list[CatalogEntry]:
    """The readable runs of the dataset with this content hash that have figures, oldest
    first."""
    out = [e for e in entries if e.dataset_hash == dataset_hash and e.metrics and not e.error]
    return sorted(out, key=lambda e: (e.created_at or "", e.run_id))


def _when(text: str | None) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(text or "")
    except ValueError:
        return None


def metrics_over_time(entries: Sequence[CatalogEntry], dataset_hash: str) -> bytes | None:
    """The plot (PNG) of each model's accuracy and sampled pass@1 across the dataset's runs by
    date, CI bars; None when fewer than two runs have figures (a sentence says so instead)."""
    runs = runs_of_dataset(entries, dataset_hash)
    if len(runs) < 2:
        return None
    models = sorted({m.model for e in runs for m in e.metrics})
    shown = [
        (attr, label)
        for attr, label in METRICS
        if any(_err(getattr(m, attr)) for e in runs for m in e.metrics)
    ]
    with matplotlib.rc_context(RC):  # type: ignore[arg-type]
        fig = Figure(figsize=(7.5, 2.6 * max(1, len(shown))))
        axes = [fig.add_subplot(len(shown), 1, i + 1) for i in range(len(shown))]
        for ax, (attr, label) in zip(axes, shown, strict=True):
            for j, model in enumerate(models):
                xs: list[float] = []
                ys, lo, hi = [], [], []
                for e in runs:
                    m = e.metric(model)
                    when = _when(e.created_at)
                    err = _err(getattr(m, attr)) if m is not None else None
                    if err is None or when is None:
                        continue
                    xs.append(date2num(when))
                    ys.append(err[0])
                    lo.append(err[1])
                    hi.append(err[2])
                if xs:
                    ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o-", capsize=3,
                                color=PALETTE[j % len(PALETTE)], label=_short(model))  # fmt: skip
            ax.set_ylim(-0.02, 1.02)
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            locator = AutoDateLocator()
            ax.xaxis.set_major_locator(locator)
            ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))
        axes[0].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        axes[0].set_title(f"{len(runs)} runs of dataset {dataset_hash[:12]} (95% CI over patients)")
        return _png(fig)


def over_time(r: SummaryReport) -> bytes | None:
    """The summary's over-time plot: each of the run's models across the earlier runs of its
    dataset and this one (``SummaryReport.history``); None when there is no earlier run."""
    h = r.history
    if h is None or no_history_text(h) is not None:
        return None
    return metrics_over_time(h.runs, h.dataset_hash)
