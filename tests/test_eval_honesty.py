"""Issue 24: a case that cannot be loaded never vanishes, a failed call is never hidden, and an
unknown cost is never printed as $0.

Every run here goes through the real command line (``neurosandbox``) against real peers: the
offline reference models, the loopback OpenAI-compatible server in tests/openai_server.py (via
litellm) and a closed port."""

from __future__ import annotations

import csv
import json
import os
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from engine_helpers import brain_png, cli_env, data_uri, neurosandbox_bin
from gateway_synth import make_study
from openai_server import Fault as ServerFault
from openai_server import OpenAIServer, Script
from store_legacy import make_legacy
from typer.testing import CliRunner

from evaluation import CaseCoverage
from evaluation.datasets import DatasetSpec, load_dataset
from evaluation.log import RunStore
from gateway.cli import app
from gateway.pacs_local import free_port

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
ROOT = Path(__file__).resolve().parents[1]
NOTE = "34-year-old woman with optic neuritis and relapsing numbness; periventricular lesions."
GOOD = {
    "case_id": "H1",
    "patient_id": "P1",
    "note": NOTE,
    "ground_truth": {"final_diagnosis": {"name": "multiple sclerosis"}},
    "tasks": ["differential"],
}


def _manifest(folder: Path, *extra: dict[str, object]) -> Path:
    """A case manifest: GOOD and ``extra``; a case without a study gets a small real one."""
    folder.mkdir(parents=True, exist_ok=True)
    cases = []
    for case in (GOOD, *extra):
        if "study" not in case:
            study = f"studies/{case['case_id']}"
            make_study(
                folder / study, classes=("FLAIR",), n_slices=4, patient_id=f"{case['case_id']}"
            )
            case = {**case, "study": study}
        cases.append(case)
    path = folder / "pilot.yaml"
    path.write_text(yaml.safe_dump({"name": "pilot", "cases": cases}))
    return path


MISSING_STUDY = {
    "case_id": "H2",
    "study": "studies/not-there",
    "ground_truth": {"final_diagnosis": {"name": "glioblastoma"}},
}


