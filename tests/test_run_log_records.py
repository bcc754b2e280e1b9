"""The run log's sample record is typed (issue 36): each turn carries the request as sent and
the ModelOutput, the parsed answer is an Answer (or ClassificationAnswer), the grader calls and
the scores ride along; a stored row this code cannot read is a ``StoredRecordError`` naming the
sample and the part, never a KeyError; old ``run.sqlite`` files read the same way."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
from pathlib import Path

import pytest
from engine_helpers import server_spec, write_nmb
from grader_helpers import fixed_verdict
from openai_server import Fault, OpenAIServer, Script
from store_legacy import make_legacy

from evaluation.answers import Answer
from evaluation.datasets import DatasetSpec
from evaluation.engine import rescore, start_run
from evaluation.export import export_run, records
from evaluation.log import (
    GraderCall,
    RunLog,
    RunStore,
    SampleRecord,
    SampleTurn,
    StoredRecordError,
)
from evaluation.log.rundata import SentRequest
from evaluation.modelio import GenerateConfig, ModelOutput
from evaluation.reports import load_run
from evaluation.runconfig import RunConfig

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
VERDICT = {
    "findings_accuracy": 4,
    "evidence_integration": 3,
    "differential_reasoning": 4,
    "conclusion": 5,
    "safety_uncertainty": 4,
    "comments": "sound",
}


def _config(data: Path, answers: Path, tmp: Path, models: list, **kw: object) -> RunConfig:
    return RunConfig(
        dataset=DatasetSpec(path=str(data), answers=str(answers)),
        models=models,
        generate=GenerateConfig(temperature=0.0, max_tokens=500, timeout_s=10),
        bertscore=False,
        cache_dir=str(tmp / "cache"),
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def graded_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two cases answered by a model and graded by a rubric grader (one answer fails: 500)."""
    tmp = tmp_path_factory.mktemp("graded")
    data, answers = write_nmb(tmp / "data", 3, marker={2: "ALWAYS500"})
    run = tmp / "run"
    script = Script(
        responder=fixed_verdict(VERDICT), faults=[Fault("500", match="ALWAYS500", times=1000)]
    )
    with OpenAIServer(script) as server:
        config = _config(
            data,
            answers,
            tmp,
            [server_spec(server.url, max_retries=0)],
            graders=[server_spec(server.url, name="judge")],
        )
        asyncio.run(start_run(config, run))
    return run


def test_a_sample_is_a_typed_record_with_its_calls_answer_graders_and_scores(
    graded_run: Path,
) -> None:
    with RunStore(graded_run) as store:
        log = store.run_log()
        samples = store.samples()
        responses = store.responses()
        requests = store.requests()
    assert isinstance(log, RunLog) and log.coverage.evaluated == 3
    assert log.scoring_versions and None not in log.scoring_versions
    ok = [s for s in samples if s.status == "ok"]
    (failed,) = [s for s in samples if s.status == "error"]
    assert len(ok) == 2 and all(isinstance(s, SampleRecord) for s in samples)
    for s in ok:
        (turn,) = s.turns
        assert isinstance(turn, SampleTurn) and turn.turn == 1 and turn.status == "ok"
        # what a reader once indexed as turn["output"]["text"]: the stored response, typed
        assert isinstance(turn.output, ModelOutput)
        assert turn.output.text == responses[turn.cache_key].text
        # the request as the store kept it before the call (no image bytes)
        assert isinstance(turn.request, SentRequest)
        assert turn.request == SentRequest.from_record(json.loads(requests[turn.cache_key]))
        assert [m.role for m in turn.request.messages] == ["system", "user"]
        assert any(p.type == "image" and p.sha256 for p in turn.request.messages[1].parts)
        assert isinstance(s.parsed, Answer) and s.parsed.final_diagnosis
        # the graders are not turns of the model's conversation
        assert {(g.grader, g.canary) for g in s.graders} == {("judge", False), ("judge", True)}
        assert all(isinstance(g, GraderCall) and g.output is not None for g in s.graders)
        replies, canaries = s.grader_replies()
        assert json.loads(replies["judge"] or "")["conclusion"] == 5
        assert json.loads(canaries["judge"] or "")["conclusion"] == 0
        assert {x.scorer for x in s.scores} >= {"rubric"} and s.scoring_version
    # a failed call: its turn holds the failure's output (the error), no parsed answer
    (turn,) = failed.turns
    assert turn.status == "error" and turn.error and turn.output is not None
    assert turn.output.error and failed.parsed is None and failed.final_output is None


