"""Model I/O: the messages sent, the decoding parameters, what came back, and the adapter."""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field, field_validator


class TextPart(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ImagePart(BaseModel):
    type: Literal["image"] = "image"
    png: bytes = Field(repr=False)
    sha256: str
    label: str = ""


class Message(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: list[TextPart | ImagePart]


class GenerateConfig(BaseModel):
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    json_mode: bool = False
    timeout_s: float = 120.0


class ModelOutput(BaseModel):
    """What a model returned for one call (one sample)."""

    text: str = ""
    finish_reason: str | None = None
    refusal: bool = False  # a refusal or safety block, recorded as such, never a wrong answer
    error: str | None = None  # transport/provider failure after retries
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None
    latency_s: float | None = None
    retries: int = 0
    raw: dict[str, Any] | None = None  # provider response (JSON) as received
    # What the adapter changed to fit the provider (images montaged, split, re-encoded or
    # downscaled; parameters not sent or clamped), each {"kind", ..., "reason"}; see
    # evaluation.models.fitting. Stored with the response, so the run records it.
    adjustments: list[dict[str, Any]] = Field(default_factory=list)
    # What the provider says about the model that answered (the run's passports read them):
    # the response's ``model``, its ``system_fingerprint``, and version headers of the reply
    # (``openai-version``, ``anthropic-version``, ``x-ms-...-version``...). Hostile: bounded by
    # ``reported_value`` and ``reported_headers``.
    REPORTED: ClassVar[frozenset[str]] = frozenset(
        {"served_model", "system_fingerprint", "version_headers"}
    )
    served_model: str | None = None
    system_fingerprint: str | None = None
    version_headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("served_model", "system_fingerprint", mode="before")
    @classmethod
    def _bounded(cls, v: Any) -> str | None:
        return reported_value(v)

    @field_validator("version_headers", mode="before")
    @classmethod
    def _bounded_headers(cls, v: Any) -> dict[str, str]:
        return reported_headers(v)


MAX_REPORTED = 200  # characters of a value a provider reports about its model
MAX_HEADERS = 16  # version headers kept per reply
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200b-\u200f\u202a-\u202e\u2066-\u2069]")
_VERSION_HEADER = re.compile(r"version|(^|-)model$")


def reported_value(value: Any) -> str | None:
    """A value a provider reports (a model name, a fingerprint, a header) as a short printable
    string: a string or number kept, control and direction characters dropped, cut at
    ``MAX_REPORTED`` characters (with ``...``); anything else (an object, a list, empty) None."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    text = _CONTROL.sub("", str(value)).strip()
    if not text:
        return None
    return text if len(text) <= MAX_REPORTED else text[: MAX_REPORTED - 3] + "..."


def reported_headers(headers: Any) -> dict[str, str]:
    """The version headers among a reply's headers (names lower-cased, litellm's
    ``llm_provider-`` prefix removed; a name with "version" in it, or ending in "-model"),
    values as ``reported_value`` keeps them; at most ``MAX_HEADERS``."""
    if not isinstance(headers, dict):
        try:
            headers = dict(headers.items())  # httpx.Headers and other mappings
        except (AttributeError, TypeError, ValueError):
            return {}
    out: dict[str, str] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or len(name) > 100:
            continue
        key = name.lower().removeprefix("llm_provider-")
        if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", key) or not _VERSION_HEADER.search(key):
            continue
        kept = reported_value(value)
        if kept is not None and key not in out:
            out[key] = kept
            if len(out) >= MAX_HEADERS:
                break
    return dict(sorted(out.items()))


@runtime_checkable
class ModelAdapter(Protocol):
    """Anything that answers messages: litellm models, the reference models, replay."""

    name: str

    async def generate(self, messages: list[Message], config: GenerateConfig) -> ModelOutput: ...
