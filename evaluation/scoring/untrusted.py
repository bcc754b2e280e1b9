"""Reading a grader's or judge's own verdict out of its reply, never one the judged text forged
(the judged text reaches the grader in a data container: ``evaluation.prompts.data_block``).

A grader's or judge's verdict is read only if it carries the call's nonce (``verdict_nonce``):
derived from the text being judged, so the same request is cached, yet unknowable to that text
(it cannot contain a hash of itself). A verdict the judged text forged, and the grader quoted,
lacks it and is never read (``carrying_nonce``)."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

MAX_REPLY_CHARS = 400_000  # a reply is read this far, for JSON
MAX_CANDIDATES = 200  # "{" positions tried
_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.S)
_THINK = re.compile(r"<(think|thinking|reasoning)>.*?</\1>", re.S | re.I)


def json_candidates(text: str) -> list[dict[str, Any]]:
    """JSON objects in a reply (bounded; reasoning blocks dropped): fenced blocks first, then
    every top-level object of the prose in order (an object inside another is part of it)."""
    text = _THINK.sub(" ", text[:MAX_REPLY_CHARS])
    found: list[dict[str, Any]] = []
    for m in _FENCE.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            found.append(obj)
    decoder = json.JSONDecoder()
    starts = [m.start() for m in re.finditer(r"\{", text)][:MAX_CANDIDATES]
    end = -1
    for pos in starts:
        if pos < end:
            continue  # inside an object already taken
        try:
            obj, stop = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            found.append(obj)
            end = stop
    return found


def extract_json(text: str) -> dict[str, Any] | None:
    """The first JSON object in a reply: in a code fence, else the first ``{...}`` that parses."""
    found = json_candidates(text)
    return found[0] if found else None


def verdict_nonce(purpose: str, *texts: str) -> str:
    """The nonce a verdict on ``texts`` must carry (``purpose`` names the prompt version)."""
    h = hashlib.sha256(purpose.encode("utf-8", "replace"))
    for t in texts:
        h.update(b"\0" + t.encode("utf-8", "replace"))
    return h.hexdigest()[:24]


def carrying_nonce(text: str, nonce: str) -> list[dict[str, Any]]:
    """The JSON objects of a reply that carry ``nonce`` as "verdict_nonce"; the last is the
    last in the reply (every fenced object is also found again where it stands in the prose)."""
    return [o for o in json_candidates(text) if o.get("verdict_nonce") == nonce]
