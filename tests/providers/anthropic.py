"""Anthropic's Messages API (``POST /v1/messages``), checked as Anthropic checks it.

Checks: ``x-api-key`` and ``anthropic-version`` headers; ``max_tokens`` required; no unknown
fields (so no ``n``, no ``seed``); ``system`` at the top level, never as a message; roles
alternate starting with ``user``; non-empty text blocks; images only as ``source.base64`` with
raw base64 (a ``data:`` URL is rejected) whose bytes match ``media_type``; at most 5 MB of
base64 per image, 8000 px per side (2000 px when a request has more than 20 images), 100
images per request; ``temperature`` within 0..1; for Claude Opus 4.1, Sonnet 4.5, Haiku 4.5
and later, not both ``temperature`` and ``top_p``; for Opus 4.7 and later, no ``top_p`` and no
``temperature`` but 1 (sampling parameters were removed). Answers with ``content`` blocks,
``stop_reason`` and ``usage.input_tokens``/``output_tokens``; faults: 429 ``rate_limit_error``
(with ``retry-after``), 529 ``overloaded_error``, ``refusal`` (``stop_reason: "refusal"``).
"""

from __future__ import annotations

import base64
import binascii
import io
import itertools
from typing import Any

from PIL import Image

from providers.base import Exchange, ProviderServer, Reply, sha256

MAX_IMAGE_B64 = 5 * 1024 * 1024
MAX_IMAGES = 100
KNOWN = {
    "model",
    "messages",
    "max_tokens",
    "system",
    "temperature",
    "top_p",
    "top_k",
    "stop_sequences",
    "stream",
    "metadata",
    "tools",
    "tool_choice",
    "thinking",
}
# The models, as Anthropic lists them, that take temperature or top_p but not both.
ONE_SAMPLER = (
    "claude-opus-4-1",
    "claude-sonnet-4-5",
    "claude-haiku-4-5",
    "claude-opus-4-5",
    "claude-sonnet-4-6",
    "claude-opus-4-6",
)
NO_SAMPLING = ("claude-opus-4-7", "claude-opus-4-8")  # sampling parameters removed
MAGIC = {"image/png": b"\x89PNG\r\n\x1a\n", "image/jpeg": b"\xff\xd8\xff"}


