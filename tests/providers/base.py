"""What every provider test server shares: a real HTTP server on loopback, in a thread.

A server checks each request against its provider's format, answers in that format, and
records what it saw (path, headers, body, the problems it found). Faults are scripted: a
:class:`Fault` answers matching requests with a provider error (rate limit, overload, refusal,
safety block...) ``times`` times, then requests are answered normally. One fault every server
shares, ``garbled``, answers 200 with a body that is not JSON (a proxy's HTML page), whatever
the request, as a misbehaving load balancer in front of any provider does.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

GARBLED_PAGE = "<html><body><h1>200 OK</h1>upstream answered nothing</body></html>"
SHARED_FAULTS = {"garbled"}  # answered by the base server, before the provider's checks


@dataclass
class Fault:
    kind: str  # "garbled", or provider-specific: "429", "529", "503", "refusal", "safety", ...
    match: str | None = None  # substring of the raw request body; None = any request
    times: int = 1


@dataclass
class Exchange:
    """One request as the server saw it."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    status: int = 0
    problems: list[str] = field(default_factory=list)
    fault: str | None = None  # a shared fault that answered it ("garbled")


@dataclass
class Reply:
    status: int
    payload: Any
    headers: dict[str, str] = field(default_factory=dict)
    text: str | None = None  # sent as is (text/html) instead of the JSON payload


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ProviderServer:
    """Base of the provider servers: subclasses implement ``handle`` (and ``error``)."""

    family = "base"

    def __init__(
        self,
        *,
        reply: str = '{"final_diagnosis": "multiple sclerosis"}',
        faults: list[Fault] | None = None,
        prompt_tokens: int = 1200,
        completion_tokens: int = 80,
    ) -> None:
        self.reply = reply
        self.faults = list(faults or [])
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.exchanges: list[Exchange] = []  # generation requests
        self.side: list[Exchange] = []  # other requests (model info lookups)
        self.lock = threading.Lock()
        self._fault_used: dict[int, int] = {}
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    # ---------------------------------------------------------------- lifecycle

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_base(self) -> str:
        """What a models file puts in ``api_base`` for this provider."""
        return self.root

    def __enter__(self) -> ProviderServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    # ---------------------------------------------------------------- what was seen

    @property
    def calls(self) -> int:
        return len(self.exchanges)

    @property
    def bodies(self) -> list[Any]:
        return [e.body for e in self.exchanges]

    def problems(self) -> list[str]:
        return [p for e in self.exchanges for p in e.problems]

    # ---------------------------------------------------------------- for subclasses

    def take_fault(self, raw: str, *, shared: bool = False) -> Fault | None:
        """The next fault for this request: a provider's own kind, or (``shared``) a kind every
        server answers the same way (:data:`SHARED_FAULTS`)."""
        with self.lock:
            for i, f in enumerate(self.faults):
                used = self._fault_used.get(i, 0)
                if (f.kind in SHARED_FAULTS) != shared:
                    continue
                if used < f.times and (f.match is None or f.match in raw):
                    self._fault_used[i] = used + 1
                    return f
        return None

    def reply_for(self, raw: str) -> str:
        """The scripted answer; a server subclass may override (e.g. per prompt)."""
        return self.reply

    def is_side(self, path: str) -> bool:
        """A request that is not a generation (kept apart from ``exchanges``)."""
        return False

    def handle(self, ex: Exchange, raw: str) -> Reply:
        raise NotImplementedError


def _handler_for(server: ProviderServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _serve(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except json.JSONDecodeError:
                body = None
            ex = Exchange(method, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            with server.lock:
                (server.side if server.is_side(self.path) else server.exchanges).append(ex)
            text = raw.decode("utf-8", "replace")
            if raw and body is None:
                reply = Reply(400, {"error": {"message": "body is not JSON"}})
            elif not server.is_side(self.path) and (shared := server.take_fault(text, shared=True)):
                ex.fault = shared.kind
                reply = Reply(200, None, text=GARBLED_PAGE)
            else:
                reply = server.handle(ex, text)
            ex.status = reply.status
            if reply.text is not None:
                payload, content_type = reply.text.encode(), "text/html; charset=utf-8"
            else:
                payload, content_type = json.dumps(reply.payload).encode(), "application/json"
            self.send_response(reply.status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            for k, v in reply.headers.items():
                self.send_header(k, v)
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(payload)

        def do_POST(self) -> None:
            self._serve("POST")

        def do_GET(self) -> None:
            self._serve("GET")

    return Handler
