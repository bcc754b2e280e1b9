"""Orthanc on PostgreSQL (`neurosandbox pacs config --postgresql`): the URL checked as hostile
input, the password kept out of the command line and the file, and a real Debian Orthanc with
``orthanc-postgresql`` started from the rendered file on the session's PostgreSQL, a study
stored with dcmtk's storescu, found again after a restart, and read by a second Orthanc."""

from __future__ import annotations

import io
import json
import secrets
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pydicom
import pytest
from psycopg import sql
from sqlalchemy.engine import URL, make_url
from typer.testing import CliRunner, Result

from gateway.cli import app
from gateway.orthanc_pg import (
    DEBIAN_PG_PLUGINS,
    OrthancPostgresUrlError,
    parse_postgresql_url,
    postgresql_section,
)
from gateway.pacs_local import dcmtk_env, free_port
from gateway.pg_local import LocalPostgres
from tests.gateway_synth import make_study
from tests.guard import stop
from tests.pg_server import fresh_pg_database

REST_PASSWORD = "rest-secret-for-the-test"


def _config(tmp: Path, argv: list[str], **env: str) -> Result:
    """``neurosandbox pacs config ARGV`` in this process (its settings read from ``env``)."""
    return CliRunner().invoke(
        app,
        ["pacs", "config", *argv],
        env={
            "NEUROSANDBOX_DATA_DIR": str(tmp / "data"),
            "NEUROSANDBOX_ORTHANC_PASSWORD": REST_PASSWORD,
            **env,
        },
    )


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgresql://orthanc:hunter2@db/orthanc", "holds a password"),
        ("mysql://orthanc@db/orthanc", "scheme"),
        ("postgresql://orthanc@db;touch /tmp/x/orthanc", "spaces or control"),
        ("postgresql://orthanc@db%3Bx/orthanc", "not a host name"),
        ("postgresql://orthanc@db:99999/orthanc", "(?i)port"),
        ("postgresql://orthanc@db:0/orthanc", "port 0"),
        ("postgresql://orthanc@/orthanc?host=/run/postgresql", "name the server"),
        ("postgresql://orthanc@db1,db2/orthanc", "one host"),
        ("postgresql://db/orthanc", "no role"),
        ("postgresql://orthanc@db/", "no database"),
        ('postgresql://orthanc@db/or"; DROP', "spaces or control"),
        ("postgresql://orthanc@db/or%22tab", "database"),
        ("postgresql://orthanc@db/orthanc?options=-c%20x", "only sslmode"),
        ("postgresql://orthanc@db/orthanc?sslmode=maybe", "sslmode"),
        ("postgresql://orthanc@db/orthanc\n", "control"),
        ("postgresql://orthanc@db/" + "x" * 2000, "over 1000"),
        ("postgresql://orthanc@db/orthanc?" + "&".join(["sslmode=require"] * 9), "too many"),
        ("postgresql://orthanc@db/orth%00anc", "database"),
        ("postgresql://orth%0aanc@db/orthanc", "role"),
        ("postgresql://orthanc@bäd.example/orthanc", "not a host name"),
        ("postgresql://orthanc@[::1/orthanc", "IPv6"),
        ("postgresql://orthanc@db:port/orthanc", "(?i)port"),
    ],
)
def test_a_bad_url_is_refused_saying_why(url: str, says: str) -> None:
    with pytest.raises(OrthancPostgresUrlError, match=says) as info:
        parse_postgresql_url(url)
    assert "hunter2" not in str(info.value)


def test_a_good_url_gives_every_part_and_the_section_keeps_the_password_out() -> None:
    target = parse_postgresql_url("postgresql+psycopg://orthanc@10.0.0.5:6432/pacs?sslmode=require")
    assert (target.host, target.port, target.database, target.username, target.ssl) == (
        "10.0.0.5",
        6432,
        "pacs",
        "orthanc",
        True,
    )
    six = parse_postgresql_url("POSTGRESQL://orthanc@[::1]/pacs")
    assert (six.host, six.port, six.ssl) == ("::1", 5432, False)
    section = postgresql_section(target)
    assert section["Password"] == "${ORTHANC_POSTGRESQL_PASSWORD}"
    assert (section["EnableIndex"], section["EnableStorage"], section["Lock"]) == (
        True,
        True,
        False,
    )
    assert section["IndexConnectionsCount"] > 1
    # a variable not meant for a PACS is never written into a PACS's configuration
    with pytest.raises(OrthancPostgresUrlError, match="PACS or ORTHANC"):
        postgresql_section(target, password_env="OPENAI_API_KEY", inline_password=True)
    with pytest.raises(OrthancPostgresUrlError, match="2-100"):
        postgresql_section(target, index_connections=1)


