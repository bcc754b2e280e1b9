"""Benchmark: the evaluation engine against inspect_ai on the same workload and the same server.

Workload: 200 tasks x 5 samples = 1000 chat-completion calls (one image + text each) to the
loopback OpenAI-compatible test server (tests/openai_server.py, in its own process) answering
after 200 ms, at 32 calls in flight. Prints, as the median of --reps repetitions run interleaved:
  - efficiency = ideal time / our wall time, ideal = calls x latency / concurrency (goal >= 0.9);
  - our wall time / inspect_ai's wall time on the same calls (goal <= 1.0);
  - our CPU per call: the run's process (all its threads), plus its litellm worker processes
    with --processes (Linux /proc); the figure to watch, since this engine is CPU-bound;
  - litellm alone: the same 1000 calls through litellm.acompletion and nothing else (no prompt
    building, store, parsing, scoring), over as many processes as --processes (at least one),
    started together after a warm-up: the ceiling for any engine that calls through litellm on
    this machine, and ours / litellm alone, the engine's own cost (--no-ceiling skips it).
Ours: the full engine (prompt build, PHI gate, litellm, SQLite store with a commit per call,
parse, scoring in a worker thread). inspect_ai: Task(dataset, generate(), includes()) with
epochs=5 and max_connections=32, its OpenAI provider pointed at the same server, logging to a
temp folder. Timing starts when the calls start (imports, dataset loading excluded for both).

inspect_ai 0.3.285's OpenAI provider needs openai>=3.4, which litellm (openai<3) excludes from
the project venv, so the peer runs in its own venv: --peer-python, else .venv/peer-inspect
(created on first use with pip: inspect_ai==0.3.285 and openai>=3.4).
Store: SQLite by default (one run.sqlite per run, as `neurosandbox eval` writes it);
--database-url URL puts the runs' rows in that PostgreSQL database instead, keyed by run id, as
NEUROSANDBOX_DATABASE_URL does; --postgres starts a throwaway PostgreSQL (gateway/pg_local.py,
the tests' server, but with fsync on as a real install has it) and uses that, and also prints the
server's CPU per call (its postmaster and backends), which SQLite spends inside our process.
Run: .venv/bin/python bench/engine.py [--reps 3] [--processes 2] [--no-peer] [--no-ceiling]
     [--tasks 200 --samples 5 --latency 0.2] [--postgres | --database-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
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

import peers  # noqa: E402

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

REPLY = json.dumps(
    {
        "findings": [
            {"description": "periventricular lesions", "sequence": "FLAIR", "hemisphere": "left"}
        ],
        "differential": [{"diagnosis": "multiple sclerosis", "likelihood": 0.7}],
        "final_diagnosis": "multiple sclerosis",
        "rationale": "ovoid periventricular FLAIR lesions",
        "confidence": 0.7,
    }
)
PEER = r"""
import json, sys, time, os
from inspect_ai import Task, eval as inspect_eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ChatMessageUser, ContentImage, ContentText
from inspect_ai.scorer import includes
from inspect_ai.solver import generate
spec = json.loads(sys.argv[1])
os.environ["OPENAI_API_KEY"] = "no-key"
samples = []
for rec in map(json.loads, open(spec["data"])):
    content = [ContentText(text=rec["text"]), ContentImage(image=rec["images"][0], detail="high")]
    samples.append(Sample(input=[ChatMessageUser(content=content)], target="multiple sclerosis"))
task = Task(dataset=samples, solver=generate(), scorer=includes(), epochs=spec["samples"])
t0 = time.perf_counter()
logs = inspect_eval(task, model="openai/gpt-4o", model_base_url=spec["url"], max_connections=spec["concurrency"],
                    log_dir=spec["log_dir"], display="none", temperature=0.7, top_p=0.95, max_retries=3)
