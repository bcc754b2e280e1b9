"""The embedded PACS: the Debian Orthanc on loopback ports, started and stopped by PID.

``neurosandbox pacs up`` renders ``deploy/orthanc/orthanc.json.j2`` into ``DATA_DIR/pacs``,
generates a password (kept in a 0600 file), picks free loopback ports for whatever the
settings leave unset, starts ``Orthanc`` detached, waits until its REST API answers and
records everything in ``pacs.json``; the other commands read the endpoints from there.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import jinja2
from pydantic import BaseModel

from dicom import atomic_write
from gateway.settings import Settings

log = logging.getLogger(__name__)
TEMPLATE = Path(__file__).resolve().parents[1] / "deploy" / "orthanc" / "orthanc.json.j2"
DEBIAN_PLUGINS = ["/usr/share/orthanc/plugins/libOrthancDicomWeb.so"]
DEFAULT_PORTS = {"http": 8042, "dicom": 4242, "gateway": 11112, "api": 8700}


class PacsError(RuntimeError):
    """The local Orthanc could not be configured, started, reached or stopped."""


class Endpoints(BaseModel):
    """Where everything is: what ``pacs status --json`` prints (minus the password itself)."""

    orthanc_url: str
    username: str
    password_file: str | None = None
    orthanc_aet: str
    orthanc_dicom_host: str
    orthanc_dicom_port: int
    gateway_aet: str
    gateway_host: str
    gateway_dicom_port: int
    api_url: str
    api_port: int
    stable_age: int
    data_dir: str


def free_port(preferred: int | None = None, host: str = "127.0.0.1") -> int:
    """``preferred`` when it can be bound on ``host``, else a free ephemeral port."""
    for port in ([preferred] if preferred else []) + [0]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise PacsError(f"no free TCP port on {host}")


def dcmtk_env() -> dict[str, str]:
    """This environment with ``TCP_NODELAY=1``, for dcmtk tools and Orthanc (which links dcmtk).

    Debian builds dcmtk with Nagle's algorithm left on unless this variable is set; each C-STORE
    then stalls on a delayed ACK (about 60 ms per instance on loopback: 20 s instead of 1.2 s for
    one 320-file phantom study into Orthanc).
    """
    return dict(os.environ, TCP_NODELAY="1")


def write_secret(path: Path, value: str) -> None:
    """Write ``value`` to ``path`` readable by the owner only (created 0600, never widened)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with atomic_write(path, "w", perm=0o600, fsync=False) as fh:
        fh.write(value)


def read_secret(path: Path) -> str:
    """The first line of a secret file (warns when group/others may read it)."""
    if path.stat().st_mode & 0o077:
        log.warning("secret file %s is readable by group/others: chmod 600 it", path)
    try:
        return path.read_text().splitlines()[0].strip()
    except IndexError:
        raise PacsError(f"secret file {path} is empty") from None


