"""Putting model text in front of another model (grader, judge) without letting it give orders,
and reading JSON back out of a model's reply.

A grader's or judge's verdict is read only if it carries the call's nonce (``verdict_nonce``):
derived from the text being judged, so the same request is cached, yet unknowable to that text
(it cannot contain a hash of itself). A verdict the judged text forged, and the grader quoted,
lacks it and is never read (``carrying_nonce``)."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)


def fence(text: str, label: str = "answer") -> tuple[str, str]:
    """Wrap untrusted text as data; returns (block, tag).

    The text is JSON-encoded (quotes, newlines and control characters escaped) with every
    ``<``, ``>`` and ``&`` turned into a unicode escape, so it contains no tag at all; the tag
    carries a nonce derived from the text, so the text cannot forge the closing tag either.
    Deterministic: the same text gives the same prompt (prompts are cached by content).
    """
    nonce = hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:16]
    tag = f"{label}-{nonce}"
    body = (
        json.dumps(text, ensure_ascii=True)
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
    )
    return f"<{tag}>\n{body}\n</{tag}>", tag


def extract_json(text: str) -> dict[str, Any] | None:
    """The first JSON object in a reply: in a code fence, else the first ``{...}`` that parses."""
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    decoder = json.JSONDecoder()
    for chunk in candidates:
        for i, ch in enumerate(chunk):
            if ch != "{":
                continue
            try:
                obj, _ = decoder.raw_decode(chunk, i)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                return obj
    return None


def json_objects(text: str) -> list[dict[str, Any]]:
    """Every top-level JSON object in a reply, in order (an object inside another is part of
    it, never one of its own)."""
    decoder = json.JSONDecoder()
    out: list[dict[str, Any]] = []
    i = 0
    while (i := text.find("{", i)) != -1:
        try:
            obj, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            i += 1
            continue
        if isinstance(obj, dict):
            out.append(obj)
        i = end
    return out


def verdict_nonce(purpose: str, *texts: str) -> str:
    """The nonce a verdict on ``texts`` must carry (``purpose`` names the prompt version)."""
    h = hashlib.sha256(purpose.encode("utf-8", "replace"))
    for t in texts:
        h.update(b"\0" + t.encode("utf-8", "replace"))
    return h.hexdigest()[:24]


def carrying_nonce(text: str, nonce: str) -> list[dict[str, Any]]:
    """The JSON objects of a reply that carry ``nonce`` as "verdict_nonce", in order."""
    return [o for o in json_objects(text) if o.get("verdict_nonce") == nonce]
