"""A throwaway PostgreSQL (Debian's, e.g. ``postgresql-15``) on a free loopback port.

For the tests and the engine benchmark, as :mod:`gateway.pacs_local` starts Orthanc: ``initdb``
into a temporary folder (as the ``postgres`` user when we are root: ``initdb`` refuses root),
trust authentication on loopback only, the unix socket inside that folder, ``pg_ctl`` start on a
free ``127.0.0.1`` port, wait until it accepts connections, create a database; at the end
``pg_ctl stop -m immediate``, then SIGKILL the postmaster by its PID if it still lives, and the
folder is removed. Not a production server: ``fsync`` is off unless asked for.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from gateway.pacs_local import free_port

DEBIAN_ROOT = Path("/usr/lib/postgresql")
SERVICE_USER = "postgres"
SUPERUSER = "postgres"
DRIVER = "postgresql+psycopg"
_DB_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class PostgresError(RuntimeError):
    """The throwaway PostgreSQL could not be found, initialised, started, reached or stopped."""


class PostgresNotInstalledError(PostgresError):
    """No PostgreSQL server binaries (``initdb``, ``pg_ctl``, ``postgres``) on this machine."""


def find_bindir(root: Path = DEBIAN_ROOT) -> Path:
    """The ``bin`` folder of the newest Debian PostgreSQL holding initdb, pg_ctl and postgres."""
    candidates = []
    for d in root.glob("*/bin") if root.is_dir() else []:
        version = d.parent.name
        if version.isdigit() and all((d / b).is_file() for b in ("initdb", "pg_ctl", "postgres")):
            candidates.append((int(version), d))
    if not candidates:
        raise PostgresNotInstalledError(
            f"no PostgreSQL server under {root}/<version>/bin (apt-get install postgresql; "
            "`make setup` installs it)"
        )
    return max(candidates)[1]


def database_url(port: int, dbname: str, host: str = "127.0.0.1") -> str:
    """The SQLAlchemy URL of ``dbname`` on a trust-authenticated loopback server."""
    return f"{DRIVER}://{SUPERUSER}@{host}:{port}/{dbname}"


def _check_db_name(name: str) -> str:
    if not _DB_NAME.fullmatch(name):
        raise PostgresError(
            f"database name {name!r}: use 1-63 lower-case letters, digits and _, not a digit first"
        )
    return name


def create_database(url: str, name: str | None = None) -> str:
    """Create a new, empty database on the server of ``url`` (a fresh ``t_<hex>`` name unless
    ``name`` is given) and return its URL; ``url`` names any database the user can connect to."""
    import psycopg
    from sqlalchemy.engine import make_url

    base = make_url(url)
    name = _check_db_name(name or f"t_{uuid.uuid4().hex[:16]}")
    try:
        with psycopg.connect(
            host=base.host,
            port=base.port,
            user=base.username,
            dbname=base.database,
            autocommit=True,
            connect_timeout=10,
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # name checked above: no quoting needed
    except psycopg.Error as exc:
        raise PostgresError(
            f"cannot create database {name} on {base.host}:{base.port}: {exc}"
        ) from exc
    return base.set(database=name).render_as_string(hide_password=False)


class LocalPostgres:
    """One throwaway cluster: ``start()`` it, use :attr:`url`, ``stop()`` it (or ``with``)."""

    def __init__(
        self,
        *,
        dbname: str = "neurosandbox",
        fsync: bool = False,
        bindir: Path | None = None,
        parent: Path | None = None,
        listen: str = "127.0.0.1",
        trusted_net: str | None = None,
    ) -> None:
        self.dbname = _check_db_name(dbname)
        # the address(es) the server listens on, and a network (CIDR) it trusts besides
        # loopback: the tests' worker hosts in network namespaces
        self.listen, self.trusted_net = listen, trusted_net
        self.fsync = fsync
        self.bindir = bindir
        self.parent = parent
        self.root: Path | None = None
        self.port: int | None = None
        self.pid: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._as_service_user = os.geteuid() == 0

    # ----------------------------------------------------------------- paths

    @property
    def datadir(self) -> Path:
        return self._root() / "data"

    @property
    def log_file(self) -> Path:
        return self._root() / "postgres.log"

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the database created at start."""
        if self.port is None:
            raise PostgresError("the PostgreSQL server is not started")
        return database_url(self.port, self.dbname)

    def _root(self) -> Path:
        if self.root is None:
            raise PostgresError("the PostgreSQL server is not started")
        return self.root

    # ----------------------------------------------------------------- start / stop

    def start(self, timeout_s: float = 60.0, attempts: int = 3) -> str:
        """Initialise and start the cluster, create the database; its URL."""
        bindir = self.bindir or find_bindir()
        owner = _service_user() if self._as_service_user else None
        # The system temp folder (/tmp): the postgres user must be able to reach its folder,
        # which a root-only pytest tmp_path (0700) would not allow.
        self.root = Path(tempfile.mkdtemp(prefix="nsbx-pg-", dir=self.parent))
        try:
            if owner is not None:
                os.chown(self.root, owner.pw_uid, owner.pw_gid)
            self._run(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(self.datadir),
                    "--auth=trust",  # local and loopback host lines only (pg_hba.conf)
                    f"--username={SUPERUSER}",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",
                    "--no-instructions",
                ],
                "initdb",
                timeout_s,
            )
            if self.trusted_net is not None:
                with open(self.datadir / "pg_hba.conf", "a") as hba:
                    hba.write(
                        f"host all all {ipaddress.ip_network(self.trusted_net, strict=False)} trust\n"
                    )
            last = ""
            for _ in range(attempts):  # the free port may be taken between pick and bind
                self.port = free_port()
                self._start_postmaster(bindir, owner)
                try:
                    self._wait_ready(timeout_s)
                    break
                except PostgresError as exc:
                    last = str(exc)
                    self._stop_postmaster(bindir, timeout_s)
            else:
                raise PostgresError(f"PostgreSQL did not start after {attempts} attempts: {last}")
            create_database(database_url(self.port, "postgres"), self.dbname)
        except BaseException:
            self.stop()
            raise
        return self.url

    def restart(self, mode: str = "fast", timeout_s: float = 60.0) -> None:
        """Stop the server (``pg_ctl stop -m fast`` or ``immediate``: a crash, recovered from
        the WAL at start) and start it again on the same port: clients lose their sessions."""
        if mode not in ("fast", "immediate"):
            raise PostgresError(f"restart mode {mode!r}: fast or immediate")
        bindir = self.bindir or find_bindir()
        owner = _service_user() if self._as_service_user else None
        self._stop_postmaster(bindir, timeout_s, mode)
        self._start_postmaster(bindir, owner)
        self._wait_ready(timeout_s)

    def _start_postmaster(self, bindir: Path, owner: pwd.struct_passwd | None) -> None:
        """The postmaster as our own child (``pg_ctl start`` would detach it to PID 1, which in
        a container may never reap it): its PID is known and it is reaped on stop."""
        argv = [
            str(bindir / "postgres"),
            "-D",
            str(self.datadir),
            "-p",
            str(self.port),
            "-c",
            f"listen_addresses={self.listen}",
            "-c",
            f"unix_socket_directories={self._root()}",
            "-c",
            f"fsync={'on' if self.fsync else 'off'}",
            "-c",
            f"full_page_writes={'on' if self.fsync else 'off'}",
        ]
        with open(self.log_file, "ab") as log:
            self._proc = subprocess.Popen(
                argv,
                cwd=self._root(),
                env=_server_env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # a Ctrl-C reaches the tests alone; their stop() ends it
                user=owner.pw_uid if owner else None,
                group=owner.pw_gid if owner else None,
                extra_groups=[] if owner else None,  # drop root's supplementary groups
            )
        self.pid = self._proc.pid

    def _stop_postmaster(self, bindir: Path, timeout_s: float, mode: str = "immediate") -> None:
        """``pg_ctl stop -m immediate`` (or ``mode``), SIGKILL if the postmaster still lives,
        reap it."""
        proc, self._proc, self.pid = self._proc, None, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(PostgresError, subprocess.TimeoutExpired):
                self._run(
                    [
                        str(bindir / "pg_ctl"),
                        "-D",
                        str(self.datadir),
                        "-m",
                        mode,
                        "-w",
                        "-t",
                        str(int(timeout_s)),
                        "stop",
                    ],
                    "pg_ctl stop",
                    timeout_s + 5,
                )
        try:
            proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise PostgresError(
                    f"PostgreSQL postmaster {proc.pid} still alive {timeout_s:.0f} s after SIGKILL"
                ) from None

    def _wait_ready(self, timeout_s: float) -> None:
        """Until a connection over TCP to the ``postgres`` database succeeds."""
        import psycopg

        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise PostgresError(f"PostgreSQL exited during start-up; see {self.log_file}")
            try:
                with psycopg.connect(
                    host="127.0.0.1",
                    port=self.port,
                    user=SUPERUSER,
                    dbname="postgres",
                    connect_timeout=2,
                ) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.Error as exc:
                last = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            time.sleep(0.05)
        raise PostgresError(
            f"PostgreSQL on 127.0.0.1:{self.port} not ready after {timeout_s:.0f} s ({last}); "
            f"see {self.log_file}"
        )

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop the postmaster by its PID and remove the folder; safe to call twice, or after
        a failed start."""
        if self.root is None:
            return
        try:
            self._stop_postmaster(self.bindir or find_bindir(), timeout_s)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def __enter__(self) -> LocalPostgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------- helpers

    def _run(self, argv: list[str], what: str, timeout_s: float) -> None:
        if self._as_service_user:
            argv = ["runuser", "-u", SERVICE_USER, "--", *argv]
        proc = subprocess.run(
            argv,
            cwd=self._root(),  # the service user's working folder must be readable by it
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=_server_env(),
        )
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip()[-1500:]
            log = ""
            if self.root is not None and self.log_file.exists():
                log = "\n" + self.log_file.read_text(errors="replace")[-1500:]
            raise PostgresError(f"{what} failed (exit {proc.returncode}): {detail}{log}")


@contextlib.contextmanager
def throwaway_postgres(
    *, dbname: str = "neurosandbox", fsync: bool = False, timeout_s: float = 60.0
) -> Iterator[LocalPostgres]:
    """A started :class:`LocalPostgres`, stopped and removed on exit."""
    server = LocalPostgres(dbname=dbname, fsync=fsync)
    server.start(timeout_s=timeout_s)
    try:
        yield server
    finally:
        server.stop()


def _service_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(SERVICE_USER)
    except KeyError:
        raise PostgresNotInstalledError(
            f"running as root, and there is no {SERVICE_USER!r} user to run initdb as "
            "(initdb refuses root; Debian's postgresql package creates that user)"
        ) from None


def _server_env() -> dict[str, str]:
    """A small, fixed environment: no PG* variable of the caller's reaches the server tools."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    env.pop("LANG", None)
    return env
