"""Several workers on one run (PostgreSQL run log, evaluation/log/claims.py): three real
``neurosandbox`` processes each take a share of the run's cases (``--shard I/3``) through litellm
to the loopback server, which counts every request by its body. The provider's concurrency limit
is shared through the run log (2 calls at once for all three, each allowed 4 of its own).

One worker is killed with SIGKILL mid-run; the share is taken again (as the queue retries a
stalled job). Every call key ends with one response; a call answered is never asked again,
except the calls the killed worker had claimed, each recorded as a takeover in
``call_attempts``. A worker stopped with SIGSTOP past its lease has its calls taken over, and
once continued its late answers are refused (kept in ``call_attempts``), never overwriting."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml
from engine_helpers import cli_env, neurosandbox_bin, write_nmb
from openai_server import OpenAIServer, Script
from pg_server import fresh_pg_database

from evaluation.modelio import ModelOutput

pytestmark = pytest.mark.integration
N_CASES, SAMPLES, SHARDS = 9, 2, 3
LIVE = "extract(epoch from clock_timestamp()) + 1e8"  # a claim not yet ended by its commit


def _env(tmp: Path, url: str, server_url: str, shared: int) -> dict[str, str]:
    models = tmp / "models.yaml"
    models.write_text(yaml.safe_dump({"models": [{
        "name": "gpt", "model": "openai/gpt-4o", "api_base": server_url, "concurrency": 4,
        "max_retries": 0, "shared_concurrency": shared,
    }]}))  # fmt: skip
    return {**cli_env(tmp / "cache"), "NEUROSANDBOX_DATABASE_URL": url,
            "NEUROSANDBOX_CALL_LEASE_S": "5.0", "NEUROSANDBOX_MODELS_FILE": str(models)}  # fmt: skip


def _count(url: str, sql: str) -> int:
    eng = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with eng.connect() as c:
            return int(c.execute(sa.text(sql)).scalar() or 0)
    except sa.exc.ProgrammingError:  # the tables are not there yet
        return 0
    finally:
        eng.dispose()


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([neurosandbox_bin(), *args], env=env, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT)  # fmt: skip


def _wait(procs: list[subprocess.Popen[bytes]], logs: list[Path], timeout_s: float = 120) -> None:
    for p, log in zip(procs, logs, strict=True):
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            pytest.fail(f"worker never finished: {log.read_text()[-2000:]}")
        assert p.returncode in (0, 1), log.read_text()[-3000:]


def _first_worker(tmp: Path, data: tuple[Path, Path], env: dict[str, str], url: str,
                  run: Path, shards: int = SHARDS, share: int = 0,
                  samples: int = SAMPLES) -> subprocess.Popen[bytes]:  # fmt: skip
    """The first worker (share ``share``) starts the run; returns once its run row exists
    (the others join it)."""
    suite, answers = data
    w0 = _start(["eval", "--suite", str(suite), "--answers", str(answers), "--model", "gpt",
                 "--samples", str(samples), "--seed", "7", "--no-bertscore", "--out", str(run),
                 "--shard", f"{share}/{shards}"], env, tmp / "w0.log")  # fmt: skip
    deadline = time.monotonic() + 60
    while _count(url, "SELECT count(*) FROM run") == 0:
        if w0.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the run never started: {(tmp / 'w0.log').read_text()[-2000:]}")
        time.sleep(0.1)
    return w0


def _holds_claims(url: str, proc: subprocess.Popen[bytes], log: Path, pid: int | None = -1) -> None:
    """Returns once ``proc`` (its pid; None: any worker) holds a live claim (a call sent, or
    waiting for a shared slot)."""
    deadline = time.monotonic() + 60
    who = f"'%:{proc.pid if pid == -1 else pid}:%'" if pid is not None else "'%'"
    sql = f"SELECT count(*) FROM call_claims WHERE worker LIKE {who} AND lease_until < {LIVE}"
    while _count(url, sql) == 0:
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.05)


def test_a_stalled_worker_s_call_is_taken_over_and_its_late_answer_refused(
    pg_url: str, tmp_path: Path
) -> None:
    """The claim protocol between two workers of one run (in one process, the first one's
    renewals stopped as SIGSTOP stops them): the second waits while the claim is live, takes it
    over once its lease ran out (recorded), commits; the first one's late answer is kept apart
    and refused, and what both read back is the committed answer; an answered call is never
    claimed again. The provider's slots go the same way. (Real processes killed, stopped and
    cut off: the tests below and tests/test_queue_workers.py.)"""
    from evaluation.log import open_store
    from evaluation.log import schema as t_
    from evaluation.log.claims import Coordination
    from evaluation.log.writes import claimed_response_statements

    url = fresh_pg_database(pg_url)
    store = open_store(tmp_path / "run", database_url=url, create=True, run_id="claims")
    row = {c.name: (0 if isinstance(c.type, sa.Integer) else "x") for c in t_.requests.columns}
    with sa.create_engine(url, poolclass=sa.pool.NullPool).begin() as c:
        c.execute(t_.requests.insert(), {**row, "run_id": "claims", "cache_key": "k1"})
    a = Coordination(url, "claims", worker="host-a:1:aa", lease_s=0.6, poll_s=0.05)
    b = Coordination(url, "claims", worker="host-b:2:bb", lease_s=0.6, poll_s=0.05)
    try:
        mine = a.claim("k1")
        assert mine.token and b.claim("k1").held_by == "host-a:1:aa"
        time.sleep(0.5)
        assert b.claim("k1").held_by == "host-a:1:aa"  # renewed: still a's
        a._stop.set()  # a stalls: no more renewals
        a._renewer.join()
        time.sleep(0.7)
        theirs = b.claim("k1")
        assert theirs.token and theirs.taken_over == "host-a:1:aa"
        answer = ModelOutput(text="b's answer")
        store.commit(claimed_response_statements("k1", "m", answer, theirs.token, b.worker))
        late = ModelOutput(text="a's late answer")
        store.commit(claimed_response_statements("k1", "m", late, mine.token, a.worker))
        assert store.responses()["k1"].text == "b's answer"  # never overwritten
        assert a.finish("k1", mine.token) == b.finish("k1", theirs.token) == answer
        kinds = {"takeover": 1, "late": 1}
        for kind, n in kinds.items():
            assert _count(url, f"SELECT count(*) FROM call_attempts WHERE kind = '{kind}'") == n
        with sa.create_engine(url, poolclass=sa.pool.NullPool).connect() as conn:
            kept = conn.execute(sa.text("SELECT detail FROM call_attempts WHERE kind = 'late'"))
            assert ModelOutput.model_validate_json(kept.scalar_one()).text == "a's late answer"
        assert b.claim("k1").output == answer  # answered: never sent again
        # the provider's slots: a's two lapse with it, b gets them; a's is then not held
        c = Coordination(url, "claims", worker="host-c:3:cc", lease_s=0.6, poll_s=0.05)
        try:
            assert c.take("p", "call", 2, "t1", 0.6) and c.take("p", "call", 2, "t2", 0.6)
            assert not b.take("p", "call", 2, "t3", 0.6)  # both held: the limit holds
            time.sleep(0.7)  # c holds them without renewing (it never entered provider_slot)
            assert b.take("p", "call", 2, "t3", 0.6)
            assert not c.still_held("t1", "call", 0.6) or not c.still_held("t2", "call", 0.6)
        finally:
            c.close()
    finally:
        a.close()
        b.close()
        store.close()


def test_postgresql_restarted_mid_run_loses_and_repeats_nothing(tmp_path: Path) -> None:
    """The run log's PostgreSQL restarted twice while two workers share a run (``pg_ctl stop -m
    fast``, then ``-m immediate``: a crash recovered from the WAL): they wait it out on new
    connections and carry on; nothing committed is lost or written twice."""
    from pg_server import postgres_bindir

    from gateway.pg_local import LocalPostgres

    n_cases = 8
    distinct = n_cases * SAMPLES
    data = write_nmb(tmp_path / "data", n_cases)
    run = tmp_path / "run"
    with (
        LocalPostgres(bindir=postgres_bindir()) as pg,
        OpenAIServer(Script(latency_s=0.3)) as server,
    ):
        url = pg.url
        env = {**_env(tmp_path, url, server.url, shared=3), "NEUROSANDBOX_CALL_LEASE_S": "20"}
        w0 = _first_worker(tmp_path, data, env, url, run, shards=2, share=1)  # 2 cases
        w1 = _start(["runs", "resume", str(run), "--shard", "0/2"], env, tmp_path / "w1.log")
        _holds_claims(url, w1, tmp_path / "w1.log")  # both at work (not starting) when it goes
        for after, mode in ((3, "fast"), (9, "immediate")):  # calls in flight each time
            deadline = time.monotonic() + 60
            while server.stats.delivered < after:
                assert time.monotonic() < deadline and w1.poll() is None, (
                    (tmp_path / "w1.log").read_text()[-2000:])  # fmt: skip
                time.sleep(0.05)
            pg.restart(mode)
        _wait([w0, w1], [tmp_path / "w0.log", tmp_path / "w1.log"])
        stats = server.stats
        takeovers = _count(url, "SELECT count(*) FROM call_attempts WHERE kind = 'takeover'")
        assert _count(url, "SELECT count(*) FROM responses") == distinct
        assert _count(url, "SELECT count(*) FROM requests") == distinct
        assert stats.calls - distinct <= takeovers  # a call is sent again only when taken over
        # every payload sent is audited once: no transaction was written twice on reconnecting
        assert _count(url, "SELECT count(*) FROM audit") == stats.calls
        assert _count(url, "SELECT count(*) FROM samples WHERE status = 'ok'") == distinct
        assert _count(url, "SELECT count(*) FROM run WHERE status = 'complete'") == 1


def test_one_worker_and_three_store_the_same_answers_and_scores(
    pg_url: str, tmp_path: Path
) -> None:
    """The same run (reference models, deterministic) by one worker and by three sharing it
    at once: the same calls, the same answers, the same samples and scores."""
    import asyncio

    from evaluation import DatasetSpec, RunConfig
    from evaluation.engine import resume_run, start_run
    from evaluation.log import open_store
    from gateway.settings import get_settings

    suite, answers = write_nmb(tmp_path / "data", N_CASES)

    def config(run_id: str) -> RunConfig:
        return RunConfig.from_settings(
            get_settings(), DatasetSpec(path=str(suite), answers=str(answers)),
            models=["reference/image-rules", "reference/text-prior"], samples=SAMPLES, seed=7,
            bertscore=False, run_id=run_id,
        )  # fmt: skip

    async def three(url: str, run: Path) -> None:
        await start_run(config("same"), run, database_url=url, shard=(0, SHARDS), lease_s=5)
        await asyncio.gather(*(resume_run(run, database_url=url, shard=(i, SHARDS), lease_s=5)
                               for i in range(1, SHARDS)))  # fmt: skip

    one_url, three_url = fresh_pg_database(pg_url), fresh_pg_database(pg_url)
    asyncio.run(start_run(config("same"), tmp_path / "one", database_url=one_url))
    asyncio.run(three(three_url, tmp_path / "three"))

    def content(run: Path, url: str) -> tuple[object, ...]:
        with open_store(run, database_url=url) as store:
            answers = {k: o.text for k, o in store.responses().items()}
            samples = sorted((s.case_id, s.task, s.model, s.sample, s.status,
                              json.dumps(s.parsed, sort_keys=True, default=str))
                             for s in store.samples(calls=False, scores=False))  # fmt: skip
            scores = {k: sorted((s.scorer, s.value) for s in v) for k, v in store.scores().items()}
            return answers, samples, scores, store.run_log().status

    one, many = content(tmp_path / "one", one_url), content(tmp_path / "three", three_url)
    assert one[0] and one[0] == many[0]  # the same calls, answered the same
    assert one[1] == many[1] and one[2] == many[2]
    assert one[3] == many[3] == "complete"


def _calls_made(log: Path) -> int:
    """The calls a worker sent, from its closing line ("24/24 samples; 12 calls, 12 reused")."""
    m = re.search(r"samples; (\d+) calls?, ", log.read_text())
    assert m, log.read_text()[-2000:]
    return int(m.group(1))


def test_a_worker_joining_a_share_takes_the_calls_nobody_holds(pg_url: str, tmp_path: Path) -> None:
    """A second worker joins a share another worker is already on (a queue's retried job, an
    operator's second host): it leaves the calls the first one holds and takes the ones nobody
    holds, so the share is split, not trailed. (Waiting on each held call in the same order, the
    second worker only ever found answers: no calls of its own.) Every call is still sent once."""
    url = fresh_pg_database(pg_url)
    with OpenAIServer(Script(latency_s=1.0)) as server:
        env = _env(tmp_path, url, server.url, shared=8)
        data = write_nmb(tmp_path / "data", N_CASES)
        run = tmp_path / "run"
        first = _first_worker(tmp_path, data, env, url, run, shards=1, share=0, samples=2)
        _holds_claims(url, first, tmp_path / "w0.log")
        # the provider answers nothing more until the second worker holds claims of its own:
        # however slow it is to start, the first one cannot finish the share meanwhile
        server.script.hold_after = server.stats.delivered
        second = _start(["runs", "resume", str(run), "--shard", "0/1"], env,
                        tmp_path / "w1.log")  # fmt: skip
        _holds_claims(url, second, tmp_path / "w1.log")
        server.release_held()
        _wait([first, second], [tmp_path / "w0.log", tmp_path / "w1.log"])
        distinct = N_CASES * 2
        assert _count(url, "SELECT count(*) FROM responses") == distinct
        assert server.stats.calls == distinct  # nothing sent twice
        ours, theirs = _calls_made(tmp_path / "w0.log"), _calls_made(tmp_path / "w1.log")
        assert ours + theirs == distinct
        assert theirs >= 4, (ours, theirs)  # at least one round of its own concurrency


class _Host:
    """A worker host: a network namespace joined to this host by a veth pair (10.213.N.0/24)."""

    def __init__(self, n: int) -> None:
        self.ns, self.here, self.there = f"nsbx-w{n}", f"nsbx-h{n}", f"nsbx-n{n}"
        self.gateway, self.addr = f"10.213.{n}.1", f"10.213.{n}.2"

    def _ip(self, *args: str, ns: bool = False) -> None:
        cmd = ["ip", "netns", "exec", self.ns, "ip", *args] if ns else ["ip", *args]
        subprocess.run(cmd, check=True, capture_output=True, timeout=10)

    def __enter__(self) -> _Host:
        self.__exit__()
        subprocess.run(["ip", "netns", "add", self.ns], check=True, capture_output=True)
        self._ip("link", "add", self.here, "type", "veth", "peer", "name", self.there)
        self._ip("link", "set", self.there, "netns", self.ns)
        self._ip("addr", "add", f"{self.gateway}/24", "dev", self.here)
        self._ip("link", "set", self.here, "up")
        self._ip("addr", "add", f"{self.addr}/24", "dev", self.there, ns=True)
        self._ip("link", "set", self.there, "up", ns=True)
        self._ip("link", "set", "lo", "up", ns=True)
        return self

    def cut(self) -> None:
        """The host's link taken down (from inside its namespace)."""
        self._ip("link", "set", self.there, "down", ns=True)

    def run(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *argv]

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["ip", "link", "del", self.here], capture_output=True, timeout=10)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, timeout=10)


