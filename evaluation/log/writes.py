"""Writes to the run store: the statements of each record, and group commit off the event loop.

A record's statements are ``(name, parameters)`` pairs: ``name`` one of ``SQL``'s statements,
SQLAlchemy Core constructs of the schema compiled once per dialect (SQLite or PostgreSQL) when a
store opens; the store adds its ``run_id`` to the parameters.

``GroupCommitter`` owns the store's connection from one writer thread. The runner hands it the
statements of a record and awaits the commit: whatever arrived while the previous transaction
was being written goes into the next one (group commit, no timer), each record in its own
savepoint so that one bad record fails alone. The await returns only once the transaction is
committed, so "stored before scored" holds, while the database's I/O runs outside the event loop.
A thread that need not wait (the runner's finisher, which parses and scores answers already
stored) posts its records instead (``post``): the writer settles a plain future, and the event
loop is not woken for them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import json
import queue
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from evaluation.log import schema as t_
from evaluation.log.records import GraderCall, SampleTurn
from evaluation.modelio import ModelOutput
from evaluation.phi import AuditRecord
from evaluation.scores import ErrorLabel, Score

Statements = list[tuple[str, dict[str, Any]]]
_STOP = object()
MAX_BATCH = 256


class CommitTarget(Protocol):
    """What the writer thread needs of a store (evaluation.log.store.RunStore has it)."""

    def run_batch(self, records: list[Statements]) -> list[BaseException | None]: ...


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def sample_id(case_id: str, task: str, model: str, sample: int) -> str:
    return json.dumps([case_id, task, model, sample], separators=(",", ":"))


def _cols(table: sa.Table, *skip: str) -> dict[str, Any]:
    return {c.name: sa.bindparam(c.name) for c in table.columns if c.name not in skip}


def _key(table: sa.Table, *cols: str) -> Any:
    return sa.and_(*(table.c[c] == sa.bindparam(c) for c in cols))


def _statements(dialect: str) -> dict[str, sa.UpdateBase]:
    """Every write the store makes, as Core statements of the schema for ``dialect``."""
    ins: Callable[[sa.Table], Any] = (postgresql if dialect == "postgresql" else sqlite).insert

    def upsert(table: sa.Table, *skip: str) -> Any:
        stmt = ins(table).values(_cols(table, *skip))
        pk = [c.name for c in table.primary_key.columns]
        rest = {c.name: stmt.excluded[c.name] for c in table.columns if c.name not in pk}
        return stmt.on_conflict_do_update(index_elements=pk, set_=rest)

    def keep(table: sa.Table) -> Any:
        stmt = ins(table).values(_cols(table))
        pk = [c.name for c in table.primary_key.columns]
        return stmt.on_conflict_do_nothing(index_elements=pk)

    rid = ("run_id",)
    return {
        "request": keep(t_.requests),
        "audit": sa.insert(t_.audit).values(_cols(t_.audit, "id")),
        "response": upsert(t_.responses),
        "failure": sa.insert(t_.failures).values(_cols(t_.failures, "id")),
        "sample": upsert(t_.samples),
        "delete_scores": sa.delete(t_.scores).where(_key(t_.scores, *rid, "sample_id")),
        "delete_label": sa.delete(t_.error_labels).where(_key(t_.error_labels, *rid, "sample_id")),
        "delete_scored": sa.delete(t_.scored_samples).where(
            _key(t_.scored_samples, *rid, "sample_id")
        ),
        "scored": sa.insert(t_.scored_samples).values(_cols(t_.scored_samples)),
        "score": upsert(t_.scores),
        "label": sa.insert(t_.error_labels).values(_cols(t_.error_labels)),
        "case": keep(t_.cases),
        "delete_skipped": sa.delete(t_.skipped_cases).where(_key(t_.skipped_cases, *rid)),
        "skipped": sa.insert(t_.skipped_cases).values(_cols(t_.skipped_cases, "n")),
        "meta": upsert(t_.meta),
        "meta_keep": keep(t_.meta),
        "note": upsert(t_.notes),
        "status": sa.update(t_.run)
        .where(_key(t_.run, *rid))
        .values(status=sa.bindparam("status"), updated_at=sa.bindparam("updated_at")),
        "config": sa.update(t_.run)
        .where(_key(t_.run, *rid))
        .values(config_json=sa.bindparam("config_json"), updated_at=sa.bindparam("updated_at")),
        "run": sa.insert(t_.run).values(_cols(t_.run)),
        "gateway_run": upsert(t_.gateway_runs),
        # the record changed, its SR's evidence (large, written once) left as it is
        "gateway_run_update": sa.update(t_.gateway_runs)
        .where(_key(t_.gateway_runs, *rid))
        .values(_cols(t_.gateway_runs, "run_id", "evidence_json")),
    }


def compiled(dialect: sa.Dialect) -> dict[str, str]:
    """The write statements as SQL text of ``dialect`` (named parameters), compiled once."""
    out = {k: str(v.compile(dialect=dialect)) for k, v in _statements(dialect.name).items()}
    if dialect.name == "postgresql":
        out["response_claimed"] = RESPONSE_CLAIMED_SQL
    return out


class GroupCommitter:
    """Commits statement groups from one writer thread; ``submit`` awaits the commit."""

    def __init__(self, store: CommitTarget) -> None:
        import threading

        self._store = store
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="store-writer", daemon=True)
        self._thread.start()
        self.transactions = 0

    async def submit(self, statements: Statements) -> None:
        """Commit ``statements`` (one record); returns once they are committed."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._queue.put((statements, partial(_settle_soon, loop, fut)))
        await fut

    def post(self, statements: Statements) -> concurrent.futures.Future[None]:
        """Commit ``statements`` (one record) from any thread without waiting: the future is
        done once they are committed (or failed)."""
        fut: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._queue.put((statements, partial(_settle_now, fut)))
        return fut

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
        try:
            results = self._store.run_batch([statements for statements, _ in batch])
            self.transactions += 1
        except Exception as exc:  # the commit itself failed: every record of the batch fails
            results = [exc] * len(batch)
        for (_, settle), err in zip(batch, results, strict=True):
            settle(err)