wall = time.perf_counter() - t0
print(json.dumps({"wall": wall, "status": logs[0].status}))
"""


def _png(seed: int) -> bytes:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    img = (rng.random((128, 128)) * 60 + 60).astype("uint8")
    buf = io.BytesIO()
    Image.fromarray(img, mode="L").save(buf, format="PNG")
    return buf.getvalue()


def write_dataset(folder: Path, n: int) -> tuple[Path, Path]:
    data, answers = folder / "tasks.jsonl", folder / "answers.jsonl"
    with data.open("w") as d, answers.open("w") as a:
        for i in range(n):
            uri = "data:image/png;base64," + base64.b64encode(_png(i)).decode()
            text = f"Case {i}: 31-year-old woman, two episodes of numbness and optic neuritis."
            d.write(
                json.dumps(
                    {
                        "case_id": f"t{i:04d}",
                        "text": text,
                        "images": [uri],
                        "questions": [
                            {
                                "question_number": 1,
                                "question_text": "What is the most likely diagnosis?",
                            }
                        ],
                    }
                )
                + "\n"
            )
            a.write(json.dumps({"case_id": f"t{i:04d}", "answer": "multiple sclerosis"}) + "\n")
    return data, answers


def start_server(latency: float) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tests" / "openai_server.py"),
            "--fast",
            "--latency",
            str(latency),
            "--reply",
            REPLY,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    return proc, f"http://127.0.0.1:{port}/v1"


def server_calls(url: str) -> int:
    with urllib.request.urlopen(url.replace("/v1", "/_stats")) as r:
        return int(json.loads(r.read())["calls"])


def run_ours(
    data: Path,
    answers: Path,
    url: str,
    samples: int,
    concurrency: int,
    work: Path,
    processes: int = 0,
    database_url: str | None = None,
) -> tuple[float, float]:
    """Wall time of one run, and the CPU it took (the run's process and its litellm workers);
    its rows in ``database_url`` (PostgreSQL) when given, else in the run folder's SQLite."""
    from evaluation.datasets import DatasetSpec, load_dataset
    from evaluation.modelio import GenerateConfig
    from evaluation.models import create_model, resolve_specs
    from evaluation.runconfig import RunConfig
    from evaluation.runner import Runner

    specs = resolve_specs(
        ["openai/gpt-4o"], api_base=url, concurrency=concurrency, processes=processes
    )
    config = RunConfig(
        dataset=DatasetSpec(path=str(data), answers=str(answers)),
        models=specs,
        samples=samples,
        generate=GenerateConfig(temperature=0.7, top_p=0.95, max_tokens=1024, timeout_s=60),
        bertscore=False,
        cache_dir=str(work / "cache"),
    )
    dataset = load_dataset(config.dataset, work / "cache")
    run = Path(tempfile.mkdtemp(dir=work))
    store = open_run_store(run, config.run_id, database_url)
    store.init_run(config.run_id, config.model_dump(mode="json"), dataset_name="bench", dataset_kind=dataset.kind,
                   dataset_hash=dataset.hash, prompt_version="", code_version="", packages={})  # fmt: skip
    adapters = {s.name: create_model(s) for s in specs}  # ours, so workers outlive the run
    runner = Runner(config, dataset, store, adapters=adapters)
    pools = [a._pool for a in adapters.values() if getattr(a, "_pool", None) is not None]  # type: ignore[attr-defined]
    workers = [p.pid for pool in pools for p in pool._procs]
    if processes:  # the worker processes import litellm: wait for them outside the timing
        asyncio.run(_warm(runner, pools))
    cpu0, workers0 = time.process_time(), sum(map(_cpu_of, workers))
    t0 = time.perf_counter()
    stats = asyncio.run(runner.run())
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0 + sum(map(_cpu_of, workers)) - workers0
    for adapter in adapters.values():
        adapter.close()  # type: ignore[attr-defined]
    store.close()
    if stats.errors or stats.calls != len(dataset.cases) * samples:
        raise SystemExit(f"benchmark: our run was not clean: {stats}")
    return wall, cpu


def store_opener_missing() -> str | None:
    """Why the store cannot be opened on PostgreSQL yet (None when it can)."""
    import evaluation.log

    if not hasattr(evaluation.log, "open_store"):
        return (
            "--postgres/--database-url: the run store does not speak PostgreSQL yet "
            "(evaluation.log.open_store(run_dir, run_id=..., database_url=...) has not landed; "
            "issue 36). Run without them to measure the SQLite store."
        )
    return None


def open_run_store(run: Path, run_id: str, database_url: str | None) -> Any:
    """The run's store: SQLite in ``run`` (today's default), or ``database_url``'s database."""
    if database_url is None:
        from evaluation.log.store import RunStore

        return RunStore(run, create=True)
    missing = store_opener_missing()
    if missing:
        raise SystemExit(missing)
    from evaluation.log import open_store  # type: ignore[attr-defined]

    return open_store(run, run_id=run_id, database_url=database_url, create=True)


def _tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid``, of its live children and of its children already reaped (Linux
    /proc): a PostgreSQL server's postmaster and backends."""
    total = 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == str(pid):
            total += _cpu_of(int(stat.parent.name))
    return total


def _alone_child(spec: dict[str, Any], start: Any, results: Any) -> None:
    """One process of the litellm-alone ceiling: its share of the calls, its share of the slots."""
    import litellm

    records = [json.loads(line) for line in Path(spec["data"]).read_text().splitlines()]
    kwargs = {
        "model": "openai/gpt-4o",
        "api_base": spec["url"],
        "api_key": "no-key",
        "timeout": 60,
        "num_retries": 0,
        "max_retries": 0,
        "temperature": 0.7,
        "top_p": 0.95,
        "max_tokens": 1024,
    }

    def messages(i: int) -> list[dict[str, Any]]:
        rec = records[i % len(records)]
        return [
            {"role": "system", "content": "You are an experienced neurologist."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": rec["text"]},
                    {"type": "image_url", "image_url": {"url": rec["images"][0], "detail": "high"}},
                    {"type": "text", "text": rec["questions"][0]["question_text"]},
                ],
            },
        ]

    async def calls(first: int, n: int) -> None:
        slots = asyncio.Semaphore(spec["slots"])

        async def one(i: int) -> None:
            async with slots:
                resp = await litellm.acompletion(messages=messages(i), seed=i, **kwargs)
                if not resp.choices[0].message.content:
                    raise SystemExit("litellm-alone: empty answer")

        await asyncio.gather(*(one(first + i) for i in range(n)))

    async def both() -> None:
        await calls(0, spec["slots"])  # connections, lazy imports: outside the timing
        results.put("ready")
        start.wait()
        cpu0 = time.process_time()
        await calls(spec["first"], spec["calls"])
        results.put(time.process_time() - cpu0)

    asyncio.run(both())


