"""Token usage as OpenAI reports it for gpt-4o, computed here from the request body: the
loopback server's ``Script.usage`` for tests that check an estimate against what a provider
says it counted.

Written from OpenAI's published rules, not from litellm's counter (which the estimate uses):
text with tiktoken's o200k_base and 3 tokens per message plus 3 priming the reply; each
high-detail image 85 + 170 per 512 px tile, after the image is fitted into 2048 x 2048 and its
short side scaled to 768 px.
"""

from __future__ import annotations

import base64
import io
import math
from typing import Any

from PIL import Image

PER_MESSAGE = 3
REPLY_PRIMING = 3


def _encoding() -> Any:
    from evaluation.models.litellm_lib import import_litellm

    import_litellm()
    # points tiktoken at litellm's bundled encodings (no download)
    import litellm.litellm_core_utils.default_encoding  # noqa: F401
    import tiktoken

    return tiktoken.get_encoding("o200k_base")


def image_tokens(width: int, height: int) -> int:
    scale = min(1.0, 2048 / max(width, height))
    w, h = width * scale, height * scale
    scale = min(1.0, 768 / min(w, h))
    w, h = math.floor(w * scale), math.floor(h * scale)
    return 85 + 170 * math.ceil(w / 512) * math.ceil(h / 512)


def _image_size(url: str) -> tuple[int, int]:
    data = base64.b64decode(url.split(",", 1)[1])
    with Image.open(io.BytesIO(data)) as im:
        return im.size


def openai_usage(body: dict[str, Any], reply: str) -> tuple[int, int]:
    """(prompt_tokens, completion_tokens) of a chat request and its reply."""
    enc = _encoding()
    prompt = REPLY_PRIMING
    for m in body.get("messages", []):
        prompt += PER_MESSAGE + len(enc.encode(str(m.get("role", ""))))
        content = m.get("content")
        if isinstance(content, str):
            prompt += len(enc.encode(content))
            continue
        for part in content or []:
            if part.get("type") == "text":
                prompt += len(enc.encode(part["text"]))
            elif part.get("type") == "image_url":
                prompt += image_tokens(*_image_size(part["image_url"]["url"]))
    return prompt, len(enc.encode(reply))
