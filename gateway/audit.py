"""The audit log: who did what to which resource, as JSON lines; never PHI, never secrets.

Targets are opaque handles (run ids, Orthanc IDs, token ids), not patient data. The log rotates
by size (``audit.jsonl`` -> ``audit.jsonl.1`` ... ``.N``, the oldest dropped), so that anonymous
requests cannot fill the disk; ``tail`` reads across the rotated files.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel


class AuditEvent(BaseModel):
    time: str
    actor: str  # token id, or "system"
    action: str  # e.g. "GET /studies", "evaluation", "token.create"
    target: str = ""
    outcome: str = ""  # HTTP status or done/failed/denied
    detail: str = ""


DEFAULT_MAX_BYTES = 16 << 20
DEFAULT_BACKUPS = 5


class _PrivateRotatingFile(logging.handlers.RotatingFileHandler):
    """The standard size-rotating handler, creating its files readable by the owner only."""

    def _open(self) -> Any:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        return open(fd, "a", encoding="utf-8")


class AuditLog:
    @classmethod
    def from_settings(cls, settings: Any) -> AuditLog:
        """This host's audit log (``Settings``): DATA_DIR/audit.jsonl, rotated as set."""
        return cls(settings.data_dir / "audit.jsonl", settings.audit_max_bytes,
                   settings.audit_backups)  # fmt: skip

    def __init__(
        self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES, backups: int = DEFAULT_BACKUPS
    ) -> None:
        self.path = path
        self.backups = max(1, backups)
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handler = _PrivateRotatingFile(
            path, maxBytes=max(1024, max_bytes), backupCount=self.backups, delay=True
        )
        self._handler.setFormatter(logging.Formatter("%(message)s"))

    def write(
        self, actor: str, action: str, target: str = "", outcome: str = "", detail: str = ""
    ) -> None:
        event = AuditEvent(
            time=datetime.now(UTC).isoformat(timespec="milliseconds"),
            actor=actor[:64],
            action=action[:128],
            target=target[:256],
            outcome=str(outcome)[:32],
            detail=detail[:256],
        )
        record = logging.makeLogRecord({"msg": event.model_dump_json(), "levelno": logging.INFO})
        with self._lock:
            self._handler.emit(record)  # the handler flushes each record

    def close(self) -> None:
        self._handler.close()

    def files(self) -> list[Path]:
        """The log's files, newest first (the current one, then ``.1``, ``.2``...)."""
        names = [self.path] + [Path(f"{self.path}.{k}") for k in range(1, self.backups + 1)]
        return [p for p in names if p.exists()]

    def tail(self, limit: int = 100, actor: str | None = None) -> list[AuditEvent]:
        """The last ``limit`` events (newest first), across the rotated files."""
        out: list[AuditEvent] = []
        for path in self.files():
            if len(out) >= limit:
                break
            out.extend(_tail_file(path, limit - len(out), actor))
        return out


def _tail_file(path: Path, limit: int, actor: str | None) -> list[AuditEvent]:
    # Read from the end in blocks: a file only grows until it is rotated.
    out: list[AuditEvent] = []
    try:
        fh = open(path, "rb")  # noqa: SIM115 (closed by the with below)
    except FileNotFoundError:  # rotated away meanwhile
        return out
    with fh:
        fh.seek(0, os.SEEK_END)
        pos, buf = fh.tell(), b""
        while pos > 0 and len(out) < limit:
            step = min(65536, pos)
            pos -= step
            fh.seek(pos)
            buf = fh.read(step) + buf
            lines = buf.split(b"\n")
            buf = lines[0]
            for raw in reversed(lines[1:]):
                if raw.strip():
                    ev = AuditEvent.model_validate(json.loads(raw))
                    if actor is None or ev.actor == actor:
                        out.append(ev)
                    if len(out) >= limit:
                        break
        if pos == 0 and buf.strip() and len(out) < limit:
            ev = AuditEvent.model_validate(json.loads(buf))
            if actor is None or ev.actor == actor:
                out.append(ev)
    return out