def run_litellm_alone(
    data: Path, url: str, calls: int, concurrency: int, processes: int
) -> tuple[float, float]:
    """The ceiling: the same calls through ``litellm.acompletion`` and nothing else (no prompt
    building, store, parsing or scoring), the slots split over ``processes`` processes started
    together. Wall time and CPU."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    n = max(processes, 1)
    start, results = ctx.Event(), ctx.Queue()
    procs = []
    for k in range(n):
        spec = {"data": str(data), "url": url, "slots": concurrency // n,
                "first": k * (calls // n), "calls": calls // n + (calls % n if k == n - 1 else 0)}  # fmt: skip
        procs.append(ctx.Process(target=_alone_child, args=(spec, start, results), daemon=True))
        procs[-1].start()
    for _ in procs:
        if results.get(timeout=300) != "ready":
            raise SystemExit("litellm-alone: a process did not start")
    before = server_calls(url)
    t0 = time.perf_counter()
    start.set()
    done = [results.get(timeout=600) for _ in procs]
    wall = time.perf_counter() - t0
    assert server_calls(url) - before == calls, "litellm alone made a different number of calls"
    for proc in procs:
        proc.join(timeout=30)
        if proc.exitcode != 0:
            raise SystemExit(f"litellm-alone: a process ended with {proc.exitcode}")
    return wall, sum(done)


def _cpu_of(pid: int) -> float:
    """CPU seconds a live process has used (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


async def _warm(runner: object, pools: list[Any]) -> None:
    from evaluation.scoring_bridge import warm

    for pool in pools:
        await pool.wait_ready()
    await asyncio.get_running_loop().run_in_executor(runner._score_pool, warm)  # type: ignore[attr-defined]


def peer_python(arg: str | None) -> str:
    return peers.peer_python(arg, "peer-inspect", ["inspect_ai==0.3.285", "openai>=3.4"])


def run_inspect(py: str, data: Path, url: str, samples: int, concurrency: int, work: Path) -> float:
    spec = {
        "data": str(data),
        "url": url,
        "samples": samples,
        "concurrency": concurrency,
        "log_dir": tempfile.mkdtemp(dir=work),
    }
    out = subprocess.run(
        [py, "-c", PEER, json.dumps(spec)], capture_output=True, text=True, timeout=1800, cwd=work
    )
    if out.returncode != 0:
        raise SystemExit(f"inspect_ai peer failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result["status"] != "success":
        raise SystemExit(f"inspect_ai peer run status {result['status']}")
    return float(result["wall"])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--processes", type=int, default=0, help="our litellm calls in N worker processes"
    )
    parser.add_argument(
        "--peer-python", default=None, help="python with inspect_ai and openai>=3.4"
    )
    parser.add_argument("--no-peer", action="store_true", help="skip the inspect_ai peer")
    parser.add_argument("--no-ceiling", action="store_true", help="skip the litellm-alone ceiling")
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--database-url",
        default=None,
        help="the store's rows in this PostgreSQL database (postgresql+psycopg://...)",
    )
    where.add_argument(
        "--postgres", action="store_true", help="start a throwaway PostgreSQL and use it"
    )
    args = parser.parse_args()
    if args.database_url or args.postgres:
        missing = store_opener_missing()
        if missing:
            parser.error(missing)
    with contextlib.ExitStack() as stack:
        pg = None
        if args.postgres:
            from gateway.pg_local import LocalPostgres

            pg = LocalPostgres(fsync=True)  # a real install's durability, not the tests' server
            pg.start()
            stack.callback(pg.stop)
            args.database_url = pg.url
        return bench(args, pg.pid if pg else None)


