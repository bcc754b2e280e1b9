"""The Orthanc client's retries (tenacity) against a real HTTP server on loopback that fails the
first requests (503/502, or drops the connection without answering) and then answers.

Idempotent calls get ``retries`` more attempts with a doubling wait on 502/503/504 and transport
errors; other statuses and non-idempotent calls are tried once; the final error says which
failure it was. Waits are a few tens of ms here (``backoff_s``), so every test is fast.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import pairwise
from pathlib import Path

import httpx
import pytest

from gateway.orthanc import OrthancClient, OrthancError

BACKOFF_S = 0.04


class Flaky(ThreadingHTTPServer):
    """Answers each request with the next action of ``script`` ("503", "404", "drop", ...),
    then "ok" for good; records (method, path, arrival time, body) of every request."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.script: list[str] = []
        self.seen: list[tuple[str, str, float, bytes]] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def attempts(self, path: str) -> int:
        return sum(1 for _m, p, _t, _b in self.seen if p == path)


class Handler(BaseHTTPRequestHandler):
    server: Flaky

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _serve(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server.lock:
            self.server.seen.append((self.command, self.path, time.monotonic(), body))
            action = self.server.script.pop(0) if self.server.script else "ok"
        if action == "drop":  # read the request, close the connection, answer nothing
            self.close_connection = True
            return
        if action == "ok":
            status = 200
            payload: object = {"ID": "inst-1", "Status": "Success", "Version": "1.12"}
        else:
            status, payload = int(action), {"Message": f"scripted {action}"}
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = _serve


@pytest.fixture
def server() -> Iterator[Flaky]:
    srv = Flaky()
    t = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(5)


def client(server: Flaky, retries: int = 3) -> OrthancClient:
    return OrthancClient(server.url, None, None, timeout_s=5, retries=retries, backoff_s=BACKOFF_S)


@pytest.mark.timeout(30)
def test_503s_then_an_answer_is_retried_with_doubling_waits(
    server: Flaky, caplog: pytest.LogCaptureFixture
) -> None:
    server.script = ["503", "503", "503"]
    c = client(server, retries=3)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="gateway.orthanc"):
        assert c.system()["Version"] == "1.12"
    assert server.attempts("/system") == 4
    arrivals = [t for _m, _p, t, _b in server.seen]
    gaps = [b - a for a, b in pairwise(arrivals)]
    for gap, wait in zip(gaps, (BACKOFF_S, 2 * BACKOFF_S, 4 * BACKOFF_S), strict=True):
        assert gap >= wait * 0.9, gaps  # 0.04, 0.08, 0.16 s
    assert time.monotonic() - t0 < 3
    assert "orthanc GET /system failed (HTTP 503, attempt 1), retrying" in caplog.text
    assert "attempt 3" in caplog.text and "attempt 4" not in caplog.text
    c.close()


@pytest.mark.timeout(30)
def test_dropped_connections_then_an_answer_are_retried(server: Flaky) -> None:
    server.script = ["drop", "502", "drop"]
    c = client(server, retries=3)
    assert c.get_json("/patients") == {"ID": "inst-1", "Status": "Success", "Version": "1.12"}
    assert server.attempts("/patients") == 4
    c.close()


@pytest.mark.timeout(30)
def test_retries_stop_after_the_setting_and_say_why(server: Flaky) -> None:
    server.script = ["503"] * 10
    c = client(server, retries=2)
    with pytest.raises(OrthancError) as err:
        c.get_json("/studies")
    assert server.attempts("/studies") == 3  # the first try and 2 retries
    assert err.value.status == 503
    assert str(err.value).startswith("Orthanc GET /studies: HTTP 503 ")
    assert "scripted 503" in str(err.value)  # Orthanc's own words, cut to 200 characters

    server.script = ["drop"] * 10
    with pytest.raises(OrthancError) as err:
        c.get_json("/series")
    assert server.attempts("/series") == 3
    assert err.value.status is None
    assert str(err.value) == f"Orthanc GET /series: RemoteProtocolError talking to {server.url}"

    zero = client(server, retries=0)
    server.script = ["503"]
    with pytest.raises(OrthancError):
        zero.get_json("/tools/now")
    assert server.attempts("/tools/now") == 1
    c.close()
    zero.close()


@pytest.mark.timeout(30)
def test_other_statuses_are_not_retried(server: Flaky) -> None:
    server.script = ["404"]
    c = client(server)
    with pytest.raises(OrthancError) as err:
        c.study("nope")
    assert server.attempts("/studies/nope") == 1
    assert err.value.status == 404 and "HTTP 404" in str(err.value)
    c.close()


@pytest.mark.timeout(30)
def test_non_idempotent_calls_are_tried_once(server: Flaky) -> None:
    c = client(server, retries=3)

    def post() -> object:
        r = c.api.post(f"{c.url}/tools/execute-script", content=b"x")
        r.raise_for_status()
        return r.json()

    server.script = ["503", "503"]
    with pytest.raises(OrthancError) as err:
        c._retry("POST /tools/execute-script", post, idempotent=False)
    assert err.value.status == 503
    server.script = ["drop"]
    with pytest.raises(OrthancError, match="RemoteProtocolError talking to"):
        c._retry("POST /tools/execute-script", post, idempotent=False)
    assert server.attempts("/tools/execute-script") == 2  # one per call, none retried

    # The viewer's streamed proxy is not retried either (the browser retries).
    server.script = ["drop", "drop"]
    timeout = httpx.Timeout(5.0)
    with pytest.raises(OrthancError, match="RemoteProtocolError"):
        c.open_stream("/wado", "", {}, timeout)
    assert server.attempts("/wado") == 1
    c.close()


@pytest.mark.timeout(30)
def test_upload_of_a_file_is_retried_whole(server: Flaky, tmp_path: Path) -> None:
    # POST /instances is idempotent in Orthanc: a retry sends the whole file again.
    f = tmp_path / "one.dcm"
    f.write_bytes(b"DICM" * 5000)
    server.script = ["503", "drop"]
    c = client(server)
    assert c.upload(f) == "inst-1"
    bodies = [b for m, p, _t, b in server.seen if (m, p) == ("POST", "/instances")]
    assert len(bodies) == 3 and all(b == f.read_bytes() for b in bodies)
    c.close()
