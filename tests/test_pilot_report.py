"""The pilot report for a governance board (`neurosandbox pilot-report`): built from a real
run of the reference models, its figures the run summary's own, every section present, hostile
strings escaped, the intended-use file validated, reviews fed back, the PDF printed by Chromium
with a sane page count."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from html import unescape
from pathlib import Path

import numpy as np
import pytest
from engine_helpers import run_phantoms, write_nmb
from pg_server import fresh_pg_database
from PIL import Image
from report_fixtures import BAD, XSS_MODEL, build_run
from typer.testing import CliRunner

from evaluation.log import PG_MARKER, STORE_FILE, ModelPassport, Observed
from evaluation.reports import (
    IntendedUseError,
    build_pilot,
    build_summary,
    load_intended_use,
    load_run,
    not_given,
    pilot_run,
    render_pilot,
)
from evaluation.review import Action, ReviewEvent, ReviewStore, Verdict, answer_key
from evaluation.scoring import SubgroupRow
from gateway.cli import app

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
MODELS = ("reference/text-prior", "reference/image-rules")
SECTIONS = ("intended-use", "dataset", "models", "results", "subgroups", "failure-modes",
            "agreement", "cost", "versions", "limits")  # fmt: skip


@pytest.fixture(scope="module")
def ref_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run: the two reference models on five small Neural-MedBench-shaped cases."""
    tmp = tmp_path_factory.mktemp("pilot")
    data, answers = write_nmb(tmp / "data", 5)
    run = tmp / "runs" / "r1"
    args = ["eval", "--suite", str(data), "--answers", str(answers), "--no-bertscore",
            "--out", str(run)] + [a for m in MODELS for a in ("--model", m)]  # fmt: skip
    env = {"NEUROSANDBOX_CACHE_DIR": str(tmp / "cache"), "NEUROSANDBOX_DATA_DIR": str(tmp / "var")}
    res = CliRunner().invoke(app, args, env=env)
    assert res.exit_code == 0, res.output
    return run


def _cli(tmp: Path, *args: str) -> tuple[int, str]:
    env = {"NEUROSANDBOX_CACHE_DIR": str(tmp / "cache"), "NEUROSANDBOX_DATA_DIR": str(tmp / "var")}
    res = CliRunner().invoke(app, list(args), env=env)
    return res.exit_code, " ".join(res.output.split())


def _cell(html: str, model: str, metric: str) -> str:
    """The text of a results cell (model row, metric column), tags dropped."""
    row = re.search(rf'<tr data-model="{re.escape(model)}">(.*?)</tr>', html, re.S)
    assert row, model
    cell = re.search(rf'data-metric="{metric}">(.*?)</td>', row.group(1), re.S)
    assert cell, (model, metric)
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", cell.group(1))).split())


