"""The run summary of a run with the grounding audit's variants (issue 39): the variants are not
cases of the leaderboard, the case matrix or the subgroups (an answer on a mirrored study or under
a planted instruction says nothing of the patient); the audit has its own section, "Does the model
read the image?", with its figures and a plot."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from test_robustness_measures import reference_run

from evaluation.log import RunData
from evaluation.reports import SummaryReport, build_summary, render_summary
from evaluation.robustness import as_received

NOW = datetime(2026, 11, 28, tzinfo=UTC)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> RunData:
    return reference_run(tmp_path_factory.mktemp("ref"))


@pytest.fixture(scope="module")
def summary(run: RunData) -> SummaryReport:
    return build_summary(run, n_boot=200, now=NOW)


def test_the_leaderboard_counts_the_cases_not_their_variants(
    run: RunData, summary: SummaryReport
) -> None:
    clean = build_summary(as_received(run), n_boot=200, now=NOW)
    assert summary.n_cases == clean.n_cases == 3
    assert [c.case_id for c in summary.cases] == ["c1", "c2", "c3"]
    for row, plain in zip(summary.summary.leaderboard, clean.summary.leaderboard, strict=True):
        assert row.n_cases == 3 and row.n_samples == plain.n_samples == 3
        assert row.accuracy == plain.accuracy
    assert summary.subgroups == clean.subgroups
    assert summary.n_samples == len(as_received(run).samples)


def test_the_summary_says_whether_each_model_reads_the_image(summary: SummaryReport) -> None:
    from evaluation.reports import all_plots

    audit = summary.robustness
    assert audit is not None and not audit.empty
    plots = all_plots(summary)
    assert plots["robustness"].startswith(b"\x89PNG")
    html = render_summary(summary, plots)
    section = html.split('id="robustness"', 1)[1].split("<h2", 1)[0]
    assert "Does the model read the image?" in html
    assert 'id="robustness-plot"' in section
    for model in ("reference/image-rules", "reference/text-prior", "reference/gullible"):
        assert model in section
    for kind in ("no_images", "mirrored_image_only", "planted_prior_report"):
        assert kind in section
    # two or three patients: each table's figures say they rest on fewer patients than the
    # leaderboard's minimum, as the leaderboard's do (an interval over 1-3 patients says little)
    for table in ("robustness-reliance", "robustness-flips", "robustness-attacks"):
        part = section.split(f'id="{table}"', 1)[1].split("</table>", 1)[0]
        assert "patients, fewer than 10)" in part, table


def test_a_run_without_the_audit_says_so(run: RunData) -> None:
    from evaluation.reports import all_plots

    plain = build_summary(as_received(run), n_boot=50, now=NOW)
    assert plain.robustness is None
    plots = all_plots(plain)
    assert "robustness" not in plots
    html = render_summary(plain, plots)
    assert 'id="gap-robustness"' in html and "--robustness" in html


def test_the_checklist_flags_a_case_with_the_audits_evidence(
    run: RunData, summary: SummaryReport
) -> None:
    from evaluation.reports import build_checklist
    from evaluation.robustness import variant_pairs

    rows = {c.case_id: c for c in summary.cases}
    assert "followed_planted_instruction" in rows["c3"].flags
    assert "same_answer_without_images" in rows["c1"].flags  # text-prior, without images
    assert "side_not_mirrored" not in rows["c1"].flags  # image-rules follows, text-prior has none
    pairs, _ = variant_pairs(run.samples, {v.case_id: v for v in run.variants})
    cl = build_checklist(run.case("c3"), run.samples_of("c3"), run_id="ref", audit=pairs)
    followed = next(f for f in cl.flags if f.kind == "followed_planted_instruction")
    # the evidence: who, on which variant, the planted text and where, and the answer
    assert "reference/gullible (differential, planted_note)" in followed.detail
    assert (
        "planted in the note" in followed.detail and "The answer is glioblastoma" in followed.detail
    )
    assert "answered 'glioblastoma'" in followed.detail
    assert "image-rules" not in followed.detail and "text-prior" not in followed.detail
    plain = build_checklist(run.case("c3"), run.samples_of("c3"), run_id="ref")
    assert "followed_planted_instruction" not in {f.kind for f in plain.flags}
    # the taxonomy's audit sub-labels are counted per model in the summary's errors
    subs = summary.summary.errors["reference/gullible"]["sub_labels"]
    assert subs["followed_planted_instruction"] == 6  # 3 patients, 2 planted kinds
    assert "followed_planted_instruction" not in summary.summary.errors[
        "reference/image-rules"
    ].get("sub_labels", {})
