"""Model adapters through litellm against a real OpenAI-compatible server on loopback, and the
built-in reference models and replay."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
from pathlib import Path

import pytest
from engine_helpers import brain_png, server_spec
from openai_server import Fault, OpenAIServer, Script

from evaluation.case import TaskFamily
from evaluation.modelio import GenerateConfig, ImagePart, Message, TextPart
from evaluation.models import create_model, resolve_specs
from evaluation.models.context import RequestContext, current_request
from evaluation.models.limiter import AdaptiveLimiter
from evaluation.models.litellm_adapter import LiteLLMAdapter
from evaluation.parsing import parse_answer
from evaluation.prompts import data_block
from evaluation.scores import ParseStatus

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
CFG = GenerateConfig(temperature=0.7, top_p=0.95, max_tokens=300, seed=5, timeout_s=10)


def _messages(tag: str = "") -> list[Message]:
    a, b = brain_png(1), brain_png(2)
    return [
        Message(role="system", content=[TextPart(text="You are a neurologist.")]),
        Message(
            role="user",
            content=[
                TextPart(text=f"Image 1: FLAIR {tag}"),
                ImagePart(png=a, sha256=hashlib.sha256(a).hexdigest(), label="FLAIR"),
                TextPart(text="Image 2: DWI"),
                ImagePart(png=b, sha256=hashlib.sha256(b).hexdigest(), label="DWI"),
                TextPart(text="Task: differential diagnosis."),
            ],
        ),
    ]


def test_images_arrive_in_order_as_png_data_urls_with_decoding_parameters() -> None:
    with OpenAIServer() as server:
        adapter = LiteLLMAdapter(server_spec(server.url))
        msgs = _messages()
        out = asyncio.run(adapter.generate(msgs, CFG))
        body = server.stats.bodies[0]
    assert out.error is None and out.text.startswith("{")
    user = body["messages"][1]["content"]
    assert [p["type"] for p in user] == ["text", "image_url", "text", "image_url", "text"]
    sent = [p["image_url"] for p in user if p["type"] == "image_url"]
    assert all(
        s["detail"] == "high" and s["url"].startswith("data:image/png;base64,") for s in sent
    )
    decoded = [base64.b64decode(s["url"].split(",", 1)[1]) for s in sent]
    expected = [p.png for p in msgs[1].content if isinstance(p, ImagePart)]
    assert decoded == expected  # bytes intact, order kept
    assert body["temperature"] == 0.7 and body["top_p"] == 0.95 and body["seed"] == 5
    assert body.get("n") in (None, 1)
    assert out.prompt_tokens == 100 and out.completion_tokens == 50
    assert out.cost_usd is not None and out.cost_usd > 0  # gpt-4o is in the bundled price map


def test_429_500_timeout_and_malformed_json_are_retried_then_answered() -> None:
    faults = [
        Fault("429", match="T429", times=2),
        Fault("500", match="T500", times=1),
        Fault("timeout", match="TIMEOUT", times=1, hold_s=3),
        Fault("malformed", match="MALFORMED", times=1),
    ]
    cfg = CFG.model_copy(update={"timeout_s": 0.6})
    with OpenAIServer(Script(faults=faults)) as server:
        adapter = LiteLLMAdapter(server_spec(server.url))

        async def go() -> list:
            tags = ["T429", "T500", "TIMEOUT", "MALFORMED"]
            return await asyncio.gather(*(adapter.generate(_messages(t), cfg) for t in tags))

        outs = asyncio.run(go())
        calls = server.stats.calls
    assert [o.error for o in outs] == [None] * 4
    assert [o.retries for o in outs] == [2, 1, 1, 1]
    assert calls == 4 + 5
    assert adapter.limiter.throttles == 2


def test_gives_up_after_max_retries_and_reports_the_error() -> None:
    with OpenAIServer(Script(faults=[Fault("500", times=100)])) as server:
        adapter = LiteLLMAdapter(server_spec(server.url, max_retries=2))
        out = asyncio.run(adapter.generate(_messages(), CFG))
        assert server.stats.calls == 3
    assert out.error and "InternalServerError" in out.error and out.retries == 2


def test_bad_request_is_not_retried() -> None:
    with OpenAIServer(Script(faults=[Fault("400", times=100)])) as server:
        out = asyncio.run(LiteLLMAdapter(server_spec(server.url)).generate(_messages(), CFG))
        assert server.stats.calls == 1
    assert out.error and "BadRequest" in out.error and out.retries == 0


def test_content_filter_is_recorded_as_refusal_not_error() -> None:
    with OpenAIServer(Script(faults=[Fault("refusal", times=1)])) as server:
        out = asyncio.run(LiteLLMAdapter(server_spec(server.url)).generate(_messages(), CFG))
    assert out.refusal and out.error is None
    assert (
        parse_answer(out.text, TaskFamily.DIFFERENTIAL, refusal=out.refusal).status
        is ParseStatus.REFUSAL
    )


def test_concurrency_limit_is_respected_and_reached() -> None:
    with OpenAIServer(Script(latency_s=0.15)) as server:
        adapter = LiteLLMAdapter(server_spec(server.url, concurrency=3))

        async def go() -> None:
            await asyncio.gather(*(adapter.generate(_messages(str(i)), CFG) for i in range(12)))

        asyncio.run(go())
        assert server.stats.max_in_flight == 3
        assert server.stats.calls == 12


def test_limiter_halves_on_throttle_and_recovers_additively() -> None:
    lim = AdaptiveLimiter(8, cooldown_s=0.0)
    lim.on_throttle()
    assert lim.current == 4
    lim.on_throttle()
    assert lim.current == 2
    for _ in range(10):
        lim.on_success()
    assert 2 < lim.current < 8

    async def fifo() -> list[int]:
        order: list[int] = []
        small = AdaptiveLimiter(1)

        async def job(i: int) -> None:
            async with small.slot():
                order.append(i)
                await asyncio.sleep(0.001)

        await asyncio.gather(*(job(i) for i in range(5)))
        return order

    assert asyncio.run(fifo()) == [0, 1, 2, 3, 4]


def test_api_key_comes_from_the_named_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NS_TEST_KEY", raising=False)
    with pytest.raises(Exception, match="NS_TEST_KEY"):
        LiteLLMAdapter(server_spec("http://127.0.0.1:9/v1", api_key_env="NS_TEST_KEY"))


def test_models_file_and_cli_names_resolve(tmp_path: Path) -> None:
    f = tmp_path / "models.yaml"
    f.write_text(
        "models:\n  - name: local-qwen\n    model: hosted_vllm/qwen2.5-vl\n"
        "    api_base: http://127.0.0.1:8000/v1\n    concurrency: 2\n"
    )
    specs = resolve_specs(
        ["local-qwen", "openai/gpt-4o", "reference/image-rules", "replay:x.jsonl"],
        models_file=f,
        api_base="http://10.0.0.5/v1",
    )
    assert [s.kind for s in specs] == ["litellm", "litellm", "reference/image-rules", "replay"]
    assert specs[0].api_base == "http://127.0.0.1:8000/v1" and specs[0].concurrency == 2
    assert specs[1].api_base == "http://10.0.0.5/v1"
    assert specs[2].api_base is None


def test_reference_models_answer_valid_json_for_every_family() -> None:
    specs = resolve_specs(["reference/text-prior", "reference/image-rules"])
    for spec in specs:
        model = create_model(spec)
        for family, task in (
            (TaskFamily.DIFFERENTIAL, "differential diagnosis"),
            (TaskFamily.LESION, "lesion recognition"),
            (TaskFamily.CLASSIFICATION, "structured classification of the image"),
        ):
            msgs = _messages()
            msgs[1].content[-1] = TextPart(text=f"Task: {task}.")
            out = asyncio.run(model.generate(msgs, CFG))
            parsed = parse_answer(out.text, family)
            assert parsed.status is ParseStatus.OK, (spec.name, family, parsed.error)


def test_text_prior_reads_the_record_not_the_template() -> None:
    from evaluation.models.reference_text import TextPriorModel

    msgs = [
        Message(
            role="user",
            content=[
                TextPart(
                    text="Clinical note:\n"
                    + data_block(
                        "Sudden left arm weakness, NIHSS 9, atrial fibrillation.", "clinical-note"
                    )
                    + "\n\nTask: structured classification of the image.\n"
                    "- diagnosis_detailed: carcinoma, glioma"
                )
            ],
        )
    ]
    out = asyncio.run(TextPriorModel().generate(msgs, CFG))
    assert json.loads(out.text)["diagnosis_name"] == "stroke"


def test_replay_answers_by_case_task_sample_and_turn(tmp_path: Path) -> None:
    f = tmp_path / "answers.jsonl"
    f.write_text(
        json.dumps({"case_id": "c1", "task": "differential", "sample": 1, "text": "S1"})
        + "\n"
        + json.dumps({"case_id": "c1", "task": "multiturn", "sample": 0, "turn": 2, "text": "T2"})
        + "\n"
    )
    model = create_model(resolve_specs([f"replay:{f}"])[0])

    def ask(task: str, sample: int, turn: int) -> str:
        ctx = RequestContext(
            case_id="c1", task=task, family=task, sample=sample, turn=turn, cache_key="k"
        )
        token = current_request.set(ctx)
        try:
            out = asyncio.run(model.generate([], CFG))
        finally:
            current_request.reset(token)
        return out.text or f"ERROR {out.error}"

    assert ask("differential", 1, 1) == "S1"
    assert ask("multiturn", 0, 2) == "T2"
    assert ask("differential", 0, 1).startswith("ERROR replay: no answer")


def test_calls_through_worker_processes_keep_retries_and_limits_in_the_run() -> None:
    from evaluation.models.call_pool import CallPool

    with OpenAIServer(
        Script(latency_s=0.05, faults=[Fault("429", match="T429", times=1)])
    ) as server:
        adapter = LiteLLMAdapter(
            server_spec(server.url, concurrency=2), pool=CallPool(1, prepare_inline=True)
        )
        try:

            async def go() -> list:
                return await asyncio.gather(
                    *(adapter.generate(_messages(t), CFG) for t in ("T429", "a", "b", "c"))
                )

            outs = asyncio.run(go())
        finally:
            adapter.close()
        assert server.stats.max_in_flight <= 2 and server.stats.calls == 5
    assert [o.error for o in outs] == [None] * 4 and outs[0].retries == 1
    assert adapter.limiter.throttles == 1 and outs[1].cost_usd and outs[1].prompt_tokens == 100
