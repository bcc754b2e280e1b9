"""Model I/O: the messages sent, the decoding parameters, what came back, and the adapter."""

from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field


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


@runtime_checkable
class ModelAdapter(Protocol):
    """Anything that answers messages: litellm models, the reference models, replay."""

    name: str

    async def generate(self, messages: list[Message], config: GenerateConfig) -> ModelOutput: ...
