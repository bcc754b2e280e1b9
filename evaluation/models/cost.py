"""How a cost is shown, everywhere (progress line, leaderboard, reports): the one rule.

A cost is *unknown* when no price is known for the model (litellm's local price map lacks it
and the provider did not say what it charged): it is then shown as ``unknown``, never ``$0``.
A known zero (the reference models, a replay) is shown as ``$0.0000``.
"""

from __future__ import annotations

UNKNOWN = "unknown"


def cost_text(usd: float | None, *, unknown_calls: int = 0, digits: int = 4) -> str:
    """``$0.0123``; ``unknown`` when nothing is priced; a partial sum says what it leaves out.

    ``usd``: the known part (None: none known); ``unknown_calls``: calls without a price.
    """
    unpriced = f"{unknown_calls} call{'s' if unknown_calls != 1 else ''} unpriced"
    if usd is None or (unknown_calls and usd == 0):
        return UNKNOWN + (f" ({unpriced})" if unknown_calls else "")
    text = f"${usd:.{digits}f}"
    return text + (f" + {UNKNOWN} ({unpriced})" if unknown_calls else "")


def call_cost(litellm_model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    """What one call of ``prompt_tokens`` in and ``completion_tokens`` out costs by litellm's
    bundled price map; None (unknown, never 0) for a model the map does not price.

    The price of an estimate and of the budget's reservations; a recorded call's cost is the
    one its response carried (the provider's charge, else the same map).
    """
    from evaluation.models.litellm_lib import import_litellm
    from evaluation.models.providers import price_known

    if not price_known(litellm_model):
        return None
    try:
        prompt, completion = import_litellm().cost_per_token(
            model=litellm_model,
            prompt_tokens=max(0, prompt_tokens),
            completion_tokens=max(0, completion_tokens),
        )
    except Exception:  # litellm's map lacks a field this route needs: not a price we know
        return None
    return float(prompt) + float(completion)
