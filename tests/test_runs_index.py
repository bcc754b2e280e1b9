"""`neurosandbox runs index`: every run of the install in one catalog (evaluation.log.catalog):
a run made by `neurosandbox eval`, its key metrics with CIs as the leaderboard computes them,
cost, scoring version, the canary's mark; filters; --json; a broken run folder is a row saying
why; on PostgreSQL the runs of the run log. (The gateway's and the demo's runs:
tests/test_runs_index_gateway.py.)"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from engine_helpers import write_nmb
from pg_server import fresh_pg_database
from typer.testing import CliRunner

from evaluation.log import PG_MARKER, CatalogEntry, RunStore, list_runs, open_store
from gateway.cli import app

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("NEUROSANDBOX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("NEUROSANDBOX_DATA_DIR", str(tmp_path / "var"))
    monkeypatch.setenv("NEUROSANDBOX_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("COLUMNS", "300")
    return tmp_path / "runs"


def _eval(tmp_path: Path, name: str, cases: int, models: list[str]) -> Path:
    data, answers = write_nmb(tmp_path / f"data-{cases}", cases)
    out = tmp_path / "runs" / name
    args = ["eval", "--suite", str(data), "--answers", str(answers), "--samples", "1",
            "--no-bertscore", "--out", str(out)]  # fmt: skip
    for m in models:
        args += ["--model", m]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    return out


def _index(*args: str) -> list[dict[str, object]]:
    res = CliRunner().invoke(app, ["runs", "index", "--json", *args])
    assert res.exit_code == 0, res.output
    return list(json.loads(res.stdout)["runs"])


def test_the_index_lists_a_cli_run_with_its_leaderboard_figures_cost_and_scoring_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _env(monkeypatch, tmp_path)
    first = _eval(tmp_path, "r1", 3, ["reference/text-prior", "reference/image-rules"])
    second = _eval(tmp_path, "r2", 2, ["reference/text-prior"])
    broken = runs / "broken"
    broken.mkdir()
    (broken / "run.sqlite").write_bytes(b"not a database, written by hand" * 40)

    rows = _index()
    assert len(rows) == 3
    entries = [CatalogEntry.model_validate(r) for r in rows]  # the --json schema is the record
    by_dir = {Path(e.run_dir or "").name: e for e in entries}
    bad = by_dir["broken"]
    assert bad.status == "unreadable" and bad.error and "not a usable run store" in bad.error

    e1 = by_dir["r1"]
    assert e1.source == "cli" and e1.status == "complete" and e1.engine == "sqlite"
    assert e1.models == ["reference/text-prior", "reference/image-rules"]
    assert e1.dataset_hash and len(e1.dataset_hash) >= 12 and e1.n_samples == 6
    assert list(e1.scoring_versions.values()) == [6]
    # the figures are the leaderboard's, read from the stored scores
    shown = CliRunner().invoke(app, ["runs", "show", str(first), "--json"])
    board = {r["model"]: r for r in json.loads(shown.stdout)["summary"]["leaderboard"]}
    for m in e1.metrics:
        acc = board[m.model]["accuracy"]
        assert m.accuracy is not None
        assert (m.accuracy.value, m.accuracy.low, m.accuracy.high) == (
            acc["value"],
            acc["low"],
            acc["high"],
        )
        assert m.n_scored == board[m.model]["n_scored"] == 3
    # the reference models cost a known zero: $0, not "unknown"
    assert e1.cost.usd == 0.0 and e1.cost.unknown_calls == 0 and e1.cost.text == "$0.0000"
    # newest first
    assert entries[0].run_dir == str(second) and entries[1].run_dir == str(first)

    # filters: by dataset hash (a prefix), by dataset name, by model
    h = e1.dataset_hash
    assert h is not None
    assert [r["run_id"] for r in _index("--dataset", h[:10])] == [e1.run_id]
    assert {r["run_id"] for r in _index("--dataset", e1.dataset_name or "")} >= {e1.run_id}
    only = _index("--model", "reference/image-rules")
    assert [r["run_id"] for r in only] == [e1.run_id]
    assert _index("--model", "nobody/none") == []

    # the table: the run, its figures with CIs, the broken folder's reason
    res = CliRunner().invoke(app, ["runs", "index"])
    assert res.exit_code == 0, res.output
    assert e1.run_id in res.output and "acc 0.00 [0.00, 0.00]" in res.output
    assert "not a usable run" in res.output and "$0.0000" in res.output
    # `runs list` finds the same runs by the same rule
    listed = CliRunner().invoke(app, ["runs", "list"])
    assert listed.exit_code == 0 and e1.run_id in listed.output


def test_an_unpriced_model_costs_unknown_and_a_canary_note_is_read_leniently(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _env(monkeypatch, tmp_path)
    run = _eval(tmp_path, "r1", 2, ["reference/text-prior"])
    with open_store(run) as store:
        # a response without a price: the run's cost is unknown for it, never $0
        store.connection.execute("UPDATE responses SET output_json = json_set(output_json, "
                                 "'$.cost_usd', json('null'))")  # fmt: skip
        store.set_note("canary", '{"name": "weekly", "verdict": "alarm", "detail": "<b>x</b>",'
                       ' "file_sha256": "ab"}')  # fmt: skip
    [e] = list_runs([runs])
    assert e.cost.usd is None and e.cost.unknown_calls == 2 and e.cost.text.startswith("unknown")
    assert e.canary is not None and e.canary.verdict == "alarm" and e.canary.name == "weekly"
    with open_store(run) as store:
        store.set_note("canary", "[1, 2")  # by hand, hostile
    [e] = list_runs([runs])
    assert e.canary is not None and e.canary.verdict == "unreadable" and e.error is None
    with open_store(run) as store:
        store.set_note("canary", json.dumps({"verdict": "drifted", "name": "n" * 5000}))
    [e] = list_runs([runs])
    assert e.canary is not None and e.canary.verdict == "unreadable"
    assert len(e.canary.name) <= 300


def test_entries_are_cached_until_the_run_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _env(monkeypatch, tmp_path)
    run = _eval(tmp_path, "r1", 2, ["reference/text-prior"])
    cache = tmp_path / "catalog.json"
    [cold] = list_runs([runs], cache=cache)
    assert cache.is_file()
    # a cached entry is what the next listing returns while the run is unchanged (proof: the
    # cache's copy, altered, comes back) ...
    data = json.loads(cache.read_text())
    [key] = data["runs"]
    data["runs"][key]["entry"]["dataset_name"] = "from the cache"
    cache.write_text(json.dumps(data))
    [warm] = list_runs([runs], cache=cache)
    assert warm.dataset_name == "from the cache"
    # ... and a write to the run (any committed write replaces its stamp) reads it again
    with open_store(run) as store:
        store.set_note("canary", json.dumps({"verdict": "quiet", "name": "w"}))
    [again] = list_runs([runs], cache=cache)
    assert again.dataset_name == cold.dataset_name and again.canary is not None
    assert again.canary.verdict == "quiet"


def test_listing_200_cached_runs_is_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _env(monkeypatch, tmp_path)
    run = _eval(tmp_path, "r000", 2, ["reference/text-prior"])
    import shutil

    for n in range(1, 200):  # copies of one run folder: 200 stores to list
        shutil.copytree(run, runs / f"r{n:03d}")
    cache = tmp_path / "catalog.json"
    t0 = time.perf_counter()
    cold = list_runs([runs], cache=cache)
    t_cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    warm = list_runs([runs], cache=cache)
    t_warm = time.perf_counter() - t0
    assert len(cold) == len(warm) == 200 and all(e.error is None for e in warm)
    print(f"200 runs: cold {t_cold:.2f} s, cached {t_warm:.3f} s")
    assert t_warm < 2.0, t_warm


def test_the_index_lists_the_runs_of_the_postgresql_run_log(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = fresh_pg_database(pg_url)
    runs = _env(monkeypatch, tmp_path)
    monkeypatch.setenv("NEUROSANDBOX_DATABASE_URL", url)
    run = _eval(tmp_path, "r1", 2, ["reference/text-prior"])
    assert (run / PG_MARKER).is_file()
    run_id = json.loads((run / PG_MARKER).read_text())["run_id"]
    # a run of the same log whose folder is elsewhere (another host's runs folder): listed too
    elsewhere = _eval(tmp_path, "moved", 2, ["reference/image-rules"])
    other_id = json.loads((elsewhere / PG_MARKER).read_text())["run_id"]
    (tmp_path / "archive").mkdir()
    elsewhere.rename(tmp_path / "archive" / "moved")
    rows = {r["run_id"]: CatalogEntry.model_validate(r) for r in _index()}
    assert set(rows) == {run_id, other_id}
    here, away = rows[run_id], rows[other_id]
    assert here.engine == away.engine == "postgresql" and here.run_dir == str(run)
    assert away.run_dir is None and away.models == ["reference/image-rules"]
    assert here.status == "complete" and here.metrics and here.metrics[0].accuracy is not None
    assert [r["run_id"] for r in _index("--model", "reference/image-rules")] == [other_id]
    # the canary's note on PostgreSQL
    with RunStore(run, database_url=url) as store:
        store.set_note("canary", json.dumps({"verdict": "first", "name": "c"}))
    rows = {r["run_id"]: r for r in _index()}
    assert rows[run_id]["canary"]["verdict"] == "first"
    # `runs list` of the runs folder: its run (by its marker), not the one elsewhere
    listed = CliRunner().invoke(app, ["runs", "list", str(runs)])
    assert listed.exit_code == 0 and run_id in listed.output and other_id not in listed.output


def test_the_table_shows_each_models_passport_line_bounded_and_without_terminal_escapes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from evaluation.log.passport import NOTE_PREFIX

    _env(monkeypatch, tmp_path)
    run = _eval(tmp_path, "r1", 2, ["reference/text-prior", "reference/image-rules"])
    res = CliRunner().invoke(app, ["runs", "index"])
    assert res.exit_code == 0, res.output
    entry = CatalogEntry.model_validate(_index()[0])
    line = entry.passport_lines["reference/text-prior"]
    # each model's passport line is printed under its figures (the table folds long cells:
    # compare without the table's line breaks and borders)
    flat = " ".join(res.output.replace("│", " ").split())
    assert f"passport: {' '.join(line.split())[:30]}" in flat

    # a run log edited by hand: a recorded passport naming a provider with terminal escapes
    # and a thousand characters, a canary note's name with a screen-clearing escape
    key = NOTE_PREFIX + "reference/text-prior"
    with open_store(run) as store:
        note = json.loads(store.note(key) or "{}")
        note["provider"] = "evil\x1b]0;pwned\x07\x1b[2J" + "p" * 1000
        store.set_note(key, json.dumps(note))
        store.set_note("canary", json.dumps({"verdict": "alarm", "name": "w\x1b[31mred"}))
    res = CliRunner().invoke(app, ["runs", "index"])
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.output and "\x07" not in res.output
    flat = "".join(res.output.replace("│", " ").split())
    assert "evil]0;pwned[2J" in flat and "alarmw[31mred" in flat  # shown, as inert text
    assert "p" * 200 not in flat  # bounded (the catalog keeps 300 characters, the table 160)
