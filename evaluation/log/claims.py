"""Several workers on one run of a PostgreSQL run log: one committed response per call key, and
each provider's limits shared by every worker.

Delivery is at least once (a worker may die, stall or lose its link mid-call), so the run log,
not the queue, guarantees that a call is answered once:

- **A call is claimed before it is sent** (``call_claims``): one holder at a time, for a lease
  the holder renews while the call is in flight (``lease_s``, every third of it). A call already
  answered is not claimed: its committed response is used. A claim held by a live worker is
  waited for (its answer is used), after the runner did the calls nobody holds first
  (``acquire(wait_held=False)``: two workers on one share split it); a claim whose lease ran out (the holder died, stalled past
  the lease, or lost its link), or whose holder was a process of this host that is gone, is
  taken over, and the takeover is recorded in ``call_attempts``
  (the earlier holder's call may have reached the provider: a possible duplicate).
- **The commit checks the claim** (``response_statement``): the response is written only while
  the committing worker still holds the call's claim (the claim row is read ``FOR SHARE``, so a
  takeover waits for the commit and then sees the answer), and never over a committed one; a
  late answer is kept in ``call_attempts`` instead, never overwriting.
- **A provider's limits are the provider's** (``provider_leases``): concurrent calls and
  requests per minute per provider/model, as rows claimed with ``FOR UPDATE SKIP LOCKED`` by
  every worker: a call slot is held for the call (renewed, released when it ends, free again
  when its holder's lease runs out), a minute row for the 60 s after each request (a sliding
  window). Not advisory locks: a busy session holds those long after its client died.

Times are the database's clock (``clock_timestamp()``), so hosts need not agree on the time.
The database going away mid-run (a restart) is waited out for ``outage_s``: each operation is
tried again on a new connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa

from evaluation.errors import StoreError
from evaluation.log import db as db_
from evaluation.log.writes import now
from evaluation.modelio import ModelOutput

log = logging.getLogger(__name__)

DEFAULT_LEASE_S = 30.0
DEFAULT_OUTAGE_S = 120.0
MINUTE_S = 60.0
MAX_SLOTS = 10_000  # rows per provider and kind (a limit above this is refused)
_CLOCK = "extract(epoch from clock_timestamp())"
T = TypeVar("T")

# and the claim's lease ends with the commit (an answered call is never claimed again)
DONE_SQL = f"""
UPDATE call_claims SET lease_until = {_CLOCK} + 1e9
WHERE run_id = %(run_id)s AND cache_key = %(cache_key)s AND token = %(token)s
"""


@dataclass(frozen=True)
class Claim:
    """What claiming a call found: its committed answer, or the claim (its token), or that a
    live worker holds it (``held_by``)."""

    output: ModelOutput | None = None
    token: str | None = None
    held_by: str | None = None
    taken_over: str | None = None  # the earlier holder whose lease ran out


class Coordination:
    """The claims and shared limits of one worker process on one run (PostgreSQL only)."""

    def __init__(
        self,
        url: str,
        run_id: str,
        *,
        worker: str | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        outage_s: float = DEFAULT_OUTAGE_S,
        poll_s: float = 0.1,
    ) -> None:
        if not db_.is_postgres(url):
            raise StoreError("several workers on one run need the PostgreSQL run log")
        if not 0.3 <= lease_s <= 3600:
            raise StoreError(f"lease of {lease_s} s: out of 0.3 .. 3600 s")
        self.url, self.run_id = url, run_id
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.lease_s, self.outage_s, self.poll_s = lease_s, outage_s, poll_s
        engine = db_.postgres_engine(url)
        self._lock = threading.Lock()  # the worker's state below
        # two connections: the renewals never queue behind the claims and takes
        # a session whose client vanished mid-transaction (a host cut off) is ended by the
        # server after the lease, its row locks freed; a claim waits at most this for a lock
        session = (f"SET idle_in_transaction_session_timeout = {int(lease_s * 1000)}; "
                   f"SET lock_timeout = {int(min(2.0, lease_s / 2) * 1000)}")  # fmt: skip
        self._main = _Connection(engine, outage_s, session)
        self._renewal = _Connection(engine, outage_s, session)
        self._claims: dict[str, str] = {}  # token -> cache key, calls in flight
        self._slots: set[str] = set()  # tokens of the call slots held
        self._sized: set[tuple[str, str, int]] = set()
        # one coroutine per provider and kind asks the database for a row; the others wait here
        self._takers: dict[tuple[str, str], asyncio.Lock] = {}
        self._freed: dict[tuple[str, str], asyncio.Event] = {}  # a call slot given back here
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=self._renew_loop, name="lease-renewal", daemon=True)
        self._renewer.start()

    def _do(self, fn: Callable[[Any], T]) -> T:
        return self._main.do(fn)

    def close(self) -> None:
        self._stop.set()
        self._renewer.join(timeout=5)
        self._main.close()
        self._renewal.close()

    # ---------------------------------------------------------------- calls

    def claim(self, key: str) -> Claim:
        """Claim the call ``key`` before sending it (see the module's doc)."""
        token = secrets.token_hex(8)
        p = {"run_id": self.run_id, "key": key, "worker": self.worker, "token": token,
             "lease": self.lease_s}  # fmt: skip

        def tx(cur: Any) -> Claim:
            cur.execute(
                "SELECT worker, lease_until < " + _CLOCK + " FROM call_claims "
                "WHERE run_id = %(run_id)s AND cache_key = %(key)s FOR UPDATE",
                p,
            )
            row = cur.fetchone()
            cur.execute(
                "SELECT output_json FROM responses WHERE run_id = %(run_id)s AND "
                "cache_key = %(key)s",
                p,
            )
            done = cur.fetchone()
            if done is not None:
                return Claim(output=ModelOutput.model_validate_json(done[0]))
            if row is None:
                cur.execute(
                    "INSERT INTO call_claims (run_id, cache_key, worker, token, lease_until, "
                    f"claimed_at, n) VALUES (%(run_id)s, %(key)s, %(worker)s, %(token)s, "
                    f"{_CLOCK} + %(lease)s, {_CLOCK}, 1) ON CONFLICT DO NOTHING",
                    p,
                )
                if cur.rowcount != 1:  # claimed by another worker just now
                    return Claim(held_by="another worker")
                return Claim(token=token)
            holder, expired = row
            if not expired and not _gone(str(holder)):
                return Claim(held_by=str(holder))
            cur.execute(
                f"UPDATE call_claims SET worker = %(worker)s, token = %(token)s, lease_until = "
                f"{_CLOCK} + %(lease)s, claimed_at = {_CLOCK}, n = n + 1 "
                "WHERE run_id = %(run_id)s AND cache_key = %(key)s",
                p,
            )
            cur.execute(
                "INSERT INTO call_attempts (run_id, cache_key, worker, kind, detail, created_at) "
                "VALUES (%(run_id)s, %(key)s, %(worker)s, 'takeover', %(detail)s, %(at)s)",
                {**p, "detail": f"claim of {holder} taken over (lease ran out)", "at": now()},
            )
            return Claim(token=token, taken_over=str(holder))

        try:
            got = self._do(tx)
        except Exception as exc:  # the claim row locked past lock_timeout: held, ask again
            if not _lock_timeout(exc):
                raise
            return Claim(held_by="(row locked)")
        if got.token is not None:
            with self._lock:
                self._claims[got.token] = key
        if got.taken_over:
            log.warning("call %s: claim of %s taken over (its lease ran out)", key[:12],
                        got.taken_over)  # fmt: skip
        return got

    async def acquire(self, key: str, *, wait_held: bool = True) -> Claim:
        """Claim ``key``, waiting while a live worker holds it: its answer (``output``), or
        the claim once it is free or its lease ran out. ``wait_held=False``: a claim a live
        worker holds is returned at once (``held_by``), for the caller to do other work first."""
        wait = self.poll_s
        while True:
            got = await asyncio.to_thread(self.claim, key)
            if got.held_by is None or not wait_held:
                return got
            await asyncio.sleep(_jitter(wait))
            wait = min(wait * 1.5, self.lease_s / 4)

    def response_params(self, token: str) -> dict[str, str]:
        """What the claimed response statement needs besides the response's own values."""
        return {"token": token, "worker": self.worker}

    def finish(self, key: str, token: str) -> ModelOutput | None:
        """After the commit: the claim ends; the call's committed answer (another worker's if
        this one's came late), or None when there is none (a failure: the claim is released
        so that another worker may try)."""
        with self._lock:
            self._claims.pop(token, None)
        p = {"run_id": self.run_id, "cache_key": key, "token": token}

        def tx(cur: Any) -> ModelOutput | None:
            cur.execute(
                "SELECT output_json FROM responses WHERE run_id = %(run_id)s AND "
                "cache_key = %(cache_key)s",
                p,
            )
            row = cur.fetchone()
            if row is None:
                cur.execute(
                    "DELETE FROM call_claims WHERE run_id = %(run_id)s AND "
                    "cache_key = %(cache_key)s AND token = %(token)s",
                    p,
                )
                return None
            cur.execute(DONE_SQL, p)
            return ModelOutput.model_validate_json(row[0])

        return self._do(tx)

    # ---------------------------------------------------------------- provider limits

    def _size(self, cur: Any, provider: str, kind: str, n: int) -> None:
        if (provider, kind, n) in self._sized:
            return
        cur.execute(
            "INSERT INTO provider_leases (provider, kind, slot, holder, lease_until) "
            "SELECT %(p)s, %(k)s, g, NULL, 0 FROM generate_series(0, %(n)s - 1) g "
            "ON CONFLICT DO NOTHING",
            {"p": provider, "k": kind, "n": n},
        )
        self._sized.add((provider, kind, n))

    def take(self, provider: str, kind: str, n: int, token: str, lease_s: float) -> bool:
        """One free row of ``provider``'s ``kind`` (slots ``0..n-1``), held by ``token`` for
        ``lease_s``; False when every one is held."""
        if not 1 <= n <= MAX_SLOTS:
            raise StoreError(f"{provider}: a shared limit of {n}: out of 1 .. {MAX_SLOTS}")

        def tx(cur: Any) -> bool:
            self._size(cur, provider, kind, n)
            cur.execute(
                f"UPDATE provider_leases SET holder = %(t)s, lease_until = {_CLOCK} + %(l)s "
                "WHERE (provider, kind, slot) = (SELECT provider, kind, slot FROM "
                "provider_leases WHERE provider = %(p)s AND kind = %(k)s AND slot < %(n)s "
                f"AND lease_until < {_CLOCK} ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED)",
                {"p": provider, "k": kind, "n": n, "t": token, "l": lease_s},
            )
            return bool(cur.rowcount == 1)

        return self._do(tx)

    async def _hold(self, provider: str, kind: str, n: int, token: str, lease_s: float) -> None:
        """One of ``provider``'s ``kind`` rows held by ``token``, waiting for a free one (one
        coroutine of this worker asks at a time, backing off). A take that returned late (the
        process paused, stopped or starved past half the lease) is checked again: its row may
        have been taken over meanwhile."""
        taker = self._takers.setdefault((provider, kind), asyncio.Lock())
        freed = self._freed.setdefault((provider, kind), asyncio.Event())
        wait = self.poll_s
        async with taker:
            while True:
                freed.clear()  # a slot this worker gives back from now on wakes the wait
                t0 = time.monotonic()
                got = await asyncio.to_thread(self.take, provider, kind, n, token, lease_s)
                if got and (
                    time.monotonic() - t0 < lease_s / 2
                    or await asyncio.to_thread(self.still_held, token, kind, lease_s)
                ):
                    return
                with contextlib.suppress(TimeoutError):  # another worker's: found by asking
                    await asyncio.wait_for(freed.wait(), _jitter(wait))
                wait = min(wait * 1.5, 0.5)

    def still_held(self, token: str, kind: str, lease_s: float) -> bool:
        """Whether ``token`` still holds its ``kind`` row (its lease not run out); extended."""

        def tx(cur: Any) -> bool:
            cur.execute(
                f"UPDATE provider_leases SET lease_until = {_CLOCK} + %(l)s WHERE holder = "
                f"%(t)s AND kind = %(k)s AND lease_until > {_CLOCK}",
                {"t": token, "k": kind, "l": lease_s},
            )
            return bool(cur.rowcount == 1)

        return self._do(tx)

    def give_back(self, token: str) -> None:
        """Free the call slot ``token`` holds (a minute row stays held for its minute)."""
        with self._lock:
            self._slots.discard(token)
        self._do(lambda cur: cur.execute(
            "UPDATE provider_leases SET holder = NULL, lease_until = 0 WHERE holder = %(t)s "
            "AND kind = 'call'", {"t": token}))  # fmt: skip

    @contextlib.asynccontextmanager
    async def provider_slot(
        self, provider: str, concurrent: int | None, per_minute: int | None
    ) -> AsyncIterator[None]:
        """Hold one of ``provider``'s ``concurrent`` call slots and one of its ``per_minute``
        request rows for one request (either None: not limited), waiting for them."""
        token = secrets.token_hex(8)
        if per_minute:
            await self._hold(provider, "minute", per_minute, token, MINUTE_S)
        if not concurrent:
            yield
            return
        await self._hold(provider, "call", concurrent, token, self.lease_s)
        with self._lock:
            self._slots.add(token)
        try:
            yield
        finally:
            await asyncio.shield(asyncio.to_thread(self.give_back, token))
            self._freed.setdefault((provider, "call"), asyncio.Event()).set()

    # ---------------------------------------------------------------- leases

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                self.renew()
            except Exception:  # the database is away: the next round tries again
                log.warning("lease renewal failed", exc_info=True)

    def renew(self) -> None:
        """Extend the lease of every claim and call slot this worker holds."""
        with self._lock:
            claims, slots = list(self._claims), list(self._slots)
        if not claims and not slots:
            return
        p = {"run_id": self.run_id, "c": claims, "s": slots, "l": self.lease_s}

        def tx(cur: Any) -> None:
            if claims:
                cur.execute(
                    f"UPDATE call_claims SET lease_until = {_CLOCK} + %(l)s "
                    "WHERE run_id = %(run_id)s AND token = ANY(%(c)s)",
                    p,
                )
            if slots:
                cur.execute(
                    f"UPDATE provider_leases SET lease_until = {_CLOCK} + %(l)s "
                    "WHERE kind = 'call' AND holder = ANY(%(s)s)",
                    p,
                )

        self._renewal.do(tx)


def _lock_timeout(exc: BaseException) -> bool:
    import psycopg

    return isinstance(exc, psycopg.errors.LockNotAvailable)


def _jitter(wait: float) -> float:
    return wait * (0.5 + secrets.randbelow(1000) / 1000)


class _Connection:
    """One connection to the run log's PostgreSQL, used by one thread at a time; the database
    going away is waited out on a new connection for ``outage_s``, then ``StoreError``."""

    def __init__(self, engine: sa.Engine, outage_s: float, session: str = "") -> None:
        self.engine, self.outage_s, self.session = engine, outage_s, session
        self.conn: sa.Connection | None = None
        self.lock = threading.Lock()

    def do(self, fn: Callable[[Any], T]) -> T:
        """``fn(cursor)`` in one transaction."""
        deadline = time.monotonic() + self.outage_s
        delay = 0.2
        while True:
            with self.lock:
                try:
                    if self.conn is None:
                        self.conn = self.engine.connect().execution_options(
                            isolation_level="AUTOCOMMIT"
                        )
                        if self.session:
                            self.conn.exec_driver_sql(self.session)
                    raw: Any = self.conn.connection.driver_connection
                    with raw.transaction():
                        return fn(raw.cursor())
                except Exception as exc:
                    if not db_.connection_lost(exc):
                        raise
                    self._drop()
                    if time.monotonic() >= deadline:
                        raise StoreError(
                            f"the run log's database was unreachable for {self.outage_s:.0f} s: "
                            f"{exc}"
                        ) from exc
                    log.warning("run log database unreachable (%s); trying again", exc)
            time.sleep(delay)
            delay = min(5.0, delay * 2)

    def _drop(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.invalidate()
                self.conn.close()
            self.conn = None

    def close(self) -> None:
        with self.lock:
            self._drop()


def _gone(worker: str) -> bool:
    """Whether ``worker`` (``host:pid:nonce``) ran on this host and its process is gone: its
    claims need not wait for their lease (a ``runs resume`` after a kill on the same host)."""
    parts = worker.rsplit(":", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive (another user's)
        return False
    return False