def test_pilot_report_shows_the_summary_figures_and_every_section(
    ref_run: Path, tmp_path: Path
) -> None:
    use = tmp_path / "use.yaml"
    use.write_text(
        "title: Second reader for neuro MRI\norganisation: Example Hospital\n"
        "purpose: |\n  A second look at studies where the model disagrees.\n"
        "out_of_scope: unsupervised diagnosis\n"
    )
    code, out = _cli(tmp_path, "pilot-report", str(ref_run), "--out", str(tmp_path / "p"),
                     "--intended-use", str(use), "--no-pdf")  # fmt: skip
    assert code == 0, out
    html = (tmp_path / "p" / "pilot.html").read_text()
    for section in SECTIONS:
        assert f'id="{section}"' in html, section
    assert "Second reader for neuro MRI" in html and "unsupervised diagnosis" in html
    assert "no clinician reviews yet" in html and "Grounding audit:</b> not run" in html
    assert 'id="over-time"' not in html  # one run: no plot across runs
    # the figures are the summary's: `neurosandbox report` writes the same records
    code, out = _cli(tmp_path, "report", str(ref_run), "--out", str(tmp_path / "r"), "--no-pdf")
    assert code == 0, out
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())["summary"]
    pilot = json.loads((tmp_path / "p" / "pilot.json").read_text())
    ours = pilot["runs"][0]["summary"]["summary"]
    assert ours["leaderboard"] == summary["leaderboard"] and ours["errors"] == summary["errors"]
    assert {row["model"] for row in summary["leaderboard"]} == set(MODELS)
    for row in summary["leaderboard"]:
        acc = row["accuracy"]
        shown = _cell(html, row["model"], "accuracy")
        assert shown.startswith(f"{acc['value']:.2f} [{acc['low']:.2f}–{acc['high']:.2f}]"), shown
        assert f"n={acc['n']}" in shown
        cats = summary["errors"].get(row["model"], {}).get("categories", {})
        errors = re.search(rf'<table class="errors".*?data-model="{re.escape(row["model"])}">'
                           r"(.*?)</tr>", html, re.S)  # fmt: skip
        assert errors
        for cat, n in cats.items():
            assert f'data-category="{cat}">{n}</td>' in errors.group(1)
    # the limits of the evidence say what this small run cannot show
    limits = " ".join(pilot["runs"][0]["limits"])
    assert "changed since" not in limits  # one run: nothing to compare a passport with
    passports = {p["model"]: p for p in pilot["runs"][0]["passports"]}
    assert set(passports) == set(MODELS) and passports[MODELS[0]]["kind"] == MODELS[0]
    assert passports[MODELS[0]]["prompt_digest"] and passports[MODELS[0]]["recorded_at"]
    assert "5 cases from 5 patients" in limits and "fewer than 10 patients" in limits
    assert "No ablation" in limits and "No clinician reviews yet" in limits
    # no case records a subgroup attribute: one sentence, no tables of "not recorded"
    assert "Not recorded for any case: vendor, scanner model, field strength" in limits
    assert "subgroups-unrecorded" in html and 'data-attribute="' not in html
    assert pilot["runs"][0]["dataset"]["n_cases"] == 5 and pilot["runs"][0]["dataset"]["hash"]


def test_a_passport_change_between_two_runs_is_shown(ref_run: Path, tmp_path: Path) -> None:
    """The same model a month later after a provider update (a replay model whose recorded
    responses name another served model): the later run's passport says what changed, and its
    limits that the two runs' figures may be of different models."""
    data = ref_run.parent.parent / "data"
    replay = tmp_path / "answers.jsonl"
    reply = json.dumps({"final_diagnosis": "multiple sclerosis", "confidence": 0.7})
    runs = []
    for month, served in (("june", "vendor-model-v1"), ("july", "vendor-<b>model</b>-v2")):
        rows = [{"case_id": f"nmb-{i:03d}", "task": "differential#q1", "text": reply,
                 "served_model": served} for i in range(5)]  # fmt: skip
        replay.write_text("".join(json.dumps(r) + "\n" for r in rows))
        runs.append(tmp_path / "runs" / month)
        code, out = _cli(tmp_path, "eval", "--suite", str(data / "nmb.jsonl"), "--answers",
                         str(data / "answers.jsonl"), "--no-bertscore", "--out", str(runs[-1]),
                         "--model", f"replay:{replay}", "--model", MODELS[0])  # fmt: skip
        assert code == 0, out
    code, out = _cli(tmp_path, "pilot-report", *map(str, runs), "--out", str(tmp_path / "p"),
                     "--no-pdf")  # fmt: skip
    assert code == 0, out
    pilot = json.loads((tmp_path / "p" / "pilot.json").read_text())
    june, july = pilot["runs"]
    assert june["passport_changes"] == []
    same, change = sorted(july["passport_changes"], key=lambda c: c["model"] != MODELS[0])
    assert same == {"model": MODELS[0], "since_run": june["run_id"], "changes": []}
    assert change["model"] == f"replay:{replay}" and change["since_run"] == june["run_id"]
    fields = {c["field"]: (c["before"], c["after"]) for c in change["changes"]}
    assert fields["served_models"] == ("vendor-model-v1", "vendor-<b>model</b>-v2")
    assert "replay_sha256" in fields
    assert any("changed since run" in line for line in july["limits"])
    html = (tmp_path / "p" / "pilot.html").read_text()
    assert f"Changed since run {june['run_id']}" in html
    assert f"No passport field changed since run {june['run_id']}" in html  # not repeated
    assert 'id="over-time"' in html  # one dataset, two runs: the figures across them by date
    assert re.search(r"<td>served_models</td><td[^>]*>vendor-model-v1</td>"
                     r"<td[^>]*>vendor-&lt;b&gt;model&lt;/b&gt;-v2</td>", html)  # fmt: skip
    assert 'vendor-model-v1 <span class="meta">(5 calls)</span>' in html


