"""Reports read straight from the evaluation engine's run folder (run.sqlite + dataset)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from engine_helpers import server_spec, write_nmb
from openai_server import OpenAIServer, Script

from evaluation.datasets import DatasetSpec
from evaluation.engine import start_run
from evaluation.modelio import GenerateConfig
from evaluation.reports import load_run, write_report
from evaluation.reports.checklist_view import FlagKind
from evaluation.runconfig import RunConfig
from evaluation.scores import ParseStatus

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def test_report_from_an_engine_run_folder(tmp_path: Path) -> None:
    data, answers = write_nmb(tmp_path / "data", 3, marker={1: "FMTFAIL"})
    script = Script(
        latency_s=0.01, replies=[("FMTFAIL", "Probably MS <script>alert(1)</script>, no JSON.")]
    )
    run_dir = tmp_path / "run"
    with OpenAIServer(script) as server:
        config = RunConfig(
            dataset=DatasetSpec(path=str(data), answers=str(answers)),
            models=[server_spec(server.url)],
            generate=GenerateConfig(temperature=0.7, max_tokens=300, timeout_s=10),
            bertscore=False,
            cache_dir=str(tmp_path / "cache"),
            samples=2,
        )
        asyncio.run(start_run(config, run_dir))
    run = load_run(run_dir)  # the server is gone: nothing may call a model now
    assert run.run_id == config.run_id and len(run.cases) == 3 and len(run.samples) == 6
    statuses = {s.scored.case_id: s.scored.status for s in run.samples}
    assert statuses["nmb-001"] is ParseStatus.FORMAT_FAILURE
    assert statuses["nmb-000"] is ParseStatus.OK
    ok = next(s for s in run.samples if s.scored.case_id == "nmb-000")
    assert ok.answer is not None and ok.text and ok.images_sent
    index = write_report(run, tmp_path / "report", pdf=False)
    assert set(index.cases) == {"nmb-000", "nmb-001", "nmb-002"}
    from evaluation.reports.bundle import load_checklist

    cl = load_checklist(tmp_path / "report", "nmb-001")
    assert FlagKind.FORMAT_FAILURE in {f.kind for f in cl.flags}
    assert cl.images and all(i.verified and i.sent for i in cl.images)
    html = Path(index.cases["nmb-001"]).read_text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>alert(1)" not in html
