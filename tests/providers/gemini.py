"""Google's Gemini API (``POST /v1beta/models/{model}:generateContent``), checked as Google does.

Checks: the key in ``x-goog-api-key`` (or ``?key=``); ``contents`` with roles ``user``/``model``;
parts as ``text`` or ``inline_data``/``inlineData`` holding raw base64 (a ``data:`` URL is not
base64 and is rejected) whose bytes match the mime type; the system prompt in
``system_instruction``; ``generationConfig`` with known fields only (both the proto names and
their camelCase JSON names are accepted, as Google's JSON parser does); ``candidateCount``
absent or 1; at most 20 MB per request. Answers with ``candidates`` and ``usageMetadata``;
faults: 429 ``RESOURCE_EXHAUSTED`` (with a ``RetryInfo``), 503 ``UNAVAILABLE`` (overloaded),
``safety`` (a candidate finished with ``SAFETY`` and no content), ``blocked``
(``promptFeedback.blockReason`` and no candidates).
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from providers.base import Exchange, ProviderServer, Reply, sha256

MAX_REQUEST = 20 * 1024 * 1024
CONFIG = {
    "temperature",
    "topP",
    "topK",
    "maxOutputTokens",
    "candidateCount",
    "stopSequences",
    "responseMimeType",
    "responseSchema",
    "seed",
    "mediaResolution",
    "thinkingConfig",
    "presencePenalty",
    "frequencyPenalty",
    "responseLogprobs",
}
MAGIC = {"image/png": b"\x89PNG\r\n\x1a\n", "image/jpeg": b"\xff\xd8\xff"}
PATH = re.compile(r"^/v1beta/models/([^/:]+):generateContent(\?.*)?$")


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


def _get(d: dict[str, Any], name: str) -> Any:
    """A field by its camelCase or snake_case name (Google's parser takes both)."""
    snake = re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name)
    return d.get(name, d.get(snake))