def test_the_report_shows_the_models_reply_not_the_graders(graded_run: Path) -> None:
    """The report's raw text of a graded answer is the model's reply (it was the canary
    grader's: the samples row lists the grader calls after the model's turns)."""
    run = load_run(graded_run)
    graded = [s for s in run.samples if s.answer is not None]
    assert len(graded) == 2
    for s in graded:
        assert "verdict_nonce" not in s.text and "conclusion" not in s.text
        assert Answer.model_validate_json(s.text).final_diagnosis == s.answer.final_diagnosis  # type: ignore[union-attr]
        assert s.turn == 0


def _copy(run: Path, tmp: Path) -> Path:
    out = tmp / "copy"
    out.mkdir()
    con = sqlite3.connect(run / "run.sqlite")
    con.execute("VACUUM INTO ?", (str(out / "run.sqlite"),))
    con.close()
    return out


@pytest.mark.parametrize(
    ("column", "edit", "says"),
    [
        (
            "turns_json",
            lambda t: [{k: v for k, v in t[0].items() if k != "cache_key"}],
            "cache_key",
        ),
        ("turns_json", lambda t: [{**t[0], "turn": "first"}], "stored turn 1"),
        ("turns_json", lambda t: {"turn": 1}, "not a list"),
        ("turns_json", lambda t: ["a turn"], "stored turn 1 is not an object"),
        ("parsed_json", lambda p: {**p, "answer": {"findings": "none"}}, "parsed answer"),
    ],
)
def test_a_bad_stored_row_is_a_specific_error_not_a_key_error(
    graded_run: Path, tmp_path: Path, column: str, edit: object, says: str
) -> None:
    run = _copy(graded_run, tmp_path)
    con = sqlite3.connect(run / "run.sqlite")
    sid, raw = con.execute(
        f"SELECT sample_id, {column} FROM samples WHERE status='ok' ORDER BY sample_id LIMIT 1"
    ).fetchone()
    con.execute(
        f"UPDATE samples SET {column}=? WHERE sample_id=?",
        (json.dumps(edit(json.loads(raw))), sid),  # type: ignore[operator]
    )
    con.commit()
    con.close()
    with RunStore(run) as store:
        with pytest.raises(StoredRecordError) as err:
            list(records(store))  # the export reads every sample
        with pytest.raises(StoredRecordError):
            rescore(run)
    text = str(err.value)
    assert says in text and json.loads(sid)[0] in text and "run " in text


