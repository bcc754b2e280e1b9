"""No idle or slow socket stops the HTTP API (issue 34).

Sockets that send half a request line, or one header line, and then nothing (or a byte now
and then) made /health and the review pages answer 503 for as long as they stayed open:
uvicorn's limit counted connections and nothing timed out reading request headers. The API's
server (``gateway.serve.api_server_config``, run here as ``neurosandbox serve`` runs it) now
closes a connection whose headers are not complete within the header timeout, gives each
client address a share of the connections, and counts requests in progress, not sockets.

Run as a script (``python tests/test_slowloris_api.py DATA_DIR PORT``) it is the server.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

HEADER_TIMEOUT_S = 2.0
PER_CLIENT = 16  # the default share of one client address
N_FLOOD_ADDRESSES = 4  # 4 x 16 = 64 slowloris sockets that all stay open
PARTS = (
    b"GET /health HT",  # half a request line
    b"GET /review/login HTTP/1.1\r\nHost: x\r\n",  # one header line, then nothing
)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    from guard import stop, wait_healthy

    from gateway.pacs_local import free_port

    root = Path(__file__).resolve().parents[1]
    data, port = tmp_path_factory.mktemp("slowloris-api"), free_port()
    env = {
        **os.environ,
        "PYTHONPATH": f"{root}{os.pathsep}{root / 'tests'}",
        "NEUROSANDBOX_API_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
    }
    proc = subprocess.Popen([sys.executable, __file__, str(data), str(port)], env=env, cwd=root)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, 30)
        yield port
    finally:
        stop(proc, 10)


def slow(port: int, source: str, part: bytes) -> socket.socket:
    """A connection from ``source`` (a loopback address) that sends ``part`` and waits."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    s.sendall(part)
    return s


def is_open(s: socket.socket) -> bool:
    """The server has not closed ``s`` (nothing to read, no EOF)."""
    s.setblocking(False)
    try:
        s.recv(1 << 16)  # EOF, or an answer (408) before the close
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        s.settimeout(5)


def read_until_closed(s: socket.socket, timeout_s: float) -> bytes:
    s.settimeout(timeout_s)
    got = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := s.recv(1 << 16):
            got += chunk
    return got


def read_response(s: socket.socket) -> bytes:
    """One whole response (head and a Content-Length body) from a kept-alive connection."""
    got = b""
    while b"\r\n\r\n" not in got or len(got.partition(b"\r\n\r\n")[2]) < int(
        got.lower().partition(b"content-length:")[2].split(b"\r\n")[0] or b"0"
    ):
        chunk = s.recv(1 << 16)
        assert chunk, f"closed before the whole response: {got[:100]!r}"
        got += chunk
    return got


def test_health_and_review_pages_answer_while_64_slowloris_sockets_are_open(api: int) -> None:
    flood: list[socket.socket] = []
    try:
        for a in range(N_FLOOD_ADDRESSES):  # each address within its share: none is closed
            for i in range(PER_CLIENT):
                flood.append(slow(api, f"127.0.0.{a + 2}", PARTS[i % 2]))
        # and more from the prober's own address than its share
        mine = [slow(api, "127.0.0.1", PARTS[i % 2]) for i in range(PER_CLIENT + 8)]
        t0 = time.monotonic()
        answers = []
        with httpx.Client(timeout=5) as client:
            for k in range(10):
                for path in ("/health", "/review/login"):
                    t = time.monotonic()
                    # a new connection each time: every one must get in past the flood
                    r = client.get(f"http://127.0.0.1:{api}{path}", headers={"Connection": "close"})
                    answers.append((path, r.status_code, time.monotonic() - t))
                for s in flood[k::10]:  # the flood goes on trickling header bytes
                    s.send(b"X")
        assert time.monotonic() - t0 < HEADER_TIMEOUT_S, "the probes must end before the deadline"
        assert [(p, c) for p, c, _ in answers if c != 200] == []
        assert max(t for _, _, t in answers) < 1.0
        assert sum(map(is_open, flood)) == len(flood) == 64  # they were all there, open
        # the prober's address keeps its share: its own oldest idle sockets made room
        assert sum(map(is_open, mine)) <= PER_CLIENT
        assert not any(is_open(s) for s in mine[:8])
    finally:
        for s in flood:
            s.close()


def test_a_slow_header_sender_is_closed_at_the_header_timeout(api: int) -> None:
    """A byte every 0.3 s keeps any per-read timeout happy; the headers' deadline closes it."""
    with slow(api, "127.0.0.9", b"GET /health HTTP/1.1\r\n") as s:
        t0 = time.monotonic()
        closed_at = None
        while time.monotonic() - t0 < HEADER_TIMEOUT_S + 3:
            try:
                s.sendall(b"X")
            except OSError:
                closed_at = time.monotonic() - t0
                break
            if not is_open(s):
                closed_at = time.monotonic() - t0
                break
            time.sleep(0.3)
        assert closed_at is not None, "a header that never ends was read for ever"
        assert HEADER_TIMEOUT_S - 0.5 < closed_at < HEADER_TIMEOUT_S + 1.5


def test_a_partial_request_is_answered_408_and_an_idle_socket_is_closed(api: int) -> None:
    with (
        slow(api, "127.0.0.10", b"GET /health HTTP/1.1\r\nHost: x\r\n") as partial,
        socket.create_connection(("127.0.0.1", api), timeout=5) as idle,
    ):
        t0 = time.monotonic()
        reply = read_until_closed(partial, HEADER_TIMEOUT_S + 3)
        assert reply.startswith(b"HTTP/1.1 408"), reply[:100]
        assert read_until_closed(idle, 3) == b""  # nothing sent: closed without a word
        assert time.monotonic() - t0 < HEADER_TIMEOUT_S + 2


def test_a_kept_alive_connection_serves_requests_and_each_gets_its_own_deadline(
    api: int,
) -> None:
    with socket.create_connection(("127.0.0.1", api), timeout=5) as s:
        for _ in range(3):  # several requests on one connection, each well within the deadline
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            reply = read_response(s)
            assert reply.startswith(b"HTTP/1.1 200"), reply[:100]
            time.sleep(0.3)  # under uvicorn's 5 s keep-alive
        s.sendall(b"GET /health HTTP/1.1\r\n")  # then a request whose headers never end
        t0 = time.monotonic()
        reply = read_until_closed(s, HEADER_TIMEOUT_S + 3)
        assert reply.startswith(b"HTTP/1.1 408"), reply[:100]
        assert time.monotonic() - t0 < HEADER_TIMEOUT_S + 1


def main() -> None:
    import uvicorn
    from review_server import build_context

    from gateway.api import create_app
    from gateway.serve import api_server_config
    from gateway.settings import Settings

    data, port = Path(sys.argv[1]), int(sys.argv[2])
    settings = Settings(data_dir=data)
    app = create_app(build_context(data))
    uvicorn.Server(api_server_config(app, settings, port)).run()


if __name__ == "__main__":
    main()
