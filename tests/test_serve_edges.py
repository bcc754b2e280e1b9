"""The edges of `neurosandbox serve` and of the command line a hospital team meets first: a port
already taken (one line naming the port and what holds it, exit 2, nothing started), and output
that is not a terminal (tokens and run ids printed whole, never wrapped)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.pacs_local import free_port
from gateway.ports import holder

BIN = Path(sys.executable).parent / "neurosandbox"


@pytest.fixture()
def held() -> Iterator[int]:
    """A port this test process listens on (a real socket, as another server would)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def _serve(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {
        **os.environ,
        "NEUROSANDBOX_DATA_DIR": str(tmp_path / "var"),
        "NEUROSANDBOX_ORTHANC_URL": f"http://127.0.0.1:{free_port()}",
        "NEUROSANDBOX_FOLLOW_CHANGES": "false",
        "NEUROSANDBOX_WARM_WORKER": "false",
        **env,
    }
    return subprocess.run(
        [str(BIN), "serve"], env=full, capture_output=True, text=True, timeout=60, cwd=tmp_path
    )


@pytest.mark.parametrize(
    ("setting", "what"),
    [("NEUROSANDBOX_API_PORT", "API"), ("NEUROSANDBOX_GATEWAY_DICOM_PORT", "DICOM")],
)
def test_serve_with_a_port_taken_says_which_and_by_whom_in_one_line_and_exits_2(
    tmp_path: Path, held: int, setting: str, what: str
) -> None:
    ports = {"NEUROSANDBOX_API_PORT": str(free_port()),
             "NEUROSANDBOX_GATEWAY_DICOM_PORT": str(free_port())}  # fmt: skip
    ports[setting] = str(held)
    r = _serve(tmp_path, **ports)
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(lines) == 1, lines
    (line,) = lines
    assert f"{what} port {held} on 127.0.0.1 is already in use" in line
    assert f"process {os.getpid()} (" in line and setting in line
    # nothing started: a gateway already serving this DATA_DIR keeps its runs and its spool
    assert not (tmp_path / "var" / "runs").exists() and not (tmp_path / "var" / "spool").exists()


def test_the_holder_of_a_port_is_named_where_readable_else_another_process(
    held: int, tmp_path: Path
) -> None:
    assert holder(held).startswith(f"process {os.getpid()} (")
    assert holder(free_port()) == "another process"  # nothing listens there
    assert holder(held, proc=tmp_path) == "another process"  # no /proc to read


@pytest.mark.parametrize("taken", ["api_port", "gateway_dicom_port"])
@pytest.mark.parametrize("checked", [True, False])
def test_the_service_itself_stops_on_a_port_taken_with_the_same_error(
    tmp_path: Path, held: int, taken: str, checked: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`serve` behind another front end (no CLI check), and the DICOM port taken between the
    check and the node's bind (``checked`` False): the same error, every part stopped."""
    import threading

    import gateway.serve
    from gateway.ports import PortUnavailableError
    from gateway.settings import Settings

    if not checked:
        monkeypatch.setattr(gateway.serve, "check_free", lambda *a: None)
    ports = {"api_port": free_port(), "gateway_dicom_port": free_port(), taken: held}
    settings = Settings(data_dir=tmp_path / "var", orthanc_url=f"http://127.0.0.1:{free_port()}",
                        warm_worker=False, **ports)  # fmt: skip
    before = set(threading.enumerate())
    with pytest.raises(PortUnavailableError, match=f"port {held} on 127.0.0.1 is already in use"):
        gateway.serve.serve(settings)
    left = [t for t in threading.enumerate() if t not in before and not t.daemon]
    assert not left, left  # nothing keeps the process alive
    with socket.socket() as probe:  # the API's socket was closed
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", ports["api_port"] if taken != "api_port" else free_port()))