def _run(tmp: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """The real CLI, its stdout and stderr together, at a width that never cuts a line."""
    full = {**cli_env(tmp / "cache"), "COLUMNS": "250", **(env or {})}
    res = subprocess.run(
        [neurosandbox_bin(), *args], capture_output=True, text=True, env=full, timeout=120
    )
    return res.returncode, res.stdout + res.stderr


def _eval(
    tmp: Path,
    suite: Path,
    out: Path,
    *args: str,
    models: tuple[str, ...] = ("reference/text-prior",),
    env: dict[str, str] | None = None,
) -> tuple[int, str]:
    """`neurosandbox eval` of ``suite`` with ``models`` into ``out`` (``args``: more options)."""
    chosen = [a for m in models for a in ("--model", m)]
    return _run(tmp, "eval", "--suite", str(suite), *chosen, "--out", str(out), *args, env=env)


def _coverage(run: Path) -> CaseCoverage:
    with RunStore(run) as store:
        return store.coverage()


def _shown(tmp: Path, run: Path) -> tuple[int, str, dict[str, Any]]:
    """`runs show` of ``run``: its exit code and text, and its JSON (``--json``)."""
    code, shown = _run(tmp, "runs", "show", str(run))
    _, raw = _run(tmp, "runs", "show", str(run), "--json")
    return code, shown, json.loads(raw[: raw.rindex("}") + 1])


def _models_file(tmp: Path, entries: list[dict[str, object]]) -> Path:
    path = tmp / "models.yaml"
    quick = {"max_retries": 2, "backoff_base_s": 0.01, "backoff_max_s": 0.02}
    path.write_text(yaml.safe_dump({"models": [{**quick, **e} for e in entries]}))
    return path


# --------------------------------------------------------------------------- skipped cases


def test_a_skipped_manifest_case_is_listed_recorded_and_reported_n_of_m(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path / "ds", MISSING_STUDY)
    run = tmp_path / "run"
    code, out = _eval(tmp_path, manifest, run, "--no-bertscore")
    assert code == 0, out
    # Listed before the run and again in the final summary, with the reason.
    assert out.count("manifest case 2 (H2)") >= 2, out
    assert "not-there" in out
    assert "1 of 2 cases evaluated" in out
    # Recorded in the run store, as a typed record.
    coverage = _coverage(run)
    assert coverage.evaluated == 1 and coverage.listed == 2
    [skipped] = coverage.skipped
    assert (skipped.position, skipped.case_id) == (2, "H2") and "not-there" in skipped.reason
    # `runs show` (text and JSON) says the same.
    code, shown, data = _shown(tmp_path, run)
    assert code == 0 and "1 of 2 cases evaluated" in shown and "manifest case 2 (H2)" in shown
    cov = data["coverage"]
    assert cov["evaluated"] == 1 and cov["listed"] == 2 and cov["skipped"][0]["case_id"] == "H2"
    # The report: its summary JSON and HTML, and the command's own line.
    code, said = _run(tmp_path, "report", str(run), "--no-pdf", "--out", str(tmp_path / "rep"))
    assert code == 0, said
    assert "1 of 2 cases evaluated" in said and "manifest case 2 (H2)" in said
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert summary["coverage"]["evaluated"] == 1 and summary["coverage"]["listed"] == 2
    html = (tmp_path / "rep" / "summary.html").read_text()
    assert "1 of 2 cases evaluated" in html and "manifest case 2 (H2)" in html
    assert "not-there" in html


def test_strict_exits_3_when_a_case_was_skipped_and_0_when_none_was(tmp_path: Path) -> None:
    skipping = _manifest(tmp_path / "a", MISSING_STUDY)
    whole = _manifest(tmp_path / "b")
    code, out = _eval(tmp_path, skipping, tmp_path / "r1", "--no-bertscore", "--strict")
    assert code == 3, out
    assert "manifest case 2 (H2)" in out and "--strict" in out
    code, out = _eval(tmp_path, whole, tmp_path / "r2", "--no-bertscore", "--strict")
    assert code == 0, out
    assert "1 of 1 cases evaluated" in out


def test_a_dataset_that_cannot_be_loaded_exits_2(tmp_path: Path) -> None:
    code, out = _eval(tmp_path, tmp_path / "no-such-manifest.yaml", tmp_path / "run")
    assert code == 2, out
    assert "dataset not found" in out


def _suite_folder(root: Path) -> Path:
    good = root / "case-a"
    good.mkdir(parents=True)
    (good / "case.json").write_text(
        json.dumps({**GOOD, "case_id": "A", "provenance": {"source": "folder"}})
    )
    bad = root / "case-b"
    bad.mkdir()
    (bad / "case.json").write_text('{"case_id": "B", "tasks": ["no-such-family"]}')
    return root


def _nmb(root: Path) -> Path:
    root.mkdir(parents=True)
    recs = [
        {"case_id": "nmb-0", "text": NOTE, "images": ["data:image/png;base64,@@@@"]},
        {"case_id": "nmb-1", "text": NOTE, "images": [data_uri(brain_png(1))]},
    ]
    path = root / "nmb.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _neurovlm(root: Path) -> Path:
    (root / "img").mkdir(parents=True)
    (root / "img" / "a.png").write_bytes(brain_png(2))
    with (root / "image_mapping.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["dataset", "file_path", "class", "modality", "plane"])
        w.writerow(["d", "img/a.png", "normal", "MRI", "axial"])
        w.writerow(["d", "img/gone.png", "normal", "MRI", "axial"])
        w.writerow(["d", "../outside.png", "normal", "MRI", "axial"])
    return root / "image_mapping.csv"


@pytest.mark.parametrize(
    ("kind", "build", "expected"),
    [
        ("suite", _suite_folder, [(2, "case-b", "tasks[0]: Input should be")]),
        ("manifest", lambda p: _manifest(p, MISSING_STUDY), [(2, "H2", "not-there")]),
        ("neural-medbench", _nmb, [(1, "nmb-0", "image 1")]),
        ("neurovlm", _neurovlm, [(3, None, "gone.png"), (4, None, "outside")]),
    ],
)
def test_every_dataset_kind_reports_its_skipped_cases_as_typed_records(
    tmp_path: Path, kind: str, build: object, expected: list[tuple[int, str | None, str]]
) -> None:
    from evaluation import SkippedCase

    path = build(tmp_path / "ds")  # type: ignore[operator]
    ds = load_dataset(DatasetSpec(path=str(path), kind=kind), tmp_path / "cache")  # type: ignore[arg-type]
    assert len(ds.cases) == 1
    assert all(isinstance(s, SkippedCase) for s in ds.skipped)
    got = [(s.position, s.case_id) for s in ds.skipped]
    assert got == [(p, c) for p, c, _ in expected]
    for s, (_, _, words) in zip(ds.skipped, expected, strict=True):
        assert words in s.reason
        assert str(s) in ds.warnings  # the warnings still say it, from the same record


def test_a_suite_folder_case_that_fails_to_load_is_listed_and_counted(tmp_path: Path) -> None:
    suite = _suite_folder(tmp_path / "suite")
    code, out = _eval(tmp_path, suite, tmp_path / "run", "--no-bertscore")
    assert code == 0, out
    assert "case folder 2 (case-b)" in out and "1 of 2 cases evaluated" in out


def test_a_case_with_no_task_to_run_is_skipped_with_the_reason_not_dropped(tmp_path: Path) -> None:
    lesion_only = {**GOOD, "case_id": "H3", "tasks": ["lesion"]}
    manifest = _manifest(tmp_path / "ds", lesion_only)
    run = tmp_path / "run"
    code, out = _eval(tmp_path, manifest, run, "--tasks", "differential", "--no-bertscore")
    assert code == 0, out
    assert "1 of 2 cases evaluated" in out and "H3" in out and "lesion" in out
    [s] = _coverage(run).skipped
    assert s.case_id == "H3" and "--tasks" in s.reason


def test_a_store_from_before_skipped_cases_were_recorded_opens_and_says_so(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path / "ds", MISSING_STUDY)
    run = tmp_path / "run"
    code, out = _eval(tmp_path, manifest, run, "--no-bertscore")
    assert code == 0, out
    # Make it a store of the previous layout: no skipped-case table, no case count.
    make_legacy(run / "run.sqlite", drop=("skipped_cases",))
    db = sqlite3.connect(run / "run.sqlite")
    db.execute("DELETE FROM meta WHERE key != 'store_version'")
    db.commit()
    db.close()
    code, shown = _run(tmp_path, "runs", "show", str(run))
    assert code == 0, shown
    assert "skipped cases not recorded" in shown and "cases evaluated: 1" in shown
    # Opening it migrated it: the table is there, and the run still says "not recorded".
    store = RunStore(run)
    try:
        coverage = store.coverage()
        tables = {r[0] for r in store.connection.execute("SELECT name FROM sqlite_master")}
    finally:
        store.close()
    assert coverage.recorded is False and coverage.skipped == [] and coverage.evaluated == 1
    assert "skipped_cases" in tables


# --------------------------------------------------------------------------- failed calls


def test_a_closed_port_prints_the_reason_per_model_counts_retries_and_exits_1(
    tmp_path: Path,
) -> None:
    port = free_port()
    models = _models_file(
        tmp_path,
        [{"name": "x", "model": "openai/x", "api_base": f"http://127.0.0.1:{port}/v1"}],
    )
    manifest = _manifest(
        tmp_path / "ds",
        {**GOOD, "case_id": "H4", "patient_id": "P4", "note": "Sudden left hemiparesis."},
    )
    run = tmp_path / "run"
    code, out = _eval(
        tmp_path, manifest, run, "--models-file", str(models), "--no-bertscore",
        models=("x", "reference/text-prior"),
    )  # fmt: skip
    assert code == 1, out
    lines = out.splitlines()
    [x_line] = [ln for ln in lines if ln.strip().startswith("x: 2 samples")]
    assert "Connection error" in x_line  # the first message, on the model's own line
    assert not any(ln.strip().startswith("reference/text-prior: ") for ln in lines)
    assert "4 retries" in out  # two calls, each retried twice before giving up
    code, shown, data = _shown(tmp_path, run)
    assert code == 0, shown
    [x_line] = [ln for ln in shown.splitlines() if ln.strip().startswith("x: 2 samples")]
    assert "Connection error" in x_line and "4 retries" in shown
    [group] = data["call_errors"]
    assert group["model"] == "x" and group["samples"] == 2 and group["retries"] == 4
    assert "Connection error" in group["first_error"]


@pytest.mark.parametrize(
    ("fault", "reason"),
    [("400", "BadRequestError"), ("500", "InternalServerError")],
    ids=["refused-request", "server-error-every-time"],
)
def test_a_server_that_answers_every_call_with_an_error_is_reported_and_exits_1(
    tmp_path: Path, fault: str, reason: str
) -> None:
    """Other members of the class than a closed port: a reachable server whose every answer is
    an HTTP error (a permanent 400, a 500 each time)."""
    with OpenAIServer(Script(faults=[ServerFault(fault, times=1000)])) as server:
        models = _models_file(
            tmp_path, [{"name": "bad", "model": "openai/gpt-4o", "api_base": server.url}]
        )
        run = tmp_path / "run"
        code, out = _eval(
            tmp_path, _manifest(tmp_path / "ds"), run, "--models-file", str(models),
            "--no-bertscore", models=("bad",), env={"OPENAI_API_KEY": "sk-test"},
        )  # fmt: skip
    assert code == 1, out
    [line] = [ln for ln in out.splitlines() if ln.strip().startswith("bad: ")]
    assert "failed" in line and reason in line, line
    code, shown, data = _shown(tmp_path, run)
    assert code == 0 and reason in shown
    [group] = data["call_errors"]
    assert group["model"] == "bad" and reason in group["first_error"]


def test_a_retried_call_that_then_succeeds_is_counted_and_the_run_exits_0(tmp_path: Path) -> None:
    with OpenAIServer(Script(faults=[ServerFault("500", times=1)])) as server:
        models = _models_file(
            tmp_path, [{"name": "flaky", "model": "openai/gpt-4o", "api_base": server.url}]
        )
        manifest = _manifest(tmp_path / "ds")
        run = tmp_path / "run"
        code, out = _eval(
            tmp_path, manifest, run, "--models-file", str(models), "--no-bertscore",
            models=("flaky",), env={"OPENAI_API_KEY": "sk-test"},
        )  # fmt: skip
        assert server.stats.calls == 2
    assert code == 0, out
    assert "1 retry" in out and "failed" not in out.lower()


def test_an_error_message_is_printed_escaped_and_bounded(tmp_path: Path) -> None:
    run = tmp_path / "run"
    store = RunStore(run, create=True)
    try:
        store.init_run(
            "r1",
            {"models": [{"name": "m"}]},
            dataset_name="d",
            dataset_kind="manifest",
            dataset_hash="0" * 64,
            prompt_version="1",
            code_version="test",
            packages={},
        )
        hostile = "[bold red]boom[/bold red] \x1b[31m" + "x" * 5000
        for n in range(3):
            store.record_sample(
                case_id=f"c{n}",
                task="differential",
                family="differential",
                model="[red]m[/red]",
                sample=0,
                status="error",
                turns=[],
                parsed=None,
                parse_error=hostile,
                image_hashes=[],
            )
    finally:
        store.close()
    res = CliRunner().invoke(app, ["runs", "show", str(run)], env={"COLUMNS": "250"})
    text = res.output
    [line] = [ln for ln in text.splitlines() if "3 samples" in ln]
    assert line.strip().startswith("[red]m[/red]: 3 samples")  # markup shown, not applied
    assert "[bold red]boom[/bold red]" in line and "\x1b" not in text
    assert len(line) < 600


# --------------------------------------------------------------------------- costs


def test_an_unknown_price_prints_unknown_in_progress_leaderboard_and_report(
    tmp_path: Path,
) -> None:
    with OpenAIServer() as server:
        models = _models_file(
            tmp_path,
            [{"name": "unpriced", "model": "openai/no-such-vlm-xyz", "api_base": server.url}],
        )
        manifest = _manifest(tmp_path / "ds")
        run = tmp_path / "run"
        code, out = _eval(
            tmp_path, manifest, run, "--models-file", str(models), "--no-bertscore",
            models=("unpriced", "reference/text-prior"), env={"OPENAI_API_KEY": "sk-test"},
        )  # fmt: skip
    assert code == 0, out
    progress = [ln for ln in out.splitlines() if "cases 1/1" in ln]
    assert progress and "cost unknown" in progress[-1], out
    final = [ln for ln in out.splitlines() if "samples;" in ln]
    assert final and "cost unknown" in final[-1], out
    # the leaderboard is the last table with a row per model
    row = [ln for ln in out.splitlines() if "│ unpriced" in ln][-1]
    assert row.rstrip(" │").endswith("unknown") and "0.0000" not in row
    ref = [ln for ln in out.splitlines() if "│ reference/text-prior" in ln][-1]
    assert ref.rstrip(" │").endswith("$0.0000")  # a known zero stays a zero
    code, said = _run(tmp_path, "report", str(run), "--no-pdf", "--out", str(tmp_path / "rep"))
    assert code == 0, said
    html = (tmp_path / "rep" / "summary.html").read_text()
    cost_table = html[html.index('id="cost"') :]
    cost_table = cost_table[: cost_table.index("<h2", 1)]  # the cost section only
    [unpriced_row] = [r for r in cost_table.split("<tr>") if "<td>unpriced</td>" in r]
    assert unpriced_row.count("unknown") == 2  # total and per task


def test_models_check_a_missing_price_is_a_warning_and_fail_means_nonzero(tmp_path: Path) -> None:
    env = {"COLUMNS": "250", "OPENAI_API_KEY": "sk-test"}
    runner = CliRunner()
    with OpenAIServer() as server:
        res = runner.invoke(
            app, ["models", "check", "openai/no-such-vlm-xyz", "--api-base", server.url], env=env
        )
        strict = runner.invoke(
            app,
            ["models", "check", "openai/no-such-vlm-xyz", "--api-base", server.url, "--strict"],
            env=env,
        )
    assert res.exit_code == 0, res.output
    [cost] = [ln for ln in res.output.splitlines() if " cost " in ln]
    assert cost.split()[0] == "WARN" and "price map" in cost
    assert "FAIL" not in res.output and "works" in res.output
    # --strict makes warnings failures: shown as FAIL, and the exit code says so.
    assert strict.exit_code == 1 and "FAIL" in strict.output
    dead = f"http://127.0.0.1:{free_port()}/v1"
    gone = runner.invoke(
        app, ["models", "check", "openai/gpt-4o", "--api-base", dead, "--timeout", "5"], env=env
    )
    assert "FAIL" in gone.output and gone.exit_code != 0


# --------------------------------------------------------------------------- exit codes


def test_the_exit_codes_are_one_table_in_eval_help_and_in_the_docs() -> None:
    res = CliRunner().invoke(app, ["eval", "--help"], env={"COLUMNS": "250"})
    doc = (ROOT / "docs" / "exit-codes.md").read_text()
    for code, words in (
        (0, "every sample"),
        (1, "call error"),
        (2, "could not be loaded"),
        (3, "--strict"),
    ):
        [help_line] = [
            ln for ln in res.output.splitlines() if ln.strip(" │").startswith(f"{code} ")
        ]
        assert words in help_line, help_line
        assert f"| {code} |" in doc and words in doc
