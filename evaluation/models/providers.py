"""What each provider accepts: image limits, parameter quirks, and how litellm reaches it.

A :class:`ProviderProfile` is derived from the litellm model name (its ``provider/`` prefix,
else litellm's own routing) and may be tightened by the spec (``max_images_per_request`` etc.).
The limits are the providers' documented ones; sizes are measured on the base64 text as it is
sent, which is what the strictest providers (Anthropic) measure.

    openai      (any ``openai/`` route) 20 MB per image, 50 MB of images per request, 500 images per request
    anthropic   5 MB per image, 32 MB per request, 100 images, 8000 px a side (2000 px when a
                request holds more than 20 images), temperature 0..1; Claude Opus 4.1,
                Sonnet 4.5, Haiku 4.5 and later take temperature or top_p, not both; the same
                rules for Claude on Bedrock and Vertex AI (``bedrock/anthropic.claude-...``,
                ``vertex_ai/claude-...``; a cloud's own limits can be set on the spec)
    gemini      20 MB per request (inline data), 3000 images per request
    xai         10 MiB per image
    ollama      images as raw base64 beside the text: ``[img]`` markers keep their place;
                Llama 3.2 Vision (mllama) takes one image per request
    bedrock (models other than Claude), vllm, openrouter, lm_studio...: no default limit (for vLLM set
                ``max_images_per_request`` to the server's ``--limit-mm-per-prompt``)

Reasoning models (o1, o3, o4, gpt-5 but not gpt-5-chat) reject ``temperature`` and ``top_p``:
they are not sent, and that is recorded.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict

from evaluation.models.spec import LIMITS, ModelSpec

MB = 1024 * 1024
REASONING = re.compile(r"^(o1|o3|o4)(-|$)|^gpt-5(?!-chat)")
MLLAMA = re.compile(r"llama3\.2-vision|llama-3\.2-.*vision|mllama", re.I)
# claude-opus-4-1-20250805, claude-sonnet-4-5, claude-haiku-4-5@20251001: tier, major, minor
# (a date after the major, as in claude-sonnet-4-20250514, is no minor version).
CLAUDE = re.compile(r"claude-(opus|sonnet|haiku)-(\d+)(?:[-.](\d{1,2}))?(?=$|[-@:])")
# The first version of each tier that rejects temperature and top_p together (HTTP 400
# "`temperature` and `top_p` cannot both be specified for this model").
ONE_SAMPLER_FROM = {"opus": (4, 1), "sonnet": (4, 5), "haiku": (4, 5)}
# OpenAI-format routes of litellm: the family a prefix belongs to.
FAMILIES = {
    "openai": "openai",
    "text-completion-openai": "openai",
    "azure": "openai",
    "anthropic": "anthropic",
    "gemini": "gemini",
    "vertex_ai": "gemini",
    "xai": "xai",
    "openrouter": "openrouter",
    "ollama_chat": "ollama",
    "ollama": "ollama",
    "bedrock": "bedrock",
    "hosted_vllm": "vllm",
    "vllm": "vllm",
    "lm_studio": "openai-compatible",
    "llamafile": "openai-compatible",
    "litellm_proxy": "openai-compatible",
}
# Servers one runs oneself: no price in any price map.
LOCAL_PROVIDERS = {"ollama", "ollama_chat", "hosted_vllm", "vllm", "lm_studio", "llamafile"}
# Clouds that also serve Anthropic's Claude (Messages API, same image and sampling rules).
CLAUDE_CLOUDS = {"bedrock", "vertex_ai"}


class ProviderProfile(BaseModel):
    """The limits and quirks one model's requests must respect."""

    model_config = ConfigDict(frozen=True)

    # openai, anthropic, gemini, xai, openrouter, bedrock, ollama, vllm, openai-compatible
    family: str
    provider: str  # litellm's provider name (route)
    model: str  # the model name the provider sees
    max_image_bytes: int | None = None  # per image, base64 as sent
    max_request_image_bytes: int | None = None  # all images of one request, base64
    max_images_per_request: int | None = None
    max_images_per_message: int | None = None
    max_image_side: int | None = None
    many_images: tuple[int, int] | None = None  # (count, side): more images, smaller sides
    temperature_max: float | None = None
    image_markers: bool = False  # Ollama: "[img]" in the text marks where each image goes
    reasoning: bool = False  # rejects temperature/top_p (o1-style)
    one_sampler: bool = False  # takes temperature or top_p, not both (Claude Sonnet 4.5...)

    @property
    def local(self) -> bool:
        """A server one runs oneself (no price in any price map)."""
        return self.provider in LOCAL_PROVIDERS


def split_model(litellm_model: str) -> tuple[str, str]:
    """(provider, model) as litellm routes a model name (prefix first, then litellm's rules)."""
    prefix, _, rest = litellm_model.partition("/")
    if rest and prefix in FAMILIES:
        return prefix, rest
    from evaluation.models.litellm_lib import import_litellm

    try:
        model, provider, _, _ = import_litellm().get_llm_provider(litellm_model)
    except Exception:  # unknown to litellm: it will say so when called
        return "openai", litellm_model
    return str(provider), str(model)


