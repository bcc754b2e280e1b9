"""`neurosandbox runs judge`: the LLM equivalence judge over a finished run, through litellm."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engine_helpers import write_nmb
from grader_helpers import asked_nonce
from openai_server import OpenAIServer, Script

UNKNOWN = "relapsing inflammatory demyelination of the optic nerves and cord"
ANSWER = json.dumps(
    {
        "findings": [],
        "differential": [{"diagnosis": UNKNOWN, "likelihood": 0.7}],
        "final_diagnosis": UNKNOWN,
        "rationale": "optic neuritis and relapsing numbness",
        "confidence": 0.7,
    }
)


def judge_reply(body: dict) -> str | None:  # type: ignore[type-arg]
    """The judge's verdict, with the nonce its request gives (None: not a judge request)."""
    text = json.dumps(body)
    if "name the same diagnosis" not in text:
        return None
    nonce = asked_nonce(text)
    return json.dumps({"equivalent": True, "reason": "a description of MS", "verdict_nonce": nonce})


def test_judge_decides_what_the_lexicon_cannot_and_rescoring_counts_it_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from gateway.cli import app

    monkeypatch.setenv("NEUROSANDBOX_CACHE_DIR", str(tmp_path / "cache"))
    data, answers = write_nmb(tmp_path / "data", 2)
    run = tmp_path / "run"
    cli = CliRunner()
    script = Script(responder=judge_reply, default_reply=ANSWER)
    with OpenAIServer(script) as server:
        res = cli.invoke(app, ["eval", "--suite", str(data), "--answers", str(answers),
                               "--model", "openai/gpt-4o", "--api-base", server.url,
                               "--tasks", "differential", "--no-bertscore", "--out", str(run)])  # fmt: skip
        assert res.exit_code == 0, res.output
        before = json.loads(cli.invoke(app, ["runs", "show", str(run), "--json"]).stdout)
        assert before["summary"]["leaderboard"][0]["accuracy"]["value"] == 0.0  # lexicon: wrong
        answered = server.stats.calls
        res = cli.invoke(app, ["runs", "judge", str(run), "--model", "openai/gpt-4o-mini",
                               "--api-base", server.url])  # fmt: skip
        assert res.exit_code == 0, res.output
        # Both cases gave the same string against the same truth: one question to the judge.
        assert server.stats.calls == answered + 1
        assert "1 undecided pair(s): 1 asked now, 1 equivalent" in " ".join(res.output.split())
        again = cli.invoke(app, ["runs", "judge", str(run), "--model", "openai/gpt-4o-mini",
                                 "--api-base", server.url])  # fmt: skip
        assert again.exit_code == 0 and server.stats.calls == answered + 1  # cached verdict
    verdicts = json.loads((run / "judge.json").read_text())
    [verdict] = verdicts.values()
    assert verdict["answer"] == UNKNOWN and verdict["truth"].lower() == "multiple sclerosis"
    after = json.loads(cli.invoke(app, ["runs", "show", str(run), "--json"]).stdout)
    board = after["summary"]["leaderboard"][0]
    assert board["accuracy"]["value"] == 1.0
    assert board["judge_matches"] == 2  # counted apart from lexicon matches
