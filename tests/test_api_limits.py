"""The HTTP API cannot be held or filled: a request body that never finishes is answered 408
and the connection freed; the audit log rotates by size however many anonymous requests come
(issue 22, the service)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from review_server import running

from gateway.audit import AuditLog

BODY_TIMEOUT_S = 2
AUDIT_MAX = 8192
AUDIT_BACKUPS = 3


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, Path]]:
    data = tmp_path_factory.mktemp("api-data")
    env = {
        "NEUROSANDBOX_API_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
        "NEUROSANDBOX_AUDIT_MAX_BYTES": str(AUDIT_MAX),
        "NEUROSANDBOX_AUDIT_BACKUPS": str(AUDIT_BACKUPS),
    }
    with running(data, **env) as (base, port):
        yield base, port, data


def _half_body(port: int, path: str) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=BODY_TIMEOUT_S + 10)
    s.sendall(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000\r\n\r\n".encode()
        + b'{"models": ['
    )
    return s


def _read_all(s: socket.socket) -> bytes:
    got = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return got
        got += chunk


@pytest.mark.parametrize("path", ["/studies/abc/evaluations", "/review/login", "/nowhere"])
def test_a_body_that_never_finishes_is_answered_408_and_the_connection_closed(
    api: tuple[str, int, Path], path: str
) -> None:
    _, port, _ = api
    t0 = time.monotonic()
    with _half_body(port, path) as s:
        reply = _read_all(s)  # returns when the server closes the connection
    took = time.monotonic() - t0
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b"not complete within 2 s" in reply
    assert BODY_TIMEOUT_S - 0.5 < took < BODY_TIMEOUT_S + 5


def test_slow_bodies_do_not_stop_other_requests(api: tuple[str, int, Path]) -> None:
    base, port, _ = api
    held = [_half_body(port, "/studies/abc/evaluations") for _ in range(20)]
    try:
        t0 = time.monotonic()
        assert httpx.get(f"{base}/health", timeout=5).status_code == 200
        assert time.monotonic() - t0 < 2
    finally:
        for s in held:
            s.close()


def test_a_whole_body_sent_slowly_within_the_deadline_is_read(api: tuple[str, int, Path]) -> None:
    _, port, _ = api
    body = b'{"not": "a login form"}'
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(
            b"POST /studies/abc/evaluations HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        for k in range(0, len(body), 8):
            time.sleep(0.2)
            s.sendall(body[k : k + 8])
        reply = _read_all(s)
    assert reply.startswith(b"HTTP/1.1 401"), reply[:200]  # read whole, then refused: no token


def test_anonymous_requests_cannot_grow_the_audit_log_without_bound(
    api: tuple[str, int, Path],
) -> None:
    base, _, data = api
    with httpx.Client(timeout=10) as client:
        for k in range(600):
            assert client.get(f"{base}/runs/run-{k}").status_code == 401
    files = sorted(data.glob("audit.jsonl*"))
    assert [f.name for f in files] == ["audit.jsonl"] + [
        f"audit.jsonl.{k}" for k in range(1, AUDIT_BACKUPS + 1)
    ]
    line_max = max(len(line) for f in files for line in f.read_bytes().splitlines())
    assert all(f.stat().st_size <= AUDIT_MAX + line_max for f in files)
    assert all(f.stat().st_mode & 0o077 == 0 for f in files), "audit files are owner-only"
    newest = json.loads(files[0].read_bytes().splitlines()[-1])
    assert newest["target"] == "run_id=run-599" and newest["outcome"] == "401"


def test_tail_reads_across_rotated_files_newest_first(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", max_bytes=2048, backups=4)
    for k in range(60):
        log.write("tok", "GET /runs/{run_id}", f"run_id=r{k}", "200")
    assert len(log.files()) > 2
    got = [e.target for e in log.tail(25)]
    assert got == [f"run_id=r{k}" for k in range(59, 34, -1)]
    log.close()