def _settle_soon(
    loop: asyncio.AbstractEventLoop, fut: asyncio.Future[None], err: BaseException | None
) -> None:
    loop.call_soon_threadsafe(_settle, fut, err)


def _settle(fut: asyncio.Future[None], err: BaseException | None) -> None:
    if fut.done():
        return
    if err is None:
        fut.set_result(None)
    else:
        fut.set_exception(err)


def _settle_now(fut: concurrent.futures.Future[None], err: BaseException | None) -> None:
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
            "request",
            {
                "cache_key": cache_key,
                "case_id": case_id,
                "task": task,
                "family": family,
                "model": model,
                "sample": sample,
                "turn": turn,
                "image_hashes": json.dumps(image_hashes),
                "prompt_hash": prompt_hash,
                "request_json": json.dumps(request),
                "created_at": now(),
            },
        ),
        (
            "audit",
            {
                "time": audit.time,
                "model": audit.model,
                "endpoint": audit.endpoint,
                "case_id": audit.case_id,
                "cache_key": audit.cache_key,
                "remote": int(audit.remote),
                "deidentified": int(audit.deidentified),
                "record_json": audit.model_dump_json(),
            },
        ),
    ]


def response_statements(cache_key: str, model: str, output: ModelOutput) -> Statements:
    return [
        (
            "response",
            {
                "cache_key": cache_key,
                "model": model,
                "text": output.text,
                "output_json": output.model_dump_json(),
                "created_at": now(),
            },
        )
    ]


# PostgreSQL, several workers on one run (evaluation.log.claims): the response of a claimed call
# is written only while the committer holds the call's claim (read FOR SHARE: a takeover waits
# for this commit, then sees the answer), never over a committed one; otherwise the answer is
# kept in call_attempts as "late"
RESPONSE_CLAIMED_SQL = """
WITH ok AS (
    SELECT 1 FROM call_claims
    WHERE run_id = %(run_id)s AND cache_key = %(cache_key)s AND token = %(token)s
    FOR SHARE
), ins AS (
    INSERT INTO responses (run_id, cache_key, model, text, output_json, created_at)
    SELECT %(run_id)s, %(cache_key)s, %(model)s, %(text)s, %(output_json)s, %(created_at)s
    WHERE EXISTS (SELECT 1 FROM ok)
    ON CONFLICT (run_id, cache_key) DO NOTHING
    RETURNING 1
)
INSERT INTO call_attempts (run_id, cache_key, worker, kind, detail, created_at)
SELECT %(run_id)s, %(cache_key)s, %(worker)s, 'late', %(output_json)s, %(created_at)s
WHERE NOT EXISTS (SELECT 1 FROM ins)
"""


def claimed_response_statements(
    cache_key: str, model: str, output: ModelOutput, token: str, worker: str
) -> Statements:
    """The response of a call claimed by ``token`` (PostgreSQL: ``RESPONSE_CLAIMED_SQL``)."""
    ((_, args),) = response_statements(cache_key, model, output)
    return [("response_claimed", {**args, "token": token, "worker": worker})]


def failure_statements(cache_key: str, model: str, output: ModelOutput) -> Statements:
    return [
        (
            "failure",
            {
                "cache_key": cache_key,
                "model": model,
                "error": output.error or "",
                "output_json": output.model_dump_json(),
                "created_at": now(),
            },
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
    turns: Sequence[SampleTurn | GraderCall],
    parsed: dict[str, Any] | None,
    parse_error: str,
    image_hashes: list[str],
) -> tuple[str, Statements]:
    sid = sample_id(case_id, task, model, sample)
    row = {
        "sample_id": sid,
        "case_id": case_id,
        "task": task,
        "family": family,
        "model": model,
        "sample": sample,
        "status": status,
        "turns_json": json.dumps([t.stored() for t in turns]),
        "parsed_json": json.dumps(parsed) if parsed is not None else None,
        "parse_error": parse_error,
        "image_hashes": json.dumps(image_hashes),
        "updated_at": now(),
    }
    return sid, [("sample", row)]


def score_statements(
    sid: str,
    scores: list[Score],
    label: ErrorLabel | None,
    scored_json: str | None,
    scoring_version: str | None = None,
) -> Statements:
    t = now()
    key = {"sample_id": sid}
    statements: Statements = [
        ("delete_scores", key),
        ("delete_label", key),
        ("delete_scored", key),
    ]
    if scored_json is not None:
        statements.append(("scored", {"sample_id": sid, "scored_json": scored_json}))
    for s in scores:
        statements.append(
            (
                "score",
                {
                    "sample_id": sid,
                    "scorer": s.scorer,
                    "value": s.value,
                    "explanation": s.explanation,
                    "details_json": s.details.model_dump_json(),
                    "scored_at": t,
                    "scoring_version": scoring_version,
                },
            )
        )
    if label is not None:
        statements.append(
            ("label", {"sample_id": sid, "label_json": label.model_dump_json(), "scored_at": t})
        )
    return statements
