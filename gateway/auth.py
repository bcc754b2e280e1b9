"""API bearer tokens: random secrets shown once, stored only as salted SHA-256 hashes.

A token reads ``nsbx_<id>_<secret>``; the id finds the record, the secret is checked in
constant time. Roles: ``reviewer`` (read studies, runs, reports; review and sign off; start
evaluations only when the routing file grants it: ``api: {reviewers_may_evaluate: true}``) and
``admin`` (also start evaluations, and the audit log), and ``sender`` (only sends studies to
evaluate by STOW-RS: ``verify`` refuses it everywhere else). The token file is 0600 and re-read when it changes, so
``neurosandbox tokens create`` works while the server runs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel

from dicom import PersonNameError, person_name
from gateway.pacs_local import write_secret

PREFIX = "nsbx"


class Role(StrEnum):
    REVIEWER = "reviewer"
    ADMIN = "admin"
    SENDER = "sender"  # STOW-RS only (POST /dicomweb/studies); nothing to read


class TokenRecord(BaseModel):
    id: str
    name: str = ""
    # The clinician's DICOM person name (family^given): the Verifying Observer of what they
    # sign; empty for tokens of programs, which cannot sign off.
    person: str = ""
    role: Role
    salt: str
    sha256: str
    created_at: str
    revoked: bool = False


class TokenError(ValueError):
    """A token operation that cannot be done (unknown id, bad file)."""


def _digest(salt: str, secret: str) -> str:
    return hashlib.sha256(f"{salt}:{secret}".encode()).hexdigest()


def tokens_file(data_dir: Path) -> Path:
    """Where the service keeps its API tokens (hashed)."""
    return data_dir / "secret" / "tokens.json"


class TokenStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._mtime: float | None = None
        self._records: dict[str, TokenRecord] = {}

    def _load(self) -> dict[str, TokenRecord]:
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            self._records, self._mtime = {}, None
            return self._records
        if mtime != self._mtime:
            try:
                raw = json.loads(self.path.read_text())
                self._records = {r["id"]: TokenRecord.model_validate(r) for r in raw}
            except (OSError, ValueError, KeyError) as exc:
                raise TokenError(f"{self.path}: unreadable token file ({exc})") from exc
            self._mtime = mtime
        return self._records

    def _save(self, records: dict[str, TokenRecord]) -> None:
        data = json.dumps([r.model_dump(mode="json") for r in records.values()], indent=2)
        write_secret(self.path, data)
        self._mtime = None

    def create(self, role: Role, name: str = "", person: str = "") -> tuple[TokenRecord, str]:
        """A new token; the returned string is the only time the secret is seen. ``person``:
        the holder's name as family^given (checked), needed to sign off and adjudicate."""
        if person:
            try:
                person = person_name(person)
            except PersonNameError as exc:
                raise TokenError(str(exc)) from None
        with self._lock:
            records = dict(self._load())
            tid = secrets.token_hex(6)
            secret = secrets.token_urlsafe(32)
            salt = secrets.token_hex(16)
            rec = TokenRecord(
                id=tid,
                name=name[:64],
                person=person,
                role=role,
                salt=salt,
                sha256=_digest(salt, secret),
                created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            )
            records[tid] = rec
            self._save(records)
        return rec, f"{PREFIX}_{tid}_{secret}"

    def verify(self, token: str, *, sending: bool = False) -> TokenRecord | None:
        """The record of a valid, unrevoked token; None otherwise (never raises on bad input).
        A ``sender`` token is valid only where ``sending`` is asked (the API, which lets it
        send by STOW-RS and answers 403 elsewhere); the review pages never know it."""
        parts = token.strip().split("_", 2)
        if len(parts) != 3 or parts[0] != PREFIX or len(token) > 200:
            return None
        with self._lock:
            try:
                rec = self._load().get(parts[1])
            except TokenError:
                return None
        if rec is None or rec.revoked:
            # Same work either way, so timing does not tell whether the id exists.
            hmac.compare_digest(_digest("x", parts[2]), "0" * 64)
            return None
        if not hmac.compare_digest(_digest(rec.salt, parts[2]), rec.sha256):
            return None
        return rec if sending or rec.role is not Role.SENDER else None

    def list(self) -> list[TokenRecord]:
        with self._lock:
            return list(self._load().values())

    def revoke(self, token_id: str) -> TokenRecord:
        with self._lock:
            records = dict(self._load())
            if token_id not in records:
                raise TokenError(f"no token with id {token_id!r}")
            records[token_id] = records[token_id].model_copy(update={"revoked": True})
            self._save(records)
            return records[token_id]
