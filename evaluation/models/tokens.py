"""Input tokens of a request before it is sent: text by litellm's token counter, images by the
provider's image-token rule from each image's pixel size (read from the PNG header).

Image rules, in this order:

- litellm's own per-model rule where it has one (``estimate_image_tokens``): OpenAI's tile rule
  per model (gpt-4o: 85 + 170 per 512 px tile after fitting into 2048 px and a 768 px short side;
  gpt-4o-mini, gpt-4.1, gpt-5, o-series with their own numbers), the patch rule of newer OpenAI
  models, Anthropic's (about width x height / 750, after fitting into Claude's long edge);
- Gemini (litellm has none): Google's documented rule, 258 tokens for an image of at most 384 px
  a side, else 258 per 768 x 768 tile;
- any other model: OpenAI's high-detail tile rule (85 + 170 per tile), the rule litellm's
  ``token_counter`` applies to every image; stated as such in the estimate.
"""

from __future__ import annotations

import math
import struct
from functools import lru_cache

from pydantic import BaseModel

from evaluation.modelio import ImagePart, Message, TextPart
from evaluation.models.litellm_lib import import_litellm

GEMINI_TILE = 768
GEMINI_SMALL = 384
GEMINI_TOKENS = 258


class RequestTokens(BaseModel):
    """The input tokens of one request, its images apart, and the image rule used."""

    text: int
    images: int
    image_rule: str

    @property
    def total(self) -> int:
        return self.text + self.images


def png_size(png: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG's IHDR chunk; None when the bytes are no PNG."""
    if len(png) < 24 or png[:8] != b"\x89PNG\r\n\x1a\n" or png[12:16] != b"IHDR":
        return None
    w, h = struct.unpack(">II", png[16:24])
    return (int(w), int(h)) if w and h else None


def gemini_image_tokens(size: tuple[int, int] | None) -> int:
    """Google's rule: 258 for at most 384 px a side, else 258 per 768 x 768 tile."""
    if size is None:
        return GEMINI_TOKENS
    w, h = size
    if w <= GEMINI_SMALL and h <= GEMINI_SMALL:
        return GEMINI_TOKENS
    return GEMINI_TOKENS * math.ceil(w / GEMINI_TILE) * math.ceil(h / GEMINI_TILE)


@lru_cache(maxsize=256)
def image_rule(litellm_model: str, family: str) -> str:
    """Which rule prices this model's images: "litellm", "gemini" or "openai-tiles"."""
    if family == "gemini":
        return "gemini"
    import_litellm()
    try:
        from litellm.litellm_core_utils import token_counter as tc

        known = tc._image_model_family(litellm_model) is not None
    except (ImportError, AttributeError):  # litellm moved it: the stated fallback
        return "openai-tiles"
    return "litellm" if known else "openai-tiles"


def image_tokens(litellm_model: str, family: str, part: ImagePart) -> int:
    """Input tokens of one image as this model's provider counts them (see the module)."""
    rule = image_rule(litellm_model, family)
    if rule == "gemini":
        return gemini_image_tokens(png_size(part.png))
    from evaluation.models.litellm_adapter import data_url

    import_litellm()
    from litellm.litellm_core_utils import token_counter as tc

    if rule == "litellm":
        return int(tc.estimate_image_tokens(litellm_model, data_url(part), "high"))
    return int(tc.calculate_img_tokens(data_url(part), "high"))


def request_tokens(litellm_model: str, family: str, messages: list[Message]) -> RequestTokens:
    """The input tokens of ``messages`` (as fitted for the provider) for ``litellm_model``."""
    litellm = import_litellm()
    text_only = [
        {"role": m.role, "content": "".join(p.text for p in m.content if isinstance(p, TextPart))}
        for m in messages
    ]
    text = int(litellm.token_counter(model=litellm_model, messages=text_only))
    images = sum(
        image_tokens(litellm_model, family, p)
        for m in messages
        for p in m.content
        if isinstance(p, ImagePart)
    )
    return RequestTokens(text=text, images=images, image_rule=image_rule(litellm_model, family))