class AnthropicServer(ProviderServer):
    family = "anthropic"

    def __init__(self, *, model: str | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.model = model

    @staticmethod
    def _blocks(m: dict[str, Any]) -> list[dict[str, Any]]:
        c = m["content"]
        return [{"type": "text", "text": c}] if isinstance(c, str) else list(c)

    @classmethod
    def sequence(cls, body: dict[str, Any]) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for m in body["messages"]:
            if m["role"] != "user":
                continue
            for b in cls._blocks(m):
                if b["type"] == "text":
                    out.append(("text", b["text"]))
                elif b["type"] == "image":
                    out.append(("image", sha256(base64.b64decode(b["source"]["data"]))))
        return out

    @classmethod
    def images(cls, body: dict[str, Any]) -> list[bytes]:
        return [
            base64.b64decode(b["source"]["data"], validate=True)
            for m in body["messages"]
            for b in cls._blocks(m)
            if b["type"] == "image"
        ]

    def _check(self, ex: Exchange) -> list[str]:
        if ex.path != "/v1/messages":
            return [f"unknown path {ex.path}"]
        if not ex.headers.get("x-api-key"):
            return ["authentication_error: x-api-key header is required"]
        if not ex.headers.get("anthropic-version"):
            return ["anthropic-version: header is required"]
        body = ex.body
        if not isinstance(body, dict):
            return ["body must be an object"]
        problems = [f"{k}: Extra inputs are not permitted" for k in sorted(set(body) - KNOWN)]
        if not isinstance(body.get("max_tokens"), int):
            problems.append("max_tokens: Field required")
        if self.model is not None and body.get("model") != self.model:
            problems.append(f"model: {body.get('model')}")
        t = body.get("temperature")
        if t is not None and not 0 <= t <= 1:
            problems.append("temperature: Input should be less than or equal to 1")
        model = str(body.get("model", ""))
        if model.startswith(NO_SAMPLING):
            if "top_p" in body:
                problems.append("`top_p` is deprecated for this model.")
            if t is not None and t != 1:
                problems.append("`temperature` is deprecated for this model.")
        elif model.startswith(ONE_SAMPLER) and "temperature" in body and "top_p" in body:
            problems.append(
                "`temperature` and `top_p` cannot both be specified for this model. "
                "Please use only one."
            )
        messages = body.get("messages") or []
        roles = [m.get("role") for m in messages]
        if "system" in roles:
            problems.append('messages: Unexpected role "system". Use the top-level system')
        if not roles or roles[0] != "user":
            problems.append("messages: first message must use the user role")
        if any(a == b for a, b in itertools.pairwise(roles)):
            problems.append("messages: roles must alternate between user and assistant")
        images = [
            (i, j, b)
            for i, m in enumerate(messages)
            for j, b in enumerate(self._blocks(m))
            if b.get("type") == "image"
        ]
        for i, m in enumerate(messages):
            for j, b in enumerate(self._blocks(m)):
                if b.get("type") == "text" and not str(b.get("text", "")).strip():
                    problems.append(
                        f"messages.{i}.content.{j}: text content blocks must be non-empty"
                    )
        if len(images) > MAX_IMAGES:
            problems.append(f"messages: Too many images: {len(images)} > {MAX_IMAGES}")
        max_side = 2000 if len(images) > 20 else 8000
        for i, j, b in images:
            problems += _check_image(b.get("source") or {}, f"messages.{i}.content.{j}", max_side)
        return problems

    def handle(self, ex: Exchange, raw: str) -> Reply:
        problems = self._check(ex)
        if problems:
            ex.problems = problems
            return _error(400, "invalid_request_error", problems[0])
        fault = self.take_fault(raw)
        if fault is not None:
            if fault.kind == "429":
                return _error(
                    429,
                    "rate_limit_error",
                    "Number of requests has exceeded your rate limit.",
                    {"retry-after": "1"},
                )
            if fault.kind == "529":
                return _error(529, "overloaded_error", "Overloaded")
            if fault.kind == "refusal":
                return Reply(200, self._message(ex.body, "", "refusal"))
            raise ValueError(fault.kind)
        return Reply(200, self._message(ex.body, self.reply_for(raw), "end_turn"))

    def _message(self, body: dict[str, Any], text: str, stop: str) -> dict[str, Any]:
        return {
            "id": f"msg_{self.calls:04d}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [{"type": "text", "text": text}] if text else [],
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": self.completion_tokens},
        }


def _check_image(source: dict[str, Any], where: str, max_side: int) -> list[str]:
    if source.get("type") != "base64":
        return [f"{where}.image.source.type: expected base64, got {source.get('type')!r}"]
    data = str(source.get("data", ""))
    if data.startswith("data:"):
        return [f"{where}.image.source.base64.data: invalid base64 data (a data: URL)"]
    if len(data) > MAX_IMAGE_B64:
        return [
            f"{where}.image.source.base64: image exceeds 5 MB maximum: "
            f"{len(data)} bytes > {MAX_IMAGE_B64} bytes"
        ]
    try:
        raw = base64.b64decode(data, validate=True)
    except binascii.Error:
        return [f"{where}.image.source.base64.data: invalid base64 data"]
    media = source.get("media_type")
    if media not in MAGIC or not raw.startswith(MAGIC[media]):
        return [f"{where}.image.source.base64: the image does not match media type {media}"]
    w, h = Image.open(io.BytesIO(raw)).size
    if max(w, h) > max_side:
        return [
            f"{where}.image.source.base64: image dimensions exceed max allowed size "
            f"for many-image requests: {max_side} pixels"
        ]
    return []


def _error(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> Reply:
    return Reply(
        status, {"type": "error", "error": {"type": kind, "message": message}}, headers or {}
    )