def render_config(**values: Any) -> dict[str, Any]:
    """Render the Orthanc template with ``values`` and check the result is valid JSON."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)
    try:
        text = env.from_string(TEMPLATE.read_text()).render(**values)
        return dict(json.loads(text))
    except (jinja2.UndefinedError, json.JSONDecodeError) as exc:
        raise PacsError(f"{TEMPLATE}: cannot render the Orthanc configuration: {exc}") from exc


class LocalPacs:
    """The local Orthanc of one data folder."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.root = (settings.data_dir / "pacs").resolve()
        self.state_file = self.root / "pacs.json"
        self.pid_file = self.root / "orthanc.pid"
        self.config_file = self.root / "orthanc.json"
        self.password_file = self.root / "secret" / "orthanc-password"
        self.log_file = self.root / "orthanc.log"

    # ----------------------------------------------------------------- state

    def endpoints(self) -> Endpoints | None:
        """The endpoints recorded by the last ``up`` (None if it never ran here)."""
        if not self.state_file.exists():
            return None
        return Endpoints.model_validate_json(self.state_file.read_text())

    def pid(self) -> int | None:
        """PID of the running Orthanc started from this folder, or None."""
        config = str(self.config_file).encode()
        return _our_pid(self.pid_file, lambda cmdline: config in cmdline)  # our config path

    def password(self) -> str:
        return read_secret(self.password_file)

    # ----------------------------------------------------------------- up / down

    def up(self, timeout_s: float = 30.0) -> Endpoints:
        """Start Orthanc (or reuse the running one) and return its endpoints once REST answers."""
        binary = shutil.which("Orthanc")
        if binary is None:
            raise PacsError("Orthanc is not installed (apt-get install orthanc orthanc-dicomweb)")
        if self.pid() is not None:
            ep = self.endpoints()
            if ep is not None:
                self._wait_ready(ep, timeout_s)
                return ep
        s = self.settings
        old = self.endpoints()
        was = old.model_dump() if old else {}
        (self.root / "db").mkdir(parents=True, exist_ok=True)
        if not self.password_file.exists():
            write_secret(self.password_file, secrets.token_urlsafe(24))

        def port(configured: int | None, previous: int | None, default: int) -> int:
            return configured or free_port(previous or default)

        ep = Endpoints(
            orthanc_url="",
            username=s.orthanc_username,
            password_file=str(self.password_file),
            orthanc_aet=s.orthanc_aet,
            orthanc_dicom_host="127.0.0.1",
            orthanc_dicom_port=port(
                s.orthanc_dicom_port, was.get("orthanc_dicom_port"), DEFAULT_PORTS["dicom"]
            ),
            gateway_aet=s.gateway_aet,
            gateway_host=s.gateway_host,
            gateway_dicom_port=port(
                s.gateway_dicom_port, was.get("gateway_dicom_port"), DEFAULT_PORTS["gateway"]
            ),
            api_url="",
            api_port=port(s.api_port, was.get("api_port"), DEFAULT_PORTS["api"]),
            stable_age=s.orthanc_stable_age,
            data_dir=str(s.data_dir.resolve()),
        )
        http_port = s.orthanc_http_port or free_port(
            _port_of(old.orthanc_url) if old else DEFAULT_PORTS["http"]
        )
        ep.orthanc_url = f"http://127.0.0.1:{http_port}"
        ep.api_url = f"http://{s.api_host}:{ep.api_port}"
        config = render_config(
            name="NeuroSandbox",
            storage_dir=str(self.root / "db"),
            index_dir=str(self.root / "db"),
            http_port=http_port,
            dicom_port=ep.orthanc_dicom_port,
            aet=ep.orthanc_aet,
            username=ep.username,
            password=self.password(),
            remote_access_allowed=False,
            stable_age=ep.stable_age,
            plugins=[p for p in DEBIAN_PLUGINS if Path(p).exists()],
            gateway_aet=ep.gateway_aet,
            gateway_host="127.0.0.1",
            gateway_port=ep.gateway_dicom_port,
            check_modality_host=True,
        )
        write_secret(self.config_file, json.dumps(config, indent=2))  # holds the password
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(
                [binary, str(self.config_file)],
                cwd=self.root,
                env=dcmtk_env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # outlives the CLI that started it
            )
        self.pid_file.write_text(f"{proc.pid}\n")
        self.state_file.write_text(ep.model_dump_json(indent=2))
        try:
            self._wait_ready(ep, timeout_s, proc)
        except PacsError:
            self.down()
            raise
        return ep

    def _wait_ready(
        self, ep: Endpoints, timeout_s: float, proc: subprocess.Popen[bytes] | None = None
    ) -> None:
        deadline = time.monotonic() + timeout_s
        auth = (ep.username, self.password())
        last = "no answer"
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise PacsError(
                    f"Orthanc exited with code {proc.returncode} during start-up; see {self.log_file}"
                )
            try:
                r = httpx.get(f"{ep.orthanc_url}/system", auth=auth, timeout=2.0)
                if r.status_code == 200:
                    return
                last = f"HTTP {r.status_code}"
            except httpx.HTTPError as exc:
                last = type(exc).__name__
            time.sleep(0.1)
        raise PacsError(
            f"Orthanc at {ep.orthanc_url} not ready after {timeout_s:.0f} s ({last}); see {self.log_file}"
        )

    def down(self, timeout_s: float = 20.0) -> bool:
        """Stop the Orthanc of this folder by its PID; True if it was running."""
        return _stop_pid(self.pid(), self.pid_file, timeout_s)

    def status(self) -> dict[str, Any]:
        """Endpoints plus whether Orthanc runs and answers."""
        ep = self.endpoints()
        pid = self.pid()
        out: dict[str, Any] = {"running": pid is not None, "pid": pid}
        if ep is None:
            return out | {"configured": False}
        out |= ep.model_dump()
        out["configured"] = True
        out["reachable"] = False
        if pid is not None:
            try:
                r = httpx.get(
                    f"{ep.orthanc_url}/system", auth=(ep.username, self.password()), timeout=3.0
                )
                out["reachable"] = r.status_code == 200
                if r.status_code == 200:
                    out["orthanc_version"] = r.json().get("Version")
            except httpx.HTTPError:
                pass
        return out


