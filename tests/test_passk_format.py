"""pass@k and format failures, and thin evidence: an unusable answer (format failure, refusal) is
a wrong sample, a failed call is left out (and resumable), the number of unscored samples stands
beside every figure, and a figure resting on fewer patients than MIN_PATIENTS says so."""

from __future__ import annotations

import pytest
from scoring_cases import answer, stroke_case

from evaluation.case import Case, TaskFamily
from evaluation.scores import ParseStatus
from evaluation.scoring import ScoredSample, make_scored_sample, summarise

D = TaskFamily.DIFFERENTIAL
RIGHT = answer("acute ischaemic stroke", differential=["acute ischaemic stroke"])
WRONG = answer("multiple sclerosis", differential=["multiple sclerosis"])
OK, FORMAT, REFUSAL, CALL = (
    ParseStatus.OK,
    ParseStatus.FORMAT_FAILURE,
    ParseStatus.REFUSAL,
    ParseStatus.ERROR,
)


def _case(n: int) -> Case:
    c = stroke_case()
    return c.model_copy(update={"case_id": f"c{n}", "patient_id": f"p{n}"})


def _samples(case: Case, outcomes: list[object], model: str = "m") -> list[ScoredSample]:
    out = []
    for i, o in enumerate(outcomes):
        status = o if isinstance(o, ParseStatus) else OK
        parsed = None if isinstance(o, ParseStatus) else RIGHT if o else WRONG
        out.append(
            make_scored_sample(case, D, model, status, parsed, "", sample_index=i, bertscore=False)
        )
    return out


def test_a_format_failure_is_a_wrong_sample_in_pass_at_k() -> None:
    """The issue: one format failure among five samples left the question out of pass@5, so a
    model failing the format on its hardest question looked better."""
    easy = _samples(_case(1), [True] * 5)
    hard = _samples(_case(2), [FORMAT, False, False, False, False])
    row = summarise(easy + hard, ks=(1, 5), n_boot=50).leaderboard[0]
    assert row.sampled_pass_at["5"].value == pytest.approx(0.5)
    assert row.sampled_pass_at["5"].n == 2
    assert row.sampled_pass_at["1"].value == pytest.approx(0.5)
    assert row.sampled_pass_left_out == {"1": 0, "5": 0}


def test_a_refusal_is_wrong_and_the_model_that_answers_is_not_behind() -> None:
    answers = _samples(_case(1), [True, False, False, False, False], "answers")
    refuses = _samples(_case(1), [True, REFUSAL, REFUSAL, REFUSAL, REFUSAL], "refuses")
    rows = {r.model: r for r in summarise(answers + refuses, ks=(1,), n_boot=50).leaderboard}
    assert rows["refuses"].sampled_pass_at["1"].value == pytest.approx(0.2)
    assert rows["refuses"].sampled_pass_at["1"].value == rows["answers"].sampled_pass_at["1"].value
    assert rows["refuses"].ranked_pass_at["1"].value == pytest.approx(0.2)


def test_a_failed_call_is_left_out_and_counted_beside_the_figure() -> None:
    samples = _samples(_case(1), [True, CALL, False, False, False])
    samples += _samples(_case(2), [True] * 5)
    row = summarise(samples, ks=(1, 5), n_boot=50).leaderboard[0]
    assert row.sampled_pass_at["5"].n == 1  # the unit with a failed call waits for its resume
    assert row.sampled_pass_left_out == {"1": 0, "5": 1}
    assert row.sampled_pass_at["1"].unscored == 1
    assert row.sampled_pass_at["1"].value == pytest.approx((1 / 4 + 1) / 2)