def bench(args: argparse.Namespace, pg_pid: int | None) -> int:
    py = None if args.no_peer else peer_python(args.peer_python)
    import litellm  # noqa: F401  (import cost outside the timing)

    import evaluation.scoring  # noqa: F401

    calls = args.tasks * args.samples
    ideal = calls * args.latency / args.concurrency
    ours, cpus, server_cpus, alone, alone_cpus, peer = [], [], [], [], [], []
    db_cpus: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data, answers = write_dataset(work, args.tasks)
        server, url = start_server(args.latency)
        try:
            db = args.database_url
            run_ours(data, answers, url, 1, args.concurrency, work, args.processes, db)  # warm-up
            for rep in range(args.reps):
                before, server_cpu = server_calls(url), _cpu_of(server.pid)
                db_cpu = _tree_cpu(pg_pid) if pg_pid else 0.0
                wall, cpu = run_ours(
                    data, answers, url, args.samples, args.concurrency, work, args.processes, db
                )
                ours.append(wall)
                cpus.append(cpu)
                server_cpus.append(_cpu_of(server.pid) - server_cpu)
                if pg_pid:
                    db_cpus.append(_tree_cpu(pg_pid) - db_cpu)
                assert server_calls(url) - before == calls
                if not args.no_ceiling:
                    wall, cpu = run_litellm_alone(
                        data, url, calls, args.concurrency, args.processes
                    )
                    alone.append(wall)
                    alone_cpus.append(cpu)
                if py:
                    before = server_calls(url)
                    peer.append(run_inspect(py, data, url, args.samples, args.concurrency, work))
                    assert server_calls(url) - before == calls, (
                        "inspect_ai made a different number of calls"
                    )
                print(
                    f"rep {rep + 1}: ours {ours[-1]:.2f} s"
                    + (f", litellm alone {alone[-1]:.2f} s" if alone else "")
                    + (f", inspect_ai {peer[-1]:.2f} s" if peer else ""),
                    file=sys.stderr,
                )
        finally:
            server.terminate()
            server.wait(timeout=10)
    mine = statistics.median(ours)
    print(
        f"ours: litellm calls {'in ' + str(args.processes) + ' worker process(es)' if args.processes else 'in-process'}; load average at end {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(
        "store: "
        + (
            "SQLite, one run.sqlite per run"
            if not args.database_url
            else "PostgreSQL, a throwaway server with fsync on (gateway/pg_local.py)"
            if pg_pid
            else "PostgreSQL at --database-url"
        )
    )
    print(
        f"workload: {args.tasks} tasks x {args.samples} samples = {calls} calls, latency {args.latency * 1000:.0f} ms, concurrency {args.concurrency}"
    )
    print(f"ideal time {ideal:.2f} s; ours (median of {args.reps}) {mine:.2f} s")
    print(
        f"our CPU per call (median): {statistics.median(cpus) / calls * 1000:.1f} ms"
        + (" (run's process and litellm workers)" if args.processes else "")
        + f"; the test server's {statistics.median(server_cpus) / calls * 1000:.1f} ms"
    )
    if db_cpus:
        print(
            f"the PostgreSQL server's CPU per call (median; postmaster and backends): "
            f"{statistics.median(db_cpus) / calls * 1000:.1f} ms"
        )
    print(f"efficiency = ideal / ours = {ideal / mine:.3f}   (goal >= 0.9)")
    if alone:
        bare = statistics.median(alone)
        print(
            f"litellm alone (the same calls, nothing else; {max(args.processes, 1)} process(es), "
            f"median of {args.reps}) {bare:.2f} s, CPU per call "
            f"{statistics.median(alone_cpus) / calls * 1000:.1f} ms; efficiency {ideal / bare:.3f}"
            " (the ceiling for any engine calling litellm here)"
        )
        print(f"ours / litellm alone = {mine / bare:.3f}   (the engine's own cost)")
    if peer:
        theirs = statistics.median(peer)
        print(f"inspect_ai (median of {args.reps}) {theirs:.2f} s; efficiency {ideal / theirs:.3f}")
        print(f"ours / inspect_ai = {mine / theirs:.3f}   (goal <= 1.0)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