def gateway_pid(data_dir: Path) -> int | None:
    """PID of the gateway (``neurosandbox serve``) the demo started for this data folder."""
    return _our_pid(
        data_dir / "gateway.pid",
        lambda cmdline: any(a.endswith(b"neurosandbox") for a in cmdline) and b"serve" in cmdline,
    )


def _our_pid(pid_file: Path, ours: Callable[[list[bytes]], bool]) -> int | None:
    """The live process ``pid_file`` names when its command line (arguments) is ``ours``: a
    PID recycled by another program, a zombie or an unreadable file give None."""
    try:
        pid = int(pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if ours(cmdline) and not _is_zombie(pid) else None


def stop_gateway(data_dir: Path, timeout_s: float = 30.0) -> bool:
    """Stop the demo's gateway of this data folder by its PID (SIGTERM: it finishes or fails
    its running evaluation and stops; SIGKILL after ``timeout_s``); True if one was running."""
    return _stop_pid(gateway_pid(data_dir), data_dir / "gateway.pid", timeout_s)


def _stop_pid(pid: int | None, pid_file: Path, timeout_s: float) -> bool:
    """SIGTERM to ``pid`` (ours, checked by the caller), SIGKILL when it has not ended after
    ``timeout_s``; reap it if it is our child; remove its PID file. True if it was running."""
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            if _is_zombie(pid):
                break
            time.sleep(0.05)
        else:
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):  # reap our own child (tests, the demo)
            os.waitpid(pid, os.WNOHANG)
    pid_file.unlink(missing_ok=True)
    return pid is not None


def _port_of(url: str) -> int | None:
    try:
        return int(url.rsplit(":", 1)[1].split("/")[0])
    except (IndexError, ValueError):
        return None


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return False


def resolve_endpoints(settings: Settings) -> Endpoints:
    """Endpoints the gateway uses: explicit settings first, then the local ``pacs.json``."""
    local = LocalPacs(settings).endpoints()
    s = settings

    def pick(configured: int | None, recorded: int | None, default: int) -> int:
        return configured or recorded or default

    orthanc_url = s.orthanc_url or (local.orthanc_url if local else None)
    if orthanc_url is None:
        port = s.orthanc_http_port or DEFAULT_PORTS["http"]
        orthanc_url = f"http://127.0.0.1:{port}"
    api_port = pick(s.api_port, local.api_port if local else None, DEFAULT_PORTS["api"])
    password_file = s.orthanc_password_file or (
        Path(local.password_file) if local and local.password_file else None
    )
    return Endpoints(
        orthanc_url=orthanc_url.rstrip("/"),
        username=s.orthanc_username,
        password_file=str(password_file) if password_file else None,
        orthanc_aet=s.orthanc_aet,
        orthanc_dicom_host=s.orthanc_dicom_host,
        orthanc_dicom_port=pick(
            s.orthanc_dicom_port, local.orthanc_dicom_port if local else None, 4242
        ),
        gateway_aet=s.gateway_aet,
        gateway_host=s.gateway_host,
        gateway_dicom_port=pick(
            s.gateway_dicom_port,
            local.gateway_dicom_port if local else None,
            DEFAULT_PORTS["gateway"],
        ),
        api_url=f"http://{s.api_host}:{api_port}",
        api_port=api_port,
        stable_age=s.orthanc_stable_age,
        data_dir=str(s.data_dir.resolve()),
    )


def orthanc_password(settings: Settings, endpoints: Endpoints | None = None) -> str | None:
    """The Orthanc password: from the environment, else from the secret file; never logged."""
    if settings.orthanc_password is not None:
        return settings.orthanc_password.get_secret_value()
    ep = endpoints or resolve_endpoints(settings)
    if ep.password_file:
        path = Path(ep.password_file)
        if not path.exists():
            raise PacsError(f"Orthanc password file {path} does not exist")
        return read_secret(path)
    return None
