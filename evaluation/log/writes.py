"""Writes to the run store: the statements of each record, and group commit off the event loop.

``GroupCommitter`` owns the store's connection from one writer thread. The runner hands it the
statements of a record and awaits the commit: whatever arrived while the previous transaction
was being written goes into the next one (group commit, no timer), each record in its own
savepoint so that one bad record fails alone. The await returns only once the transaction is
committed, so "stored before scored" holds, while SQLite's I/O runs outside the event loop.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import queue
import sqlite3
import threading
from typing import Any, Protocol

from evaluation.modelio import ModelOutput
from evaluation.phi import AuditRecord
from evaluation.scores import ErrorLabel, Score


class CommitTarget(Protocol):
    """What the writer thread needs of a store (evaluation.store.RunStore has both)."""

    @property
    def lock(self) -> threading.RLock: ...

    @property
    def connection(self) -> sqlite3.Connection: ...


Statements = list[tuple[str, tuple[Any, ...]]]
_STOP = object()
MAX_BATCH = 256


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def sample_id(case_id: str, task: str, model: str, sample: int) -> str:
    return json.dumps([case_id, task, model, sample], separators=(",", ":"))


class GroupCommitter:
    """Commits statement groups from one writer thread; ``submit`` awaits the commit."""

    def __init__(self, store: CommitTarget) -> None:
        self._store = store
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="store-writer", daemon=True)
        self._thread.start()
        self.transactions = 0

    async def submit(self, statements: Statements) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._queue.put((statements, loop, fut))
        await fut

    def close(self) -> None:
        self._queue.put(_STOP)
        self._thread.join()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            batch = [item]
            stop = False
            while len(batch) < MAX_BATCH:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is _STOP:
                    stop = True
                    break
                batch.append(more)
            self._commit(batch)
            if stop:
                return

    def _commit(self, batch: list[Any]) -> None:
        results: list[BaseException | None] = []
        try:
            with self._store.lock:
                db = self._store.connection
                db.execute("BEGIN IMMEDIATE")
                for n, (statements, _, _) in enumerate(batch):
                    db.execute(f"SAVEPOINT r{n}")
                    try:
                        for sql, args in statements:
                            db.execute(sql, args)
                    except Exception as exc:  # this record fails, the others are kept
                        db.execute(f"ROLLBACK TO r{n}")
                        results.append(exc)
                    else:
                        results.append(None)
                    db.execute(f"RELEASE r{n}")
                db.execute("COMMIT")
            self.transactions += 1
        except Exception as exc:  # the commit itself failed: every record of the batch fails
            results = [exc] * len(batch)
        for (_, loop, fut), err in zip(batch, results, strict=True):
            loop.call_soon_threadsafe(_settle, fut, err)


def _settle(fut: asyncio.Future[None], err: BaseException | None) -> None:
    if fut.done():
        return
    if err is None:
        fut.set_result(None)
    else:
        fut.set_exception(err)


# --------------------------------------------------------------------------- statements


def request_statements(
    cache_key: str,
    *,
    case_id: str,
    task: str,
    family: str,
    model: str,
    sample: int,
    turn: int,
    image_hashes: list[str],
    prompt_hash: str,
    request: dict[str, Any],
    audit: AuditRecord,
) -> Statements:
    """The request (kept once per key) and the audit summary of this sending of it."""
    return [
        (
            "INSERT OR IGNORE INTO requests VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                cache_key,
                case_id,
                task,
                family,
                model,
                sample,
                turn,
                json.dumps(image_hashes),
                prompt_hash,
                json.dumps(request),
                now(),
            ),
        ),
        (
            "INSERT INTO audit (time, model, endpoint, case_id, cache_key, remote, "
            "deidentified, record_json) VALUES (?,?,?,?,?,?,?,?)",
            (
                audit.time,
                audit.model,
                audit.endpoint,
                audit.case_id,
                audit.cache_key,
                int(audit.remote),
                int(audit.deidentified),
                audit.model_dump_json(),
            ),
        ),
    ]


def response_statements(cache_key: str, model: str, output: ModelOutput) -> Statements:
    return [
        (
            "INSERT OR REPLACE INTO responses VALUES (?,?,?,?,?)",
            (cache_key, model, output.text, output.model_dump_json(), now()),
        )
    ]


def failure_statements(cache_key: str, model: str, output: ModelOutput) -> Statements:
    return [
        (
            "INSERT INTO failures (cache_key, model, error, output_json, created_at) "
            "VALUES (?,?,?,?,?)",
            (cache_key, model, output.error or "", output.model_dump_json(), now()),
        )
    ]


def sample_statements(
    *,
    case_id: str,
    task: str,
    family: str,
    model: str,
    sample: int,
    status: str,
    turns: list[dict[str, Any]],
    parsed: dict[str, Any] | None,
    parse_error: str,
    image_hashes: list[str],
) -> tuple[str, Statements]:
    sid = sample_id(case_id, task, model, sample)
    row = (
        sid,
        case_id,
        task,
        family,
        model,
        sample,
        status,
        json.dumps(turns),
        json.dumps(parsed) if parsed is not None else None,
        parse_error,
        json.dumps(image_hashes),
        now(),
    )
    return sid, [("INSERT OR REPLACE INTO samples VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", row)]


def score_statements(
    sid: str,
    scores: list[Score],
    label: ErrorLabel | None,
    scored_json: str | None,
    scoring_version: str | None = None,
) -> Statements:
    t = now()
    statements: Statements = [
        ("DELETE FROM scores WHERE sample_id=?", (sid,)),
        ("DELETE FROM error_labels WHERE sample_id=?", (sid,)),
        ("DELETE FROM scored_samples WHERE sample_id=?", (sid,)),
    ]
    if scored_json is not None:
        statements.append(("INSERT INTO scored_samples VALUES (?,?)", (sid, scored_json)))
    for s in scores:
        statements.append(
            (
                "INSERT OR REPLACE INTO scores (sample_id, scorer, value, explanation, "
                "details_json, scored_at, scoring_version) VALUES (?,?,?,?,?,?,?)",
                (sid, s.scorer, s.value, s.explanation, json.dumps(s.details), t, scoring_version),
            )
        )
    if label is not None:
        statements.append(
            ("INSERT INTO error_labels VALUES (?,?,?)", (sid, label.model_dump_json(), t))
        )
    return statements
