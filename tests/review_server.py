"""Run the gateway's HTTP API (with the review pages) for a browser test, without the DICOM node
or a local Orthanc: ``python tests/review_server.py DATA_DIR PORT [ORTHANC_URL]``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import uvicorn

from gateway.api import GatewayContext, create_app
from gateway.audit import AuditLog
from gateway.auth import TokenStore
from gateway.orthanc import OrthancClient
from gateway.runs import StudyRunStore
from gateway.settings import Settings


def build_context(
    data: Path,
    orthanc_url: str = "http://127.0.0.1:9",
    auth: tuple[str, str] | None = None,
    **extra: object,
) -> GatewayContext:
    """The gateway's shared context on ``data`` (Orthanc only matters for re-issue)."""
    settings = Settings(data_dir=data, orthanc_url=orthanc_url, **extra)  # type: ignore[arg-type]
    user, password = auth or (None, None)
    return GatewayContext(
        settings=settings,
        orthanc=OrthancClient(orthanc_url, user, password, timeout_s=30),
        runs=StudyRunStore(data),
        audit=AuditLog(data / "audit.jsonl", settings.audit_max_bytes, settings.audit_backups),
        tokens=TokenStore(data / "secret" / "tokens.json"),
    )


@contextlib.contextmanager
def running(data: Path, **env: str) -> Iterator[tuple[str, int]]:
    """This script as a child process on a free loopback port (``env``: extra settings, e.g.
    NEUROSANDBOX_API_BODY_TIMEOUT_S); yields (base URL, port); stopped by PID."""
    from gateway.pacs_local import free_port

    root = Path(__file__).resolve().parents[1]
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), str(data), str(port)],
        env={**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{root / 'tests'}", **env},
        cwd=root,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            raise RuntimeError("the review server did not start within 30 s")
        yield base, port
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def main() -> None:
    data, port = Path(sys.argv[1]), int(sys.argv[2])
    url = sys.argv[3] if len(sys.argv) > 3 else "http://127.0.0.1:9"  # unused by review pages
    uvicorn.run(
        create_app(build_context(data, url)), host="127.0.0.1", port=port, log_level="warning"
    )


if __name__ == "__main__":
    main()