def test_the_password_is_in_the_file_only_when_asked(tmp_path: Path) -> None:
    out = tmp_path / "orthanc.json"
    url = "postgresql://orthanc@db.example:5432/pacs"
    env = {"HOSPITAL_ORTHANC_DB_PASSWORD": "pg-secret-value"}
    proc = _config(tmp_path, ["--out", str(out), "--postgresql", url,
                              "--password-env", "HOSPITAL_ORTHANC_DB_PASSWORD"], **env)  # fmt: skip
    assert proc.exit_code == 0, proc.output
    text = out.read_text()
    assert "pg-secret-value" not in text + proc.output
    cfg = json.loads(text)
    assert cfg["PostgreSQL"]["Password"] == "${HOSPITAL_ORTHANC_DB_PASSWORD}"
    assert cfg["Plugins"][-2:] == DEBIAN_PG_PLUGINS
    assert all(Path(p).is_file() for p in cfg["Plugins"])  # Debian's paths, installed here
    proc = _config(tmp_path, ["--out", str(out), "--postgresql", url, "--inline-password",
                              "--password-env", "HOSPITAL_ORTHANC_DB_PASSWORD"], **env)  # fmt: skip
    assert proc.exit_code == 0, proc.output
    assert json.loads(out.read_text())["PostgreSQL"]["Password"] == "pg-secret-value"
    assert out.stat().st_mode & 0o077 == 0
    assert "pg-secret-value" not in proc.output
    proc = _config(tmp_path, ["--out", str(out), "--postgresql", url + "?sslmode=sometimes"])
    assert proc.exit_code != 0 and "sslmode" in proc.output


# ------------------------------------------------------------------ a real Orthanc on PostgreSQL


class _Orthanc:
    def __init__(
        self, tmp: Path, name: str, pg: str, *extra: str, password: str | None = None, **env: str
    ) -> None:
        """Rendered by ``pacs config --postgresql pg *extra`` (``env`` for it); started with
        ``password`` in ORTHANC_POSTGRESQL_PASSWORD, which the file names."""
        self.password = password
        self.http_port, self.dicom_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.storage = tmp / name / "storage"
        self.storage.mkdir(parents=True)
        self.config = tmp / name / "orthanc.json"
        self.log = tmp / name / "orthanc.log"
        argv = ["--out", str(self.config), "--postgresql", pg, "--storage", str(self.storage)]
        proc = _config(
            tmp,
            [*argv, *extra],
            NEUROSANDBOX_ORTHANC_HTTP_PORT=str(self.http_port),
            NEUROSANDBOX_ORTHANC_DICOM_PORT=str(self.dicom_port),
            NEUROSANDBOX_GATEWAY_DICOM_PORT=str(free_port()),
            NEUROSANDBOX_ORTHANC_STABLE_AGE="1",
            **env,
        )
        assert proc.exit_code == 0, proc.output
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = dcmtk_env()
        env.pop("ORTHANC_POSTGRESQL_PASSWORD", None)
        if self.password is not None:
            env["ORTHANC_POSTGRESQL_PASSWORD"] = self.password
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                ["Orthanc", str(self.config)], env=env, stdin=subprocess.DEVNULL,
                stdout=log, stderr=log, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                if self.get("/system").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"Orthanc did not answer: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc, 20)
            self.proc = None

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, auth=("neurosandbox", REST_PASSWORD), timeout=10)

    def stable_studies(self, wait_s: float) -> set[str]:
        """The studies /changes has a StableStudy for (waiting up to ``wait_s`` for one)."""
        deadline = time.monotonic() + wait_s
        while True:
            changes = self.get("/changes?limit=1000").json()["Changes"]
            stable = {c["ID"] for c in changes if c["ChangeType"] == "StableStudy"}
            if stable or time.monotonic() >= deadline:
                return stable
            time.sleep(0.1)

    def find_study(self, uid: str) -> list[str]:
        r = httpx.post(
            self.url + "/tools/find",
            json={"Level": "Study", "Query": {"StudyInstanceUID": uid}},
            auth=("neurosandbox", REST_PASSWORD),
            timeout=10,
        )
        r.raise_for_status()
        return list(r.json())


@pytest.fixture
def orthancs() -> Iterator[list[_Orthanc]]:
    started: list[_Orthanc] = []
    try:
        yield started
    finally:
        for o in started:
            o.stop()