def _defaults(family: str, model: str) -> dict[str, Any]:
    if family == "openai":
        return {
            "max_image_bytes": 20 * MB,
            "max_request_image_bytes": 50 * MB,
            "max_images_per_request": 500,
            "reasoning": bool(REASONING.match(model.rsplit("/", 1)[-1])),
        }
    if family == "anthropic":
        return {
            "max_image_bytes": 5 * MB,
            "max_request_image_bytes": 30 * MB,  # 32 MB per request, with room for the text
            "max_images_per_request": 100,
            "max_image_side": 8000,
            "many_images": (20, 2000),
            "temperature_max": 1.0,
            "one_sampler": one_sampler(model),
        }
    if family == "gemini":
        return {"max_request_image_bytes": 19 * MB, "max_images_per_request": 3000}
    if family == "xai":
        return {"max_image_bytes": 10 * MB}
    if family == "ollama":
        return {
            "image_markers": True,
            "max_images_per_request": 1 if MLLAMA.search(model) else None,
        }
    if family == "openai-compatible":
        return {"reasoning": bool(REASONING.match(model.rsplit("/", 1)[-1]))}
    return {}


def family_of(provider: str, model: str) -> str:
    """The family whose rules a model's requests follow: Claude is Claude on Bedrock and Vertex
    AI too (``bedrock/anthropic.claude-sonnet-4-5-...``, ``vertex_ai/claude-sonnet-4-5@...``)."""
    if provider in CLAUDE_CLOUDS and "claude" in model.lower():
        return "anthropic"
    return FAMILIES.get(provider, "openai-compatible")


def one_sampler(model: str) -> bool:
    """Whether a Claude model takes temperature or top_p but not both (Opus 4.1, Sonnet 4.5,
    Haiku 4.5 and every later version)."""
    m = CLAUDE.search(model.lower())
    if m is None:
        return False
    version = (int(m.group(2)), int(m.group(3) or 0))
    return version >= ONE_SAMPLER_FROM[m.group(1)]


@lru_cache(maxsize=256)
def _profile(litellm_model: str, overrides: tuple[tuple[str, Any], ...]) -> ProviderProfile:
    provider, model = split_model(litellm_model)
    family = family_of(provider, model)
    fields = _defaults(family, model)
    for k, v in overrides:
        fields[k] = v if isinstance(v, bool) else (v or None)  # a limit of 0: none
    return ProviderProfile(family=family, provider=provider, model=model, **fields)


def profile_for(spec: ModelSpec) -> ProviderProfile:
    """The profile of a litellm model spec (provider defaults, then the spec's own limits)."""
    overrides = tuple((k, getattr(spec, k)) for k in LIMITS if getattr(spec, k) is not None)
    return _profile(spec.litellm_model, overrides)


def price_known(litellm_model: str) -> bool:
    """Whether litellm's bundled price map prices this model (else cost is unknown, not 0).

    Looked up in ``litellm.model_cost`` itself: ``get_model_info`` invents a zero-priced entry
    for an unknown Anthropic model and asks a live Ollama server, neither of which we want.
    """
    from evaluation.models.litellm_lib import import_litellm

    prices = import_litellm().model_cost
    provider, model = split_model(litellm_model)
    for key in (litellm_model, f"{provider}/{model}", model):
        entry = prices.get(key)
        if entry and entry.get("input_cost_per_token") is not None:
            return provider == entry.get("litellm_provider", provider) or key != model
    return False


# OpenAI names of the decoding parameters -> the names providers give them (litellm maps them).
ALIASES = {
    "temperature": ("temperature",),
    "top_p": ("top_p", "topP"),
    "max_tokens": (
        "max_tokens",
        "max_completion_tokens",
        "max_output_tokens",
        "maxTokens",  # Bedrock Converse
        "num_predict",
    ),
    "seed": ("seed",),
    "response_format": ("response_format", "response_mime_type", "response_schema", "format"),
}


def unsent_params(profile: ProviderProfile, params: dict[str, Any]) -> list[str]:
    """Which of ``params`` (OpenAI names) litellm will not send to this provider and model."""
    from evaluation.models.litellm_lib import import_litellm

    litellm = import_litellm()
    try:
        from litellm.utils import get_optional_params

        sent = get_optional_params(
            model=profile.model,
            custom_llm_provider=profile.provider,
            drop_params=True,
            **params,
        )
        return [p for p in params if not any(a in sent for a in ALIASES.get(p, (p,)))]
    except Exception:  # litellm's internals moved: fall back to its public list
        supported = litellm.get_supported_openai_params(
            model=profile.model, custom_llm_provider=profile.provider
        )
        return [p for p in params if supported is not None and p not in supported]
