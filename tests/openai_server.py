"""A real OpenAI-compatible chat-completions server on loopback, for tests and benchmarks.

It speaks enough of the API for litellm and inspect_ai (``POST /v1/chat/completions``), answers
from a script, and records what it saw: every request body, the number of calls, the number of
answers it delivered and the most requests it ever held at once. Behaviour is scripted with
:class:`Script`: latency, faults (429, 500, timeouts, malformed JSON, refusals) and replies
chosen by a substring of the prompt.

In a test::

    with OpenAIServer(Script(latency_s=0.05)) as server:
        ... api_base=server.url ...
        assert server.stats.calls == 3

As a process (benchmarks): ``python tests/openai_server.py --latency 0.2`` prints the port on
stdout; ``GET /_stats`` returns the counters as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_REPLY = json.dumps(
    {
        "sequences_identified": [{"image": "1", "sequence": "FLAIR"}],
        "findings": [
            {
                "description": "hyperintense lesion",
                "sequence": "FLAIR",
                "hemisphere": "left",
                "region": "periventricular white matter",
                "signal": "hyperintense",
            }
        ],
        "differential": [{"diagnosis": "multiple sclerosis", "likelihood": 0.6}],
        "final_diagnosis": "multiple sclerosis",
        "rationale": "periventricular FLAIR lesions",
        "confidence": 0.6,
        "next_steps": [],
    }
)


@dataclass
class Fault:
    """Answer matching requests badly ``times`` times (then normally).

    kind: "400", "429", "500", "timeout" (hold past the client's timeout), "malformed" (a body that
    is not JSON), "refusal" (a content-filter finish), "drop" (close the connection),
    "no_choices" (200 with an empty ``choices``), "null_content" (200, content null, finish "stop").
    """

    kind: str
    match: str | None = None  # substring of the request body; None = any request
    times: int = 1
    hold_s: float = 30.0  # for "timeout"


@dataclass
class Script:
    latency_s: float = 0.0
    default_reply: str = DEFAULT_REPLY
    replies: list[tuple[str, str]] = field(default_factory=list)  # (substring, reply)
    # computes a reply from the request body (None: fall back to replies/default_reply)
    responder: Callable[[dict[str, Any]], str | None] | None = None
    faults: list[Fault] = field(default_factory=list)
    # Hold (never answer) every request once this many answers were delivered; for kill tests.
    hold_after: int | None = None
    record_bodies: bool = True
    prompt_tokens: int = 100
    completion_tokens: int = 50
    # computes (prompt_tokens, completion_tokens) of a request and its reply (None: the fixed
    # numbers above); openai_usage.openai_usage counts them as OpenAI does
    usage: Callable[[dict[str, Any], str], tuple[int, int]] | None = None
    # What ``GET /v1/models`` lists (an empty list, as before: the server lists nothing).
    models: list[str] = field(default_factory=list)
    # What a reply says about the model that answered: its ``model`` (None: the model asked
    # for), its ``system_fingerprint`` (None: left out; any JSON value: hostile tests), and
    # extra response headers (e.g. ``{"openai-version": "2020-10-01"}``).
    served_model: Any = None
    system_fingerprint: Any = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Stats:
    calls: int = 0  # requests received on /chat/completions
    delivered: int = 0  # successful answers fully written to the client
    in_flight: int = 0
    max_in_flight: int = 0
    faults_sent: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    delivered_keys: list[str] = field(default_factory=list)  # sha256 of delivered request bodies
    held: int = 0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        return  # quiet

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/_stats"):
            s = self.server.state
            with s.lock:
                body = {
                    "calls": s.stats.calls,
                    "delivered": s.stats.delivered,
                    "max_in_flight": s.stats.max_in_flight,
                    "faults_sent": s.stats.faults_sent,
                    "held": s.stats.held,
                }
            self._send(200, json.dumps(body).encode())
        elif self.path.rstrip("/").endswith("/models"):
            listed = [
                {"id": m, "object": "model", "owned_by": "test"}
                for m in self.server.state.script.models
            ]
            self._send(200, json.dumps({"object": "list", "data": listed}).encode())
        else:
            self._send(404, b'{"error": {"message": "not found"}}')

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send(404, b'{"error": {"message": "not found"}}')
            return
        state = self.server.state
        try:
            body = json.loads(raw)
        except json.JSONDecodeError:
            self._send(400, b'{"error": {"message": "request is not JSON"}}')
            return
        key = hashlib.sha256(raw).hexdigest()
        with state.lock:
            state.stats.calls += 1
            state.stats.in_flight += 1
            state.stats.max_in_flight = max(state.stats.max_in_flight, state.stats.in_flight)
            if state.script.record_bodies:
                state.stats.bodies.append(body)
            fault = state.take_fault(raw.decode("utf-8", "replace"))
            hold = (
                state.script.hold_after is not None
                and state.stats.delivered >= state.script.hold_after
            )
            if hold:
                state.stats.held += 1
        try:
            if hold:
                # Never answer: the client is about to be killed. Wait for release or shutdown;
                # a request held for a killed client is dropped unanswered (not delivered).
                state.release.wait()
                if state.drop_held:
                    self.close_connection = True
                    return
            if state.script.latency_s:
                time.sleep(state.script.latency_s)
            if fault is not None:
                self._fault(fault)
                return
            self._answer(body, key)
        finally:
            with state.lock:
                state.stats.in_flight -= 1

    def _fault(self, fault: Fault) -> None:
        state = self.server.state
        with state.lock:
            state.stats.faults_sent += 1
        if fault.kind == "429":
            err = {"error": {"message": "Rate limit reached", "type": "rate_limit_exceeded"}}
            self._send(429, json.dumps(err).encode(), {"Retry-After": "0"})
        elif fault.kind == "400":
            err = {"error": {"message": "Invalid image_url", "type": "invalid_request_error"}}
            self._send(400, json.dumps(err).encode())
        elif fault.kind == "500":
            self._send(500, b'{"error": {"message": "internal error", "type": "server_error"}}')
        elif fault.kind == "timeout":
            state.release.wait(fault.hold_s)
            self._send(504, b'{"error": {"message": "late"}}')
        elif fault.kind == "malformed":
            self._send(200, b'{"id": "x", "choices": [ {"message": oops')
        elif fault.kind == "drop":
            self.close_connection = True
            self.connection.close()
        elif fault.kind == "refusal":
            msg = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
            self._send(200, json.dumps(_completion(msg, "content_filter", 10, 0)).encode())
        elif fault.kind == "no_choices":
            out = _completion({"role": "assistant", "content": "x"}, "stop", 10, 0)
            out["choices"] = []
            self._send(200, json.dumps(out).encode())
        elif fault.kind == "null_content":
            msg = {"role": "assistant", "content": None}
            self._send(200, json.dumps(_completion(msg, "stop", 10, 0)).encode())
        else:
            raise ValueError(f"unknown fault kind {fault.kind!r}")

    def _answer(self, body: dict[str, Any], key: str) -> None:
        state = self.server.state
        text = json.dumps(body)
        reply = state.script.default_reply
        for needle, r in state.script.replies:
            if needle in text:
                reply = r
                break
        if state.script.responder is not None:
            computed = state.script.responder(body)
            reply = reply if computed is None else computed
        msg = {"role": "assistant", "content": reply}
        script = state.script
        pt, ct = script.prompt_tokens, script.completion_tokens
        if script.usage is not None:
            pt, ct = script.usage(body, reply)
        out = _completion(msg, "stop", pt, ct, model=str(body.get("model", "test")))
        if script.served_model is not None:
            out["model"] = script.served_model
        if script.system_fingerprint is not None:
            out["system_fingerprint"] = script.system_fingerprint
        if self._send(200, json.dumps(out).encode(), script.headers):
            with state.lock:
                state.stats.delivered += 1
                state.stats.delivered_keys.append(key)

    def _send(self, status: int, payload: bytes, headers: dict[str, str] | None = None) -> bool:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(payload)
            self.wfile.flush()
            return True
        except (BrokenPipeError, ConnectionResetError, OSError):
            return False


def _completion(
    message: dict[str, Any], finish: str, pt: int, ct: int, model: str = "test"
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct},
    }


class _State:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.stats = Stats()
        self.lock = threading.Lock()
        self.release = threading.Event()
        self.drop_held = False
        self._fault_counts: dict[int, int] = {}

    def take_fault(self, text: str) -> Fault | None:
        for i, f in enumerate(self.script.faults):
            used = self._fault_counts.get(i, 0)
            if used < f.times and (f.match is None or f.match in text):
                self._fault_counts[i] = used + 1
                return f
        return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    state: _State


class OpenAIServer:
    """Runs the server in a thread of this process; a context manager."""

    def __init__(
        self, script: Script | None = None, port: int = 0, host: str = "127.0.0.1"
    ) -> None:
        self.host = host  # another address than loopback: reached from a network namespace
        self._httpd = _Server((host, port), _Handler)
        self._httpd.state = _State(script or Script())
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """The api_base to give a client (OpenAI style, with /v1)."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def stats(self) -> Stats:
        return self._httpd.state.stats

    @property
    def script(self) -> Script:
        return self._httpd.state.script

    def release_held(self, *, drop: bool = False) -> None:
        """Stop holding requests; held ones are answered, or dropped unanswered with ``drop``."""
        self._httpd.state.script.hold_after = None
        self._httpd.state.drop_held = drop
        self._httpd.state.release.set()

    def serve_forever(self) -> None:
        """Serve in the calling thread (the command-line server)."""
        self._httpd.serve_forever()

    def start(self) -> OpenAIServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.state.release.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _serve_fast(port: int, latency: float, reply: str) -> None:
    """A lean asyncio server (canned answer, keep-alive): for benchmarks, where the server
    stands for a remote provider and should spend as little of this machine's CPU as possible."""
    import asyncio

    counts = {"calls": 0, "delivered": 0, "in_flight": 0, "max_in_flight": 0}
    body = json.dumps(
        _completion({"role": "assistant", "content": reply}, "stop", 100, 50, "gpt-4o")
    ).encode()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                header = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in header.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                if length:
                    await reader.readexactly(length)
                if header.startswith(b"GET") and b"/_stats" in header.split(b"\r\n", 1)[0]:
                    stats = json.dumps(counts).encode()
                    writer.write(head % len(stats) + stats)
                    await writer.drain()
                    continue
                counts["calls"] += 1
                counts["in_flight"] += 1
                counts["max_in_flight"] = max(counts["max_in_flight"], counts["in_flight"])
                await asyncio.sleep(latency)
                counts["in_flight"] -= 1
                writer.write(head % len(body) + body)
                await writer.drain()
                counts["delivered"] += 1
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=512)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description="OpenAI-compatible test server on loopback")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per answer")
    parser.add_argument("--reply", default=None, help="text of every answer")
    parser.add_argument("--fast", action="store_true", help="lean asyncio server, canned answer")
    args = parser.parse_args()
    if args.fast:
        import asyncio

        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_serve_fast(args.port, args.latency, args.reply or DEFAULT_REPLY))
        return
    script = Script(latency_s=args.latency, record_bodies=False)
    if args.reply is not None:
        script.default_reply = args.reply
    server = OpenAIServer(script, args.port)
    print(server.port, flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()


if __name__ == "__main__":
    main()
