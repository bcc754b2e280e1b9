"""Run the gateway's HTTP API (with the review pages) for a browser test, without the DICOM node
or a local Orthanc: ``python tests/review_server.py DATA_DIR PORT [ORTHANC_URL]``."""

from __future__ import annotations

import sys
from pathlib import Path

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


def main() -> None:
    data, port = Path(sys.argv[1]), int(sys.argv[2])
    url = sys.argv[3] if len(sys.argv) > 3 else "http://127.0.0.1:9"  # unused by review pages
    uvicorn.run(
        create_app(build_context(data, url)), host="127.0.0.1", port=port, log_level="warning"
    )


if __name__ == "__main__":
    main()
