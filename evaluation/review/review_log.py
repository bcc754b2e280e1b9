"""Clinician reviews: an append-only SQLite log of who did what, when; state derived from it.

Every action is one row; rows are never updated or deleted (triggers refuse it), so the log is
the audit trail. The state of a case for a reviewer is the latest row per item; a sign-off
freezes that reviewer's review of the case (later changes are refused). Summaries count
signed-off reviews only: work in progress is shown, never counted.
"""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import threading
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, Field

from evaluation.scores import ErrorCategory, ErrorLabel
from evaluation.scoring.taxonomy import override_error

MAX_TEXT = 4000
_SCHEMA = """
CREATE TABLE IF NOT EXISTS review_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at TEXT NOT NULL,
    reviewer TEXT NOT NULL,
    run_id TEXT NOT NULL,
    case_id TEXT NOT NULL,
    answer_key TEXT NOT NULL DEFAULT '',
    item_id TEXT NOT NULL DEFAULT '',
    action TEXT NOT NULL,
    verdict TEXT,
    category TEXT,
    rating REAL,
    text TEXT NOT NULL DEFAULT '',
    person TEXT NOT NULL DEFAULT '',
    passed_over TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS review_events_case ON review_events (run_id, case_id);
CREATE TRIGGER IF NOT EXISTS review_events_no_update BEFORE UPDATE ON review_events
BEGIN SELECT RAISE(ABORT, 'review_events is append-only'); END;
"""
# Rows are never deleted, except by erasure (``ReviewStore.erase``), which lifts this for once
_NO_DELETE = """CREATE TRIGGER IF NOT EXISTS review_events_no_delete BEFORE DELETE ON review_events
BEGIN SELECT RAISE(ABORT, 'review_events is append-only'); END;"""
_SCHEMA += _NO_DELETE
COLUMNS = (
    "id",
    "at",
    "reviewer",
    "run_id",
    "case_id",
    "answer_key",
    "item_id",
    "action",
    "verdict",
    "category",
    "rating",
    "text",
    "person",
    "passed_over",
)


class Action(StrEnum):
    ITEM = "item"  # verdict on one checklist item (+ correction text)
    DIAGNOSIS = "diagnosis"  # the clinician's diagnosis of the case (text)
    ERROR = "error_category"  # override of an answer's error category (+ evidence text)
    RATING = "rating"  # the clinician's 0-5 rating of an answer (grader calibration)
    COMMENT = "comment"
    SIGNOFF = "signoff"
    REISSUE = "reissue"  # the verified report was stored in PACS (text: SOP Instance UID)
    ADJUDICATE = "adjudicate"  # an admin's ruling on an item the reviewers disagree on


class Verdict(StrEnum):
    ACCEPT = "accept"
    REJECT = "reject"
    CORRECT = "correct"


class ReviewError(ValueError):
    """A review action that cannot be recorded (signed off already, missing field)."""


class Superseded(BaseModel):
    """A newer report version of the same study (its StudyInstanceUID and patient) that
    supersedes the report under review: what the case page and the queue row say, and what a
    knowing sign-off or re-issue of the older version names."""

    version: int  # the version under review
    newer_version: int
    newer_run_id: str  # the newer version's gateway run (its report folder)
    newer_slug: str = ""  # the same case in the newer report ("" when it cannot be told)
    newer_finished_at: str = ""
    url: str = ""  # the newer version's page, as the review pages link it (href)

    @property
    def newer(self) -> str:
        """How the log, the pages and the VERIFIED SR name the newer version."""
        return f"version {self.newer_version} (gateway run {self.newer_run_id})"

    def href(self, base: str) -> str:
        """The newer version's case page (its queue when the case cannot be told)."""
        url = f"{base}/runs/{self.newer_run_id}"
        return f"{url}/cases/{self.newer_slug}" if self.newer_slug else url


class ReviewEvent(BaseModel):
    id: int | None = None
    at: str = ""
    reviewer: str
    run_id: str
    case_id: str
    answer_key: str = ""
    item_id: str = ""
    action: Action
    verdict: Verdict | None = None
    category: ErrorCategory | None = None
    rating: float | None = Field(default=None, ge=0, le=5)
    text: str = ""
    person: str = ""  # the actor's DICOM person name (family^given), from their token
    # a sign-off or re-issue of a superseded report version: the newer version knowingly
    # passed over ("version 2 (gateway run ...)"); "" for the newest version
    passed_over: str = ""


class ItemState(BaseModel):
    verdict: Verdict
    text: str = ""
    at: str
    id: int = 0  # the event's id in the log: the later of two decisions has the larger one


