"""The audit line of a request is on disk before the reply's last byte leaves: a client that
reads the audit log right after its reply sees its own request (a fresh-clone CI run saw the
newest line one request behind, because the line was written after the reply was sent)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from gateway.api.middleware import AccessLog
from gateway.audit import AuditLog


class _Recording(AuditLog):
    def __init__(self, path: Path, events: list[str]) -> None:
        super().__init__(path)
        self.events = events

    def write(self, *args: Any, **kwargs: Any) -> None:
        super().write(*args, **kwargs)
        self.events.append("audit")


def _app(status: int, chunks: int, fail: bool = False) -> Any:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        scope["route"] = type("R", (), {"path": "/runs/{run_id}"})()
        scope["path_params"] = {"run_id": "r1"}
        if fail:
            raise RuntimeError("boom")
        await send({"type": "http.response.start", "status": status, "headers": []})
        for k in range(chunks):
            await send({"type": "http.response.body", "body": b"x", "more_body": k < chunks - 1})

    return app


def _run(app: Any, tmp_path: Path) -> tuple[list[str], AuditLog]:
    events: list[str] = []
    audit = _Recording(tmp_path / "audit.jsonl", events)
    scope: Scope = {"type": "http", "method": "GET", "path": "/runs/r1", "state": {}}

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(msg: Message) -> None:
        last = msg["type"] == "http.response.body" and not msg.get("more_body", False)
        events.append("last-byte" if last else msg["type"])

    with contextlib.suppress(RuntimeError):
        asyncio.run(AccessLog(app, audit)(scope, receive, send))
    return events, audit


def test_the_audit_line_is_written_before_the_last_byte_of_the_reply(tmp_path: Path) -> None:
    for chunks in (1, 3):
        events, audit = _run(_app(401, chunks), tmp_path / str(chunks))
        assert events.count("audit") == 1
        assert events.index("audit") < events.index("last-byte"), events
        line = audit.tail(1)[0]
        assert line.target == "run_id=r1" and line.outcome == "401"
        audit.close()


def test_a_request_that_fails_before_replying_is_audited_once_as_500(tmp_path: Path) -> None:
    events, audit = _run(_app(200, 1, fail=True), tmp_path)
    assert events == ["audit"]
    assert audit.tail(1)[0].outcome == "500"
    audit.close()
