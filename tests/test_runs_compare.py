"""`neurosandbox runs compare RUN_A RUN_B`: two runs of one dataset, per model and per metric,
checked against a hand computation on a small table; refused across datasets and across scoring
versions (with the command that rescores), or rescored first with --rescore."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from engine_helpers import write_nmb
from run_pairs import TASK, case_id, replay_run, write_replay
from scipy import stats as st
from typer.testing import CliRunner

from evaluation.scoring.stats import paired_bootstrap
from evaluation.scoring.version import SCORING_VERSION
from gateway.cli import app

N = 9
# Run A: right on 0-5 and 8, wrong on 6 and 7. Run B: wrong on 0, 1, 2 and 7, right on 3-6,
# and no answer on case 8 (its call fails: the unit only run A scored).
A_RIGHT = [1, 1, 1, 1, 1, 1, 0, 0]  # cases 0-7, the units both runs scored
B_RIGHT = [0, 0, 0, 1, 1, 1, 1, 0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("compare")
    data, answers = write_nmb(tmp / "data", N)
    # one replay file, rewritten between runs: the same model name, answers changed behind it
    replay = tmp / "model.jsonl"
    write_replay(replay, N, wrong={6, 7})
    a = replay_run(data, answers, replay, tmp / "a", tmp / "cache")
    write_replay(replay, N, wrong={0, 1, 2, 7}, missing={8})
    b = replay_run(data, answers, replay, tmp / "b", tmp / "cache")
    other, other_answers = write_nmb(tmp / "other", N + 1)
    c = replay_run(other, other_answers, replay, tmp / "c", tmp / "cache")
    return {"a": a, "b": b, "c": c, "model": Path(f"replay:{replay}")}


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("NEUROSANDBOX_DATA_DIR", str(tmp_path / "var"))
    monkeypatch.setenv("NEUROSANDBOX_CACHE_DIR", str(tmp_path / "cache"))
    return CliRunner()


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_two_runs_compared_as_by_hand(runs: dict[str, Path], cli: CliRunner) -> None:
    res = cli.invoke(app, ["runs", "compare", str(runs["a"]), str(runs["b"]), "--json",
                           "--n-boot", "500"])  # fmt: skip
    assert res.exit_code == 0, res.output
    c = json.loads(res.stdout)
    assert c["scoring_version"] == SCORING_VERSION
    [m] = c["models"]
    assert m["model"] == str(runs["model"])
    assert m["n_shared_units"] == 8
    acc = next(d for d in m["metrics"] if d["metric"] == "accuracy")
    # McNemar's discordant pairs: right in A and wrong in B (cases 0, 1, 2), the reverse (6)
    assert (acc["mcnemar"]["b"], acc["mcnemar"]["c"]) == (3, 1)
    assert (acc["both_right"], acc["both_wrong"]) == (3, 1)
    assert acc["mcnemar"]["exact"] is True
    assert acc["mcnemar"]["p_value"] == pytest.approx(st.binomtest(1, 4, 0.5).pvalue)  # 0.625
    # the paired difference B - A on the shared units, and its interval by patient (here each
    # case is its own patient), as the clustered bootstrap gives it on the same table
    assert acc["a"]["value"] == pytest.approx(6 / 8) and acc["b"]["value"] == pytest.approx(4 / 8)
    assert acc["difference"]["value"] == pytest.approx(-0.25)
    by_hand = paired_bootstrap(B_RIGHT, A_RIGHT, [case_id(i) for i in range(8)], n_boot=500)
    assert acc["difference"]["low"] == pytest.approx(by_hand.difference.low)
    assert acc["difference"]["high"] == pytest.approx(by_hand.difference.high)
    assert acc["difference"]["low"] < -0.25 < acc["difference"]["high"]
    assert acc["p_value"] == pytest.approx(by_hand.p_value)
    # the flipped units, each with its checklist in both runs
    assert [f["case_id"] for f in m["right_to_wrong"]] == [case_id(i) for i in (0, 1, 2)]
    assert [f["case_id"] for f in m["wrong_to_right"]] == [case_id(6)]
    assert m["n_right_to_wrong"] == 3 and m["n_wrong_to_right"] == 1
    flip = m["wrong_to_right"][0]
    assert flip["task"] == TASK
    ra, rb = (json.loads(cli.invoke(app, ["runs", "show", str(runs[k]), "--json"]).stdout)
              for k in ("a", "b"))  # fmt: skip
    assert flip["checklist_a"] == f"/review/runs/{ra['run']['run_id']}/cases/{case_id(6)}"
    assert flip["checklist_b"] == f"/review/runs/{rb['run']['run_id']}/cases/{case_id(6)}"
    # the unit only run A scored is listed, not dropped
    assert [(u["case_id"], u["task"]) for u in m["only_a"]] == [(case_id(8), TASK)]
    assert m["only_b"] == [] and m["n_only_a"] == 1
    # the table says the same
    res = cli.invoke(app, ["runs", "compare", str(runs["a"]), str(runs["b"]), "--n-boot", "500"])
    assert res.exit_code == 0, res.output
    out = _flat(res.output)
    assert "8 shared case/question units" in out
    assert "3 R->W, 1 W->R, p 0.6250 (exact)" in out
    assert "-0.250" in out
    assert f"right -> wrong: 3 units {case_id(0)} {TASK}" in out
    assert f"only run A has 1 unit: {case_id(8)} {TASK}" in out
    assert "not recorded for any case: vendor, scanner model, field strength, age band, sex" in out


def test_runs_of_different_datasets_are_refused_naming_both_hashes(
    runs: dict[str, Path], cli: CliRunner
) -> None:
    hashes = [
        json.loads(cli.invoke(app, ["runs", "show", str(runs[k]), "--json"]).stdout)["run"][
            "dataset_hash"
        ]
        for k in ("a", "c")
    ]
    assert hashes[0] != hashes[1]
    res = cli.invoke(app, ["runs", "compare", str(runs["a"]), str(runs["c"])])
    assert res.exit_code == 1
    out = _flat(res.output)
    assert "different datasets" in out
    assert hashes[0] in out and hashes[1] in out


def _as_if_scored_before_versions(run: Path) -> None:
    """Make a run's stored scores look as if scored before versions were recorded, and all
    wrong: compared as they are, that would read as a huge drift."""
    db = sqlite3.connect(run / "run.sqlite")
    db.execute("UPDATE scores SET scoring_version=NULL")
    db.execute("UPDATE scores SET value=0 WHERE scorer='diagnosis_match'")
    for sid, raw in db.execute("SELECT sample_id, scored_json FROM scored_samples").fetchall():
        data = json.loads(raw)
        data.pop("scoring_version", None)
        for s in data["scores"]:
            if s["scorer"] == "diagnosis_match":
                s["value"] = 0.0
        db.execute(
            "UPDATE scored_samples SET scored_json=? WHERE sample_id=?", (json.dumps(data), sid)
        )
    db.commit()
    db.close()


def test_runs_of_different_scoring_versions_are_refused_or_rescored_first(
    runs: dict[str, Path], cli: CliRunner, tmp_path: Path
) -> None:
    import shutil

    old = tmp_path / "old"
    shutil.copytree(runs["a"], old)
    _as_if_scored_before_versions(old)
    res = cli.invoke(app, ["runs", "compare", str(old), str(runs["b"])])
    assert res.exit_code == 1
    out = _flat(res.output)
    assert "different scoring versions" in out and "1 (unrecorded)" in out
    # the exact command, for the run that is behind (not for the current one)
    assert f"`neurosandbox runs rescore {old}`" in out
    assert f"runs rescore {runs['b']}" not in out
    res = cli.invoke(app, ["runs", "compare", str(old), str(runs["b"]), "--rescore", "--json",
                           "--n-boot", "500"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert f"rescored {old}: scoring version changed: 1 (unrecorded)" in _flat(res.stderr)
    [m] = json.loads(res.stdout)["models"]
    acc = next(d for d in m["metrics"] if d["metric"] == "accuracy")
    # the rescored figures are run A's own: the planted zeros are gone
    assert acc["a"]["value"] == pytest.approx(6 / 8)
    assert (acc["mcnemar"]["b"], acc["mcnemar"]["c"]) == (3, 1)


def test_the_one_run_form_and_its_options_stay_apart(runs: dict[str, Path], cli: CliRunner) -> None:
    res = cli.invoke(app, ["runs", "compare", str(runs["a"]), str(runs["b"]), "--a", "x"])
    assert res.exit_code == 1 and "use --model" in _flat(res.output)
    res = cli.invoke(app, ["runs", "compare", str(runs["a"]), "--model", "x"])
    assert res.exit_code == 1 and "use --a/--b" in _flat(res.output)
    res = cli.invoke(app, ["runs", "compare", str(runs["a"]), str(runs["b"]), "--model", "nope"])
    assert res.exit_code == 1 and "'nope' is in neither run" in _flat(res.output)


def _run_id(cli: CliRunner, run: Path) -> str:
    return json.loads(cli.invoke(app, ["runs", "show", str(run), "--json"]).stdout)["run"]["run_id"]


def test_the_compare_page_shows_two_runs_by_id(runs: dict[str, Path], cli: CliRunner) -> None:
    from fastapi.testclient import TestClient
    from review_server import build_context

    from gateway.api import create_app
    from gateway.auth import Role

    ids = {k: _run_id(cli, runs[k]) for k in ("a", "b", "c")}
    ctx = build_context(runs["a"].parent / "var", runs_dir=runs["a"].parent)
    _, token = ctx.tokens.create(Role.REVIEWER, "compare")
    auth = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(ctx), follow_redirects=False) as c:
        url = f"/review/compare?a={ids['a']}&b={ids['b']}"
        assert c.get(url).status_code in (302, 303, 307)  # not signed in: to the login page
        page = c.get(url, headers=auth)
        assert page.status_code == 200, page.text
        assert page.headers["content-security-policy"].startswith("default-src 'none'")
        text = _flat(page.text)
        assert f'data-model="{runs["model"]}"' in text
        assert "3 right→wrong, 1 wrong→right, p 0.6250 (exact)" in text
        assert "Right → wrong: 3" in text and "Wrong → right: 1" in text
        assert f'href="/review/runs/{ids["b"]}/cases/{case_id(6)}"' in text
        assert f"Only run A scored 1 unit: {case_id(8)}" in text
        # by subgroup: the records give none of the attributes: one sentence, not five rows
        assert "Not recorded for any of the shared cases: vendor, scanner model, field" in text
        assert "data-attribute=" not in text
        # runs of two datasets: refused, the page says why with both hashes
        other = c.get(f"/review/compare?a={ids['a']}&b={ids['c']}", headers=auth)
        assert other.status_code == 409 and "different datasets" in other.text
        assert c.get("/review/compare?a=nope&b=nada", headers=auth).status_code == 404
        assert c.get("/review/compare?a=%3Cscript%3E&b=x", headers=auth).status_code == 422
        assert c.get("/review/compare", headers=auth).status_code == 200  # the form alone


def test_the_compare_page_escapes_what_runs_hold() -> None:
    from evaluation.reports import render_page
    from evaluation.scoring import ModelDelta, RunComparison, RunSide
    from evaluation.scoring.runcompare import FlippedUnit

    evil = '<script>alert(1)</script>"'
    side = RunSide(run_id="r1", dataset_hash="0" * 64, dataset_name=evil)
    c = RunComparison(
        a=side,
        b=side.model_copy(update={"run_id": "r2"}),
        scoring_version="4",
        models=[
            ModelDelta(
                model=evil,
                n_shared_units=1,
                right_to_wrong=[
                    FlippedUnit(
                        case_id=evil, task=evil, patient_id="p", checklist_a='javascript:"x'
                    )
                ],
                n_right_to_wrong=1,
            )
        ],
        models_only_b=[evil],
    )
    page = render_page("compare.html.j2", base="/review", a="r1", b="r2", c=c)
    assert "<script>alert" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&#34;" in page
    assert "javascript:" not in page  # only the app's own paths are linked


def test_accuracy_by_subgroup_across_two_runs_as_by_hand() -> None:
    """24 women aged 30 and 24 men aged 70, one case each, plus 3 cases of unrecorded sex: run A
    right on every case, run B wrong on 12 of the women. By sex and by age band the drop is the
    women's alone; the 3 cases are a subgroup too small for a figure, kept and marked."""
    from evaluation.case import Case, Provenance, RecordPatient, TaskFamily
    from evaluation.scores import ParseStatus, Score
    from evaluation.scoring import RunSide, ScoredSample, compare_runs

    cases, a, b = {}, [], []
    people = [("female", 30)] * 24 + [("male", 70)] * 24 + [("", None)] * 3
    for i, (sex, age) in enumerate(people):
        cid = f"c{i:02d}"
        cases[cid] = Case(
            case_id=cid,
            patient_id=f"p{i}",
            provenance=Provenance(source="folder", patient=RecordPatient(age=age, sex=sex)),
        )
        for samples, right in ((a, True), (b, not (sex == "female" and i < 12))):
            samples.append(
                ScoredSample(
                    case_id=cid,
                    patient_id=f"p{i}",
                    model="m",
                    family=TaskFamily.DIFFERENTIAL,
                    task="differential",
                    status=ParseStatus.OK,
                    scores=[Score(scorer="diagnosis_match", value=1.0 if right else 0.0)],
                    scoring_version=SCORING_VERSION,
                )
            )
    side = RunSide(run_id="A", dataset_hash="h")
    c = compare_runs(side, a, side.model_copy(update={"run_id": "B"}), b, cases=cases, n_boot=300)
    [m] = c.models
    rows = {(r.attribute, r.value): r for r in m.subgroups}
    women, men = rows[("sex", "female")], rows[("sex", "male")]
    assert (women.n_units, women.n_patients, women.too_small) == (24, 24, False)
    assert women.a.value == 1.0 and women.b.value == pytest.approx(0.5)
    assert women.difference.value == pytest.approx(-0.5)
    assert men.difference.value == 0.0 and men.b.value == 1.0
    assert rows[("age_band", "18-39")].difference.value == pytest.approx(-0.5)
    assert rows[("age_band", "60-79")].difference.value == 0.0
    small = rows[("sex", "not recorded")]
    assert (small.n_patients, small.too_small) == (3, True)
    # the whole run: 12 of 51 flipped; vendor unknown for all (one subgroup, every case)
    assert m.n_right_to_wrong == 12 and rows[("vendor", "not recorded")].n_units == 51
    # the order a reader expects: age bands youngest first, the unknown last
    bands = [r.value for r in m.subgroups if r.attribute == "age_band"]
    assert bands == ["18-39", "60-79", "not recorded"]
