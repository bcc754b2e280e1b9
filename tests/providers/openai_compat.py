"""OpenAI chat completions and the servers that speak it: OpenAI, xAI, OpenRouter, vLLM.

One server class, four flavours, each with its provider's path, auth, limits and error bodies:

- ``openai``: ``/v1/chat/completions``; reasoning models (o1, o3, o4, gpt-5) reject
  ``temperature``/``top_p`` and ``max_tokens`` exactly as OpenAI does; 20 MB per image, 500
  images per request; refusals as ``message.refusal`` or a ``content_filter`` finish.
- ``xai``: same path; PNG/JPEG only, 10 MiB per image; errors as ``{"code", "error"}``.
- ``openrouter``: ``/api/v1/chat/completions``; usage carries the charged ``cost``.
- ``vllm``: ``/v1/chat/completions``, no key; ``limit_mm_per_prompt`` images per request, the
  way ``vllm serve --limit-mm-per-prompt '{"image": N}'`` rejects more.
"""

from __future__ import annotations

import base64
import binascii
import re
import time
from typing import Any

from providers.base import Exchange, Fault, ProviderServer, Reply, sha256

REASONING = re.compile(r"^(o1|o3|o4)(-|$)|^gpt-5(?!-chat)")
PATHS = {
    "openai": "/v1/chat/completions",
    "xai": "/v1/chat/completions",
    "openrouter": "/api/v1/chat/completions",
    "vllm": "/v1/chat/completions",
}
KNOWN = {
    "model",
    "messages",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "seed",
    "response_format",
    "stream",
    "stop",
    "user",
    "logprobs",
    "top_logprobs",
    "presence_penalty",
    "frequency_penalty",
    "usage",
    "reasoning_effort",
}
PNG = b"\x89PNG\r\n\x1a\n"


def decode_data_url(url: str) -> tuple[str, bytes]:
    """(mime type, bytes) of a ``data:`` URL; ValueError when it is not one."""
    m = re.fullmatch(r"data:([\w/+.-]+);base64,(.*)", url, re.S)
    if not m:
        raise ValueError(f"not a base64 data URL: {url[:40]!r}")
    return m.group(1), base64.b64decode(m.group(2), validate=True)