def test_reviews_fed_back_show_agreement(ref_run: Path, tmp_path: Path) -> None:
    run = load_run(ref_run)
    log = ReviewStore(tmp_path / "reviews.sqlite")
    case = run.cases[0].case_id
    keys = [answer_key(s) for s in run.samples_of(case)]
    for who, verdicts in {"Dr A": ["accept", "reject"], "Dr B": ["accept", "accept"]}.items():
        for key, v in zip(keys, verdicts, strict=True):
            log.append(ReviewEvent(reviewer=who, run_id=run.run_id, case_id=case,
                                   action=Action.ITEM, answer_key=key, item_id="final",
                                   verdict=Verdict(v)))  # fmt: skip
        log.append(
            ReviewEvent(reviewer=who, run_id=run.run_id, case_id=case, action=Action.SIGNOFF)
        )
    code, out = _cli(tmp_path, "pilot-report", str(ref_run), "--out", str(tmp_path / "p"),
                     "--reviews", str(tmp_path / "reviews.sqlite"), "--no-pdf")  # fmt: skip
    assert code == 0, out
    html = (tmp_path / "p" / "pilot.html").read_text()
    assert "no clinician reviews yet" not in html and "not_given" not in html
    assert "<b>1</b> of 5 cases signed off by Dr A, Dr B" in html
    assert "Dr A vs Dr B: item verdicts" in html
    limits = json.loads((tmp_path / "p" / "pilot.json").read_text())["runs"][0]["limits"]
    assert any("signed off 1 of 5 cases" in line for line in limits)
    assert "none was given" in out  # no --intended-use: said on the console and in the page
    assert 'id="intended-use-missing"' in html


