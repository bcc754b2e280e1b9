"""litellm itself: its lazy import (with the bundled price map), how its exceptions read, and
whether it can route a model name.

Shared by the adapter (evaluation.models.litellm_adapter), the worker pool (call_pool), the
provider profiles (providers) and the name check (spec), which all need litellm but not each
other.
"""

from __future__ import annotations

import asyncio
import os
import re
from typing import Any


def import_litellm() -> Any:
    """litellm, imported lazily with the bundled price map (it takes seconds to import)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    return litellm


def retry_after_of(exc: BaseException) -> float | None:
    """Seconds the provider asked us to wait: Retry-After(-ms), Gemini's RetryInfo
    ``retryDelay``, or OpenAI's "try again in 20ms" (litellm keeps the headers aside)."""
    for headers in (
        getattr(exc, "litellm_response_headers", None),
        getattr(getattr(exc, "response", None), "headers", None),
        getattr(exc, "headers", None),
    ):
        if not headers:
            continue
        try:
            if headers.get("retry-after-ms") is not None:
                return max(0.0, float(headers["retry-after-ms"]) / 1000)
            if headers.get("retry-after") is not None:
                return max(0.0, float(headers["retry-after"]))
        except (TypeError, ValueError):
            continue  # an HTTP date: use our own backoff
    m = _RETRY_DELAY.search(str(exc)) or _TRY_AGAIN.search(str(exc))
    if m is None:
        return None
    return float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)


# How a model name is written for the servers people run themselves or reach by URL.
ROUTES = (
    ("openai", "an OpenAI-compatible server, with --api-base / api_base"),
    ("hosted_vllm", "vLLM"),
    ("ollama_chat", "Ollama"),
    ("lm_studio", "LM Studio"),
    ("openrouter", "OpenRouter"),
)


def route_problem(litellm_model: str, api_base: str | None = None) -> str | None:
    """Why litellm cannot route ``litellm_model`` (None: it can), with what it could be: the
    provider prefixes it could take, a provider litellm knows spelt like the prefix, a model of
    litellm's price map spelt like the name. litellm's own routing decides; nothing is called."""
    import difflib

    litellm = import_litellm()
    try:
        litellm.get_llm_provider(litellm_model, api_base=api_base)
    except Exception:  # litellm says BadRequestError "LLM Provider NOT provided"
        pass
    else:
        return None
    prefix, _, rest = litellm_model.partition("/")
    providers = sorted(str(getattr(p, "value", p)) for p in litellm.provider_list)
    routes = "; ".join(f"{p}/{litellm_model} ({what})" for p, what in ROUTES)
    if rest:
        near = difflib.get_close_matches(prefix.lower(), providers, n=1, cutoff=0.6)
        mean = f" (did you mean {near[0]!r}?)" if near else ""
        return (
            f"{prefix[:80]!r} is not a provider litellm knows{mean}; with the provider in front "
            f"it could be {routes}"
        )
    names = [k for k in litellm.model_cost if "/" not in k and k != "sample_spec"]
    near = difflib.get_close_matches(litellm_model.lower(), names, n=1, cutoff=0.85)
    mean = f"did you mean {near[0]!r}? Or " if near else ""
    return (
        f"litellm cannot route {litellm_model[:120]!r}: a name with no provider prefix must be "
        f"one litellm knows. {mean}write the provider in front: {routes}"
    )


_RETRY_DELAY = re.compile(r'"retryDelay"\s*:\s*"(\d+(?:\.\d+)?)(s)"')
_TRY_AGAIN = re.compile(r"try again in (\d+(?:\.\d+)?)\s*(ms|s)\b", re.I)
_OVERLOAD = re.compile(r"overloaded|RESOURCE_EXHAUSTED|server busy", re.I)
# A 200 whose body is not JSON (a proxy's error page, a cut-off body), as litellm words it: its
# own HTTP handler (OpenAI-compatible routes, Anthropic) and its Gemini parser.
_GARBLED = re.compile(
    r"Unable to get json response|"
    r"Error converting to valid response block=.*line \d+ column \d+ \(char \d+\)"
)


def classify_exception(exc: BaseException) -> str:
    """ "throttle", "retry", "refusal" or "fatal" for an exception raised by a call."""
    litellm = import_litellm()
    if isinstance(exc, litellm.ContentPolicyViolationError):
        return "refusal"
    status = getattr(exc, "status_code", None)
    if isinstance(exc, litellm.RateLimitError) or status in (429, 529):
        return "throttle"
    if isinstance(status, int) and status >= 500 and _OVERLOAD.search(str(exc)):
        return "throttle"  # overloaded (Gemini 503 UNAVAILABLE, Ollama's full queue): slow down
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
    if isinstance(exc, litellm.APIError | litellm.BadRequestError) and _GARBLED.search(str(exc)):
        return "retry"  # a glitch of the answer, not a fault of the request
    return "fatal"