class OpenAICompatServer(ProviderServer):
    family = "openai"

    def __init__(
        self,
        flavour: str = "openai",
        *,
        model: str | None = None,
        limit_mm_per_prompt: int | None = None,
        cost: float = 0.00123,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        if flavour not in PATHS:
            raise ValueError(flavour)
        self.flavour = flavour
        self.family = flavour
        self.model = model  # the served model name to insist on (None: any)
        self.limit_mm = limit_mm_per_prompt
        self.cost = cost  # OpenRouter's charged cost per call

    @property
    def api_base(self) -> str:
        return self.root + ("/api/v1" if self.flavour == "openrouter" else "/v1")

    # ---------------------------------------------------------------- decoded views

    @staticmethod
    def sequence(body: dict[str, Any]) -> list[tuple[str, str]]:
        """Text and images of every user message, in order (images by sha256)."""
        out: list[tuple[str, str]] = []
        for m in body["messages"]:
            if m["role"] != "user":
                continue
            content = m["content"]
            if isinstance(content, str):
                out.append(("text", content))
                continue
            for p in content:
                if p["type"] == "text":
                    out.append(("text", p["text"]))
                else:
                    out.append(("image", sha256(decode_data_url(p["image_url"]["url"])[1])))
        return out

    @staticmethod
    def images(body: dict[str, Any]) -> list[bytes]:
        return [
            decode_data_url(p["image_url"]["url"])[1]
            for m in body["messages"]
            if isinstance(m["content"], list)
            for p in m["content"]
            if p["type"] == "image_url"
        ]

    # ---------------------------------------------------------------- checks

    def _check(self, ex: Exchange) -> list[str]:
        body, problems = ex.body, []
        if ex.path != PATHS[self.flavour]:
            return [f"unknown path {ex.path}"]
        auth = ex.headers.get("authorization", "")
        if self.flavour != "vllm" and not auth.startswith("Bearer "):
            problems.append("missing Authorization: Bearer")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return [*problems, "messages must be a list"]
        model = str(body.get("model", ""))
        if self.model is not None and model != self.model:
            problems.append(f"The model `{model}` does not exist")
        unknown = set(body) - KNOWN
        if unknown:
            problems.append(f"Unrecognized request arguments supplied: {sorted(unknown)}")
        if self.flavour == "openai" and REASONING.match(model):
            for p in ("temperature", "top_p"):
                if p in body and body[p] != 1:
                    problems.append(
                        f"Unsupported parameter: '{p}' is not supported with this model."
                    )
            if "max_tokens" in body:
                problems.append(
                    "Unsupported parameter: 'max_tokens' is not supported with this model. "
                    "Use 'max_completion_tokens' instead."
                )
        n_images = 0
        for i, m in enumerate(body["messages"]):
            content = m.get("content")
            if isinstance(content, str):
                continue
            if not isinstance(content, list):
                problems.append(f"messages[{i}].content must be a string or a list")
                continue
            for j, p in enumerate(content):
                if p.get("type") == "text":
                    continue
                if p.get("type") != "image_url" or m["role"] != "user":
                    problems.append(f"messages[{i}].content[{j}]: unexpected part {p.get('type')}")
                    continue
                n_images += 1
                problems += self._check_image(p["image_url"].get("url", ""), f"[{i}][{j}]")
        limit = {"openai": 500, "vllm": self.limit_mm}.get(self.flavour)
        if limit is not None and n_images > limit:
            problems.append(
                f"At most {limit} image(s) may be provided in one request."
                if self.flavour == "vllm"
                else f"Too many images in request: {n_images} > {limit}"
            )
        return problems

    def _check_image(self, url: str, where: str) -> list[str]:
        try:
            mime, data = decode_data_url(url)
        except (ValueError, binascii.Error) as exc:
            return [f"Invalid image_url {where}: {exc}"]
        if mime == "image/png" and not data.startswith(PNG):
            return [f"image {where} is not a PNG"]
        if self.flavour == "xai":
            if mime not in ("image/png", "image/jpeg"):
                return [f"Unsupported image format {mime}"]
            if len(data) > 10 * 1024 * 1024:
                return [f"Image {where} is larger than 10 MiB"]
        if self.flavour == "openai" and len(data) > 20 * 1024 * 1024:
            return [f"Image {where} exceeds 20 MB"]
        return []

    # ---------------------------------------------------------------- answers

    def handle(self, ex: Exchange, raw: str) -> Reply:
        problems = self._check(ex)
        if problems:
            ex.problems = problems
            return self._error(400, problems[0], "invalid_request_error")
        fault = self.take_fault(raw)
        if fault is not None:
            return self._fault(fault, ex)
        return Reply(200, self._completion(ex.body, self.reply_for(raw), "stop"))

    def _fault(self, fault: Fault, ex: Exchange) -> Reply:
        if fault.kind == "429":
            return self._error(
                429,
                "Rate limit reached. Please try again in 1s.",
                "rate_limit_exceeded",
                {"retry-after": "1"},
            )
        if fault.kind == "503":
            return self._error(503, "The server is overloaded, try again later.", "server_error")
        if fault.kind == "refusal":  # a refusal of the model itself (structured outputs)
            msg = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
            return Reply(200, self._completion(ex.body, None, "stop", message=msg))
        if fault.kind == "content_filter":
            return Reply(200, self._completion(ex.body, "", "content_filter"))
        raise ValueError(f"unknown fault {fault.kind}")

    def _error(
        self, status: int, message: str, kind: str, headers: dict[str, str] | None = None
    ) -> Reply:
        if self.flavour == "xai":
            payload: dict[str, Any] = {"code": kind, "error": message}
        elif self.flavour == "vllm":
            payload = {
                "object": "error",
                "message": message,
                "type": "BadRequestError",
                "param": None,
                "code": status,
            }
        elif self.flavour == "openrouter":
            payload = {"error": {"code": status, "message": message, "metadata": {}}}
        else:
            payload = {"error": {"message": message, "type": kind, "param": None, "code": kind}}
        return Reply(status, payload, headers or {})

    def _completion(
        self,
        body: dict[str, Any],
        text: str | None,
        finish: str,
        message: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        pt, ct = self.prompt_tokens, self.completion_tokens
        usage: dict[str, Any] = {
            "prompt_tokens": pt,
            "completion_tokens": ct,
            "total_tokens": pt + ct,
        }
        out: dict[str, Any] = {
            "id": f"chatcmpl-{self.calls}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "test"),
            "choices": [
                {
                    "index": 0,
                    "message": message or {"role": "assistant", "content": text},
                    "finish_reason": finish,
                }
            ],
            "usage": usage,
        }
        if self.flavour == "openrouter":
            usage["cost"] = self.cost
            out["provider"] = "Together"
        return out
