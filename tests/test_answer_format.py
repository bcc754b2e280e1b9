"""What a model must return is published (a versioned JSON Schema, a docs page with an example),
and an answer that misses it says why wherever it is counted: ``runs show`` and the checklist."""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

import pytest
from openai_server import OpenAIServer, Script
from typer.testing import CliRunner

from evaluation.case import TaskFamily
from evaluation.parsing import MAX_REASON, answer_schema, format_reason, parse_answer
from evaluation.scores import ParseStatus
from gateway.cli import app

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
OTHER_SHAPE = json.dumps({"diagnosis": "ischaemic stroke", "certainty": "high"})


@pytest.mark.parametrize(
    ("kind", "file"),
    [("answer", "answer.schema.json"), ("classification", "answer-classification.schema.json")],
)
def test_the_published_answer_schema_is_the_one_answers_are_validated_against(
    kind: str, file: str
) -> None:
    published = answer_schema(kind)
    committed = json.loads((DOCS / file).read_text())
    assert committed == published, f"regenerate docs/{file}: neurosandbox cases schema --answer ..."
    assert re.search(r"-\d+$", published["$id"]) and published["version"] in published["$id"]
    extra = ["--classification"] if kind == "classification" else []
    res = CliRunner().invoke(app, ["cases", "schema", "--answer", *extra])
    assert res.exit_code == 0 and json.loads(res.output) == published
    if kind == "answer":  # which fields each task requires, as parsing requires them
        assert published["x-required-by-task"]["differential"] == [
            "differential",
            "final_diagnosis",
        ]
        assert published["x-required-by-task"]["lesion"] == ["findings"]


def test_the_documented_example_is_a_valid_answer_and_the_readme_links_the_page() -> None:
    page = (DOCS / "answer-format.md").read_text()
    blocks = re.findall(r"```json\n(.*?)```", page, re.S)
    assert blocks, "docs/answer-format.md shows an example answer"
    for family in (TaskFamily.DIFFERENTIAL, TaskFamily.LESION, TaskFamily.RATIONALE):
        parsed = parse_answer(blocks[0], family)
        assert parsed.status is ParseStatus.OK and not parsed.repairs, (family, parsed.error)
    assert answer_schema("answer")["version"] in page
    assert "docs/answer-format.md" in (ROOT / "README.md").read_text()


def test_a_reply_of_another_shape_says_which_field_is_wrong_bounded() -> None:
    parsed = parse_answer(OTHER_SHAPE, TaskFamily.DIFFERENTIAL)
    assert parsed.status is ParseStatus.FORMAT_FAILURE
    assert "'differential' is a required property" in parsed.error
    hostile = json.dumps(
        {"differential": [{"diagnosis": 7 * ("x\u202e\n" * 900)}], "final_diagnosis": 3}
    )
    reason = format_reason(parse_answer(hostile, TaskFamily.DIFFERENTIAL).error)
    assert len(reason) <= MAX_REASON and "\n" not in reason and "\u202e" not in reason
    assert reason.startswith("schema: ")


def _run_other_shape(suite_dir: Path, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from engine_helpers import server_spec

    from evaluation.datasets import DatasetSpec
    from evaluation.engine import start_run
    from evaluation.modelio import GenerateConfig
    from evaluation.runconfig import RunConfig

    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("NEUROSANDBOX_DATA_DIR", str(tmp / "var"))
    monkeypatch.setenv("NEUROSANDBOX_CACHE_DIR", str(tmp / "cache"))
    run = tmp / "run"
    with OpenAIServer(Script(default_reply=OTHER_SHAPE)) as server:
        config = RunConfig(
            dataset=DatasetSpec(path=str(suite_dir)),
            models=[server_spec(server.url, name="team-vlm")],
            tasks=[TaskFamily.DIFFERENTIAL],
            generate=GenerateConfig(temperature=0.0, max_tokens=500, timeout_s=10),
            bertscore=False,
            cache_dir=str(tmp / "cache"),
        )
        asyncio.run(start_run(config, run))
    return run


def test_runs_show_and_the_checklist_say_why_an_answer_has_no_valid_format(
    phantom_suite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine_helpers import phantom_subset

    from evaluation.log.store import STORE_FILE
    from evaluation.reports import build_checklist
    from evaluation.reports.storeread import run_from_store

    run = _run_other_shape(
        phantom_subset(phantom_suite, ("stroke",), tmp_path / "suite"), tmp_path, monkeypatch
    )
    shown = CliRunner().invoke(app, ["runs", "show", str(run)])
    flat = " ".join(shown.output.split())
    assert "team-vlm" in flat and "'differential' is a required property" in flat, shown.output
    data = run_from_store(run / STORE_FILE)
    case = data.cases[0]
    checklist = build_checklist(
        case, [s for s in data.samples if s.scored.case_id == case.case_id], run_id=data.run_id
    )
    flags = [f for a in checklist.answers for f in a.flags if f.kind.value == "format_failure"]
    assert flags and "'differential' is a required property" in flags[0].detail
    assert len(flags[0].detail) <= MAX_REASON + 40
