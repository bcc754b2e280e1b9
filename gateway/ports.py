"""The ports ``serve`` listens on: bound (or checked) before anything starts, and when one is
taken, which process holds it (Linux ``/proc/net/tcp*`` and ``/proc/<pid>/fd``, where readable)."""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from gateway.pacs_local import Endpoints

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column
MAX_COMMAND = 120  # characters of the holder's command line shown


class PortUnavailableError(RuntimeError):
    """A port ``serve`` needs cannot be bound; the message names it, what it is for, the
    setting that chooses it and (where readable) the process holding it."""

    def __init__(self, errno_: int, message: str) -> None:
        super().__init__(message)
        self.errno = errno_


class Listen(NamedTuple):
    """A port ``serve`` listens on: where, what for, the setting that chooses it."""

    host: str
    port: int
    what: str
    setting: str


def serve_ports(api_host: str, ep: Endpoints) -> tuple[Listen, Listen]:
    """The API's and the DICOM node's ports."""
    return (
        Listen(api_host, ep.api_port, "API", "NEUROSANDBOX_API_PORT"),
        Listen(ep.gateway_host, ep.gateway_dicom_port, "DICOM", "NEUROSANDBOX_GATEWAY_DICOM_PORT"),
    )


def _family(host: str) -> socket.AddressFamily:
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:  # a host name
        return socket.AF_INET


def bind_listening(host: str, port: int, what: str, setting: str) -> socket.socket:
    """A listening TCP socket on ``host:port`` (address reuse on, as servers set it), or
    :class:`PortUnavailableError` saying why not."""
    sock = socket.socket(_family(host), socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise unavailable(exc, host, port, what, setting) from None
    return sock


def check_free(host: str, port: int, what: str, setting: str) -> None:
    """Raise :class:`PortUnavailableError` when ``host:port`` cannot be listened on now (a
    server that binds it itself starts next)."""
    if port:
        bind_listening(host, port, what, setting).close()


def unavailable(
    exc: OSError, host: str, port: int, what: str, setting: str
) -> PortUnavailableError:
    """The error for a failed bind of ``host:port``, in one line a user can act on."""
    where = f"{what} port {port} on {host}"
    if exc.errno == errno.EADDRINUSE:
        return PortUnavailableError(
            exc.errno,
            f"{where} is already in use by {holder(port)}: stop it, or choose another port "
            f"with {setting}",
        )
    if exc.errno == errno.EACCES:
        reason = "needs privileges (a port below 1024)"
    elif exc.errno == errno.EADDRNOTAVAIL:
        reason = f"{host} is not an address of this machine"
    else:
        reason = exc.strerror or str(exc)
    return PortUnavailableError(
        exc.errno or 0, f"{where} cannot be listened on: {reason} (set {setting})"
    )


def holder(port: int, proc: Path = Path("/proc")) -> str:
    """``process <pid> (<command line>)`` holding a listening socket on ``port``, else
    ``another process`` (not Linux, or the holder's file descriptors are not readable)."""
    inodes = _listening_inodes(port, proc)
    if not inodes:
        return "another process"
    try:
        pids = [d for d in os.listdir(proc) if d.isdigit()]
    except OSError:
        return "another process"
    for pid in pids:
        fd_dir = proc / pid / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # another user's process, or gone
            continue
        for fd in fds:
            try:
                target = os.readlink(fd_dir / fd)
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                return f"process {pid} ({_command(proc / pid)})"
    return "another process"


def _listening_inodes(port: int, proc: Path) -> set[str]:
    found = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 10 or cols[3] != _LISTEN:
                continue
            _addr, _, hexport = cols[1].rpartition(":")
            if int(hexport, 16) == port:
                found.add(cols[9])
    return found


def _command(pid_dir: Path) -> str:
    try:
        raw = (pid_dir / "cmdline").read_bytes()
    except OSError:
        return "command not readable"
    text = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)
    text = "".join(c if c.isprintable() else " " for c in text) or "no command line"
    return text if len(text) <= MAX_COMMAND else text[: MAX_COMMAND - 1] + "…"