class CaseReview(BaseModel):
    """One reviewer's current review of one case, derived from the log."""

    reviewer: str
    run_id: str
    case_id: str
    items: dict[str, dict[str, ItemState]] = Field(default_factory=dict)  # answer -> item -> state
    diagnosis: str | None = None
    errors: dict[str, ErrorLabel] = Field(default_factory=dict)  # answer -> clinician label
    error_states: dict[str, ItemState] = Field(default_factory=dict)  # the same, as a decision
    ratings: dict[str, float] = Field(default_factory=dict)  # answer -> 0..5
    comments: list[tuple[str, str]] = Field(default_factory=list)  # (at, text)
    signed_off_at: str | None = None
    signed_digest: str = ""  # what the sign-off confirmed (review.verify.digest)
    passed_over: str = ""  # the newer report version the sign-off knowingly passed over
    last_id: int = 0  # the reviewer's latest event in the log
    reissued: list[str] = Field(default_factory=list)  # SOP Instance UIDs
    adjudicated: dict[str, dict[str, ItemState]] = Field(default_factory=dict)  # admin rulings
    person: str = ""  # DICOM person name (family^given) the reviewer acted under
    n_events: int = 0

    def verdict(self, answer_key: str, item_id: str) -> ItemState | None:
        return self.items.get(answer_key, {}).get(item_id)


def fold(events: Iterable[ReviewEvent]) -> dict[tuple[str, str, str], CaseReview]:
    """(run, case, reviewer) -> that reviewer's review, from events in log order."""
    out: dict[tuple[str, str, str], CaseReview] = {}
    for e in events:
        r = out.setdefault(
            (e.run_id, e.case_id, e.reviewer),
            CaseReview(reviewer=e.reviewer, run_id=e.run_id, case_id=e.case_id),
        )
        r.n_events += 1
        r.last_id = max(r.last_id, e.id or 0)
        r.person = e.person or r.person
        if e.action is Action.ITEM and e.verdict is not None:
            r.items.setdefault(e.answer_key, {})[e.item_id] = ItemState(
                verdict=e.verdict, text=e.text, at=e.at, id=e.id or 0
            )
        elif e.action is Action.DIAGNOSIS:
            r.diagnosis = e.text or None
        elif e.action is Action.ERROR and e.category is not None:
            r.errors[e.answer_key] = override_error(
                category=e.category,
                clinician=e.reviewer,
                evidence=e.text or "clinician override",
                at=datetime.fromisoformat(e.at),
            )
            r.error_states[e.answer_key] = ItemState(
                verdict=Verdict.CORRECT, text=e.category.value, at=e.at, id=e.id or 0
            )
        elif e.action is Action.RATING and e.rating is not None:
            r.ratings[e.answer_key] = e.rating
        elif e.action is Action.COMMENT and e.text:
            r.comments.append((e.at, e.text))
        elif e.action is Action.SIGNOFF and r.signed_off_at is None:
            r.signed_off_at, r.signed_digest, r.passed_over = e.at, e.text, e.passed_over
        elif e.action is Action.REISSUE and e.text:
            r.reissued.append(e.text)
        elif e.action is Action.ADJUDICATE and e.verdict is not None:
            r.adjudicated.setdefault(e.answer_key, {})[e.item_id] = ItemState(
                verdict=e.verdict, text=e.text, at=e.at, id=e.id or 0
            )
    return out


def _check(event: ReviewEvent) -> None:
    if len(event.text) > MAX_TEXT:
        raise ReviewError(f"text longer than {MAX_TEXT} characters")
    if event.action in (Action.ITEM, Action.ADJUDICATE) and (
        event.verdict is None or not event.item_id
    ):
        raise ReviewError("an item verdict needs the item and accept, reject or correct")
    if (
        event.action in (Action.ITEM, Action.ADJUDICATE)
        and event.verdict is Verdict.CORRECT
        and not event.text.strip()
    ):
        raise ReviewError("a correction needs the corrected text")
    if event.action is Action.ERROR and event.category is None:
        raise ReviewError("an error-category override needs the category")
    if event.action is Action.RATING and event.rating is None:
        raise ReviewError("a rating needs a value from 0 to 5")