class GeminiServer(ProviderServer):
    family = "gemini"

    def __init__(self, *, model: str | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.model = model

    @property
    def api_base(self) -> str:
        return self.root + "/v1beta"

    @staticmethod
    def generation_config(body: dict[str, Any]) -> dict[str, Any]:
        """``generationConfig`` with every key in its camelCase JSON name."""
        cfg = _get(body, "generationConfig") or {}
        return {camel(k): v for k, v in cfg.items()}

    @staticmethod
    def sequence(body: dict[str, Any]) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for c in body["contents"]:
            if c.get("role") != "user":
                continue
            for p in c["parts"]:
                inline = _get(p, "inlineData")
                if inline is not None:
                    out.append(("image", sha256(base64.b64decode(inline["data"]))))
                elif "text" in p:
                    out.append(("text", p["text"]))
        return out

    @staticmethod
    def images(body: dict[str, Any]) -> list[bytes]:
        return [
            base64.b64decode(_get(p, "inlineData")["data"], validate=True)
            for c in body["contents"]
            for p in c["parts"]
            if _get(p, "inlineData") is not None
        ]

    def _check(self, ex: Exchange, raw: str) -> list[str]:
        m = PATH.match(ex.path)
        if not m:
            return [f"unknown path {ex.path}"]
        if not ex.headers.get("x-goog-api-key") and "key=" not in (m.group(2) or ""):
            return ["API key not valid. Please pass a valid API key."]
        if self.model is not None and m.group(1) != self.model:
            return [f"models/{m.group(1)} is not found for API version v1beta"]
        if len(raw) > MAX_REQUEST:
            return [f"Request payload size exceeds the limit: {MAX_REQUEST} bytes."]
        body = ex.body
        problems = []
        known = {
            "contents",
            "systemInstruction",
            "system_instruction",
            "generationConfig",
            "generation_config",
            "safetySettings",
            "safety_settings",
            "tools",
            "toolConfig",
        }
        for k in sorted(set(body) - known):
            problems.append(f'Invalid JSON payload received. Unknown name "{k}"')
        cfg = self.generation_config(body)
        for k in sorted(set(cfg) - CONFIG):
            problems.append(
                f"Invalid JSON payload received. Unknown name \"{k}\" at 'generation_config'"
            )
        if cfg.get("candidateCount", 1) != 1:
            problems.append("candidateCount > 1 is not what this sandbox sends")
        for i, c in enumerate(body.get("contents") or []):
            if c.get("role") not in ("user", "model"):
                problems.append(f"contents[{i}].role: Please use a valid role: user, model.")
            for j, p in enumerate(c.get("parts") or []):
                inline = _get(p, "inlineData")
                if inline is not None:
                    problems += _check_inline(inline, f"contents[{i}].parts[{j}]")
                elif not isinstance(p.get("text"), str):
                    problems.append(f"contents[{i}].parts[{j}]: empty part")
        return problems

    def handle(self, ex: Exchange, raw: str) -> Reply:
        problems = self._check(ex, raw)
        if problems:
            ex.problems = problems
            status = 404 if "not found" in problems[0] else 400
            return _error(status, "NOT_FOUND" if status == 404 else "INVALID_ARGUMENT", problems[0])
        fault = self.take_fault(raw)
        if fault is not None:
            if fault.kind == "429":
                details = [
                    {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1s"}
                ]
                return _error(
                    429,
                    "RESOURCE_EXHAUSTED",
                    "You exceeded your current quota, please check your plan and billing details.",
                    details,
                )
            if fault.kind == "503":
                return _error(
                    503, "UNAVAILABLE", "The model is overloaded. Please try again later."
                )
            if fault.kind == "safety":
                cand = {"finishReason": "SAFETY", "index": 0, "safetyRatings": _ratings(True)}
                return Reply(200, self._response([cand]))
            if fault.kind == "blocked":
                out = self._response([])
                out["promptFeedback"] = {"blockReason": "SAFETY", "safetyRatings": _ratings(True)}
                return Reply(200, out)
            raise ValueError(fault.kind)
        cand = {
            "content": {"parts": [{"text": self.reply_for(raw)}], "role": "model"},
            "finishReason": "STOP",
            "index": 0,
            "safetyRatings": _ratings(False),
        }
        return Reply(200, self._response([cand]))

    def _response(self, candidates: list[dict[str, Any]]) -> dict[str, Any]:
        pt, ct = self.prompt_tokens, self.completion_tokens if candidates else 0
        out: dict[str, Any] = {
            "usageMetadata": {
                "promptTokenCount": pt,
                "candidatesTokenCount": ct,
                "totalTokenCount": pt + ct,
            },
            "modelVersion": self.model or "gemini-2.5-flash",
            "responseId": f"resp-{self.calls}",
        }
        if candidates:
            out["candidates"] = candidates
        return out


def _check_inline(inline: dict[str, Any], where: str) -> list[str]:
    mime = _get(inline, "mimeType")
    data = str(inline.get("data", ""))
    try:
        raw = base64.b64decode(data, validate=True)
    except binascii.Error:
        return [f"Invalid value at '{where}.inline_data.data' (TYPE_BYTES), Base64 decoding failed"]
    if mime not in MAGIC or not raw.startswith(MAGIC[mime]):
        return [f"{where}: Unable to process input image (mime type {mime})"]
    return []


def _ratings(blocked: bool) -> list[dict[str, Any]]:
    return [
        {
            "category": "HARM_CATEGORY_DANGEROUS_CONTENT",
            "probability": "HIGH" if blocked else "NEGLIGIBLE",
            "blocked": blocked,
        }
    ]


def _error(
    status: int, kind: str, message: str, details: list[dict[str, Any]] | None = None
) -> Reply:
    err: dict[str, Any] = {"code": status, "message": message, "status": kind}
    if details:
        err["details"] = details
    return Reply(status, {"error": err})
