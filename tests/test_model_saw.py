"""The checklist's "What the model saw" is the recorded requests, not the case's record: a note
the prompt never carried (an HTML DocumentReference in the record) is not shown, and what is
shown is byte for byte the text that was sent, as the PHI gate left it for a remote model."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
from html import unescape
from pathlib import Path

from engine_helpers import brain_png
from openai_server import OpenAIServer

from evaluation import Case as EvalCase
from evaluation import (
    Dataset,
    DatasetSpec,
    GenerateConfig,
    ImageRef,
    Provenance,
    RunConfig,
    TaskFamily,
    dataset_hash,
    start_run,
)
from evaluation.log import STORE_FILE
from evaluation.reports import run_from_store
from evaluation.reports.checklist import build_checklist
from evaluation.reports.html import render_checklist
from gateway.settings import Settings

HTML_NOTE = "<p>HTMLNOTE-7731: seen with her girlfriend Wilhelmina Quarrington.</p>"
SENT_NOTE = "Plain note: Zebulon Fairweather-Oakes has had left arm weakness for 2 hours."


def _case(tmp: Path) -> EvalCase:
    png = tmp / "flair.png"
    png.write_bytes(brain_png(3, lesion=(40, 30)))
    bundle = {
        "resourceType": "Bundle",
        "type": "collection",
        "entry": [
            {
                "resource": {
                    "resourceType": "Patient",
                    "name": [{"family": "Fairweather-Oakes", "given": ["Zebulon"]}],
                    "gender": "male",
                    "birthDate": "1961-03-03",
                }
            },
            {
                "resource": {
                    "resourceType": "DocumentReference",
                    "status": "current",
                    "content": [
                        {
                            "attachment": {
                                "contentType": "text/html",
                                "data": base64.b64encode(HTML_NOTE.encode()).decode(),
                            }
                        }
                    ],
                }
            },
        ],
    }
    return EvalCase(
        case_id="note-case",
        images=[
            ImageRef(
                path=str(png),
                sha256=hashlib.sha256(png.read_bytes()).hexdigest(),
                label="FLAIR axial",
                series_class="FLAIR",
                kind="montage",
            )
        ],
        ehr=bundle,
        note=SENT_NOTE,
        tasks=[TaskFamily.DIFFERENTIAL],
        provenance=Provenance(source="test"),
    )


def test_the_checklist_shows_exactly_the_requests_and_nothing_else(tmp_path: Path) -> None:
    case = _case(tmp_path)
    models = tmp_path / "models.yaml"
    models.write_text("models:\n  - name: ward-vlm\n    model: openai/gpt-4o\n    max_retries: 1\n")
    spec = DatasetSpec(path=str(tmp_path), kind="memory")
    dataset = Dataset(name="t", kind="memory", spec=spec, cases=[case], hash=dataset_hash([case]))
    work = tmp_path / "run"
    with OpenAIServer() as server:
        # no trusted host: the loopback endpoint is remote for the PHI gate
        settings = Settings(
            data_dir=tmp_path, models_file=models, api_base=server.url, phi_trusted_hosts=[]
        )
        config = RunConfig.from_settings(
            settings,
            spec,
            models=["reference/image-rules", "ward-vlm"],
            cache_dir=tmp_path / "cache",
            run_id="r1",
            tasks=[TaskFamily.DIFFERENTIAL],
            generate=GenerateConfig(temperature=0.0, max_tokens=512, json_mode=True),
            bertscore=False,
        )
        asyncio.run(start_run(config, work, dataset=dataset))
        bodies = list(server.stats.bodies)
    run = run_from_store(work / STORE_FILE, dataset=dataset)
    checklist = build_checklist(
        case, run.samples_of(case.case_id), run_id=run.run_id, requests=run.requests
    )
    page = render_checklist(checklist, lambda i: None)
    dumped = checklist.model_dump_json()

    # the record's HTML note never reached a prompt: it is nowhere on the checklist
    assert "HTMLNOTE-7731" not in dumped and "Quarrington" not in dumped
    assert "HTMLNOTE-7731" not in page and "Quarrington" not in page

    by_model = {a.split(" ")[0]: item for item in checklist.model_saw for a in item.answers}
    assert set(by_model) == {"reference/image-rules", "ward-vlm"}
    assert checklist.model_saw_recorded

    # the remote model: the texts shown are byte for byte the texts on the wire
    [body] = bodies
    wire = [
        part["text"] if isinstance(part, dict) else part
        for m in body["messages"]
        for part in (m["content"] if isinstance(m["content"], list) else [m["content"]])
        if isinstance(part, str) or part.get("type") == "text"
    ]
    shown = [p.text for m in by_model["ward-vlm"].messages for p in m.parts if p.type == "text"]
    assert shown == wire
    remote_text = "\n".join(shown)
    assert "Fairweather" not in remote_text and "Zebulon" not in remote_text  # redacted
    assert "left arm weakness" in remote_text  # the note as the gate left it
    # the trusted in-process model got the note as written, and the page says so
    local_text = "\n".join(
        p.text for m in by_model["reference/image-rules"].messages for p in m.parts
    )
    assert SENT_NOTE in local_text
    # the page: each text part, unescaped, is the text sent, in order, and nothing else
    on_page = [
        unescape(t) for t in re.findall(r'<div class="pre sent-text">(.*?)</div>', page, re.S)
    ]
    sent = [
        p.text for i in checklist.model_saw for m in i.messages for p in m.parts if p.type == "text"
    ]
    assert on_page == sent
    assert page.count("[image: FLAIR axial") == len(checklist.model_saw)  # named by its label