def _role_with_password(server: LocalPostgres, db: URL) -> tuple[str, str]:
    """A new role owning ``db`` that must give its password over TCP (scram-sha-256: a line
    for that role and database alone heads pg_hba.conf, the server's other users keep trust)."""
    role, password = f"orthanc_{uuid.uuid4().hex[:10]}", secrets.token_urlsafe(18)
    hba = server.datadir / "pg_hba.conf"
    hba.write_text(f"host {db.database} {role} 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
    with psycopg.connect(host=db.host, port=db.port, user=db.username, dbname=db.database,
                         autocommit=True) as c:  # fmt: skip
        c.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(role), sql.Literal(password)))  # fmt: skip
        c.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(
            sql.Identifier(str(db.database)), sql.Identifier(role)))  # fmt: skip
        c.execute("SELECT pg_reload_conf()")
    deadline = time.monotonic() + 5
    while True:  # the reload is asynchronous: wait until a wrong password is refused
        try:
            psycopg.connect(host=db.host, port=db.port, user=role, dbname=db.database,
                            password="wrong", connect_timeout=2).close()  # fmt: skip
        except psycopg.OperationalError:
            return role, password
        assert time.monotonic() < deadline, "pg_hba.conf was not reloaded"
        time.sleep(0.05)


def test_an_orthanc_on_postgresql_keeps_a_study_across_a_restart_and_shares_it(
    pg_server: LocalPostgres, pg_url: str, tmp_path: Path, orthancs: list[_Orthanc]
) -> None:
    if shutil.which("Orthanc") is None or not all(Path(p).exists() for p in DEBIAN_PG_PLUGINS):
        pytest.skip("Orthanc or orthanc-postgresql is not installed (make setup)")
    db = make_url(fresh_pg_database(pg_url))
    role, password = _role_with_password(pg_server, db)
    pg = f"postgresql://{role}@{db.host}:{db.port}/{db.database}"
    # The file names the password's variable; Orthanc (and so the plugin) reads it at start.
    receiver = _Orthanc(tmp_path, "receiver", pg, password=password)
    assert password not in receiver.config.read_text()
    orthancs.append(receiver)
    receiver.start()
    study = make_study(tmp_path / "study", classes=("FLAIR",), n_slices=3, size=32)
    sent = subprocess.run(
        ["/usr/bin/storescu", "-aet", "NEUROSANDBOX", "-aec", "ORTHANC", "+sd", "+r", "-q",
         "127.0.0.1", str(receiver.dicom_port), str(tmp_path / "study")],
        env=dcmtk_env(), capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    [study_id] = receiver.find_study(study.study_uid)
    assert receiver.get(f"/studies/{study_id}/instances").json().__len__() == 3

    # The index and the files are the plugin's tables in PostgreSQL, not the storage folder.
    with psycopg.connect(host=db.host, port=db.port, user=role, password=password,
                         dbname=db.database) as c:  # fmt: skip
        instances = c.execute("SELECT count(*) FROM resources WHERE resourcetype = 3").fetchone()
        files = c.execute("SELECT count(*) FROM storagearea").fetchone()
    assert instances == (3,) and files is not None and files[0] >= 3
    assert not [p for p in receiver.storage.rglob("*") if p.is_file()]

    # Stability is the receiving Orthanc's own timer (in memory: a restart before StableAge
    # forgets it); the event it writes goes to the changes log in the database.
    assert study_id in receiver.stable_studies(wait_s=10)
    receiver.stop()
    receiver.start()
    assert receiver.find_study(study.study_uid) == [study_id]
    [instance] = receiver.get(f"/studies/{study_id}/instances").json()[:1]
    got = pydicom.dcmread(io.BytesIO(receiver.get(f"/instances/{instance['ID']}/file").content))
    sent_files = {ds.SOPInstanceUID: ds for ds in map(pydicom.dcmread, study.files)}
    assert got.PixelData == sent_files[got.SOPInstanceUID].PixelData

    # A second Orthanc on the same database (Lock off) serves reads of what the first received.
    # (rendered with the password written in, from the variable --password-env names)
    reader = _Orthanc(tmp_path, "reader", pg, "--reader", "--inline-password",
                      "--password-env", "HOSPITAL_ORTHANC_PG", HOSPITAL_ORTHANC_PG=password)  # fmt: skip
    orthancs.append(reader)
    reader.start()
    assert reader.find_study(study.study_uid) == [study_id]
    # a follower of any Orthanc of the database (the gateway's /changes) sees that event
    assert study_id in reader.stable_studies(wait_s=0)
    assert json.loads(reader.config.read_text())["SaveJobs"] is False
