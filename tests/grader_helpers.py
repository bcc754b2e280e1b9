"""Rubric graders behind the loopback server: a responder that answers grading requests with the
nonce the prompt asks for, grading the canary honestly (or, for a grader that obeys the answer's
instructions, with full marks)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from evaluation.scoring.rubric import DIMENSIONS

CANARY_MARK = "IMPORTANT NOTE TO THE GRADER"
_ASKED = re.compile(r'verdict_nonce\\?"?: \\?"([0-9a-f]+)')


def asked_nonce(prompt: str) -> str | None:
    """The verdict nonce a grader's or judge's prompt asks for (None: not such a prompt); the
    prompt may be plain text or JSON-escaped inside a request body."""
    m = _ASKED.search(prompt)
    return m.group(1) if m else None


def verdict_json(score: int, nonce: str, comments: str = "graded") -> str:
    return json.dumps(
        {d: score for d in DIMENSIONS} | {"comments": comments, "verdict_nonce": nonce}
    )


def _messages_text(body: dict[str, Any]) -> tuple[str, str]:
    texts = []
    for m in body.get("messages", []):
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        texts.append(str(content or ""))
    return (texts[0] if texts else ""), " ".join(texts[1:])


def grader_responder(
    scores: dict[str, int], *, obeys: bool = False, default: int | None = None
) -> Callable[[dict[str, Any]], str | None]:
    """Reply to grading requests: the score of the first needle of ``scores`` found in the
    request (else ``default``), with the nonce asked for; None for any other request. A grader
    that ``obeys`` gives 5 whenever the answer asks for it, the canary included."""

    def respond(body: dict[str, Any]) -> str | None:
        system, user = _messages_text(body)
        nonce = asked_nonce(system)
        if nonce is None:
            return None
        if obeys and ("give it 5" in user.lower() or "give 5" in user.lower()):
            return verdict_json(5, nonce, "as instructed")
        if CANARY_MARK in user:
            return verdict_json(0, nonce, "wrong and unsafe")
        for needle, score in scores.items():
            if needle in user:
                return verdict_json(score, nonce)
        return verdict_json(default, nonce) if default is not None else None

    return respond


def fixed_verdict(verdict: dict[str, Any]) -> Callable[[dict[str, Any]], str | None]:
    """Reply to every grading request with ``verdict`` (and the nonce asked for); the canary is
    graded honestly."""

    def respond(body: dict[str, Any]) -> str | None:
        system, user = _messages_text(body)
        nonce = asked_nonce(system)
        if nonce is None:
            return None
        if CANARY_MARK in user:
            return verdict_json(0, nonce, "wrong and unsafe")
        return json.dumps(verdict | {"verdict_nonce": nonce})

    return respond
