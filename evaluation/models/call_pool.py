"""Worker processes that make litellm calls, for runs whose bottleneck is litellm's own CPU.

A litellm call costs milliseconds of Python CPU (request building in the OpenAI SDK, response
objects, cost and logging); at dozens of calls in flight one event loop saturates a core. With
``processes > 0`` the litellm adapter sends each attempt to one of N worker processes (each its
own event loop and litellm) and keeps everything that must be global in the run's process: the
concurrency limiter, retries and backoff, the store. A worker only turns keyword arguments into
one ``litellm.acompletion`` result (or a classified exception).

Workers are spawned (never forked: the run has threads), die with their parent (Linux
PR_SET_PDEATHSIG, and end-of-pipe), and import litellm once, in parallel, at start.

A worker's hot path is its event loop alone. It reads requests from its pipe (a socket pair, in
``multiprocessing.Connection``'s framing) and buffers its replies on the loop, and in a pool
for a route of :data:`PREPARE_INLINE` it also runs litellm's request building there
(``litellm.acompletion`` hands ``litellm.completion`` to the loop's default executor). Each
thread hop costs a wake-up and two GIL hand-overs: with a dozen calls in flight the reader
thread and the executor hop cost about 6% of a worker's CPU. Other executor work (DNS lookups,
other routes' request building, which may block on credentials) still runs in threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import multiprocessing as mp
import os
import pickle
import signal
import socket
import struct
import threading
from collections.abc import Callable
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

from evaluation.modelio import reported_headers

# litellm routes whose request building does no I/O (the OpenAI SDK route: OpenAI and any
# OpenAI-compatible server reached as ``openai/<model>`` with an api_base).
PREPARE_INLINE = frozenset({"openai"})


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
    finish = getattr(choice, "finish_reason", None)
    fault = None  # the provider failed (retry it), as opposed to the model answering badly
    if choice is None:
        fault = "the provider returned no choices"
    elif (
        content is None
        and not refusal
        and finish != "content_filter"
        and not getattr(message, "tool_calls", None)
    ):
        fault = f"the provider returned no content (finish_reason {finish!r})"
    return {
        "fault": fault,
        "text": content or "",
        "finish_reason": finish,
        "refusal": bool(refusal),
        "refusal_text": str(refusal)[:2000] if refusal else None,
        "prompt_tokens": getattr(usage, "prompt_tokens", None),
        "completion_tokens": getattr(usage, "completion_tokens", None),
        "cost_usd": float(cost) if isinstance(cost, (int, float)) else None,
        "charged_usd": float(charged) if isinstance(charged, (int, float)) else None,
        "raw": raw,
        # what the provider says answered (ModelOutput bounds them: hostile)
        "served_model": getattr(resp, "model", None),
        "system_fingerprint": getattr(resp, "system_fingerprint", None),
        "version_headers": reported_headers(
            getattr(resp, "_response_headers", None) or hidden.get("additional_headers") or {}
        ),
    }


class _WorkerLoop(asyncio.SelectorEventLoop):
    """A worker's event loop. With ``inline`` set to litellm's ``completion``, the request
    building ``litellm.acompletion`` hands to the default executor (``partial(ctx.run,
    partial(completion, ...))``) runs on the loop itself, its result in a loop future (no
    thread, no wake-up); everything else still goes to the executor."""

    inline: Callable[..., Any] | None = None

    def run_in_executor(self, executor: Any, func: Any, *args: Any) -> Any:  # type: ignore[override]
        inner = func.args[0] if isinstance(func, partial) and func.args else None
        if (
            executor is None
            and self.inline is not None
            and isinstance(inner, partial)
            and inner.func is self.inline
        ):
            done = self.create_future()
            try:
                done.set_result(func(*args))
            except BaseException as exc:  # as a pool thread would: the awaiting call re-raises it
                done.set_exception(exc)
            return done
        return super().run_in_executor(executor, func, *args)


_SIZE = struct.Struct("!i")  # multiprocessing.Connection's frame header
_BIG_SIZE = struct.Struct("!Q")  # after a size of -1, for frames over 2 GiB


class _Channel(asyncio.Protocol):
    """A worker's end of its pipe, read and written by the worker's event loop.

    The pipe is a socket pair; the framing is ``multiprocessing.Connection``'s (a 4-byte
    big-endian length, or -1 and an 8-byte one, then the pickle), so the run's process keeps
    its ``Connection``. A request wakes only the loop (not a reader thread, then the loop), and
    a reply is buffered by the transport instead of blocking the loop on a full pipe.
    """

    def __init__(self, on_message: Callable[[Any], None]) -> None:
        self._on_message = on_message
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._buf += data
        while len(self._buf) >= 4:
            (size,) = _SIZE.unpack_from(self._buf)
            start = 4
            if size == -1:
                if len(self._buf) < 12:
                    return
                (size,) = _BIG_SIZE.unpack_from(self._buf, 4)
                start = 12
            if len(self._buf) < start + size:
                return
            with memoryview(self._buf) as view:  # no copy of the frame (its images) first
                msg = pickle.loads(view[start : start + size])
            del self._buf[: start + size]
            self._on_message(msg)

    def connection_lost(self, exc: Exception | None) -> None:
        os._exit(0)  # the parent is gone

    def send(self, message: Any) -> None:
        assert self._transport is not None
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        size = len(data)
        head = _SIZE.pack(size) if size <= 0x7FFFFFFF else _SIZE.pack(-1) + _BIG_SIZE.pack(size)
        self._transport.write(head + data)


def _worker(conn: Connection, prepare_inline: bool) -> None:
    _die_with_parent()
    from evaluation.models.litellm_lib import (
        classify_exception,
        import_litellm,
        retry_after_of,
    )

    litellm = import_litellm()
    # The ~300k objects of litellm's import live as long as the worker: out of the collector's
    # sight, so its full collections stop walking them (about 0.4 ms a call otherwise).
    gc.collect()
    gc.freeze()
    loop = _WorkerLoop()
    if prepare_inline:
        from litellm.main import completion

        loop.inline = completion

    async def call(req_id: int, kwargs: dict[str, Any], hard_timeout: float) -> None:
        try:
            resp = await asyncio.wait_for(litellm.acompletion(**kwargs), hard_timeout)
            channel.send({"id": req_id, "ok": summarise_response(resp)})
        except Exception as exc:
            channel.send(
                {
                    "id": req_id,
                    "error": {
                        "kind": classify_exception(exc),
                        "message": f"{type(exc).__name__}: {str(exc)[:500]}",
                        "retry_after": retry_after_of(exc),
                    },
                }
            )

    calls: set[asyncio.Task[None]] = set()  # referenced until done (the loop keeps weak refs)

    def received(msg: Any) -> None:
        if msg is None:
            loop.stop()
            return
        task = loop.create_task(call(msg["id"], msg["kwargs"], msg["hard_timeout"]))
        calls.add(task)
        task.add_done_callback(calls.discard)

    channel = _Channel(received)
    sock = socket.socket(fileno=os.dup(conn.fileno()))  # Pipe(duplex=True) is a socket pair
    conn.close()
    loop.run_until_complete(loop.create_unix_connection(lambda: channel, sock=sock))
    channel.send({"ready": True})
    loop.run_forever()


class CallPool:
    """N worker processes; ``call`` returns the worker's reply for one attempt."""

    def __init__(self, processes: int, *, prepare_inline: bool = False) -> None:
        """``prepare_inline``: the pool's route is in :data:`PREPARE_INLINE` (its request
        building may run on the workers' loops)."""
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
            proc = ctx.Process(
                target=_worker, args=(child, prepare_inline), daemon=True, name=f"litellm-{n}"
            )
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
        """One attempt in the least busy worker."""
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


def _resolve(fut: asyncio.Future[dict[str, Any]], msg: dict[str, Any]) -> None:
    if not fut.done():
        fut.set_result(msg)


def _fail(fut: asyncio.Future[dict[str, Any]], why: str) -> None:
    if not fut.done():
        fut.set_result({"error": {"kind": "retry", "message": why, "retry_after": None}})
