"""The HTTP API's connections: a deadline for request headers and a share per client address.

uvicorn reads request headers without a deadline and its only limit (``limit_concurrency``)
counts connections: 64 sockets that send half a request line held every slot, and /health
answered 503 for as long as they stayed open. This module keeps uvicorn and its h11 protocol,
and adds through uvicorn's extension point (``Config(http=<protocol class>)``):

- a header deadline: from the connection (or the end of the previous response on a kept-alive
  connection) to the end of the request's headers, ``header_timeout_s`` at most, however the
  bytes trickle in. Past it the connection is closed (with 408 if part of a request came);
- a share per client address (``per_client`` connections) and a total (``total``): a new
  connection over either makes room by closing the connection of that address (or, for the
  total, of any address) that has waited longest for its headers. A client that sends its
  request at once waits milliseconds, so the one closed is a slow or idle one; a connection
  inside a request is never closed for room. When none waits, the new one is answered 503;
- the limit on requests in progress moves to ``gateway.api.middleware.ConcurrencyLimit``,
  which counts requests, not connections.

The class follows uvicorn's ``H11Protocol`` (``connection_made``, ``data_received``,
``on_response_complete``, ``connection_lost``, ``cycle``); see docs/gateway.md for why
uvicorn stays (neither granian nor hypercorn limits connections per client).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


def _plain(status: str, text: str, *extra: str) -> bytes:
    """A whole HTTP/1.1 response that closes the connection (written before any app runs)."""
    body = (text + "\r\n").encode()
    head = [f"HTTP/1.1 {status}", "content-type: text/plain; charset=utf-8"]
    head += [f"content-length: {len(body)}", *extra, "connection: close", "", ""]
    return "\r\n".join(head).encode() + body


_TIMEOUT_408 = _plain("408 Request Timeout", "request headers not complete in time")
_BUSY_503 = _plain(
    "503 Service Unavailable", "every connection of this address is busy", "retry-after: 1"
)


@dataclass(frozen=True)
class ConnectionLimits:
    """How long request headers may take, and how many connections one address and all hold."""

    header_timeout_s: float = 10.0
    per_client: int = 16
    total: int = 256

    def __post_init__(self) -> None:
        if not self.header_timeout_s > 0:
            raise ValueError(f"header timeout must be > 0 s, not {self.header_timeout_s}")
        if not 1 <= self.per_client <= self.total:
            raise ValueError(
                f"connections per client ({self.per_client}) must be 1..total ({self.total})"
            )


class _Registry:
    """The open connections of one server, by client address (used on the event loop only)."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.by_peer: dict[str, dict[GuardedH11Protocol, None]] = {}
        self.all: dict[GuardedH11Protocol, None] = {}
        self.closed_slow = 0  # closed at the header deadline
        self.closed_for_room = 0  # closed to make room for a newer connection
        self.refused = 0  # answered 503: every connection of the address was in a request

    def admit(self, conn: GuardedH11Protocol) -> bool:
        mine = self.by_peer.setdefault(conn.peer, {})
        if len(mine) >= self.limits.per_client and not self._make_room(mine):
            return False
        if len(self.all) >= self.limits.total and not self._make_room(self.all):
            return False
        mine[conn] = None
        self.all[conn] = None
        return True

    def remove(self, conn: GuardedH11Protocol) -> None:
        self.all.pop(conn, None)
        mine = self.by_peer.get(conn.peer)
        if mine is not None:
            mine.pop(conn, None)
            if not mine:
                del self.by_peer[conn.peer]

    def _make_room(self, group: dict[GuardedH11Protocol, None]) -> bool:
        waiting = [c for c in group if c.waiting_since is not None]
        if not waiting:
            self.refused += 1
            return False
        oldest = min(waiting, key=lambda c: c.waiting_since or 0.0)
        self.remove(oldest)
        oldest.close_waiting()
        self.closed_for_room += 1
        return True


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the header deadline and the per-address share."""

    registry: _Registry  # set on the subclass ``guarded_protocol`` makes

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.peer = self.client[0] if self.client else ""
        self.waiting_since: float | None = None
        self._waiting_cycle: Any = None
        self._received = 0  # bytes of the request being waited for
        self._deadline: asyncio.TimerHandle | None = None
        if not self.registry.admit(self):
            transport.write(_BUSY_503)
            transport.close()
            return
        self._wait_for_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self.registry.remove(self)
        self._stop_waiting()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.waiting_since is not None:
            self._received += len(data)
        super().data_received(data)
        self._check_request_started()

    def on_response_complete(self) -> None:
        if not self.transport.is_closing():
            self._wait_for_headers()  # before the stock method: it may start a pipelined request
        super().on_response_complete()
        self._check_request_started()

    # ----------------------------------------------------------------- the header deadline

    def _wait_for_headers(self) -> None:
        self._stop_waiting()
        self.waiting_since = time.monotonic()
        self._waiting_cycle = self.cycle
        self._received = 0
        timeout = self.registry.limits.header_timeout_s
        self._deadline = self.loop.call_later(timeout, self._headers_late)

    def _stop_waiting(self) -> None:
        self.waiting_since = None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _check_request_started(self) -> None:
        # uvicorn makes a new cycle once a request's headers are complete
        if self.waiting_since is not None and self.cycle is not self._waiting_cycle:
            self._stop_waiting()

    def _headers_late(self) -> None:
        self._deadline = None
        if self.waiting_since is None or self.transport.is_closing():
            return
        self.registry.closed_slow += 1
        log.debug("HTTP connection closed: request headers not complete in time")
        if self._received:  # part of a request came: say why it ends
            self.transport.write(_TIMEOUT_408)
        self.close_waiting()

    def close_waiting(self) -> None:
        """Close this connection, which is waiting for request headers."""
        self._stop_waiting()
        self.transport.close()


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedH11Protocol]:
    """A protocol class for ``uvicorn.Config(http=...)``, with its own connection registry."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"registry": _Registry(limits)})