def test_a_legacy_run_sqlite_reads_as_typed_records(graded_run: Path, tmp_path: Path) -> None:
    run = _copy(graded_run, tmp_path)
    with RunStore(run) as store:
        want = [s.model_dump(exclude={"updated_at"}) for s in store.samples()]
    make_legacy(run / "run.sqlite")
    os.chmod(run / "run.sqlite", 0o444)  # read as it is (no upgrade): views over the old tables
    try:
        with RunStore(run, read_only=True) as store:
            assert [s.model_dump(exclude={"updated_at"}) for s in store.samples()] == want
    finally:
        os.chmod(run / "run.sqlite", 0o644)
    with RunStore(run) as store:  # upgraded when opened
        assert [s.model_dump(exclude={"updated_at"}) for s in store.samples()] == want
        export_run(store, tmp_path / "x.jsonl")
    rec = json.loads((tmp_path / "x.jsonl").read_text().splitlines()[0])
    assert rec["turns"][0]["response_text"] and set(rec["turns"][0]) >= {"turn", "cache_key"}


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_a_group_commit_batch_keeps_every_good_record_when_one_fails(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A batch is written whole first; when a record fails, the batch is written again with a
    savepoint per record, so the bad record fails alone and the others are kept."""
    from pg_server import fresh_pg_database

    from evaluation.log import open_store
    from evaluation.log.writes import response_statements

    url = fresh_pg_database(request.getfixturevalue("pg_url")) if engine == "postgresql" else None
    out = ModelOutput(text="ok")

    def call(key: str) -> list:
        req = {"cache_key": key, "case_id": "c", "task": "t", "family": "f", "model": "m",
               "sample": 0, "turn": 1, "image_hashes": "[]", "prompt_hash": "h",
               "request_json": "{}", "created_at": "now"}  # fmt: skip
        return [("request", req), *response_statements(key, "m", out)]

    with open_store(tmp_path / "r", run_id="r", create=True, database_url=url) as store:
        orphan = response_statements("no-such-request", "m", out)  # breaks the foreign key
        results = store.run_batch([call("a"), orphan, call("b")])
        assert results[0] is None and results[2] is None and results[1] is not None
        assert set(store.responses()) == {"a", "b"}
        assert store.run_batch([call("c"), call("d")]) == [None, None]
        assert set(store.responses()) == {"a", "b", "c", "d"}


def test_a_transaction_is_one_round_trip_to_postgresql(pg_url: str, tmp_path: Path) -> None:
    """The statements of one transaction (a call's request and audit row, its response, its
    sample and a dozen scores, the run's last-write stamp, BEGIN and COMMIT) go to the server
    together (psycopg's pipeline mode) and are answered once: counted in libpq's own trace of
    the protocol as the client's Sync messages, one per transaction. (One round trip per
    statement, as before, cost more of our CPU per call than SQLite's whole write.)"""
    from pg_server import fresh_pg_database

    from evaluation.log import open_store
    from evaluation.log.writes import response_statements, sample_id, sample_statements
    from evaluation.scores import Score

    url = fresh_pg_database(pg_url)
    req = {"cache_key": "k", "case_id": "c", "task": "t", "family": "f", "model": "m",
           "sample": 0, "turn": 1, "image_hashes": "[]", "prompt_hash": "h",
           "request_json": "{}", "created_at": "now"}  # fmt: skip
    trace = tmp_path / "libpq.trace"
    with open_store(tmp_path / "r", run_id="r", create=True, database_url=url) as store:
        fd = os.open(trace, os.O_WRONLY | os.O_CREAT, 0o600)
        store.connection.pgconn.trace(fd)
        try:
            assert store.run_batch([[("request", req)], response_statements("k", "m", ModelOutput(text="x"))]) == [None, None]  # fmt: skip
            _, sample = sample_statements(
                case_id="c", task="t", family="f", model="m", sample=0, status="ok", turns=[],
                parsed=None, parse_error="", image_hashes=[],
            )  # fmt: skip
            store.commit(sample)
            scores = [Score(scorer=f"s{n}", value=n / 12, explanation="") for n in range(12)]
            store.record_scores(sample_id("c", "t", "m", 0), scores, None)
        finally:
            store.connection.pgconn.untrace()
            os.close(fd)
        # the dozen scores went as one statement of JSON rows: read back as written
        stored = store.scores()[sample_id("c", "t", "m", 0)]
        assert [(x.scorer, x.value) for x in stored] == sorted((x.scorer, x.value) for x in scores)
        assert set(store.responses()) == {"k"}
        # a value JSON cannot carry (not finite) goes row by row, and is kept as it was
        odd = [Score(scorer="a", value=float("inf"), explanation=""), *scores[:2]]
        store.record_scores(sample_id("c", "t", "m", 0), odd, None)
        assert [x.value for x in store.scores()[sample_id("c", "t", "m", 0)]] == [
            float("inf"), 0.0, 1 / 12,
        ]  # fmt: skip
    sent = [line.split("\t") for line in trace.read_text().splitlines()]
    statements = [p for p in sent if len(p) > 3 and p[1] == "F" and p[3] == "Execute"]
    syncs = [p for p in sent if len(p) > 3 and p[1] == "F" and p[3] == "Sync"]
    assert len(statements) >= 15, len(statements)
    assert len(syncs) == 3, (len(syncs), len(statements))  # three transactions
    # the first dozen scores as one statement (a fresh connection parses each statement sent)
    parsed = [p[4] for p in sent if len(p) > 4 and p[1] == "F" and p[3] == "Parse"]
    assert sum("INSERT INTO scores" in q for q in parsed) == 1, parsed