def test_hostile_model_names_and_statement_are_text(tmp_path: Path) -> None:
    run = build_run(tmp_path / "src")
    hostile = f"{XSS_MODEL}&amp;"
    for s in run.samples:  # a model named by a hostile models file
        if s.scored.model == BAD:
            s.scored = s.scored.model_copy(update={"model": hostile})
    use = tmp_path / "use.md"
    use.write_text(
        "---\ntitle: <b>Pilot</b>\npurpose: triage </dd><script>alert(1)</script>\n---\n"
        "# Scope <img src=x onerror=alert(2)>\nAdults only. <iframe src=//evil>\n"
    )
    report = build_pilot(
        [pilot_run(run, [], {hostile: _passport(hostile)}, n_boot=200)],
        load_intended_use(use),
    )
    html = render_pilot(report)
    assert "<script" not in html and "<iframe" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(&#34;model&#34;)&lt;/script&gt;" in html
    assert "&lt;iframe src=//evil&gt;" in html and "&lt;b&gt;Pilot&lt;/b&gt;" in html
    assert "&amp;amp;" in html  # escaped once more, never read as an entity
    passport = re.search(r'<section class="passport" data-model="([^"]*)"', html)
    assert passport and "&lt;script&gt;" in passport.group(1)
    fields = passport.string[passport.end() : html.index("</section>", passport.end())]
    assert (
        "&lt;b&gt;v2&lt;/b&gt;" in fields and "(3 calls)" in fields and "temperature=0.7" in fields
    )
    assert "No passport: this run was read from a report" in html  # GOOD has none here


def _passport(model: str) -> ModelPassport:
    """A passport whose provider reported a hostile model name and header."""
    return ModelPassport(
        model=model,
        litellm_model="openai/x",
        provider="openai",
        served_models=[Observed(value=XSS_MODEL, calls=3)],
        version_headers={"x-model-version": [Observed(value="<b>v2</b>", calls=3)]},
        decoding={"temperature": 0.7},
    )


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        ("u.yaml", "purpse: x\n", "unknown key 'purpse' (did you mean 'purpose'?)"),
        ("u.yaml", "- a\n- b\n", "found a list"),
        ("u.yaml", "title: x\n", "says nothing"),
        ("u.yaml", "purpose: [1, {a: 2}]\n", "purpose"),
        ("u.yaml", "purpose: x\ngiven: false\n", "set by the reader"),
        ("u.yaml", "purpose: x: y: z\n", "not YAML"),
        ("u.yaml", "purpose: " + "x" * 5000 + "\n", "purpose"),
        ("u.json", "{}", "give a .yaml/.yml or .md file"),
        ("u.md", "", "says nothing"),
        ("u.md", "x" * (65 * 1024), "over 64 KiB"),
    ],
)
def test_intended_use_is_validated(tmp_path: Path, name: str, text: str, problem: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(IntendedUseError) as err:
        load_intended_use(path)
    assert problem in str(err.value)


def test_intended_use_from_markdown_and_not_a_fifo(tmp_path: Path) -> None:
    md = tmp_path / "use.md"
    md.write_text("---\ntitle: T\ncontact: it@example.org\n---\nPreamble.\n\n## Purpose\nTriage.\n"
                  "## Users\nNeuroradiologists.\n")  # fmt: skip
    use = load_intended_use(md)
    assert use.given and use.title == "T" and use.contact == "it@example.org"
    assert [(s.heading, s.text) for s in use.sections] == [
        ("", "Preamble."), ("Purpose", "Triage."), ("Users", "Neuroradiologists.")
    ]  # fmt: skip
    assert len(use.sha256) == 64 and use.source == "use.md"
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    with pytest.raises(IntendedUseError, match="not a regular file"):
        load_intended_use(fifo)  # refused unopened: opening a pipe would block
    assert not not_given().given


def test_pilot_cli_refuses_a_missing_run_and_a_bad_statement(tmp_path: Path) -> None:
    code, out = _cli(
        tmp_path, "pilot-report", str(tmp_path / "nothing"), "--out", str(tmp_path / "p")
    )
    assert code == 2 and "no rundata.json and no evaluation run store" in out
    bad = tmp_path / "u.yaml"
    bad.write_text("purpose: [\n")
    code, out = _cli(tmp_path, "pilot-report", str(tmp_path), "--out", str(tmp_path / "p"),
                     "--intended-use", str(bad))  # fmt: skip
    assert code == 2 and "not YAML" in out
    code, out = _cli(tmp_path, "pilot-report", *[str(tmp_path)] * 9, "--out", str(tmp_path / "p"))
    assert code == 2 and "at most 8" in out
    assert not (tmp_path / "p").exists()


def test_a_run_given_twice_is_refused(ref_run: Path, tmp_path: Path) -> None:
    code, out = _cli(
        tmp_path, "pilot-report", str(ref_run), str(ref_run), "--out", str(tmp_path / "p")
    )
    assert code == 2 and "given 2 times" in out and not (tmp_path / "p").exists()


def test_figures_equal_a_summary_built_directly(tmp_path: Path) -> None:
    run = build_run(tmp_path / "src")
    report = build_pilot([pilot_run(run, n_boot=300)], not_given())
    direct = build_summary(run, n_boot=300)
    assert report.runs[0].summary.summary == direct.summary
    assert report.runs[0].cost_total_usd == pytest.approx(
        sum(r.cost.cost_total_usd or 0 for r in direct.summary.leaderboard)
    )


needs_pdf = pytest.mark.skipif(
    not (
        Path("/usr/bin/chromium").exists() and shutil.which("pdftoppm") and shutil.which("pdfinfo")
    ),
    reason="needs chromium and poppler-utils",
)


@needs_pdf
@pytest.mark.browser
@pytest.mark.timeout(120)
def test_pilot_pdf_is_printed_with_a_sane_page_count(ref_run: Path, tmp_path: Path) -> None:
    code, out = _cli(tmp_path, "pilot-report", str(ref_run), "--out", str(tmp_path / "p"))
    assert code == 0, out
    pdf = tmp_path / "p" / "pilot.pdf"
    info = subprocess.run(["pdfinfo", str(pdf)], capture_output=True, text=True, check=True).stdout
    pages = int(re.search(r"^Pages:\s+(\d+)", info, re.M).group(1))  # type: ignore[union-attr]
    assert 2 <= pages <= 6, pages
    text = subprocess.run(["pdftotext", "-layout", str(pdf), "-"], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip
    for heading in (
        "1. Intended use",
        "4. Results with 95% intervals",
        "10. Limits of the evidence",
    ):
        assert heading in text, heading
    assert "reference/text-prior" in text and "no clinician reviews yet" in text
    subprocess.run(["pdftoppm", "-r", "30", "-f", "2", "-l", "2", "-png", "-singlefile", str(pdf),
                    str(tmp_path / "p2")], check=True)  # fmt: skip
    ink = float((np.asarray(Image.open(tmp_path / "p2.png").convert("L")) < 235).mean())
    assert ink > 0.02  # the results plot and tables, not a blank page


def test_the_documented_example_statement_is_valid() -> None:
    example = Path(__file__).resolve().parents[1] / "docs" / "intended-use.example.yaml"
    use = load_intended_use(example)
    assert use.purpose and use.out_of_scope and use.title


def test_a_phantom_run_shows_its_cohort_and_subgroups(
    phantom_suite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Phantom studies (CT and MR, the generator's field strength, the record's age and sex):
    the dataset names the modalities and the cohort, the subgroup tables are the summary's, a
    subgroup on too few patients says so instead of a figure, and the limits say the cases are
    synthetic."""
    run = run_phantoms(phantom_suite, ("stroke", "ich"), ["reference/image-rules"], tmp_path,
                       monkeypatch)  # fmt: skip
    code, out = _cli(tmp_path, "pilot-report", str(run), "--out", str(tmp_path / "p"), "--no-pdf")
    assert code == 0, out
    pilot = json.loads((tmp_path / "p" / "pilot.json").read_text())
    (prun,) = pilot["runs"]
    table = prun["summary"]["subgroups"]
    assert table and table["rows"]
    assert set(prun["dataset"]["modalities"]) >= {"CT", "MR"}
    strengths = prun["dataset"]["cohort"]["field_strength"]
    assert strengths and "not recorded" not in strengths
    html = (tmp_path / "p" / "pilot.html").read_text()
    for attr in ("vendor", "field_strength", "age_band", "sex"):
        assert f'data-attribute="{attr}"' in html, attr
    row = next(r for r in table["rows"] if r["attribute"] == "field_strength")
    assert row["too_small"] and SubgroupRow.model_validate(row).too_small_text in html
    limits = " ".join(prun["limits"])
    assert "synthetic phantom" in limits and "fewer than 10 patients: shown as too small" in limits


def test_pilot_report_of_runs_in_the_postgresql_run_log(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With NEUROSANDBOX_DATABASE_URL the runs' rows are in PostgreSQL (the folders hold only
    their markers): the report reads the figures, the passports and the catalog entries there."""
    monkeypatch.setenv("NEUROSANDBOX_DATABASE_URL", fresh_pg_database(pg_url))
    data, answers = write_nmb(tmp_path / "data", 3)
    runs = [tmp_path / "runs" / "a", tmp_path / "runs" / "b"]
    for run in runs:
        code, out = _cli(tmp_path, "eval", "--suite", str(data), "--answers", str(answers),
                         "--no-bertscore", "--model", MODELS[0], "--out", str(run))  # fmt: skip
        assert code == 0, out
        assert (run / PG_MARKER).is_file() and not (run / STORE_FILE).exists()
    code, out = _cli(tmp_path, "pilot-report", *map(str, runs), "--out", str(tmp_path / "p"),
                     "--no-pdf")  # fmt: skip
    assert code == 0, out
    pilot = json.loads((tmp_path / "p" / "pilot.json").read_text())
    a, b = pilot["runs"]
    assert a["dataset"]["n_cases"] == 3 and a["catalog"]["engine"] == "postgresql"
    assert [p["model"] for p in b["passports"]] == [MODELS[0]] and b["passports"][0]["recorded_at"]
    assert b["passport_changes"][0]["changes"] == []  # the same model, asked the same way
    assert 'id="over-time"' in (tmp_path / "p" / "pilot.html").read_text()