def test_every_figure_carries_its_unscored_count() -> None:
    samples = _samples(_case(1), [True, FORMAT, CALL, False, False])
    summ = summarise(samples, ks=(1,), n_boot=50)
    row = summ.leaderboard[0]
    assert row.accuracy.unscored == 2  # the format failure and the call
    assert row.strict_accuracy.unscored == 1  # the call
    assert row.ranked_pass_at["1"].unscored == 1
    breakdown = next(b for b in summ.breakdowns if b.dimension == "family")
    assert breakdown.accuracy.unscored == 2
    assert breakdown.sampled_pass_at_1 is not None and breakdown.sampled_pass_at_1.unscored == 1
    dumped = summ.model_dump(mode="json")
    assert dumped["leaderboard"][0]["accuracy"]["unscored"] == 2


def test_an_old_sample_says_it_needs_a_rescore() -> None:
    from evaluation.scoring.version import SCORING_VERSION

    assert SCORING_VERSION == "4"


def test_a_figure_on_few_patients_says_so() -> None:
    from evaluation.scoring.stats import MIN_PATIENTS

    few = [s for n in range(2) for s in _samples(_case(n), [bool(n)])]
    summ = summarise(few, ks=(1,), n_boot=50)
    acc = summ.leaderboard[0].accuracy
    assert acc.n_clusters == 2 and acc.thin
    assert f"2 patients, fewer than {MIN_PATIENTS}" in acc.note
    assert summ.model_dump(mode="json")["leaderboard"][0]["accuracy"]["thin"] is True
    assert summ.min_patients == MIN_PATIENTS
    many = [s for n in range(MIN_PATIENTS) for s in _samples(_case(n), [bool(n % 2)])]
    enough = summarise(many, ks=(1,), n_boot=50).leaderboard[0].accuracy
    assert not enough.thin and "patients" not in enough.note


def test_runs_show_prints_the_unscored_count_and_thin_evidence() -> None:
    from gateway.cli.console import pass_at_cell

    samples = _samples(_case(1), [True, CALL, FORMAT])
    row = summarise(samples, ks=(1,), n_boot=50).leaderboard[0]
    cell = pass_at_cell(row, 1)
    assert "1 unscored" in cell and "1 patient" in cell


def test_the_summary_page_shows_unscored_counts_and_thin_evidence() -> None:
    from evaluation.reports.html import render_summary
    from evaluation.reports.published import neural_medbench
    from evaluation.reports.summary import SummaryReport
    from evaluation.review.agreement import ReviewStats

    samples = _samples(_case(1), [True, CALL, FORMAT]) + _samples(_case(2), [False])
    summ = summarise(samples, ks=(1,), n_boot=50)
    report = SummaryReport(
        run_id="r",
        generated_at="2024-01-01T00:00:00+00:00",
        n_cases=2,
        n_samples=4,
        models=["m"],
        families=["differential"],
        ablations=["both"],
        summary=summ,
        reviews=ReviewStats(n_cases=2, n_signed_off=0, n_in_progress=0),
        published=neural_medbench(),
    )
    html = " ".join(render_summary(report, {}).split())
    leaderboard = html[html.index('id="leaderboard"') : html.index('id="errors"')]
    assert "2 unscored; 2 patients, fewer than 10" in leaderboard  # accuracy
    assert "1 unscored; 2 patients, fewer than 10" in leaderboard  # pass@1, strict accuracy
    assert "fewer than 10" in html[html.index('id="breakdowns"') :]


def test_a_figure_does_not_count_as_unscored_what_it_does_not_apply_to() -> None:
    """Read answers of another task (a classification answer has no differential rank): not
    unscored. The demo's leaderboard said '(25 unscored)' beside ranked top-5 for its 25 read
    classification answers."""
    from evaluation.answers import ClassificationAnswer

    case = _case(1)
    said = ClassificationAnswer(modality="CT", diagnosis_name="normal")
    samples = _samples(case, [True, False])
    for i in range(3):
        samples.append(
            make_scored_sample(case, TaskFamily.CLASSIFICATION, "m", OK, said, "",
                               sample_index=i, bertscore=False, task="classification")
        )  # fmt: skip
    row = summarise(samples, ks=(1,), n_boot=50).leaderboard[0]
    assert row.ranked_pass_at["1"].n == 2
    assert row.ranked_pass_at["1"].unscored == 0
