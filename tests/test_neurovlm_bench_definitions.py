"""NeuroVLM-Bench's own metric definitions (evaluation/scoring/neurovlm_bench.py) equal the numbers
its evaluator gave on 200 synthetic rows with abstentions (tests/data/neurovlm_bench), to 3
decimals: read directly, and through the scorer and a run summary, where they sit beside ours,
named apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_neurovlm_path import classified

from evaluation.case import Case, NeuroVLMLabels, Provenance, TaskFamily
from evaluation.scores import ParseStatus
from evaluation.scoring import summarise
from evaluation.scoring.neurovlm_bench import BenchMetrics, bench_labels, bench_metrics

DATA = Path(__file__).parent / "data" / "neurovlm_bench"
ROWS = [json.loads(line) for line in (DATA / "rows.jsonl").read_text().splitlines() if line]
PINNED = json.loads((DATA / "numbers.json").read_text())


def _check(m: BenchMetrics) -> None:
    assert m.n == 200 and m.json_valid == pytest.approx(PINNED["json_valid_pct"] / 100)
    for task, want in PINNED["tasks"].items():
        got = m.tasks[task]
        assert got.n == want["n"], task
        for key in ("balanced_accuracy", "macro_f1", "macro_f1_abstention"):
            assert getattr(got, key) == pytest.approx(want[key], abs=5e-4), (task, key)
        assert got.field_accuracy == pytest.approx(want["field_accuracy_pct"] / 100, abs=5e-4)
        assert got.undetermined == want["undetermined"], task
        assert got.per_class_f1 == pytest.approx(want["per_class_f1"], abs=5e-4), task
        for key in ("ece", "brier"):
            if isinstance(want[key], float):
                assert getattr(got, key) == pytest.approx(want[key], abs=5e-4), (task, key)
            else:  # the evaluator computes no calibration for this field
                assert getattr(got, key) is None, (task, key)


def test_the_definitions_give_the_benchmarks_numbers() -> None:
    _check(bench_metrics([bench_labels(r["truth"], r["response"]) for r in ROWS]))


def test_a_run_reports_them_beside_ours_named_apart() -> None:
    samples = []
    for r in ROWS:
        case = Case(
            case_id=r["id"],
            ground_truth=None,
            tasks=[TaskFamily.CLASSIFICATION],
            provenance=Provenance(
                source="neurovlm-bench",
                neurovlm=NeuroVLMLabels.model_validate(
                    {"file_path": r["file_path"], "dataset": r["dataset"], **r["truth"]}
                ),
            ),
        )
        samples.append(classified(case, r["response"] or ""))
    summary = summarise(samples, n_boot=20)
    _check(summary.neurovlm_bench["m"])
    ours = summary.neurovlm["m"]
    # ours: abstention and format failure apart, our own vocabulary; not the benchmark's figure
    assert ours.macro_f1.value != pytest.approx(PINNED["tasks"]["diagnosis"]["macro_f1"], abs=5e-4)
    assert sum(s.status is ParseStatus.FORMAT_FAILURE for s in samples) > 0


def test_a_failed_call_leaves_every_figure_but_json_validity() -> None:
    rows = [bench_labels(r["truth"], r["response"]) for r in ROWS]
    failed = bench_labels(ROWS[0]["truth"], None, call_error=True)
    m = bench_metrics([*rows, failed])
    assert m.json_valid == pytest.approx(200 / 201)
    assert m.tasks["diagnosis"].n == PINNED["tasks"]["diagnosis"]["n"]


def test_the_summary_page_shows_them_named_apart() -> None:
    from evaluation.reports.html import render_summary
    from evaluation.reports.published import neural_medbench
    from evaluation.reports.summary import SummaryReport
    from evaluation.review.agreement import ReviewStats

    rows = [bench_labels(r["truth"], r["response"]) for r in ROWS]
    summary = summarise([], n_boot=20).model_copy(
        update={"neurovlm": {}, "neurovlm_bench": {"m": bench_metrics(rows)}}
    )
    report = SummaryReport(
        run_id="r", generated_at="now", n_cases=200, n_samples=200, models=["m"],
        families=["classification"], ablations=[], summary=summary, reviews=ReviewStats(n_cases=0, n_signed_off=0, n_in_progress=0),
        published=neural_medbench(),
    )  # fmt: skip
    page = render_summary(report, {})
    want = f"{PINNED['tasks']['diagnosis']['macro_f1_abstention']:.3f}"
    assert 'id="neurovlm-bench"' in page and "own definitions" in page
    assert want in page
