"""Any model litellm can reach: OpenAI, Anthropic, Gemini, xAI, OpenRouter, vLLM, Ollama...

Images go as base64 PNG data-URL parts at full detail, in the order of the message parts;
litellm turns them into each provider's format (Anthropic ``source.base64``, Gemini
``inline_data``, Ollama raw base64 beside the text, where ``[img]`` markers keep their place).
First they are fitted to the provider's limits (:mod:`evaluation.models.fitting`: montage,
split, re-encode, downscale), and decoding parameters a model rejects (o1-style reasoning
models: temperature, top_p; Claude Opus 4.1, Sonnet 4.5 and later: top_p beside temperature,
unless litellm already leaves one out) or litellm drops for a provider are not sent; every such
change is recorded in ``ModelOutput.adjustments`` and logged once per model as a warning.
Decoding parameters are passed by their OpenAI names and litellm names them per provider. One
call is one sample: the provider's ``n`` is never used.
Retries are ours (litellm's and the SDK's are off): 429, overload (Anthropic 529), 5xx,
connection errors, timeouts and a 200 whose body is not JSON are retried with exponential
backoff and full jitter, honouring Retry-After (or Gemini's retryDelay); a 429 or overload also
halves the model's concurrency limit (:class:`AdaptiveLimiter`). A content-policy block, a
``content_filter`` finish (Anthropic ``refusal``, Gemini ``SAFETY`` or a blocked prompt) or
OpenAI's ``message.refusal`` is a refusal, not an error. Tokens come from the response; cost
from litellm's bundled price map (``LITELLM_LOCAL_MODEL_COST_MAP=True``: no network) or the
provider's charged cost, and is ``None`` (unknown), never 0, for a model the price map does not
know.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from dicom import credential
from evaluation.errors import ModelConfigError
from evaluation.modelio import GenerateConfig, ImagePart, Message, ModelOutput, TextPart
from evaluation.models.call_pool import CallPool, summarise_response
from evaluation.models.fitting import Adjustment, fit_images
from evaluation.models.limiter import AdaptiveLimiter, SharedLimit
from evaluation.models.litellm_lib import classify_exception, import_litellm, retry_after_of
from evaluation.models.providers import price_known, profile_for, unsent_params
from evaluation.models.spec import ModelSpec

log = logging.getLogger(__name__)
_DATA_URLS: OrderedDict[str, str] = OrderedDict()
_DATA_URL_CACHE = 256
_warned: set[tuple[str, str, str]] = set()


def data_url(part: ImagePart) -> str:
    """``data:image/png;base64,...`` of an image part (memoised by hash: samples reuse it)."""
    url = _DATA_URLS.get(part.sha256)
    if url is None:
        url = "data:image/png;base64," + base64.b64encode(part.png).decode("ascii")
        _DATA_URLS[part.sha256] = url
        if len(_DATA_URLS) > _DATA_URL_CACHE:
            _DATA_URLS.popitem(last=False)
    return url


def openai_messages(messages: list[Message], *, markers: bool = False) -> list[dict[str, Any]]:
    """Messages in the OpenAI chat format litellm takes (text and image_url parts, in order).

    ``markers`` (Ollama): a message's text becomes one part with an ``[img]`` marker where each
    image was, since Ollama keeps images apart from the text and puts each at the next marker.
    """
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role != "user" and all(isinstance(p, TextPart) for p in m.content):
            out.append({"role": m.role, "content": "".join(p.text for p in m.content)})  # type: ignore[union-attr]
            continue
        parts: list[dict[str, Any]] = []
        images = [
            {"type": "image_url", "image_url": {"url": data_url(p), "detail": "high"}}
            for p in m.content
            if isinstance(p, ImagePart)
        ]
        if markers and images:
            text = "\n".join(p.text if isinstance(p, TextPart) else "[img]" for p in m.content)
            out.append({"role": m.role, "content": [{"type": "text", "text": text}, *images]})
            continue
        for p in m.content:
            if isinstance(p, TextPart):
                parts.append({"type": "text", "text": p.text})
            else:
                parts.append(images.pop(0))
        out.append({"role": m.role, "content": parts})
    return out


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
        if spec.api_key_env and credential(spec.api_key_env) is None:
            raise ModelConfigError(
                f"model {spec.name!r}: environment variable {spec.api_key_env} (its API key) is not set"
            )
        for k in ("n", "candidate_count"):
            if k in spec.extra:
                raise ModelConfigError(
                    f"model {spec.name!r}: extra sets {k!r}; samples are independent calls "
                    "(use the run's samples), so remove it"
                )
        self.name = spec.name
        self.spec = spec
        self.profile = profile_for(spec)
        self.limiter = AdaptiveLimiter(spec.concurrency)
        # the provider's limit shared with other workers (set by the runner on a shared run)
        self.shared: SharedLimit | None = None
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._pool = pool
        self._price_known: bool | None = None
        self._prepared: dict[str, tuple[dict[str, Any], list[Adjustment]]] = {}

    def _kwargs(self, config: GenerateConfig) -> tuple[dict[str, Any], list[Adjustment]]:
        """litellm's keyword arguments for a config, and the parameters not sent as asked."""
        memo = config.model_dump_json()
        hit = self._prepared.get(memo)
        if hit is not None:
            return dict(hit[0]), hit[1]
        s, prof = self.spec, self.profile
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
            kw["api_key"] = credential(s.api_key_env) or ""
        elif s.api_base:
            kw["api_key"] = "no-key"  # local OpenAI-compatible servers ignore it; SDKs need one
        params: dict[str, Any] = {}
        for name in ("temperature", "top_p", "max_tokens"):
            value = getattr(s, name)
            value = value if value is not None else getattr(config, name)
            if value is not None:
                params[name] = value
        if config.seed is not None:
            params["seed"] = config.seed
        if config.json_mode:
            params["response_format"] = {"type": "json_object"}
        adjustments: list[Adjustment] = []
        if prof.reasoning:
            for name in ("temperature", "top_p"):
                if name in params:
                    adjustments.append(
                        {
                            "kind": "param_not_sent",
                            "param": name,
                            "value": params.pop(name),
                            "reason": f"{prof.model} is a reasoning model: it takes only its "
                            "default",
                        }
                    )
        t = params.get("temperature")
        if prof.temperature_max is not None and t is not None and t > prof.temperature_max:
            params["temperature"] = prof.temperature_max
            adjustments.append(
                {
                    "kind": "param_clamped",
                    "param": "temperature",
                    "value": t,
                    "sent": prof.temperature_max,
                    "reason": f"{prof.family} takes temperature 0..{prof.temperature_max}",
                }
            )
        if prof.one_sampler and "temperature" in params and "top_p" in params:
            both = {"temperature": params["temperature"], "top_p": params["top_p"]}
            if not unsent_params(prof, both):  # litellm would send both: the API would say 400
                adjustments.append(
                    {
                        "kind": "param_not_sent",
                        "param": "top_p",
                        "value": params.pop("top_p"),
                        "reason": f"{prof.model} takes temperature or top_p, not both: "
                        "temperature is sent",
                    }
                )
        if s.drop_params:
            for name in unsent_params(prof, params):
                adjustments.append(
                    {
                        "kind": "param_not_sent",
                        "param": name,
                        "value": params[name],
                        "reason": f"litellm does not send it to {prof.provider} ({prof.model})",
                    }
                )
        kw.update(params)
        kw.update(s.extra)
        for a in adjustments:
            key = (f"{prof.provider}/{prof.model}", a["kind"], a["param"])
            if key not in _warned:  # once per model and parameter, not per call
                _warned.add(key)
                log.warning("%s (%s %s): %s", prof.model, a["kind"], a["param"], a["reason"])
        self._prepared[memo] = (kw, adjustments)
        return dict(kw), adjustments

    # litellm's keyword arguments that are not decoding parameters (where and how to call)
    _NOT_DECODING = frozenset(
        {"model", "timeout", "num_retries", "max_retries", "drop_params", "api_base", "api_key"}
    )

    def sent_parameters(self, config: GenerateConfig) -> dict[str, Any]:
        """The decoding parameters a call with ``config`` sends (after what the model rejects
        or litellm drops was taken out, the spec's ``extra`` included; never the key)."""
        kwargs, _ = self._kwargs(config)
        return {k: v for k, v in kwargs.items() if k not in self._NOT_DECODING}

    def provider(self) -> str | None:
        """The provider litellm routes this model to (litellm's own ``get_llm_provider``)."""
        try:
            _, provider, _, _ = import_litellm().get_llm_provider(
                self.spec.litellm_model, api_base=self.spec.api_base
            )
        except Exception:  # litellm says BadRequestError for a name it cannot route
            return None
        return str(provider) if provider else None

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
        kwargs, adjustments = self._kwargs(config)
        fitted, fitting = fit_images(messages, self.profile)
        adjustments = adjustments + fitting
        kwargs["messages"] = openai_messages(fitted, markers=self.profile.image_markers)
        hard_timeout = float(kwargs["timeout"]) + 10.0
        attempt = 0
        while True:
            async with self.limiter.slot(), self._shared_slot():
                t0 = time.perf_counter()
                result = await self._attempt(kwargs, hard_timeout)
                latency = time.perf_counter() - t0
            if "ok" in result and result["ok"].get("fault"):
                # an empty reply is the provider's failure, not the model's answer: retry it
                result = {
                    "error": {
                        "kind": "retry",
                        "message": result["ok"]["fault"],
                        "retry_after": None,
                    }
                }
            if "ok" in result:
                self.limiter.on_success()
                return self._output(result["ok"], attempt, latency, adjustments)
            err = result["error"]
            if err["kind"] == "refusal":
                return ModelOutput(
                    refusal=True,
                    finish_reason="content_filter",
                    retries=attempt,
                    latency_s=latency,
                    raw={"exception": err["message"]},
                    adjustments=adjustments,
                )
            if err["kind"] == "throttle":
                self.limiter.on_throttle()
            if err["kind"] == "fatal" or attempt >= self.spec.max_retries:
                return ModelOutput(
                    error=err["message"],
                    retries=attempt,
                    latency_s=latency,
                    adjustments=adjustments,
                )
            await self._sleep(self._backoff(attempt, err["retry_after"]))
            attempt += 1

    def _shared_slot(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self.shared.slot() if self.shared is not None else contextlib.nullcontext()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def _output(
        self, summary: dict[str, Any], retries: int, latency: float, adjustments: list[Adjustment]
    ) -> ModelOutput:
        if self._price_known is None:
            self._price_known = price_known(self.spec.litellm_model)
        # The provider's own charge first; else the price map's, when it knows the model
        # (litellm reports 0 for a model it cannot price: that is "unknown", not free).
        cost = summary.get("charged_usd")
        if cost is None and self._price_known:
            cost = summary["cost_usd"]
        return ModelOutput(
            text=summary["text"],
            finish_reason=summary["finish_reason"],
            refusal=summary["finish_reason"] == "content_filter" or summary["refusal"],
            prompt_tokens=summary["prompt_tokens"],
            completion_tokens=summary["completion_tokens"],
            cost_usd=cost,
            latency_s=latency,
            retries=retries,
            raw=summary["raw"],
            adjustments=adjustments,
            served_model=summary.get("served_model"),
            system_fingerprint=summary.get("system_fingerprint"),
            version_headers=summary.get("version_headers") or {},
        )
