"""ASGI middleware: requests in progress, request body size limit, access log without PHI,
metrics, audit."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.audit import AuditLog
from gateway.metrics import METRICS

log = logging.getLogger("gateway.api")
QUIET_PATHS = {"/health", "/metrics"}  # not audited (scraped every few seconds)
# The web viewer's files and DICOMweb reads: one series opened makes hundreds of requests; the
# opening itself is audited by the viewer. Refusals (4xx/5xx) still go to the audit log.
QUIET_WHEN_OK = "/review/viewer/"


class _TooLarge(Exception):
    pass


class _SlowBody(Exception):
    pass


async def _send_json(send: Send, status: int, detail: str, *, close: bool = False) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:  # the rest of the request will never be read: free the connection now
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _NotJsonNumber(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NotJsonNumber(name)


class StrictJson:
    """A JSON request body with NaN or Infinity (which Python's parser accepts but JSON has
    not) is refused with 422 before any handler sees it. Bodies are already bounded by
    ``BodyLimit``, which wraps this."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        ctype = dict(scope.get("headers", [])).get(b"content-type", b"")
        if not ctype.split(b";")[0].strip().lower().endswith(b"json"):
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":
                await self.app(scope, receive, send)  # disconnected: let the app see it
                return
            chunks.append(msg.get("body", b""))
            more = msg.get("more_body", False)
        body = b"".join(chunks)
        # Only a body holding these words can hold the constants: others are parsed once, by
        # the handler.
        if b"NaN" in body or b"Infinity" in body:
            try:
                json.loads(body, parse_constant=_refuse_constant)
            except _NotJsonNumber as exc:
                await _send_json(
                    send,
                    422,
                    f"{exc} is not a JSON number: send finite numbers (no NaN, no Infinity)",
                )
                return
            except ValueError:
                pass  # not JSON at all: the handler's validation says so
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class ConcurrencyLimit:
    """At most ``max_requests`` HTTP requests in progress; more are answered 503 at once.

    It counts requests, never connections (uvicorn's ``limit_concurrency`` counts both, so
    idle sockets made /health answer 503); how many connections may wait for their headers,
    and for how long, is ``gateway.http_guard``'s business."""

    def __init__(self, app: ASGIApp, max_requests: int) -> None:
        if max_requests < 1:
            raise ValueError(f"max_requests must be at least 1, not {max_requests}")
        self.app, self.max_requests, self.in_progress = app, max_requests, 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.in_progress >= self.max_requests:
            await _send_json(
                send, 503, f"{self.in_progress} requests in progress, the most allowed: retry"
            )
            return
        self.in_progress += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_progress -= 1


class BodyLimit:
    """Refuse request bodies over ``max_bytes`` (413), by header and by counting the stream,
    and bodies not complete within ``timeout_s`` of the request's start (408): a client that
    sends half a body and waits must not hold a worker forever."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        timeout_s: float = 30.0,
        wider: dict[str, tuple[int, float]] | None = None,
    ) -> None:
        """``wider``: path prefix -> (max_bytes, timeout_s) for routes that take studies
        (STOW-RS), every other route keeps the API's bound."""
        self.app, self.default = app, (max_bytes, timeout_s)
        self.wider = dict(wider or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        max_bytes, timeout_s = next(
            (v for prefix, v in self.wider.items() if path.startswith(prefix)), self.default
        )
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    too_big = int(value) > max_bytes
                except ValueError:
                    await _send_json(send, 400, "invalid Content-Length")
                    return
                if too_big:
                    await _send_json(send, 413, f"request body over {max_bytes} bytes")
                    return
        seen = 0
        started = False
        body_done = False
        deadline = time.monotonic() + timeout_s

        async def limited() -> Message:
            nonlocal seen, body_done
            if body_done:  # after the body, receive() waits for the disconnect: no deadline
                return await receive()
            try:
                msg = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise _SlowBody from None
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > max_bytes:
                    raise _TooLarge
                body_done = not msg.get("more_body", False)
            else:
                body_done = True
            return msg

        async def watch(msg: Message) -> None:
            nonlocal started
            started = started or msg["type"] == "http.response.start"
            await send(msg)

        try:
            await self.app(scope, limited, watch)
        except _TooLarge:
            if not started:  # the rest of the body is never read: free the connection now
                await _send_json(send, 413, f"request body over {max_bytes} bytes", close=True)
        except _SlowBody:
            if not started:
                await _send_json(
                    send,
                    408,
                    f"request body not complete within {timeout_s:g} s: send it whole",
                    close=True,
                )


class AccessLog:
    """Log method, route template, status and time; count metrics; write the audit trail.

    The route template (``/studies/{study_id}``) is logged, never the concrete path or query.
    """

    def __init__(self, app: ASGIApp, audit: AuditLog) -> None:
        self.app, self.audit = app, audit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500
        done = False

        def record() -> None:
            # Once per request, before the reply's last byte leaves: a client that reads the
            # audit log after its reply finds its own request there.
            nonlocal done
            if done:
                return
            done = True
            route: Any = scope.get("route")
            template = getattr(route, "path", None) or "(unmatched)"
            method = scope.get("method", "")
            dt = time.perf_counter() - t0
            METRICS.inc("http_requests_total", route=template, method=method, status=str(status))
            METRICS.observe("http_request_seconds", dt, route=template)
            log.info("%s %s -> %d (%.0f ms)", method, template, status, dt * 1000)
            quiet = template in QUIET_PATHS or (template.startswith(QUIET_WHEN_OK) and status < 400)
            if not quiet:
                state = scope.get("state") or {}
                actor = state.get("actor", "anonymous")
                self.audit.write(actor, f"{method} {template}", _target(scope), str(status))

        async def watch(msg: Message) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = int(msg["status"])
            elif msg["type"] == "http.response.body" and not msg.get("more_body", False):
                record()
            await send(msg)

        try:
            await self.app(scope, receive, watch)
        finally:
            record()


def _target(scope: Scope) -> str:
    """The opaque ids of the request (run id, Orthanc study id), not free text."""
    params = scope.get("path_params") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(params.items()) if k in ("run_id", "study_id"))[
        :200
    ]
