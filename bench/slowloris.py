"""A bounded slowloris client for the gateway, on loopback only (issue 34).

HTTP: N sockets send part of a request (half a request line, or a request line and one header
line) and then one more header byte every ``--trickle`` seconds, never finishing; a socket the
server closes is opened again at once. Meanwhile a prober asks for each ``--path`` on a new
connection, one after another, and the window's successes and latencies are printed::

    python bench/slowloris.py http --port 8000 --sockets 64 --seconds 20

DICOM: N TCP connections that send nothing, each opened again as soon as the node closes it
(the ARTIM timeout), while dcmtk's ``echoscu`` (``/usr/bin/echoscu``, not pynetdicom's tool of
the same name) tries ``--echoes`` associations one after another::

    python bench/slowloris.py dicom --port 11112 --sockets 40 --echoes 12

Everything is bounded: at most 1024 sockets, at most 300 s, loopback addresses only (the flood
may come from another loopback address, ``--source 127.0.0.2``, as a second host would). The
numbers printed are the figures of the issue's "before and after".
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import ipaddress
import os
import socket
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field

MAX_SOCKETS = 1024
MAX_SECONDS = 300.0
ECHOSCU = "/usr/bin/echoscu"


def _loopback(host: str) -> str:
    if not ipaddress.ip_address(host).is_loopback:
        raise SystemExit(f"{host} is not a loopback address: this client runs on loopback only")
    return host


@dataclass
class Flood:
    """Keeps ``n`` sockets open to ``(host, port)`` from ``source``, sending ``parts(i)`` first
    and ``trickle`` every ``every_s`` seconds; reopens what the server closes."""

    host: str
    port: int
    source: str
    n: int
    first: list[bytes]
    trickle: bytes = b""
    every_s: float = 0.0
    opened: int = 0
    closed_by_server: int = 0
    refused: int = 0
    lifetimes: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _open(self, i: int) -> tuple[socket.socket, float] | None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.settimeout(2.0)
            s.bind((self.source, 0))
            s.connect((self.host, self.port))
            if self.first:
                s.sendall(self.first[i % len(self.first)])
            s.setblocking(False)
        except OSError:
            s.close()
            self.refused += 1
            return None
        self.opened += 1
        return s, time.monotonic()

    def _alive(self, s: socket.socket) -> bool:
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    return False
        except BlockingIOError:
            return True
        except OSError:
            return False

    def _run(self) -> None:
        socks: list[tuple[socket.socket, float] | None] = [self._open(i) for i in range(self.n)]
        next_trickle = time.monotonic() + self.every_s
        try:
            while not self._stop.wait(0.02):
                now = time.monotonic()
                trickle = bool(self.trickle) and now >= next_trickle
                if trickle:
                    next_trickle = now + self.every_s
                for i, entry in enumerate(socks):
                    if entry is not None and self._alive(entry[0]):
                        if trickle:
                            with contextlib.suppress(OSError):
                                entry[0].send(self.trickle)
                        continue
                    if entry is not None:
                        self.closed_by_server += 1
                        self.lifetimes.append(now - entry[1])
                        entry[0].close()
                    socks[i] = self._open(i)  # the attacker comes back at once
        finally:
            for entry in socks:
                if entry is not None:
                    entry[0].close()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def summary(self) -> str:
        life = (
            f", median lifetime {statistics.median(self.lifetimes):.1f} s" if self.lifetimes else ""
        )
        return (
            f"flood: {self.n} sockets from {self.source}, {self.opened} opened, "
            f"{self.closed_by_server} closed by the server{life}, {self.refused} refused"
        )


def probe_http(host: str, port: int, path: str, timeout_s: float) -> tuple[int, float]:
    """Status (0: no answer) and seconds of one GET on a new connection."""
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        status = conn.getresponse().status
    except OSError:
        status = 0
    finally:
        conn.close()
    return status, time.monotonic() - t0


def run_http(args: argparse.Namespace) -> None:
    first = [
        b"GET /health HT",  # half a request line
        b"GET /review/login HTTP/1.1\r\nHost: x\r\n",  # one header line, then nothing
    ]
    flood = Flood(
        args.host, args.port, args.source, args.sockets, first, b"X", every_s=args.trickle
    )
    flood.start()
    time.sleep(args.warmup)
    results: dict[str, list[tuple[int, float]]] = {p: [] for p in args.path}
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        for p in args.path:
            results[p].append(probe_http(args.host, args.port, p, args.timeout))
        time.sleep(args.interval)
    flood.stop()
    print(flood.summary())
    for p, got in results.items():
        ok = [t for s, t in got if s == 200]
        statuses = sorted({s for s, _ in got})
        lat = (
            f"median {statistics.median(ok) * 1000:.0f} ms, max {max(ok) * 1000:.0f} ms"
            if ok
            else "-"
        )
        print(f"GET {p}: {len(ok)}/{len(got)} answered 200 ({lat}); statuses seen {statuses}")


def run_dicom(args: argparse.Namespace) -> None:
    flood = Flood(args.host, args.port, args.source, args.sockets, [])
    flood.start()
    time.sleep(args.warmup)
    env = dict(os.environ, TCP_NODELAY="1")
    ok, times = 0, []
    t_all = time.monotonic()
    for _ in range(args.echoes):
        t0 = time.monotonic()
        r = subprocess.run(
            [ECHOSCU, "-aet", args.aet, "-aec", args.aec, args.host, str(args.port)],
            capture_output=True,
            timeout=args.timeout + 30,
            env=env,
        )
        times.append(time.monotonic() - t0)
        ok += r.returncode == 0
        time.sleep(args.interval)
    took = time.monotonic() - t_all
    flood.stop()
    print(flood.summary())
    print(
        f"echoscu: {ok}/{args.echoes} succeeded in {took:.1f} s "
        f"(each: median {statistics.median(times):.2f} s, max {max(times):.2f} s)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("http", "dicom"))
    ap.add_argument("--host", default="127.0.0.1", type=_loopback)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--source", default="127.0.0.1", type=_loopback, help="flood's address")
    ap.add_argument("--sockets", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=20.0, help="HTTP probing window")
    ap.add_argument("--warmup", type=float, default=1.0, help="flood before the first probe")
    ap.add_argument("--trickle", type=float, default=1.0, help="HTTP: a header byte this often")
    ap.add_argument("--interval", type=float, default=0.2, help="pause between probes")
    ap.add_argument("--timeout", type=float, default=5.0, help="one probe's timeout")
    ap.add_argument("--path", action="append", help="HTTP paths to probe (default /health)")
    ap.add_argument("--echoes", type=int, default=12)
    ap.add_argument("--aet", default="ECHOSCU")
    ap.add_argument("--aec", default="NEUROSANDBOX")
    args = ap.parse_args()
    if not 0 < args.sockets <= MAX_SOCKETS:
        raise SystemExit(f"--sockets must be 1..{MAX_SOCKETS}")
    if not 0 < args.seconds <= MAX_SECONDS:
        raise SystemExit(f"--seconds must be up to {MAX_SECONDS:g}")
    args.path = args.path or ["/health"]
    (run_http if args.mode == "http" else run_dicom)(args)


if __name__ == "__main__":
    main()
