"""Every provider family on the wire: a real phantom case (seven rendered images) through the
litellm adapter to a loopback server speaking that provider's format.

For OpenAI, Anthropic, Gemini, xAI, OpenRouter, Ollama (native chat) and vLLM: every image
arrives intact and where it was among the text; the system prompt and the decoding parameters
arrive where and as the provider names them (Claude Sonnet 4.5 gets temperature without top_p,
which it rejects beside it); no ``n``; the provider's usage becomes tokens and cost; rate
limits, overloads and a 200 whose body is not JSON are retried with backoff; refusals and
safety blocks, whether the provider flags them or the model says so, are refusals, not wrong
answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest
from providers import Fault
from providers.harness import (
    FAMILIES,
    SleepRecorder,
    b64,
    expected_cost,
    expected_sequence,
    images_of,
    normalise,
    phantom_messages,
    raw_images,
)

from evaluation.case import TaskFamily
from evaluation.modelio import GenerateConfig
from evaluation.models.litellm_adapter import LiteLLMAdapter
from evaluation.parsing import parse_answer
from evaluation.scores import ParseStatus

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
CFG = GenerateConfig(temperature=0.7, top_p=0.95, max_tokens=300, seed=5, timeout_s=20)


@pytest.fixture(scope="module")
def case_messages(phantom_suite, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return phantom_messages(phantom_suite, tmp_path_factory.mktemp("provider-wire"))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_phantom_case_arrives_intact_in_order_with_the_providers_names(
    family: str, case_messages
) -> None:
    fam = FAMILIES[family]
    case, messages = case_messages
    with fam.make() as server:
        out = asyncio.run(LiteLLMAdapter(fam.spec(server)).generate(messages, CFG))
        (ex,) = server.exchanges
    assert ex.problems == [] and ex.status == 200, ex.problems
    assert out.error is None and out.text.startswith("{")
    assert all(a["kind"].startswith("param") for a in out.adjustments)  # images fit as they are
    body = ex.body
    # Every image intact: the bytes that arrived are the rendered PNGs of the case, in order.
    rendered = [Path(ref.path).read_bytes() for ref in case.images]
    shown = images_of(messages)
    assert len(shown) == 7
    received = type(server).images(body)
    assert [hashlib.sha256(b).hexdigest() for b in received] == [p.sha256 for p in shown]
    assert {hashlib.sha256(b).hexdigest() for b in received} <= {
        hashlib.sha256(r).hexdigest() for r in rendered
    }
    if family in ("anthropic", "gemini", "ollama"):  # raw base64 of the very PNG, no data: URL
        assert raw_images(body, family) == [b64(p.png) for p in shown]
    else:
        assert all(u.startswith("data:image/png;base64,") for u in raw_images(body, family))
    # Text keeps its place around the images; the system prompt goes where the provider wants.
    assert normalise(type(server).sequence(body)) == normalise(expected_sequence(messages))
    assert " ".join(fam.system(body).split()) == " ".join(messages[0].content[0].text.split())  # type: ignore[union-attr]
    # Decoding parameters as the provider names them; one sample per call, never ``n``.
    # Claude Sonnet 4.5 rejects temperature and top_p together: only temperature goes, and the
    # output says top_p was not sent.
    not_sent = {a["param"]: a["value"] for a in out.adjustments if a["kind"] == "param_not_sent"}
    if family == "anthropic":
        assert fam.decoding(body) == {"temperature": 0.7, "top_p": None, "max_tokens": 300}
        assert not_sent["top_p"] == 0.95
    else:
        assert fam.decoding(body) == {"temperature": 0.7, "top_p": 0.95, "max_tokens": 300}
        assert "top_p" not in not_sent
    assert "n" not in body and "candidateCount" not in str(body)
    # The provider's usage numbers become tokens, and cost when the price is known.
    assert (out.prompt_tokens, out.completion_tokens) == (1200, 80)
    if family == "openrouter":
        assert out.cost_usd == pytest.approx(server.cost)  # what OpenRouter says it charged
    elif fam.priced:
        assert out.cost_usd == pytest.approx(expected_cost(fam.model, 1200, 80))
    else:
        assert out.cost_usd is None  # unknown price: None, never a made-up 0


def test_ollama_images_go_where_the_text_places_them_not_all_in_front(case_messages) -> None:
    fam = FAMILIES["ollama"]
    _, messages = case_messages
    with fam.make() as server:
        asyncio.run(LiteLLMAdapter(fam.spec(server)).generate(messages, CFG))
    user = server.bodies[0]["messages"][1]
    # One [img] marker per image, each right after the text that names it.
    assert user["content"].count("[img]") == 7 == len(user["images"])
    assert user["content"].index("Image 1:") < user["content"].index("[img]")
    assert server.bodies[0]["options"]["seed"] == 5 and server.bodies[0]["stream"] is False


@pytest.mark.parametrize(
    ("family", "kind", "asked_s"),
    [
        ("openai", "429", 1.0),
        ("anthropic", "429", 1.0),
        ("anthropic", "529", None),
        ("gemini", "429", 1.0),
        ("gemini", "503", None),
        ("xai", "429", 1.0),
        ("openrouter", "429", 1.0),
        ("ollama", "503", None),
        ("vllm", "429", 1.0),  # a vLLM behind a rate-limiting gateway
    ],
)
def test_rate_limits_and_overloads_are_retried_with_backoff(
    family: str, kind: str, asked_s: float | None, case_messages
) -> None:
    fam = FAMILIES[family]
    _, messages = case_messages
    sleep = SleepRecorder()
    with fam.make(faults=[Fault(kind, times=2)]) as server:
        adapter = LiteLLMAdapter(
            fam.spec(server, backoff_base_s=0.2, backoff_max_s=5.0), sleep=sleep
        )
        out = asyncio.run(adapter.generate(messages, CFG))
        statuses = [e.status for e in server.exchanges]
    assert statuses == [int(kind), int(kind), 200]
    assert out.error is None and out.retries == 2 and out.text
    # Exponential backoff with jitter (0.1-0.2 s, then 0.2-0.4 s), at least what was asked.
    assert len(sleep.delays) == 2
    assert sleep.delays[0] >= 0.1 and sleep.delays[1] >= 0.2
    if asked_s is not None:
        assert min(sleep.delays) >= asked_s
    # A rate limit or an overload also halves the concurrency limit: it is a throttle.
    assert adapter.limiter.throttles == 2


@pytest.mark.parametrize(
    ("family", "kind"),
    [
        ("anthropic", "refusal"),  # stop_reason "refusal"
        ("gemini", "safety"),  # finishReason SAFETY, no content
        ("gemini", "blocked"),  # promptFeedback.blockReason, no candidates
        ("openai", "refusal"),  # message.refusal
        ("openai", "content_filter"),  # finish_reason content_filter
        ("openrouter", "content_filter"),
        ("xai", "content_filter"),
    ],
)
def test_refusals_and_safety_blocks_are_refusals_not_wrong_answers(
    family: str, kind: str, case_messages
) -> None:
    fam = FAMILIES[family]
    _, messages = case_messages
    with fam.make(faults=[Fault(kind)]) as server:
        out = asyncio.run(LiteLLMAdapter(fam.spec(server)).generate(messages, CFG))
        assert server.calls == 1  # not retried
    assert out.refusal and out.error is None
    parsed = parse_answer(out.text, TaskFamily.DIFFERENTIAL, refusal=out.refusal)
    assert parsed.status is ParseStatus.REFUSAL


REFUSAL_TEXT = (
    "I'm sorry, but I can't provide a diagnosis from these images. Please consult a radiologist."
)


@pytest.mark.parametrize("family", ["xai", "ollama", "vllm"])
def test_a_refusal_in_the_models_own_words_is_a_refusal_not_a_wrong_answer(
    family: str, case_messages
) -> None:
    # Ollama and vLLM have no safety filter (and no content_filter finish): an open-weights
    # model declines in plain text with a normal "stop"; Grok does the same.
    fam = FAMILIES[family]
    _, messages = case_messages
    with fam.make(reply=REFUSAL_TEXT) as server:
        out = asyncio.run(LiteLLMAdapter(fam.spec(server)).generate(messages, CFG))
        assert server.calls == 1 and server.problems() == []  # answered once, not retried
    assert out.error is None and out.text == REFUSAL_TEXT
    assert not out.refusal and out.finish_reason == "stop"  # the provider flagged nothing
    parsed = parse_answer(out.text, TaskFamily.DIFFERENTIAL, refusal=out.refusal)
    assert parsed.status is ParseStatus.REFUSAL


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_200_whose_body_is_not_json_is_retried_as_a_glitch_not_a_throttle(
    family: str, case_messages
) -> None:
    # A proxy in front of the provider answers 200 with an HTML page once, then the provider
    # answers: litellm raises (APIError, APIConnectionError, InternalServerError or, for
    # Gemini, BadRequestError, by route), and the adapter retries rather than failing the call.
    fam = FAMILIES[family]
    _, messages = case_messages
    sleep = SleepRecorder()
    with fam.make(faults=[Fault("garbled")]) as server:
        adapter = LiteLLMAdapter(fam.spec(server), sleep=sleep)
        out = asyncio.run(adapter.generate(messages, CFG))
        answered = [(e.status, e.fault) for e in server.exchanges]
    assert answered == [(200, "garbled"), (200, None)]
    assert out.error is None and out.retries == 1 and out.text == server.reply
    assert len(sleep.delays) == 1 and adapter.limiter.throttles == 0  # backoff, no slow-down
