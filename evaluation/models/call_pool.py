"""Worker processes that make litellm calls, for runs whose bottleneck is litellm's own CPU.

A litellm call costs milliseconds of Python CPU (request building in the OpenAI SDK, response
objects, cost and logging); at dozens of calls in flight one event loop saturates a core. With
``processes > 0`` the litellm adapter sends each attempt to one of N worker processes (each its
own event loop and litellm) and keeps everything that must be global in the run's process: the
concurrency limiter, retries and backoff, the store. A worker only turns keyword arguments into
one ``litellm.acompletion`` result (or a classified exception).

Workers are spawned (never forked: the run has threads), die with their parent (Linux
PR_SET_PDEATHSIG, and end-of-pipe), and import litellm once, in parallel, at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing as mp
import os
import signal
import threading
from multiprocessing.connection import Connection
from typing import Any


def _die_with_parent() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def summarise_response(resp: Any) -> dict[str, Any]:
    """The picklable parts of a litellm response that ModelOutput needs."""
    choice = resp.choices[0] if getattr(resp, "choices", None) else None
    message = getattr(choice, "message", None)
    content = getattr(message, "content", None)
    if isinstance(content, list):
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    usage = getattr(resp, "usage", None)
    hidden = getattr(resp, "_hidden_params", None) or {}
    try:
        raw = resp.model_dump(mode="json")
    except Exception:
        raw = None
    cost = hidden.get("response_cost")
    charged = getattr(usage, "cost", None)  # what the provider says it charged (OpenRouter)
    # OpenAI's refusal (message.refusal) is kept by litellm in provider_specific_fields.
    specific = getattr(message, "provider_specific_fields", None) or {}
    refusal = getattr(message, "refusal", None) or specific.get("refusal")
    return {
        "text": content or "",
        "finish_reason": getattr(choice, "finish_reason", None),
        "refusal": bool(refusal),
        "refusal_text": str(refusal)[:2000] if refusal else None,
        "prompt_tokens": getattr(usage, "prompt_tokens", None),
        "completion_tokens": getattr(usage, "completion_tokens", None),
        "cost_usd": float(cost) if isinstance(cost, (int, float)) else None,
        "charged_usd": float(charged) if isinstance(charged, (int, float)) else None,
        "raw": raw,
    }


def _worker(conn: Connection) -> None:
    _die_with_parent()
    from evaluation.models.litellm_adapter import (
        classify_exception,
        import_litellm,
        retry_after_of,
    )

    litellm = import_litellm()
    loop = asyncio.new_event_loop()
    lock = threading.Lock()

    def reply(message: dict[str, Any]) -> None:
        with lock:
            conn.send(message)

    async def call(req_id: int, kwargs: dict[str, Any], hard_timeout: float) -> None:
        try:
            resp = await asyncio.wait_for(litellm.acompletion(**kwargs), hard_timeout)
            reply({"id": req_id, "ok": summarise_response(resp)})
        except Exception as exc:
            reply(
                {
                    "id": req_id,
                    "error": {
                        "kind": classify_exception(exc),
                        "message": f"{type(exc).__name__}: {str(exc)[:500]}",
                        "retry_after": retry_after_of(exc),
                    },
                }
            )

    def reader() -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                os._exit(0)  # the parent is gone
            if msg is None:
                loop.call_soon_threadsafe(loop.stop)
                return
            loop.call_soon_threadsafe(
                _start, loop, call(msg["id"], msg["kwargs"], msg["hard_timeout"])
            )

    reply({"ready": True})
    threading.Thread(target=reader, daemon=True).start()
    loop.run_forever()


class CallPool:
    """N worker processes; ``call`` returns the worker's reply for one attempt."""

    def __init__(self, processes: int) -> None:
        ctx = mp.get_context("spawn")
        self._conns: list[Connection] = []
        self._procs = []
        self._pending: dict[
            int, tuple[asyncio.AbstractEventLoop, asyncio.Future[dict[str, Any]]]
        ] = {}
        self._load = [0] * processes
        self._ids = itertools.count()
        self._ready = [threading.Event() for _ in range(processes)]
        self._send_lock = threading.Lock()
        for n in range(processes):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(child,), daemon=True, name=f"litellm-{n}")
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
            threading.Thread(target=self._reader, args=(n,), daemon=True).start()

    def _reader(self, n: int) -> None:
        conn = self._conns[n]
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                for loop, fut in list(self._pending.values()):
                    loop.call_soon_threadsafe(_fail, fut, "litellm worker process ended")
                return
            if msg.get("ready"):
                self._ready[n].set()
                continue
            entry = self._pending.pop(msg["id"], None)
            if entry is not None:
                with self._send_lock:
                    self._load[n] -= 1
                loop, fut = entry
                loop.call_soon_threadsafe(_resolve, fut, msg)

    async def wait_ready(self) -> None:
        """Until every worker has imported litellm."""
        for ev in self._ready:
            await asyncio.to_thread(ev.wait)

    async def call(self, kwargs: dict[str, Any], hard_timeout: float) -> dict[str, Any]:
        n = min(range(len(self._conns)), key=self._load.__getitem__)
        if not self._ready[n].is_set():
            await asyncio.to_thread(self._ready[n].wait)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[dict[str, Any]] = loop.create_future()
        req_id = next(self._ids)
        self._pending[req_id] = (loop, fut)
        with self._send_lock:
            self._load[n] += 1
            self._conns[n].send({"id": req_id, "kwargs": kwargs, "hard_timeout": hard_timeout})
        return await fut

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()


def _start(loop: asyncio.AbstractEventLoop, coro: Any) -> None:
    loop.create_task(coro)


def _resolve(fut: asyncio.Future[dict[str, Any]], msg: dict[str, Any]) -> None:
    if not fut.done():
        fut.set_result(msg)


def _fail(fut: asyncio.Future[dict[str, Any]], why: str) -> None:
    if not fut.done():
        fut.set_result({"error": {"kind": "retry", "message": why, "retry_after": None}})
