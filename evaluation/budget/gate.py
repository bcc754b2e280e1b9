"""A run's budget (``--max-cost USD``): the one gate every model and grader call passes.

Before a call is sent, the gate reserves the most it can cost: its input tokens as counted for
the provider (images fitted as the adapter fits them, :mod:`evaluation.models.tokens`) plus its
``max_tokens`` of answer, at litellm's price (:func:`evaluation.models.cost.call_cost`). A call
goes out only when the run's recorded cost (every stored response's cost, from earlier sessions
too) plus the reservations of the calls in flight plus its own stays within the budget; when it
would not, it waits for the calls in flight to come back (their real cost replaces their
reservation) and, with none left in flight and still no room, the run stops: no new call is
sent, calls in flight finish and are stored, the run is left resumable
(``neurosandbox runs resume RUN --max-cost MORE``).

So the run's recorded cost never passes the budget, up to the input-token estimate's error
(:mod:`evaluation.estimate` measures it). The built-in reference models and a replay cost a
known 0; a model the price map cannot price refuses the run (:func:`check_prices`) unless
``allow_unknown_cost``, and its calls then count as $0.
"""

from __future__ import annotations

import asyncio

from evaluation.call_keys import prompt_hash
from evaluation.errors import EvaluationError
from evaluation.modelio import ImagePart, Message
from evaluation.models.cost import call_cost, cost_text
from evaluation.models.fitting import fit_images
from evaluation.models.providers import price_known, profile_for
from evaluation.models.spec import ModelSpec
from evaluation.models.tokens import request_tokens
from evaluation.runconfig import RunConfig

# The answer a call may take when neither the model nor the run caps it (for the reservation).
UNCAPPED_OUTPUT_TOKENS = 8192


class UnknownPriceError(EvaluationError):
    """A budget was set and a model has no price: its calls could not be counted."""


class BudgetReached(EvaluationError):
    """The next call would pass the budget: the run stops (resumable)."""

    def __init__(self, spent_usd: float, max_usd: float, next_usd: float) -> None:
        self.spent_usd, self.max_usd, self.next_usd = spent_usd, max_usd, next_usd
        super().__init__(
            f"budget reached: {cost_text(spent_usd)} spent of {cost_text(max_usd)}; the next "
            f"call could cost up to {cost_text(next_usd)}"
        )


def unpriced_models(config: RunConfig) -> list[ModelSpec]:
    """The run's litellm models and graders litellm's price map cannot price."""
    specs = [*config.models, *config.graders]
    return [s for s in specs if s.kind == "litellm" and not price_known(s.litellm_model)]


def check_prices(config: RunConfig) -> None:
    """Refuse a budget the run cannot keep: a model without a price (unless allowed)."""
    if config.max_cost_usd is None or config.allow_unknown_cost:
        return
    unpriced = unpriced_models(config)
    if unpriced:
        names = ", ".join(f"{s.name} ({s.litellm_model})" for s in unpriced)
        raise UnknownPriceError(
            f"--max-cost {config.max_cost_usd:g}: litellm's price map has no price for {names}, "
            "so its calls cannot be counted against the budget; pass --allow-unknown-cost "
            "(they then count as $0) or leave out --max-cost"
        )


class CallSizer:
    """One model's calls as its adapter would send them: images fitted, input tokens counted
    (memoised by what is sent: samples of one prompt differ only in their seed)."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.profile = profile_for(spec) if spec.kind == "litellm" else None
        self._memo: dict[str, tuple[int, int, int, str | None]] = {}

    def size(self, outbound: list[Message]) -> tuple[int, int, int, str | None]:
        """(images sent, input tokens, image tokens, image rule) of one call; tokens 0 for a
        model that is not a litellm model."""
        memo = prompt_hash(outbound)
        hit = self._memo.get(memo)
        if hit is not None:
            return hit
        if self.profile is None:
            n = sum(isinstance(p, ImagePart) for m in outbound for p in m.content)
            out: tuple[int, int, int, str | None] = (n, 0, 0, None)
        else:
            fitted, _ = fit_images(outbound, self.profile)
            n = sum(isinstance(p, ImagePart) for m in fitted for p in m.content)
            tokens = request_tokens(self.spec.litellm_model, self.profile.family, fitted)
            out = (n, tokens.total, tokens.images, tokens.image_rule)
        self._memo[memo] = out
        return out

    def most(self, outbound: list[Message], max_tokens: int | None) -> float:
        """The most this call can cost (0 when its price is unknown or a known 0)."""
        if self.profile is None:
            return 0.0
        _, tokens, _, _ = self.size(outbound)
        cap = self.spec.max_tokens or max_tokens or UNCAPPED_OUTPUT_TOKENS
        return call_cost(self.spec.litellm_model, tokens, cap) or 0.0


class BudgetGate:
    """Recorded cost + reservations of calls in flight <= the budget (see the module)."""

    def __init__(self, max_usd: float, spent_usd: float = 0.0) -> None:
        self.max_usd = max_usd
        self.spent_usd = spent_usd
        self.reserved_usd = 0.0
        self.in_flight = 0
        self.reached: BudgetReached | None = None
        self._changed: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def reserve(self, most_usd: float) -> None:
        """Wait until a call that may cost ``most_usd`` fits; raise BudgetReached when it
        cannot (no call in flight left to free room), and for every call after that."""
        changed = self._condition()
        async with changed:
            while True:
                if self.reached is not None:
                    raise self.reached
                if self.spent_usd + self.reserved_usd + most_usd <= self.max_usd:
                    self.reserved_usd += most_usd
                    self.in_flight += 1
                    return
                if self.in_flight == 0:
                    self.reached = BudgetReached(self.spent_usd, self.max_usd, most_usd)
                    changed.notify_all()
                    raise self.reached
                await changed.wait()

    async def settle(self, most_usd: float, cost_usd: float | None) -> None:
        """A reserved call came back (or failed): its real cost replaces its reservation."""
        changed = self._condition()
        async with changed:
            self.reserved_usd = max(0.0, self.reserved_usd - most_usd)
            self.in_flight -= 1
            self.spent_usd += cost_usd or 0.0
            changed.notify_all()