def test_a_worker_host_cut_off_has_its_calls_and_slots_freed_within_the_lease(
    tmp_path: Path,
) -> None:
    """A worker on another host (a network namespace) loses its link while it holds claims and
    provider slots: a worker here takes its share over once the lease ran out; one response per
    key, and the shared limit still holds. Fails, not skips, when namespaces cannot be made."""
    from pg_server import postgres_bindir

    from gateway.pg_local import LocalPostgres, database_url

    lease = 6.0
    host = _Host(os.getpid() % 200 + 20)
    with (
        host,
        LocalPostgres(bindir=postgres_bindir(), listen=f"127.0.0.1,{host.gateway}",
                      trusted_net=f"{host.gateway}/24") as pg,
        OpenAIServer(Script(latency_s=1.0), host=host.gateway) as server,
    ):  # fmt: skip
        if True:
            assert pg.port is not None
            url = database_url(pg.port, pg.dbname, host.gateway)  # reached from both hosts
            data = write_nmb(tmp_path / "data", N_CASES)
            run = tmp_path / "run"
            env = {**_env(tmp_path, url, server.url, shared=2),
                   "NEUROSANDBOX_CALL_LEASE_S": str(lease)}  # fmt: skip
            # four samples a case: the far worker's share keeps it busy past the cut
            w0 = _first_worker(tmp_path, data, env, url, run, shards=2, share=1, samples=4)
            # the far host's worker and one here share the same cases (six; the far one is cut
            # off while both hold claims); the first worker takes the other three. Once the far
            # one holds claims, the provider answers nothing more until the cut: however slow
            # a worker is to start (a loaded CI machine), the far one cannot finish the share
            # before the near one holds claims too (waiting for the shared slots)
            far = subprocess.Popen(host.run([neurosandbox_bin(), "runs", "resume", str(run),
                                             "--shard", "0/2"]), env=env,
                                   stdout=(tmp_path / "far.log").open("wb"),
                                   stderr=subprocess.STDOUT)  # fmt: skip
            near: subprocess.Popen[bytes] | None = None
            try:
                _holds_claims(url, far, tmp_path / "far.log")
                server.script.hold_after = server.stats.delivered  # held until released
                near = _start(["runs", "resume", str(run), "--shard", "0/2"], env,
                              tmp_path / "near.log")  # fmt: skip
                _holds_claims(url, near, tmp_path / "near.log")
                host.cut()
                cut_at = time.monotonic()
                server.release_held()  # what the far worker asked is answered into a cut link
                held = f"SELECT count(*) FROM call_claims WHERE worker LIKE '%:{far.pid}:%'"
                assert _count(url, f"{held} AND lease_until < {LIVE}") >= 1  # cut off holding
                # freed: none of its claims is live any more (run out, or taken over). A worker
                # here takes them when it comes to them: it does the calls nobody holds first
                now = "extract(epoch from clock_timestamp())"
                while _count(url, f"{held} AND lease_until < {LIVE} AND lease_until > {now}"):
                    assert time.monotonic() - cut_at < 60, "never freed"
                    time.sleep(0.1)
                freed_after = time.monotonic() - cut_at
                sql = "SELECT count(*) FROM call_attempts WHERE kind = 'takeover'"
                while _count(url, sql) == 0:
                    assert near.poll() is None, (tmp_path / "near.log").read_text()[-2000:]
                    assert time.monotonic() - cut_at < 60, "never taken over"
                    time.sleep(0.1)
                _wait([w0, near], [tmp_path / n for n in ("w0.log", "near.log")])
            finally:
                for p in (far, near):
                    if p is not None and p.poll() is None:
                        p.kill()
                        p.wait(timeout=10)
            distinct = N_CASES * 4
            assert _count(url, "SELECT count(*) FROM responses") == distinct
            assert _count(url, "SELECT count(*) FROM run WHERE status = 'complete'") == 1
            assert server.stats.max_in_flight <= 2
            # freed within the lease (and the polling's back-off, at most a quarter of it)
            assert freed_after < lease * 1.25 + 2, freed_after
