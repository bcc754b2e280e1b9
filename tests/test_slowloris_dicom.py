"""No idle socket keeps a sender out of the DICOM node (issue 34).

40 TCP connections that send nothing, each reopened as soon as the node closes it, held every
association slot: 0 of 12 ``echoscu`` got in. The node now shares its connections among peer
addresses (``gateway.scp_transport.PeerLimits``): an address holds at most ``per_peer``, a new
connection over a bound closes the one that has waited longest without an association request,
and known senders keep slots that unknown addresses cannot take.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pynetdicom import AE
from pynetdicom.sop_class import Verification  # type: ignore[attr-defined]

from gateway.pacs_local import dcmtk_env
from gateway.scp import StorageSCP
from gateway.scp_transport import PeerLimits

ECHOSCU = "/usr/bin/echoscu"  # dcmtk's (the venv holds pynetdicom's tool of the same name)
N_FLOOD = 40
N_ECHO = 12
ARTIM_S = 2.0  # short, so that the flood's connections are closed and reopened during the test
pytestmark = pytest.mark.integration

if not Path(ECHOSCU).exists():  # pragma: no cover
    pytest.skip("dcmtk is not installed (apt-get install dcmtk)", allow_module_level=True)


@contextlib.contextmanager
def node(tmp_path: Path, **kw: object) -> Iterator[StorageSCP]:
    scp = StorageSCP(tmp_path / "spool", port=0, quiet_s=0.5, artim_timeout_s=ARTIM_S, **kw)  # type: ignore[arg-type]
    scp.start()
    try:
        yield scp
    finally:
        scp.stop()


@contextlib.contextmanager
def idle_flood(port: int, source: str, n: int = N_FLOOD) -> Iterator[list[int]]:
    """``n`` connections from ``source`` that send nothing, each reopened once the node closes
    it (checked every 10 ms); yields [connections opened]. Ends with the block."""
    stop, opened = threading.Event(), [0]

    def connect() -> socket.socket | None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind((source, 0))
            s.connect(("127.0.0.1", port))
        except OSError:
            s.close()
            return None
        s.setblocking(False)
        opened[0] += 1
        return s

    def run() -> None:
        socks = [connect() for _ in range(n)]
        while not stop.wait(0.01):
            for i, s in enumerate(socks):
                if s is not None:
                    try:
                        if s.recv(1) != b"":
                            continue
                    except BlockingIOError:
                        continue
                    except OSError:
                        pass
                    s.close()
                socks[i] = connect()
        for s in socks:
            if s is not None:
                s.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        time.sleep(0.3)
        yield opened
    finally:
        stop.set()
        t.join(5)


def echo(port: int, aet: str = "MODALITY1") -> int:
    r = subprocess.run(
        [ECHOSCU, "-aet", aet, "-aec", "NEUROSANDBOX", "127.0.0.1", str(port)],
        capture_output=True,
        timeout=30,
        env=dcmtk_env(),
    )
    return r.returncode


@pytest.mark.parametrize("source", ["127.0.0.2", "127.0.0.1"], ids=["other", "same-address"])
def test_every_echoscu_gets_in_while_40_idle_connections_are_reopened(
    tmp_path: Path, source: str
) -> None:
    with node(tmp_path) as scp, idle_flood(scp.port, source) as opened:
        t0 = time.monotonic()
        results = []
        while len(results) < N_ECHO:
            results.append(echo(scp.port))
            time.sleep(0.15)
        took = time.monotonic() - t0
        assert took > ARTIM_S  # the flood's connections were closed and reopened meanwhile
        assert opened[0] > N_FLOOD
    assert results == [0] * N_ECHO, f"echoscu exit codes with an idle flood from {source}"
    print(f"\n{N_ECHO}/{N_ECHO} echoscu in {took:.1f} s, flood from {source}: {opened[0]} opened")


def _associate(port: int, source: str) -> object:
    ae = AE(ae_title="HOLDER")
    ae.add_requested_context(Verification)
    ae.acse_timeout = ae.network_timeout = 5
    return ae.associate("127.0.0.1", port, ae_title="NEUROSANDBOX", bind_address=(source, 0))


def test_known_senders_keep_reserved_slots_that_unknown_addresses_cannot_take(
    tmp_path: Path,
) -> None:
    limits = PeerLimits(per_peer=8, reserved=8, known_hosts=frozenset({"127.0.0.1"}))
    with node(tmp_path, max_associations=32, peer_limits=limits) as scp:
        held = []
        try:
            # 24 accepted, idle associations from three unknown addresses: every unknown slot
            for a in range(3):
                for _ in range(8):
                    held.append(_associate(scp.port, f"127.0.0.{a + 2}"))
            assert all(h.is_established for h in held)  # type: ignore[attr-defined]
            late = _associate(scp.port, "127.0.0.5")  # a fourth unknown address: no room left
            assert not late.is_established  # type: ignore[attr-defined]
            # the configured sender still gets in, again and again
            assert [echo(scp.port) for _ in range(3)] == [0, 0, 0]
            # and its own share is per_peer, held while the unknown slots stay full
            mine = [_associate(scp.port, "127.0.0.1") for _ in range(8)]
            assert all(m.is_established for m in mine)  # type: ignore[attr-defined]
            held += mine
        finally:
            for h in held:
                with contextlib.suppress(Exception):
                    h.release()  # type: ignore[attr-defined]
        assert scp.wait_idle(10)
