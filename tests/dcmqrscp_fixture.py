"""A non-Orthanc archive for the tests: dcmtk's dcmqrscp (Debian dcmtk) on a free loopback port.

dcmqrscp forks a process per association (its single-process mode, -s, crashes after an
association here, dcmtk 3.6.7). The test writes its configuration (the archive's AE title and storage area, two more AE titles
that refuse storing (a full quota, read-only), and an AE table naming our C-MOVE destination at
its own free loopback port), starts it, loads studies into it
with dcmtk's storescu (``/usr/bin/storescu``: the venv has pynetdicom tools of the same names)
and stops it by PID at the end of the session.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from guard import stop

from gateway.pacs_local import free_port

AE_TITLE = "ARCHIVE"
FULL_AE = "FULLARCHIVE"  # the same archive under a quota no instance fits: refuses C-STORE (A700)
READ_ONLY_AE = "READONLY"  # read-only storage area: accepts no storage presentation context
MOVE_AE = "NSBXMOVE"  # our C-MOVE destination as the archive knows it
CALLING_AE = "NEUROSANDBOX"


@dataclass
class Dcmqrscp:
    port: int
    move_port: int  # where the archive sends C-MOVE results (MOVE_AE)
    folder: Path
    proc: subprocess.Popen[bytes]

    def store(self, *paths: Path) -> None:
        """Load files or folders into the archive with dcmtk's storescu."""
        args = ["/usr/bin/storescu", "-aet", "LOADER", "-aec", AE_TITLE, "+sd", "+r", "-q",
                "127.0.0.1", str(self.port), *map(str, paths)]  # fmt: skip
        subprocess.run(args, check=True, timeout=120, capture_output=True)

    def log(self) -> str:
        path = self.folder / "dcmqrscp.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def _wait_listening(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 20) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"dcmqrscp exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("dcmqrscp did not listen in time")


@contextlib.contextmanager
def running_dcmqrscp(folder: Path, port: int, move_port: int | None = None) -> Iterator[Dcmqrscp]:
    """dcmqrscp on ``port`` with its storage in ``folder`` (an AE table entry for MOVE_AE at
    ``move_port``; FULL_AE holds 1 kB, READ_ONLY_AE takes nothing), until the block ends;
    stopped by PID."""
    db, full, read_only = folder / "db", folder / "full", folder / "readonly"
    for d in (db, full, read_only):
        d.mkdir(parents=True, exist_ok=True)
    move_port = move_port or free_port()
    (folder / "dcmqrscp.cfg").write_text(
        f"NetworkTCPPort = {port}\nMaxPDUSize = 65536\nMaxAssociations = 16\n"
        "HostTable BEGIN\n"
        f"nsbxmove = ({MOVE_AE}, 127.0.0.1, {move_port})\n"
        "HostTable END\n"
        "VendorTable BEGIN\nVendorTable END\n"
        "AETable BEGIN\n"
        f"{AE_TITLE} {db} RW (200, 1024mb) ANY\n"
        f"{FULL_AE} {full} RW (1, 1kb) ANY\n"
        f"{READ_ONLY_AE} {read_only} R (10, 10mb) ANY\n"
        "AETable END\n"
    )
    log = open(folder / "dcmqrscp.log", "ab")  # noqa: SIM115 (closed at the end)
    proc = subprocess.Popen(
        ["dcmqrscp", "-c", str(folder / "dcmqrscp.cfg"), "-ll", "warn"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        _wait_listening(port, proc)
        yield Dcmqrscp(port, move_port, folder, proc)
    finally:
        stop(proc, 10)  # by PID: SIGTERM, then SIGKILL
        log.close()


@pytest.fixture(scope="session")
def dcmqrscp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dcmqrscp]:
    if shutil.which("dcmqrscp") is None or not Path("/usr/bin/storescu").exists():
        pytest.skip("dcmtk is not installed (apt-get install dcmtk)")
    with running_dcmqrscp(tmp_path_factory.mktemp("dcmqrscp"), free_port(), free_port()) as qr:
        yield qr