class ReviewStore:
    """The review log of one gateway (or one report folder): ``reviews.sqlite``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        with self._connect() as db:
            db.executescript(_SCHEMA)
            columns = {row[1] for row in db.execute("PRAGMA table_info(review_events)")}
            for added in ("person", "passed_over"):  # a log written before they were recorded
                if added not in columns:
                    db.execute(
                        f"ALTER TABLE review_events ADD COLUMN {added} TEXT NOT NULL DEFAULT ''"
                    )

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def append(self, event: ReviewEvent) -> ReviewEvent:
        """Record one action; refused once the reviewer has signed the case off."""
        return self.append_many([event])[0]

    def append_many(
        self, events: list[ReviewEvent], expect_last: int | None = None
    ) -> list[ReviewEvent]:
        """Record actions of one reviewer on one case at once (all or none). ``expect_last``:
        the reviewer's latest event id the actions were decided on; refused if there is a
        later one (a sign-off confirms what was shown, not what changed since)."""
        for event in events:
            _check(event)
        if not events:
            return []
        first = events[0]
        if any(
            (e.run_id, e.case_id, e.reviewer) != (first.run_id, first.case_id, first.reviewer)
            for e in events
        ):
            raise ReviewError("one batch of review actions is one reviewer's, on one case")
        at = first.at or datetime.now(UTC).isoformat(timespec="microseconds")
        out = []
        with self._lock, self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            actions = {
                (row[0], row[1])
                for row in db.execute(
                    "SELECT reviewer, action FROM review_events WHERE run_id=? AND case_id=? "
                    "AND action='signoff'",
                    (first.run_id, first.case_id),
                )
            }
            mine = (first.reviewer, "signoff") in actions
            if expect_last is not None:
                last = db.execute(
                    "SELECT COALESCE(MAX(id), 0) FROM review_events WHERE run_id=? AND case_id=? "
                    "AND reviewer=?",
                    (first.run_id, first.case_id, first.reviewer),
                ).fetchone()[0]
                if last != expect_last:
                    db.execute("ROLLBACK")
                    raise ReviewError(
                        "your review changed since the content was shown: review it again"
                    )
            for event in events:
                if mine and event.action is not Action.REISSUE:
                    db.execute("ROLLBACK")
                    raise ReviewError(
                        f"{event.reviewer} has signed off case {event.case_id!r}; the review is final"
                    )
                if event.action is Action.REISSUE and not actions:
                    db.execute("ROLLBACK")
                    raise ReviewError("only a signed-off case can be re-issued to PACS")
                cur = db.execute(
                    f"INSERT INTO review_events ({', '.join(COLUMNS[1:])}) VALUES ({', '.join('?' * (len(COLUMNS) - 1))})",
                    (
                        event.at or at,
                        event.reviewer,
                        event.run_id,
                        event.case_id,
                        event.answer_key,
                        event.item_id,
                        event.action.value,
                        event.verdict.value if event.verdict else None,
                        event.category.value if event.category else None,
                        event.rating,
                        event.text,
                        event.person,
                        event.passed_over,
                    ),
                )
                out.append(event.model_copy(update={"id": cur.lastrowid, "at": event.at or at}))
                if event.action is Action.SIGNOFF:
                    mine = True
                    actions.add((event.reviewer, "signoff"))
            db.execute("COMMIT")
        return out

    def events(self, run_id: str | None = None, case_id: str | None = None) -> list[ReviewEvent]:
        sql, args = "SELECT * FROM review_events", []
        where = []
        if run_id is not None:
            where.append("run_id=?")
            args.append(run_id)
        if case_id is not None:
            where.append("case_id=?")
            args.append(case_id)
        if where:
            sql += " WHERE " + " AND ".join(where)
        with self._connect() as db:
            db.row_factory = sqlite3.Row
            rows = db.execute(sql + " ORDER BY id", args).fetchall()
        return [ReviewEvent.model_validate(dict(r)) for r in rows]

    def erase(self, run_ids: Iterable[str], case_ids: Iterable[str] | None = None) -> int:
        """Erasure (``neurosandbox purge``), the one exception to append-only: delete every
        event of these runs (of these cases of them only, when given), then rewrite the file,
        so that nothing of them is left in free pages or the write-ahead log. Returns how many
        events were deleted."""
        runs, where = sorted(set(run_ids)), "run_id IN ({})"
        args = list(runs)
        if case_ids is not None:
            cases = sorted(set(case_ids))
            where, args = where + " AND case_id IN ({})", [*runs, *cases]
            if not cases:
                return 0
        if not runs:
            return 0
        marks = [",".join("?" * len(a)) for a in (runs, args[len(runs) :]) if a]
        with self._lock, self._connect() as db:
            db.execute("PRAGMA secure_delete=ON")
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("DROP TRIGGER IF EXISTS review_events_no_delete")
                sql = "DELETE FROM review_events WHERE " + where.format(*marks)
                n = db.execute(sql, args).rowcount
                db.execute(_NO_DELETE)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            if n:
                db.execute("VACUUM")
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return n

    def reviews(self, run_id: str, case_id: str | None = None) -> list[CaseReview]:
        return list(fold(self.events(run_id, case_id)).values())

    def version(self, run_id: str) -> int:
        """The id of the run's latest event (0 when none): changes whenever a review does."""
        with self._connect() as db:
            row = db.execute(
                "SELECT COALESCE(MAX(id), 0) FROM review_events WHERE run_id=?", (run_id,)
            ).fetchone()
        return int(row[0])


def signed_off(reviews: Iterable[CaseReview]) -> list[CaseReview]:
    return [r for r in reviews if r.signed_off_at is not None]


def by_case(reviews: Iterable[CaseReview]) -> dict[str, list[CaseReview]]:
    out: dict[str, list[CaseReview]] = defaultdict(list)
    for r in reviews:
        out[r.case_id].append(r)
    return out


def export_csv(events: Iterable[ReviewEvent]) -> str:
    """The log as CSV (one row per action); cells that a spreadsheet would run as a formula are
    prefixed with a quote."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(COLUMNS)
    for e in events:
        row = e.model_dump(mode="json")
        w.writerow([_cell(row[c]) for c in COLUMNS])
    return buf.getvalue()


def _cell(value: object) -> object:
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return "" if value is None else value


def export_json(events: Iterable[ReviewEvent]) -> str:
    """The log and the derived per-reviewer reviews, as JSON."""
    evs = list(events)
    return json.dumps(
        {
            "events": [e.model_dump(mode="json") for e in evs],
            "reviews": [r.model_dump(mode="json") for r in fold(evs).values()],
        },
        indent=2,
    )
