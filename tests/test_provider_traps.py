"""The known traps of provider paths, each against a server that enforces it as the provider does:
image size and side limits (re-encode or downscale, never drop), images per request (montage)
and per message (split), reasoning models that reject temperature/top_p, Claude models that
reject temperature and top_p together, Anthropic's temperature range, ``data:`` URLs where
raw base64 is required, and ``n``, which a sample never uses."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from PIL import Image
from providers import AnthropicServer, GeminiServer, OllamaServer, OpenAICompatServer
from providers.harness import (
    LEGEND,
    b64,
    expected_sequence,
    images_of,
    normalise,
    phantom_messages,
)

from evaluation.modelio import GenerateConfig, ImagePart, Message, TextPart
from evaluation.models.litellm_adapter import LiteLLMAdapter
from evaluation.models.providers import profile_for
from evaluation.models.spec import ModelSpec

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
CFG = GenerateConfig(temperature=0.7, top_p=0.95, max_tokens=300, timeout_s=30)


@pytest.fixture(scope="module")
def case_messages(phantom_suite, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return phantom_messages(phantom_suite, tmp_path_factory.mktemp("provider-traps"))


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _part(data: bytes, label: str) -> ImagePart:
    return ImagePart(png=data, sha256=hashlib.sha256(data).hexdigest(), label=label)


def _user(parts: list[ImagePart]) -> list[Message]:
    content: list[TextPart | ImagePart] = []
    for n, p in enumerate(parts, 1):
        content += [TextPart(text=f"Image {n}: {p.label}"), p]
    content.append(TextPart(text="Task: differential diagnosis."))
    return [Message(role="user", content=content)]


def _spec(model: str, base: str, **kw: object) -> ModelSpec:
    return ModelSpec(
        name="m",
        model=model,
        api_base=base,
        backoff_base_s=0.01,
        backoff_max_s=0.02,
        max_retries=1,
        **kw,
    )


def test_anthropic_image_over_5_mb_is_downscaled_with_a_warning_and_recorded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    noise = np.random.default_rng(3).integers(0, 256, (2048, 2048), dtype=np.uint8)
    big = _part(_png(Image.fromarray(noise)), "noise")
    small = _part(_png(Image.new("L", (64, 64), 90)), "grey")
    assert len(big.png) * 4 / 3 > 5 * 1024 * 1024  # over Anthropic's limit as base64
    with AnthropicServer() as server, caplog.at_level(logging.WARNING):
        adapter = LiteLLMAdapter(_spec("anthropic/claude-sonnet-4-5", server.api_base))
        out = asyncio.run(adapter.generate(_user([big, small]), CFG))
        (ex,) = server.exchanges
    assert ex.problems == [] and out.error is None
    sent = AnthropicServer.images(ex.body)
    assert len(sent) == 2 and sent[1] == small.png  # both sent; the small one untouched
    w, h = Image.open(io.BytesIO(sent[0])).size
    assert w < 2048 and abs(w / h - 1.0) < 0.01 and len(sent[0]) * 4 / 3 <= 5 * 1024 * 1024
    (adj,) = [a for a in out.adjustments if not a["kind"].startswith("param")]
    assert adj["kind"] == "downscaled" and adj["image"] == big.sha256
    assert adj["into"] == hashlib.sha256(sent[0]).hexdigest() and adj["from_px"] == [2048, 2048]
    assert "5242880 bytes" in adj["reason"]
    assert any("downscaled" in r.getMessage() for r in caplog.records)


def test_anthropic_many_image_request_fits_the_side_limit_and_the_image_count() -> None:
    # 101 images of 2100 px: over 100 per request, and over 2000 px a side for >20 images.
    parts = [_part(_png(Image.new("L", (2100, 8), n)), f"strip {n}") for n in range(101)]
    with AnthropicServer() as server:
        adapter = LiteLLMAdapter(_spec("anthropic/claude-sonnet-4-5", server.api_base))
        out = asyncio.run(adapter.generate(_user(parts), CFG))
        (ex,) = server.exchanges
    assert ex.problems == [] and out.error is None
    sent = AnthropicServer.images(ex.body)
    assert len(sent) == 100 and all(Image.open(io.BytesIO(b)).width <= 2000 for b in sent)
    (montage,) = [a for a in out.adjustments if a["kind"] == "montage"]
    assert montage["images"] == [parts[0].sha256, parts[1].sha256]  # the fewest merged
    assert "at most 100" in montage["reason"]
    assert sum(a["kind"] == "downscaled" for a in out.adjustments) == 100
    texts = [b["text"] for b in ex.body["messages"][0]["content"] if b["type"] == "text"]
    assert any("montage of 2 images" in t and "strip 0" in t and "strip 1" in t for t in texts)


def test_vllm_limit_mm_per_prompt_montage_of_the_case_recorded(case_messages) -> None:
    _, messages = case_messages
    shown = images_of(messages)
    with OpenAICompatServer("vllm", limit_mm_per_prompt=1) as server:
        # Not told the server's limit: vLLM's 400 is reported, not retried.
        plain = asyncio.run(
            LiteLLMAdapter(_spec("hosted_vllm/medgemma", server.api_base)).generate(messages, CFG)
        )
        assert server.calls == 1 and plain.error and "At most 1 image(s)" in plain.error
        spec = _spec("hosted_vllm/medgemma", server.api_base, max_images_per_request=1)
        out = asyncio.run(LiteLLMAdapter(spec).generate(messages, CFG))
        ex = server.exchanges[-1]
    assert ex.problems == [] and out.error is None
    (sent,) = OpenAICompatServer.images(ex.body)
    (adj,) = out.adjustments
    assert adj["kind"] == "montage" and adj["images"] == [p.sha256 for p in shown]
    assert adj["grid"] == [3, 3] and adj["into"] == hashlib.sha256(sent).hexdigest()
    # Tile 1 holds the first rendered image pixel for pixel (no resampling).
    sheet = Image.open(io.BytesIO(sent))
    first = Image.open(io.BytesIO(shown[0].png))
    tw = max(Image.open(io.BytesIO(p.png)).width for p in shown)
    th = max(Image.open(io.BytesIO(p.png)).height for p in shown)
    x0, y0 = (tw - first.width) // 2, 14 + (th - first.height) // 2
    tile = sheet.crop((x0, y0, x0 + first.width, y0 + first.height))
    assert np.array_equal(np.asarray(tile.convert(first.mode)), np.asarray(first))
    # The legend names every tile's image, in order, where the images were.
    texts = [p.get("text", "") for p in ex.body["messages"][1]["content"]]
    (legend,) = [t for t in texts if LEGEND.search(t)]
    assert LEGEND.search(legend).group(1) == "7"  # type: ignore[union-attr]
    # each label a JSON string (labels come from DICOM headers: never pasted raw)
    labels = [json.dumps(p.label, ensure_ascii=False) for p in shown]
    positions = [legend.index(f"{n} = {label}") for n, label in enumerate(labels, 1)]
    assert positions == sorted(positions)


def test_ollama_llama32_vision_gets_one_montage_or_one_image_per_message(case_messages) -> None:
    _, messages = case_messages
    shown = images_of(messages)
    model = "ollama_chat/llama3.2-vision"
    with OllamaServer(mllama=("llama3.2-vision",)) as server:
        montaged = asyncio.run(
            LiteLLMAdapter(_spec(model, server.api_base)).generate(messages, CFG)
        )
        spec = _spec(model, server.api_base, max_images_per_request=0, max_images_per_message=1)
        split = asyncio.run(LiteLLMAdapter(spec).generate(messages, CFG))
        first, second = server.exchanges
    assert first.problems == [] and second.problems == [] and not montaged.error and not split.error
    assert len(OllamaServer.images(first.body)) == 1
    assert [a["kind"] for a in montaged.adjustments] == ["montage"]
    # Split: seven consecutive user messages of one image each, text and images still in order.
    users = [m for m in second.body["messages"] if m["role"] == "user"]
    assert [len(m["images"]) for m in users] == [1] * 7
    assert normalise(OllamaServer.sequence(second.body)) == normalise(expected_sequence(messages))
    (adj,) = split.adjustments
    assert (
        adj["kind"] == "split"
        and adj["messages"] == 7
        and adj["images"] == [p.sha256 for p in shown]
    )


@pytest.mark.parametrize("model", ["openai/o1", "openai/o3", "openai/gpt-5"])
def test_reasoning_models_get_no_temperature_or_top_p_and_the_run_records_it(model: str) -> None:
    parts = [_part(_png(Image.new("L", (32, 32), 50)), "grey")]
    with OpenAICompatServer("openai") as server:
        out = asyncio.run(LiteLLMAdapter(_spec(model, server.api_base)).generate(_user(parts), CFG))
        (ex,) = server.exchanges
    assert ex.problems == [] and out.error is None  # the server rejects temperature for these
    assert "temperature" not in ex.body and "top_p" not in ex.body
    assert ex.body["max_completion_tokens"] == 300 and "max_tokens" not in ex.body
    dropped = {a["param"]: a["value"] for a in out.adjustments if a["kind"] == "param_not_sent"}
    assert dropped == {"temperature": 0.7, "top_p": 0.95}


def test_a_chat_model_keeps_its_temperature_and_a_spec_can_declare_a_reasoning_model() -> None:
    parts = [_part(_png(Image.new("L", (32, 32), 50)), "grey")]
    with OpenAICompatServer("vllm") as server:
        chat = asyncio.run(
            LiteLLMAdapter(_spec("openai/gpt-5-chat-latest", server.api_base)).generate(
                _user(parts), CFG
            )
        )
        spec = _spec("hosted_vllm/qwq-vl", server.api_base, reasoning=True)
        declared = asyncio.run(LiteLLMAdapter(spec).generate(_user(parts), CFG))
        first, second = server.bodies
    assert first["temperature"] == 0.7 and chat.adjustments == []
    assert "temperature" not in second and {a["param"] for a in declared.adjustments} == {
        "temperature",
        "top_p",
    }


def test_anthropic_temperature_above_1_is_clamped_and_unsupported_params_recorded() -> None:
    parts = [_part(_png(Image.new("L", (32, 32), 50)), "grey")]
    cfg = CFG.model_copy(update={"temperature": 1.4, "seed": 9, "json_mode": True})
    with AnthropicServer() as server:
        out = asyncio.run(
            LiteLLMAdapter(_spec("anthropic/claude-sonnet-4-5", server.api_base)).generate(
                _user(parts), cfg
            )
        )
        (ex,) = server.exchanges
    assert ex.problems == [] and ex.body["temperature"] == 1.0 and "seed" not in ex.body
    kinds = {(a["kind"], a["param"]) for a in out.adjustments}
    assert kinds == {
        ("param_clamped", "temperature"),
        ("param_not_sent", "top_p"),
        ("param_not_sent", "seed"),
        ("param_not_sent", "response_format"),
    }


# Dated snapshots: names no other test uses, so each model's once-per-process warning is seen.
@pytest.mark.parametrize(
    "model", ["claude-sonnet-4-5-20250929", "claude-opus-4-1-20250805", "claude-haiku-4-5-20251001"]
)
def test_claude_models_that_reject_temperature_with_top_p_get_temperature_alone_recorded(
    model: str, caplog: pytest.LogCaptureFixture
) -> None:
    parts = [_part(_png(Image.new("L", (32, 32), 50)), "grey")]
    with AnthropicServer() as server, caplog.at_level(logging.WARNING):
        adapter = LiteLLMAdapter(_spec(f"anthropic/{model}", server.api_base))
        out = asyncio.run(adapter.generate(_user(parts), CFG))
        (ex,) = server.exchanges
    assert ex.problems == [] and ex.status == 200 and out.error is None
    assert ex.body["temperature"] == 0.7 and "top_p" not in ex.body
    (adj,) = [a for a in out.adjustments if a["param"] == "top_p"]
    assert adj["kind"] == "param_not_sent" and adj["value"] == 0.95
    assert "temperature or top_p, not both" in adj["reason"]
    assert any(model in r.getMessage() and "top_p" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("model", ["claude-sonnet-4-20250514", "claude-3-7-sonnet-latest"])
def test_earlier_claude_models_still_get_both_temperature_and_top_p(model: str) -> None:
    parts = [_part(_png(Image.new("L", (32, 32), 50)), "grey")]
    with AnthropicServer() as server:
        adapter = LiteLLMAdapter(_spec(f"anthropic/{model}", server.api_base))
        out = asyncio.run(adapter.generate(_user(parts), CFG))
        (ex,) = server.exchanges
    assert ex.problems == [] and out.error is None
    assert (ex.body["temperature"], ex.body["top_p"]) == (0.7, 0.95)
    assert not [a for a in out.adjustments if a["param"] in ("temperature", "top_p")]


def test_claude_opus_4_7_sampling_is_left_to_litellm_and_recorded_once() -> None:
    # litellm drops Opus 4.7's removed sampling parameters itself: the adapter must not also
    # drop top_p for "not both", or the run would record it twice with the wrong reason.
    parts = [_part(_png(Image.new("L", (32, 32), 50)), "grey")]
    with AnthropicServer() as server:
        adapter = LiteLLMAdapter(_spec("anthropic/claude-opus-4-7", server.api_base))
        out = asyncio.run(adapter.generate(_user(parts), CFG))
        (ex,) = server.exchanges
    assert ex.problems == [] and out.error is None
    assert "temperature" not in ex.body and "top_p" not in ex.body
    sampling = [a for a in out.adjustments if a["param"] in ("temperature", "top_p")]
    assert sorted(a["param"] for a in sampling) == ["temperature", "top_p"]
    assert all(a["reason"].startswith("litellm does not send it") for a in sampling)


# --------------------------------------------------------------------------- raw requests
# Bodies sent straight to the servers, bypassing litellm: the servers' checks are real.


def _post(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, str]:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _anthropic(model: str, image: str, **params: Any) -> dict[str, Any]:
    source = {"type": "base64", "media_type": "image/png", "data": image}
    content = [{"type": "image", "source": source}, {"type": "text", "text": "Diagnosis?"}]
    return {
        "model": model,
        "max_tokens": 50,
        "messages": [{"role": "user", "content": content}],
        **params,
    }


ANTHROPIC_HEADERS = {"x-api-key": "k", "anthropic-version": "2023-06-01"}


@pytest.mark.parametrize(
    ("model", "rejected"),
    [
        ("claude-sonnet-4-5", True),
        ("claude-opus-4-1-20250805", True),
        ("claude-haiku-4-5", True),
        ("claude-sonnet-4-20250514", False),
    ],
)
def test_the_anthropic_server_rejects_temperature_with_top_p_as_anthropic_does(
    model: str, rejected: bool
) -> None:
    image = b64(_png(Image.new("L", (32, 32), 50)))
    with AnthropicServer() as server:
        url = server.api_base + "/v1/messages"
        both = _post(url, _anthropic(model, image, temperature=0.7, top_p=0.9), ANTHROPIC_HEADERS)
        one = _post(url, _anthropic(model, image, temperature=0.7), ANTHROPIC_HEADERS)
    assert one[0] == 200
    if rejected:
        assert both[0] == 400
        assert "`temperature` and `top_p` cannot both be specified" in both[1]
    else:
        assert both[0] == 200


def _gemini(image: str) -> dict[str, Any]:
    inline = {"mime_type": "image/png", "data": image}
    return {"contents": [{"role": "user", "parts": [{"inline_data": inline}, {"text": "Dx?"}]}]}


def _ollama(image: str) -> dict[str, Any]:
    message = {"role": "user", "content": "Diagnosis?", "images": [image]}
    return {"model": "llava", "stream": False, "messages": [message]}


# family: (server, path under api_base, headers, request body with this image string)
RAW_BASE64: dict[str, tuple[type[Any], str, dict[str, str], Callable[[str], dict[str, Any]]]] = {
    "anthropic": (
        AnthropicServer,
        "/v1/messages",
        ANTHROPIC_HEADERS,
        lambda image: _anthropic("claude-sonnet-4-5", image),
    ),
    "gemini": (
        GeminiServer,
        "/models/gemini-2.5-flash:generateContent",
        {"x-goog-api-key": "k"},
        _gemini,
    ),
    "ollama": (OllamaServer, "/api/chat", {}, _ollama),
}


@pytest.mark.parametrize(
    ("family", "error"),
    [
        ("anthropic", "invalid base64 data"),
        ("gemini", "Base64 decoding failed"),
        ("ollama", "illegal base64 data"),
    ],
)
def test_providers_that_need_raw_base64_reject_a_data_url(family: str, error: str) -> None:
    make, path, headers, body = RAW_BASE64[family]
    png = _png(Image.new("L", (32, 32), 50))
    with make() as server:
        url = server.api_base + path
        rejected = _post(url, body("data:image/png;base64," + b64(png)), headers)
        accepted = _post(url, body(b64(png)), headers)
    # The same request with the image as raw base64 is answered: the data: URL is the fault.
    assert accepted[0] == 200, accepted
    assert rejected[0] == 400 and error in rejected[1], rejected


@pytest.mark.parametrize(
    ("litellm_model", "family", "one"),
    [
        ("bedrock/anthropic.claude-sonnet-4-5-20250929-v1:0", "anthropic", True),
        ("bedrock/us.anthropic.claude-haiku-4-5-20251001-v1:0", "anthropic", True),
        ("bedrock/anthropic.claude-3-5-sonnet-20240620-v1:0", "anthropic", False),
        ("vertex_ai/claude-opus-4-1@20250805", "anthropic", True),
        ("vertex_ai/claude-sonnet-4@20250514", "anthropic", False),
        ("vertex_ai/gemini-2.5-pro", "gemini", False),
        ("bedrock/amazon.nova-pro-v1:0", "bedrock", False),
    ],
)
def test_claude_on_bedrock_and_vertex_follows_claude_rules(
    litellm_model: str, family: str, one: bool
) -> None:
    spec = ModelSpec(name="m", model=litellm_model)
    profile = profile_for(spec)
    assert (profile.family, profile.one_sampler, profile.local) == (family, one, False)
    kwargs, adjustments = LiteLLMAdapter(spec)._kwargs(CFG)
    sent = {k for k in ("temperature", "top_p") if k in kwargs}
    assert sent == ({"temperature"} if one else {"temperature", "top_p"})
    assert "max_tokens" in kwargs  # Bedrock Converse calls it maxTokens: still sent
    assert [(a["kind"], a["param"]) for a in adjustments] == (
        [("param_not_sent", "top_p")] if one else []
    )


def test_only_servers_one_runs_oneself_count_as_local() -> None:
    local = {
        m: profile_for(ModelSpec(name="m", model=m, api_base="http://127.0.0.1:1/v1")).local
        for m in ["ollama_chat/llava", "hosted_vllm/medgemma", "lm_studio/qwen", "groq/llama-4"]
    }
    assert local == {
        "ollama_chat/llava": True,
        "hosted_vllm/medgemma": True,
        "lm_studio/qwen": True,
        "groq/llama-4": False,
    }
