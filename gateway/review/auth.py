"""Browser sign-in for the review pages: a bearer token exchanged for a session cookie.

The cookie is HttpOnly, SameSite=Strict, scoped to /review, and Secure when configured; it holds
only a random session id. Every POST made with the cookie must carry the session's CSRF token
(a hidden form field) and, when the browser sends one, an Origin of this host. API clients may
send ``Authorization: Bearer`` instead (no cookie, so no CSRF check). Sessions live in memory:
a restart signs everyone out, and a revoked token ends its sessions at the next request.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi import Request

from gateway.auth import Role, TokenRecord, TokenStore

SESSION_COOKIE = "nsbx_review"
LOGIN_COOKIE = "nsbx_review_login"
COOKIE_PATH = "/review"
MAX_SESSIONS = 10_000


@dataclass(frozen=True)
class Reviewer:
    """Who is acting: the token's name (or id) is the reviewer's name in the review log."""

    name: str
    token_id: str
    role: Role
    session_id: str | None = None  # None: a bearer-token request
    csrf: str = ""
    person: str = ""  # DICOM person name (family^given) from the token; "" for programs


@dataclass
class _Session:
    token_id: str
    name: str
    role: Role
    csrf: str
    expires: float
    person: str = ""


def reviewer_name(rec: TokenRecord) -> str:
    return (rec.name or "").strip() or f"token-{rec.id}"


class SessionStore:
    def __init__(self, hours: float) -> None:
        self.ttl = max(60.0, hours * 3600)
        self._lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}

    def create(self, rec: TokenRecord) -> tuple[str, Reviewer]:
        sid, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        now = time.monotonic()
        with self._lock:
            if len(self._sessions) >= MAX_SESSIONS:
                self._sessions = {k: v for k, v in self._sessions.items() if v.expires > now}
            self._sessions[sid] = _Session(
                rec.id, reviewer_name(rec), rec.role, csrf, now + self.ttl, rec.person
            )
        return sid, Reviewer(reviewer_name(rec), rec.id, rec.role, sid, csrf, rec.person)

    def get(self, sid: str) -> _Session | None:
        with self._lock:
            s = self._sessions.get(sid)
            if s is not None and s.expires < time.monotonic():
                del self._sessions[sid]
                return None
            return s

    def drop(self, sid: str) -> None:
        with self._lock:
            self._sessions.pop(sid, None)


def identify(request: Request, tokens: TokenStore, sessions: SessionStore) -> Reviewer | None:
    """The reviewer of a request: a valid bearer token, else a live session cookie."""
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        rec = tokens.verify(auth[7:].strip())
        if rec is None:
            return None
        request.state.actor = rec.id
        return Reviewer(reviewer_name(rec), rec.id, rec.role, person=rec.person)
    sid = request.cookies.get(SESSION_COOKIE, "")
    s = sessions.get(sid) if 0 < len(sid) <= 100 else None
    if s is None:
        return None
    live = any(r.id == s.token_id and not r.revoked for r in tokens.list())
    if not live:
        sessions.drop(sid)
        return None
    request.state.actor = s.token_id
    return Reviewer(s.name, s.token_id, s.role, sid, s.csrf, s.person)


def same_origin(request: Request) -> bool:
    """False when the browser says the request came from another site."""
    origin = request.headers.get("origin")
    if origin is None:
        return request.headers.get("sec-fetch-site", "same-origin") in ("same-origin", "none")
    return urlsplit(origin).netloc == request.headers.get("host", "")


def csrf_ok(request: Request, who: Reviewer, form_token: str) -> bool:
    """A cookie-authenticated POST must carry the session's CSRF token (a form field, or the
    ``X-CSRF-Token`` header for JSON) and come from here."""
    if who.session_id is None:
        return True  # bearer token: nothing ambient a third-party page could use
    form_token = form_token or request.headers.get("x-csrf-token", "")
    return (
        bool(form_token)
        and hmac.compare_digest(form_token.encode(), who.csrf.encode())
        and same_origin(request)
    )
