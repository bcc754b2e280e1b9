"""Refusals are recognised by their structure after Unicode normalisation (issue 18)."""

from __future__ import annotations

import pytest

from evaluation.case import TaskFamily
from evaluation.parsing import parse_answer
from evaluation.scores import ParseStatus

REFUSALS = [
    "I can’t provide a diagnosis from these images.",
    "I won't provide a diagnosis.",
    "As an AI language model, I cannot give medical advice.",
    "I’m not able to interpret medical images. Please consult a radiologist.",
    "Sorry — I am unable to offer a medical opinion on this scan.",
    "I will not diagnose patients; please see a qualified clinician.",
    "I must respectfully decline to interpret this study.",
    "I do not feel comfortable providing a diagnosis.",
    "I'm sorry, but I can't help with diagnosing this MRI.",
]
NOT_REFUSALS = [
    "The lesion can't be a meningioma; it is probably a glioma. No JSON, sorry.",
    "Findings: left frontal mass. Diagnosis: glioblastoma.",
]


@pytest.mark.parametrize("text", REFUSALS)
def test_refusals_are_refusals(text: str) -> None:
    assert parse_answer(text, TaskFamily.DIFFERENTIAL).status is ParseStatus.REFUSAL


@pytest.mark.parametrize("text", NOT_REFUSALS)
def test_prose_answers_are_format_failures(text: str) -> None:
    assert parse_answer(text, TaskFamily.DIFFERENTIAL).status is ParseStatus.FORMAT_FAILURE


@pytest.mark.parametrize("kind", ["no_choices", "null_content"])
def test_a_provider_fault_is_a_retried_call_error_not_a_format_failure(kind: str) -> None:
    """Empty choices, or null content without a content-filter finish: the provider failed,
    not the model. Retried; if it persists, a call error (status error), never a format
    failure. A real content-filter block stays a refusal."""
    import asyncio
    import os

    from engine_helpers import server_spec
    from openai_server import DEFAULT_REPLY, Fault, OpenAIServer, Script

    from evaluation.modelio import GenerateConfig, Message, TextPart
    from evaluation.models.litellm_adapter import LiteLLMAdapter

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    cfg = GenerateConfig(temperature=0.0, max_tokens=100, timeout_s=10)
    msgs = [Message(role="user", content=[TextPart(text="hello")])]
    with OpenAIServer(Script(faults=[Fault(kind, times=1)])) as server:
        out = asyncio.run(LiteLLMAdapter(server_spec(server.url)).generate(msgs, cfg))
        assert server.stats.calls == 2  # retried once, then answered
    assert out.error is None and out.text == DEFAULT_REPLY and out.retries == 1
    with OpenAIServer(Script(faults=[Fault(kind, times=100)])) as server:
        spec = server_spec(server.url, max_retries=2)
        out = asyncio.run(LiteLLMAdapter(spec).generate(msgs, cfg))
    assert out.error and not out.refusal, out
    status = parse_answer(out.text or "", TaskFamily.DIFFERENTIAL, error=out.error).status
    assert status is ParseStatus.ERROR


@pytest.mark.parametrize(
    "resp",
    [
        {"choices": None},  # choices null rather than empty
        {"choices": [{"finish_reason": "stop"}]},  # a choice without a message
        {"choices": [{"message": {"content": None}, "finish_reason": "length"}]},
        {"choices": [{"message": {"content": None}, "finish_reason": None}]},
    ],
)
def test_other_shapes_of_a_provider_fault_are_faults(resp: dict) -> None:  # type: ignore[type-arg]
    """Members of the class beside the two the loopback server serves: each is the provider's
    fault (retried), never an answer."""
    from types import SimpleNamespace

    from evaluation.models.call_pool import summarise_response

    def ns(x: object) -> object:
        if isinstance(x, dict):
            return SimpleNamespace(**{k: ns(v) for k, v in x.items()})
        if isinstance(x, list):
            return [ns(v) for v in x]
        return x

    out = summarise_response(ns(resp))
    assert out["fault"], out
    blocked = ns({"choices": [{"message": {"content": None}, "finish_reason": "content_filter"}]})
    assert summarise_response(blocked)["fault"] is None  # a content-filter block: a refusal
