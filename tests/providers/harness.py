"""What the provider tests share: the families, a real phantom case's messages, and views.

``FAMILIES`` names, per provider family, the litellm model a models file would use, the loopback
server that speaks its format, and where that provider puts the decoding parameters.
"""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evaluation.case import Case
from evaluation.modelio import ImagePart, Message, TextPart
from evaluation.models.spec import ModelSpec
from providers.anthropic import AnthropicServer
from providers.base import ProviderServer
from providers.gemini import GeminiServer
from providers.ollama import OllamaServer
from providers.openai_compat import OpenAICompatServer


def _openai_decoding(body: dict[str, Any]) -> dict[str, Any]:
    return {
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_tokens": body.get("max_tokens"),
    }


def _anthropic_decoding(body: dict[str, Any]) -> dict[str, Any]:
    return {k: body.get(k) for k in ("temperature", "top_p", "max_tokens")}


def _gemini_decoding(body: dict[str, Any]) -> dict[str, Any]:
    cfg = GeminiServer.generation_config(body)
    return {
        "temperature": cfg.get("temperature"),
        "top_p": cfg.get("topP"),
        "max_tokens": cfg.get("maxOutputTokens"),
    }


def _ollama_decoding(body: dict[str, Any]) -> dict[str, Any]:
    o = body.get("options") or {}
    return {
        "temperature": o.get("temperature"),
        "top_p": o.get("top_p"),
        "max_tokens": o.get("num_predict"),
    }


def _system(body: dict[str, Any], family: str) -> str:
    """The system prompt where the provider takes it."""
    if family == "anthropic":
        s = body["system"]
        return s if isinstance(s, str) else "".join(b["text"] for b in s)
    if family == "gemini":
        si = body.get("system_instruction") or body.get("systemInstruction")
        return "".join(p["text"] for p in si["parts"])
    first = body["messages"][0]
    assert first["role"] == "system"
    return str(first["content"])


def raw_images(body: dict[str, Any], family: str) -> list[str]:
    """The image strings exactly as sent (raw base64 for Anthropic, Gemini, Ollama)."""
    if family == "anthropic":
        return [
            b["source"]["data"]
            for m in body["messages"]
            if isinstance(m["content"], list)
            for b in m["content"]
            if b["type"] == "image"
        ]
    if family == "gemini":
        return [
            (p.get("inline_data") or p.get("inlineData"))["data"]
            for c in body["contents"]
            for p in c["parts"]
            if "inline_data" in p or "inlineData" in p
        ]
    if family == "ollama":
        return [i for m in body["messages"] for i in m.get("images") or []]
    return [
        p["image_url"]["url"]
        for m in body["messages"]
        if isinstance(m["content"], list)
        for p in m["content"]
        if p["type"] == "image_url"
    ]


@dataclass
class Family:
    name: str
    model: str  # litellm model name
    make: Callable[..., ProviderServer]
    decoding: Callable[[dict[str, Any]], dict[str, Any]]
    priced: bool  # in litellm's bundled price map (else cost is unknown: None)

    def spec(self, server: ProviderServer, **kw: Any) -> ModelSpec:
        base: dict[str, Any] = {
            "name": f"{self.name}-model",
            "model": self.model,
            "api_base": server.api_base,
            "backoff_base_s": 0.01,
            "backoff_max_s": 0.05,
            "max_retries": 3,
        }
        base.update(kw)
        return ModelSpec(**base)

    def system(self, body: dict[str, Any]) -> str:
        return _system(body, self.name)


FAMILIES = {
    f.name: f
    for f in (
        Family(
            "openai",
            "openai/gpt-4o",
            lambda **kw: OpenAICompatServer("openai", model="gpt-4o", **kw),
            _openai_decoding,
            True,
        ),
        Family(
            "anthropic",
            "anthropic/claude-sonnet-4-5",
            lambda **kw: AnthropicServer(model="claude-sonnet-4-5", **kw),
            _anthropic_decoding,
            True,
        ),
        Family(
            "gemini",
            "gemini/gemini-2.5-flash",
            lambda **kw: GeminiServer(model="gemini-2.5-flash", **kw),
            _gemini_decoding,
            True,
        ),
        Family(
            "xai",
            "xai/grok-2-vision-1212",
            lambda **kw: OpenAICompatServer("xai", model="grok-2-vision-1212", **kw),
            _openai_decoding,
            False,
        ),
        Family(
            "openrouter",
            "openrouter/meta-llama/llama-3.2-90b-vision-instruct",
            lambda **kw: OpenAICompatServer(
                "openrouter", model="meta-llama/llama-3.2-90b-vision-instruct", **kw
            ),
            _openai_decoding,
            False,
        ),
        Family(
            "ollama",
            "ollama_chat/llava",
            lambda **kw: OllamaServer(models=("llava",), **kw),
            _ollama_decoding,
            False,
        ),
        Family(
            "vllm",
            "hosted_vllm/google/medgemma-27b-it",
            lambda **kw: OpenAICompatServer("vllm", model="google/medgemma-27b-it", **kw),
            _openai_decoding,
            False,
        ),
    )
}


def expected_cost(model: str, prompt_tokens: int, completion_tokens: int) -> float:
    """What litellm's bundled price map says a call of these tokens costs."""
    import litellm

    _, _, name = model.partition("/")
    entry = litellm.model_cost.get(model) or litellm.model_cost[name]
    return float(
        prompt_tokens * entry["input_cost_per_token"]
        + completion_tokens * entry["output_cost_per_token"]
    )


# --------------------------------------------------------------------------- the phantom case

_MESSAGES: dict[str, tuple[Case, list[Message]]] = {}


def phantom_messages(suite: Any, cache: Path) -> tuple[Case, list[Message]]:
    """The MS phantom case and its differential-diagnosis messages (system + user, 7 images)."""
    key = str(suite.root)
    if key not in _MESSAGES:
        from engine_helpers import phantom_subset

        from evaluation.case import TaskFamily
        from evaluation.datasets import DatasetSpec, ImageStore, load_dataset
        from evaluation.prompts import default_prompts
        from evaluation.tasks import build_turns, plan_tasks

        folder = phantom_subset(suite, ("ms",), cache / "ms-suite")
        (case,) = load_dataset(DatasetSpec(path=str(folder)), cache / "render").cases
        item = next(i for i in plan_tasks(case) if i.family is TaskFamily.DIFFERENTIAL)
        turns = build_turns(case, item, default_prompts(), ImageStore())
        _MESSAGES[key] = (case, [turns.system, turns.turns[0]])
    return _MESSAGES[key]


def images_of(messages: list[Message]) -> list[ImagePart]:
    return [p for m in messages for p in m.content if isinstance(p, ImagePart)]


def expected_sequence(messages: list[Message]) -> list[tuple[str, str]]:
    return [
        ("text", p.text) if isinstance(p, TextPart) else ("image", p.sha256)
        for m in messages
        if m.role == "user"
        for p in m.content
    ]


def normalise(seq: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Consecutive texts merged, whitespace collapsed, empty texts gone (providers join text
    parts differently; what must hold is the order of text and images)."""
    out: list[tuple[str, str]] = []
    for kind, value in seq:
        if kind == "text":
            value = " ".join(value.split())
            if not value:
                continue
            if out and out[-1][0] == "text":
                out[-1] = ("text", out[-1][1] + " " + value)
                continue
        out.append((kind, value))
    return out


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class SleepRecorder:
    """Stands in for asyncio.sleep in the adapter: records the backoff delays, waits none."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        await asyncio.sleep(0)


LEGEND = re.compile(r"montage of (\d+) images")
