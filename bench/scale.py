"""Benchmark: one run shared by 1, 2 and 3 workers against a provider with a concurrency limit,
with and without the limit shared through the run log (evaluation/log/claims.py).

The provider (a lean asyncio server on loopback, in its own process) answers each call after
--latency seconds (1 s) and admits --limit calls at once (8): a call above the limit gets 429
at once with Retry-After. The workers are real `neurosandbox` processes on one PostgreSQL run
log (a throwaway server with fsync on, gateway/pg_local.py): the first starts the run with
`eval --shard 0/N`, the others join with `runs resume RUN --shard I/N`. Each worker may send 8
calls at once of its own (as one worker alone would fill the provider); with --shared the
model's shared_concurrency is the provider's limit, held by every worker together.

Prints, per configuration (the median of --reps):
  - throughput as a share of the ideal: calls x latency / limit over the time from the first
    call to the last answer at the provider (goal >= 0.9 at 3 workers with the shared limit);
  - the 429s the provider sent;
  - p95 queue wait: the time from a call's request being stored to its answer, less the
    provider's latency (the wait for a slot, and any backoff after a 429), from the run log;
  - duplicate calls: answers the provider delivered more than once for one request (goal 0);
  - the database's milliseconds of CPU per call (the PostgreSQL server's postmaster and
    backends), the shared bookkeeping's cost.

Run: .venv/bin/python bench/scale.py [--calls 600] [--workers 1,2,3] [--reps 1] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
CLI = str(Path(sys.executable).with_name("neurosandbox"))
SAMPLES = 3


# ------------------------------------------------------------------ the provider


async def _provider(port: int, latency: float, limit: int) -> None:
    from tests.openai_server import _completion

    counts: dict[str, Any] = {"calls": 0, "delivered": 0, "throttled": 0, "in_flight": 0,
                              "max_in_flight": 0, "first": None, "last": None, "bodies": {}}  # fmt: skip
    reply = json.dumps({"final_diagnosis": "multiple sclerosis", "differential": [
        {"diagnosis": "multiple sclerosis", "likelihood": 0.7}], "rationale": "lesions"})  # fmt: skip
    body = json.dumps(
        _completion({"role": "assistant", "content": reply}, "stop", 100, 50, "gpt-4o")
    ).encode()
    ok = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    busy = (b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
            b"Retry-After: 1\r\nContent-Length: %d\r\n\r\n")  # fmt: skip
    err = json.dumps({"error": {"message": "rate limited", "type": "rate_limit"}}).encode()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                header = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in header.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                raw = await reader.readexactly(length) if length else b""
                if header.startswith(b"GET"):
                    stats = {k: v for k, v in counts.items() if k != "bodies"}
                    stats["duplicates"] = sum(n - 1 for n in counts["bodies"].values() if n > 1)
                    data = json.dumps(stats).encode()
                    writer.write(ok % len(data) + data)
                    await writer.drain()
                    continue
                counts["calls"] += 1
                if counts["in_flight"] >= limit:
                    counts["throttled"] += 1
                    writer.write(busy % len(err) + err)
                    await writer.drain()
                    continue
                now = time.time()
                counts["first"] = counts["first"] or now
                counts["in_flight"] += 1
                counts["max_in_flight"] = max(counts["max_in_flight"], counts["in_flight"])
                await asyncio.sleep(latency)
                counts["in_flight"] -= 1
                writer.write(ok % len(body) + body)
                await writer.drain()
                key = hashlib.sha256(raw).hexdigest()
                counts["bodies"][key] = counts["bodies"].get(key, 0) + 1
                counts["delivered"] += 1
                counts["last"] = time.time()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=512)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


def start_provider(latency: float, limit: int) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, __file__, "--provider", str(latency), str(limit)],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None
    return proc, f"http://127.0.0.1:{int(proc.stdout.readline())}/v1"


def provider_stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url.replace("/v1", "/_stats")) as r:
        return dict(json.loads(r.read()))


# ------------------------------------------------------------------ one configuration


def one(workers: int, shared: bool, calls: int, latency: float, limit: int, pg: Any,
        work: Path) -> dict[str, float]:  # fmt: skip
    from engine import _tree_cpu, write_dataset

    from tests.pg_server import fresh_pg_database

    url = fresh_pg_database(pg.url)
    (work / "data").mkdir()
    data, answers = write_dataset(work / "data", calls // SAMPLES)
    provider, api = start_provider(latency, limit)
    models = work / "models.yaml"
    spec = {"name": "gpt", "model": "openai/gpt-4o", "api_base": api, "concurrency": limit,
            "max_retries": 20, "backoff_base_s": 0.5, "backoff_max_s": 4.0}  # fmt: skip
    if shared:
        spec["shared_concurrency"] = limit
    models.write_text(json.dumps({"models": [spec]}))
    env = {**os.environ, "NEUROSANDBOX_DATABASE_URL": url, "NEUROSANDBOX_MODELS_FILE": str(models),
           "NEUROSANDBOX_CACHE_DIR": str(work / "cache"), "OPENAI_API_KEY": "sk-loopback",
           "LITELLM_LOCAL_MODEL_COST_MAP": "True"}  # fmt: skip
    run = work / "run"
    cpu0 = _tree_cpu(pg.pid)
    procs = [subprocess.Popen([CLI, "eval", "--suite", str(data), "--answers", str(answers),
                               "--model", "gpt", "--samples", str(SAMPLES), "--seed", "7",
                               "--no-bertscore", "--out", str(run), "--shard", f"0/{workers}"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]  # fmt: skip
    try:
        _wait_run(url)
        for i in range(1, workers):
            procs.append(subprocess.Popen([CLI, "runs", "resume", str(run), "--shard",
                                           f"{i}/{workers}"], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))  # fmt: skip
        for p in procs:
            p.wait(timeout=3600)
        stats = provider_stats(api)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        provider.terminate()
        provider.wait()
    db_ms = (_tree_cpu(pg.pid) - cpu0) * 1000 / max(1, stats["delivered"])
    span = (stats["last"] or 0) - (stats["first"] or 0)
    ideal = stats["delivered"] * latency / limit
    return {"share": ideal / span if span > 0 else 0.0, "throttled": stats["throttled"],
            "p95_wait": _p95_wait(url, latency), "duplicates": stats["duplicates"],
            "db_ms": db_ms, "calls": stats["delivered"], "max_in_flight": stats["max_in_flight"]}  # fmt: skip


def _wait_run(url: str) -> None:
    import sqlalchemy as sa

    eng = sa.create_engine(url, poolclass=sa.pool.NullPool)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            with contextlib.suppress(sa.exc.DBAPIError), eng.connect() as c:
                if c.execute(sa.text("SELECT count(*) FROM run")).scalar():
                    return
            time.sleep(0.1)
        raise SystemExit("the first worker never started the run")
    finally:
        eng.dispose()


def _p95_wait(url: str, latency: float) -> float:
    import sqlalchemy as sa

    eng = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with eng.connect() as c:
        rows = c.execute(sa.text("SELECT q.created_at, r.created_at FROM requests q JOIN "
                                 "responses r USING (run_id, cache_key)")).fetchall()  # fmt: skip
    eng.dispose()
    waits = sorted(
        max(0.0, (dt.datetime.fromisoformat(b) - dt.datetime.fromisoformat(a)).total_seconds()
            - latency) for a, b in rows
    )  # fmt: skip
    return waits[int(0.95 * (len(waits) - 1))] if waits else 0.0


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--provider":
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_provider(0, float(sys.argv[2]), int(sys.argv[3])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=600)
    ap.add_argument("--workers", default="1,2,3")
    ap.add_argument("--latency", type=float, default=1.0)
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="120 calls at 0.5 s (a smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.calls, args.latency = 120, 0.5
    from gateway.pg_local import LocalPostgres
    from tests.pg_server import postgres_bindir

    print(f"{args.calls} calls at {args.latency} s, provider limit {args.limit} (429 above); "
          f"load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    header = ("workers", "shared", "share of ideal", "429s", "p95 wait s", "dup", "db ms/call",
              "max in flight")  # fmt: skip
    print(" | ".join(header))
    with LocalPostgres(bindir=postgres_bindir(), fsync=True) as pg:
        for n in (int(w) for w in args.workers.split(",")):
            for shared in (False, True):
                got = []
                for _ in range(args.reps):
                    with tempfile.TemporaryDirectory(prefix="nsbx-scale-") as tmp:
                        got.append(one(n, shared, args.calls, args.latency, args.limit, pg,
                                       Path(tmp)))  # fmt: skip
                med = {k: statistics.median(g[k] for g in got) for k in got[0]}
                print(f"{n} | {'yes' if shared else 'no'} | {med['share']:.2f} | "
                      f"{med['throttled']:.0f} | {med['p95_wait']:.1f} | {med['duplicates']:.0f} | "
                      f"{med['db_ms']:.2f} | {med['max_in_flight']:.0f}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
