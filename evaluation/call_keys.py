"""What identifies a model call (its cache key) and what of it is stored (no image bytes).

The cache key hashes everything that makes a call what it is: the model's identity and decoding
parameters, the sample index, the turn, every text and every image by its sha256. It does not
hash the endpoint or the key, so a run resumed against a moved endpoint reuses its answers.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from evaluation.modelio import GenerateConfig, Message, TextPart
from evaluation.models.spec import ModelSpec


def cache_key(
    spec: ModelSpec, config: GenerateConfig, sample: int, turn: int, messages: list[Message]
) -> str:
    """Hash of everything that makes a call what it is (not the endpoint, not the key)."""
    body = {
        "model": spec.identity(),
        "config": config.model_dump(exclude={"timeout_s"}),
        "sample": sample,
        "turn": turn,
        "messages": _message_digest(messages),
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _message_digest(messages: list[Message]) -> list[Any]:
    return [
        [m.role, [p.text if isinstance(p, TextPart) else {"image": p.sha256} for p in m.content]]
        for m in messages
    ]


def prompt_hash(messages: list[Message]) -> str:
    return hashlib.sha256(json.dumps(_message_digest(messages)).encode()).hexdigest()


def request_record(
    messages: list[Message], spec: ModelSpec, config: GenerateConfig
) -> dict[str, Any]:
    """The request as stored: every text, every image by hash, label and size (no bytes)."""
    return {
        "model": spec.identity(),
        "config": config.model_dump(),
        "messages": [
            {
                "role": m.role,
                "content": [
                    {"type": "text", "text": p.text}
                    if isinstance(p, TextPart)
                    else {
                        "type": "image",
                        "sha256": p.sha256,
                        "label": p.label,
                        "bytes": len(p.png),
                    }
                    for p in m.content
                ],
            }
            for m in messages
        ],
    }
