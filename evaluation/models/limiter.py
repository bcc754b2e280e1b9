"""A per-model concurrency limit that backs off on rate limits (AIMD) and recovers slowly.

Additive increase, multiplicative decrease, as TCP does: each success adds 1/limit (one slot per
window of successes), each 429 halves the limit (at most once per cool-down, since one burst of
429s is one signal). Waiters are served first come, first served.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol


class AdaptiveLimiter:
    def __init__(self, max_limit: int, min_limit: int = 1, cooldown_s: float = 1.0) -> None:
        self.max_limit = max(1, max_limit)
        self.min_limit = max(1, min(min_limit, self.max_limit))
        self.limit = float(self.max_limit)
        self.cooldown_s = cooldown_s
        self.in_flight = 0
        self.max_in_flight = 0  # highest concurrency reached (for reports and tests)
        self.throttles = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._last_decrease = -1e9

    @property
    def current(self) -> int:
        return max(self.min_limit, int(self.limit))

    async def acquire(self) -> None:
        if self.in_flight < self.current and not self._waiters:
            self._take()
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # the slot was handed over as we were cancelled
            else:
                self._waiters.remove(fut)
            raise

    def _take(self) -> None:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def release(self) -> None:
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.in_flight < self.current:
            fut = self._waiters.popleft()
            if fut.done():
                continue
            self._take()
            fut.set_result(None)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        await self.acquire()
        try:
            yield
        finally:
            self.release()

    def on_success(self) -> None:
        if self.limit < self.max_limit:
            self.limit = min(float(self.max_limit), self.limit + 1.0 / self.limit)
            self._wake()

    def on_throttle(self) -> None:
        self.throttles += 1
        now = time.monotonic()
        if now - self._last_decrease >= self.cooldown_s:
            self.limit = max(float(self.min_limit), self.limit / 2)
            self._last_decrease = now


class SharedLimit(Protocol):
    """A provider's limit shared with other workers (evaluation.log.claims gives one): an
    adapter holds a slot for each request it sends."""

    def slot(self) -> contextlib.AbstractAsyncContextManager[None]: ...
