"""The audit log: who did what to which resource, as JSON lines; never PHI, never secrets.

Targets are opaque handles (run ids, Orthanc IDs, token ids), not patient data.
"""

from __future__ import annotations

import json
import os
import threading
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel


class AuditEvent(BaseModel):
    time: str
    actor: str  # token id, or "system"
    action: str  # e.g. "GET /studies", "evaluation", "token.create"
    target: str = ""
    outcome: str = ""  # HTTP status or done/failed/denied
    detail: str = ""


class AuditLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)

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
        line = event.model_dump_json() + "\n"
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)

    def tail(self, limit: int = 100, actor: str | None = None) -> list[AuditEvent]:
        """The last ``limit`` events (newest first)."""
        if not self.path.exists():
            return []
        # Read from the end in blocks: the log only grows.
        out: list[AuditEvent] = []
        with open(self.path, "rb") as fh:
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
