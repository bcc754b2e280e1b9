"""Any model litellm can reach: OpenAI, Anthropic, Gemini, xAI, OpenRouter, vLLM, Ollama...

Images go as base64 PNG data-URL parts at full detail, in the order of the message parts.
Decoding parameters are passed by their OpenAI names and litellm maps them per provider. One
call is one sample: the provider's ``n`` is never used (some drop it silently). Retries are
ours (litellm's and the SDK's are off): 429, 5xx, connection errors and timeouts are retried
with exponential backoff and full jitter, honouring Retry-After; a 429 also halves the model's
concurrency limit (:class:`AdaptiveLimiter`). A content-policy block or a ``content_filter``
finish is a refusal, not an error. Tokens and cost come from the response and litellm's bundled
price map (``LITELLM_LOCAL_MODEL_COST_MAP=True``: no network).
"""

from __future__ import annotations

import asyncio
import base64
import os
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from evaluation.errors import ModelConfigError
from evaluation.models.call_pool import CallPool, summarise_response
from evaluation.models.limiter import AdaptiveLimiter
from evaluation.models.spec import ModelSpec
from evaluation.records import GenerateConfig, ImagePart, Message, ModelOutput, TextPart

_DATA_URLS: OrderedDict[str, str] = OrderedDict()
_DATA_URL_CACHE = 256


def import_litellm() -> Any:
    """litellm, imported lazily with the bundled price map (it takes seconds to import)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    return litellm


def data_url(part: ImagePart) -> str:
    """``data:image/png;base64,...`` of an image part (memoised by hash: samples reuse it)."""
    url = _DATA_URLS.get(part.sha256)
    if url is None:
        url = "data:image/png;base64," + base64.b64encode(part.png).decode("ascii")
        _DATA_URLS[part.sha256] = url
        if len(_DATA_URLS) > _DATA_URL_CACHE:
            _DATA_URLS.popitem(last=False)
    return url


def openai_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Messages in the OpenAI chat format litellm takes (text and image_url parts, in order)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role != "user" and all(isinstance(p, TextPart) for p in m.content):
            out.append({"role": m.role, "content": "".join(p.text for p in m.content)})  # type: ignore[union-attr]
            continue
        parts: list[dict[str, Any]] = []
        for p in m.content:
            if isinstance(p, TextPart):
                parts.append({"type": "text", "text": p.text})
            else:
                parts.append(
                    {"type": "image_url", "image_url": {"url": data_url(p), "detail": "high"}}
                )
        out.append({"role": m.role, "content": parts})
    return out


def retry_after_of(exc: BaseException) -> float | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    value = headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def classify_exception(exc: BaseException) -> str:
    """ "throttle", "retry", "refusal" or "fatal" for an exception raised by a call."""
    litellm = import_litellm()
    if isinstance(exc, litellm.ContentPolicyViolationError):
        return "refusal"
    status = getattr(exc, "status_code", None)
    if isinstance(exc, litellm.RateLimitError) or status == 429:
        return "throttle"
    retryable = (
        litellm.Timeout,
        litellm.APIConnectionError,
        litellm.InternalServerError,
        litellm.ServiceUnavailableError,
        litellm.BadGatewayError,
        asyncio.TimeoutError,
        ConnectionError,
    )
    if isinstance(exc, retryable) or (isinstance(status, int) and status >= 500):
        return "retry"
    return "fatal"


class LiteLLMAdapter:
    """The litellm adapter of one model spec (its own concurrency limiter)."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
        pool: CallPool | None = None,
    ) -> None:
        if spec.api_key_env and spec.api_key_env not in os.environ:
            raise ModelConfigError(
                f"model {spec.name!r}: environment variable {spec.api_key_env} (its API key) is not set"
            )
        self.name = spec.name
        self.spec = spec
        self.limiter = AdaptiveLimiter(spec.concurrency)
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._pool = pool

    def _kwargs(self, config: GenerateConfig) -> dict[str, Any]:
        s = self.spec
        kw: dict[str, Any] = {
            "model": s.litellm_model,
            "timeout": s.timeout_s or config.timeout_s,
            "num_retries": 0,
            "max_retries": 0,
            "drop_params": s.drop_params,
        }
        if s.api_base:
            kw["api_base"] = s.api_base
        if s.api_key_env:
            kw["api_key"] = os.environ[s.api_key_env]
        elif s.api_base:
            kw["api_key"] = "no-key"  # local OpenAI-compatible servers ignore it; SDKs need one
        for name in ("temperature", "top_p", "max_tokens"):
            value = getattr(s, name)
            value = value if value is not None else getattr(config, name)
            if value is not None:
                kw[name] = value
        if config.seed is not None:
            kw["seed"] = config.seed
        if config.json_mode:
            kw["response_format"] = {"type": "json_object"}
        kw.update(s.extra)
        return kw

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        cap = min(self.spec.backoff_max_s, self.spec.backoff_base_s * (2**attempt))
        delay = self._rng.uniform(cap / 2, cap)  # jitter, so throttled callers spread out
        return max(delay, retry_after or 0.0)

    async def _attempt(self, kwargs: dict[str, Any], hard_timeout: float) -> dict[str, Any]:
        """One call: {"ok": summary} or {"error": {kind, message, retry_after}}."""
        if self._pool is not None:
            return await self._pool.call(kwargs, hard_timeout)
        litellm = import_litellm()
        try:
            resp = await asyncio.wait_for(litellm.acompletion(**kwargs), hard_timeout)
        except Exception as exc:
            return {
                "error": {
                    "kind": classify_exception(exc),
                    "message": f"{type(exc).__name__}: {str(exc)[:500]}",
                    "retry_after": retry_after_of(exc),
                }
            }
        return {"ok": summarise_response(resp)}

    async def generate(self, messages: list[Message], config: GenerateConfig) -> ModelOutput:
        kwargs = self._kwargs(config)
        kwargs["messages"] = openai_messages(messages)
        hard_timeout = float(kwargs["timeout"]) + 10.0
        attempt = 0
        while True:
            async with self.limiter.slot():
                t0 = time.perf_counter()
                result = await self._attempt(kwargs, hard_timeout)
                latency = time.perf_counter() - t0
            if "ok" in result:
                self.limiter.on_success()
                return self._output(result["ok"], attempt, latency)
            err = result["error"]
            if err["kind"] == "refusal":
                return ModelOutput(
                    refusal=True,
                    finish_reason="content_filter",
                    retries=attempt,
                    latency_s=latency,
                    raw={"exception": err["message"]},
                )
            if err["kind"] == "throttle":
                self.limiter.on_throttle()
            if err["kind"] == "fatal" or attempt >= self.spec.max_retries:
                return ModelOutput(error=err["message"], retries=attempt, latency_s=latency)
            await self._sleep(self._backoff(attempt, err["retry_after"]))
            attempt += 1

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def _output(self, summary: dict[str, Any], retries: int, latency: float) -> ModelOutput:
        return ModelOutput(
            text=summary["text"],
            finish_reason=summary["finish_reason"],
            refusal=summary["finish_reason"] == "content_filter" or summary["refusal"],
            prompt_tokens=summary["prompt_tokens"],
            completion_tokens=summary["completion_tokens"],
            cost_usd=summary["cost_usd"],
            latency_s=latency,
            retries=retries,
            raw=summary["raw"],
        )
