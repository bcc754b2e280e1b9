"""A `neurosandbox serve` process for end-to-end tests (started here, stopped by PID) and
dcmtk's storescu as the sending peer."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from guard import stop, wait_healthy
from orthanc_fixture import OrthancServer

from gateway.orthanc import OrthancClient

STORESCU = "/usr/bin/storescu"
BIN = Path(sys.executable).parent / "neurosandbox"


@dataclass
class Gateway:
    proc: subprocess.Popen[bytes]
    api: str
    dicom_port: int
    reviewer: str
    admin: str
    orthanc: OrthancClient
    log: Path

    def get(self, path: str, token: str | None = None, **kw: object) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(f"{self.api}{path}", headers=headers, timeout=30, **kw)  # type: ignore[arg-type]

    def post(self, path: str, token: str, **kw: object) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"}
        return httpx.post(f"{self.api}{path}", headers=headers, timeout=60, **kw)  # type: ignore[arg-type]

    def wait_run(self, run_id: str, timeout: float = 60) -> dict[str, object]:
        deadline = time.monotonic() + timeout
        run = self.get(f"/runs/{run_id}", self.reviewer).json()
        while run["status"] in ("queued", "running") and time.monotonic() < deadline:
            time.sleep(0.3)
            run = self.get(f"/runs/{run_id}", self.reviewer).json()
        return dict(run)


@contextlib.contextmanager
def running_gateway(
    orthanc_server: OrthancServer, log: Path, reviewer: str, admin: str, **env_extra: str
) -> Iterator[Gateway]:
    """`neurosandbox serve` on the session Orthanc's ports, until the block ends."""
    env = dict(os.environ, **orthanc_server.env, **env_extra)
    with open(log, "wb") as fh:
        proc = subprocess.Popen([str(BIN), "serve"], env=env, stdout=fh, stderr=subprocess.STDOUT)
    ep = orthanc_server.endpoints
    api = f"http://127.0.0.1:{ep.api_port}"
    try:
        wait_healthy(api, proc, 60, log)
        client = OrthancClient(ep.orthanc_url, ep.username, orthanc_server.password, timeout_s=60)
        yield Gateway(proc, api, ep.gateway_dicom_port, reviewer, admin, client, log)
    finally:
        stop(proc, 30)


def send(gw: Gateway | int, files: list[Path], *extra: str) -> None:
    """storescu ``files`` to the gateway's DICOM node (``gw``: the gateway, or its port)."""
    port = gw if isinstance(gw, int) else gw.dicom_port
    r = subprocess.run(
        [
            STORESCU,
            "-aet",
            "MRI_SCANNER",
            "-aec",
            "NEUROSANDBOX",
            *extra,
            "127.0.0.1",
            str(port),
            *map(str, files),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, TCP_NODELAY="1"),
    )
    assert r.returncode == 0, r.stderr
