"""What the runner is asking right now (case, task, sample, turn), for adapters that need it.

The adapter protocol is ``generate(messages, config)``; replay needs to know which recorded
answer is wanted, so the runner sets this context variable around each call (it follows the
asyncio task, so concurrent calls never see each other's).
"""

from __future__ import annotations

from contextvars import ContextVar

from pydantic import BaseModel


class RequestContext(BaseModel):
    case_id: str
    task: str  # TaskItem.key, e.g. "differential" or "differential#q2"
    family: str
    sample: int
    turn: int  # 1-based
    cache_key: str


current_request: ContextVar[RequestContext | None] = ContextVar("current_request", default=None)
