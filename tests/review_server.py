"""Run the gateway's HTTP API (with the review pages) for a browser test, without the DICOM node
or a local Orthanc: ``python tests/review_server.py DATA_DIR PORT [ORTHANC_URL]``."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydicom
import uvicorn
from guard import stop, wait_healthy

from gateway.api import GatewayContext, create_app
from gateway.auth import Role
from gateway.settings import Settings


def bearer(ctx: GatewayContext, name: str, person: str = "", role: Role = Role.REVIEWER) -> dict[str, str]:  # fmt: skip
    """A bearer header of a new token (a reviewer's unless ``role``)."""
    _, token = ctx.tokens.create(role, name, person)
    return {"Authorization": f"Bearer {token}"}


def instances(ctx: GatewayContext, study_uid: str, uids: list[str]) -> list[pydicom.Dataset]:
    """The stored instances of a study in Orthanc whose SOP Instance UIDs are ``uids``."""
    study_id = ctx.orthanc.find_study(study_uid)
    assert study_id is not None
    out = []
    for i in ctx.orthanc.study_instances(study_id):
        if i.get("MainDicomTags", {}).get("SOPInstanceUID", "") in uids:
            raw = ctx.orthanc.api.get(f"{ctx.orthanc.url}/instances/{i['ID']}/file").content
            out.append(pydicom.dcmread(io.BytesIO(raw)))
    return out


def build_context(
    data: Path,
    orthanc_url: str = "http://127.0.0.1:9",
    auth: tuple[str, str] | None = None,
    **extra: object,
) -> GatewayContext:
    """The gateway's shared context on ``data`` (Orthanc only matters for re-issue)."""
    kw: dict[str, Any] = {"data_dir": data, "orthanc_url": orthanc_url, "orthanc_timeout_s": 30}
    if auth is not None:
        kw.update(orthanc_username=auth[0], orthanc_password=auth[1])
    return GatewayContext.from_settings(Settings(**kw, **extra))


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
        wait_healthy(base, proc, 30)
        yield base, port
    finally:
        stop(proc, 10)


def main() -> None:
    data, port = Path(sys.argv[1]), int(sys.argv[2])
    url = sys.argv[3] if len(sys.argv) > 3 else "http://127.0.0.1:9"  # unused by review pages
    uvicorn.run(
        create_app(build_context(data, url)), host="127.0.0.1", port=port, log_level="warning"
    )


if __name__ == "__main__":
    main()
