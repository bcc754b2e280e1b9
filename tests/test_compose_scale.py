"""compose.yaml's `scale` profile, checked statically (no container engine runs here): its
services and profile, workers that come back, no secret written into the file, and the
Orthanc configuration its one-shot service renders with our own CLI is the one the Orthanc
service starts from (PostgreSQL index and storage, Lock off, the password left to Orthanc's
environment, which the service's command fills from a secret file)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from gateway.cli import app
from gateway.orthanc_pg import DEBIAN_PG_PLUGINS
from gateway.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
SCALE = {"postgres", "scale-orthanc-config", "orthanc-pg", "scale-gateway", "worker"}
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY|CREDENTIAL", re.IGNORECASE)


def _compose() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "compose.yaml").read_text()))


def _command(service: dict[str, Any]) -> str:
    cmd = service.get("command") or []
    return cmd if isinstance(cmd, str) else " ".join(map(str, cmd))


def _workers(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        name: s
        for name, s in compose["services"].items()
        if re.search(r"\bneurosandbox worker\b", _command(s))
    }


def test_the_scale_profile_holds_postgresql_orthanc_the_gateway_and_workers() -> None:
    compose = _compose()
    services = compose["services"]
    in_scale = {n for n, s in services.items() if "scale" in (s.get("profiles") or [])}
    assert in_scale == SCALE
    # the one-machine default is untouched: no profile, so `docker compose up` starts it alone
    assert {"orthanc-config", "orthanc", "gateway"} <= {
        n for n, s in services.items() if not s.get("profiles")
    }
    for name in SCALE:  # a scale service never depends on a default one (and back)
        assert set(services[name].get("depends_on") or {}) <= SCALE, name
    assert "neurosandbox serve" in _command(services["scale-gateway"])
    workers = _workers(compose)
    assert workers, "no service runs `neurosandbox worker`"
    assert sum(int((w.get("deploy") or {}).get("replicas", 1)) for w in workers.values()) >= 2
    for name, w in workers.items():
        assert w.get("restart") in ("unless-stopped", "always"), name
        assert set(w["depends_on"]) >= {"postgres"}, name
    assert services["postgres"]["image"].startswith("postgres:")


def test_the_gateway_and_workers_share_the_run_log_database_by_its_setting() -> None:
    compose = _compose()
    services = compose["services"]
    assert "database_url" in Settings.model_fields  # NEUROSANDBOX_DATABASE_URL
    pg_env = services["postgres"]["environment"]
    for name in ["scale-gateway", *_workers(compose)]:
        url = services[name]["environment"]["NEUROSANDBOX_DATABASE_URL"]
        assert re.fullmatch(
            rf"postgresql\+psycopg://{pg_env['POSTGRES_USER']}@postgres:5432/"
            rf"{pg_env['POSTGRES_DB']}",
            url,
        ), (name, url)
        assert services[name]["environment"]["NEUROSANDBOX_ORTHANC_URL"] == (
            "http://orthanc-pg:8042"
        )
        # the runs the workers write are where the gateway's review pages read them
        shared = services[name]["environment"]["NEUROSANDBOX_SHARED_DIR"]
        assert f"scale-shared:{shared}" in services[name]["volumes"], name
    assert "shared_dir" in Settings.model_fields


def test_no_secret_is_written_in_the_compose_file() -> None:
    compose = _compose()
    declared = compose["secrets"]
    for secret in declared.values():
        assert secret["file"].startswith("./deploy/secrets/")  # git-ignored, the operator's
    for name, service in compose["services"].items():
        env = service.get("environment") or {}
        for key, value in env.items():
            if SECRET_NAME.search(key):
                assert key.endswith("_FILE") and str(value).startswith("/run/secrets/"), (
                    name,
                    key,
                )
            assert not re.search(r"://[^/@\s]*:[^/@\s]*@", str(value)), (name, key)
        text = _command(service)
        assert not re.search(r"://[^/@\s]*:[^/@\s]*@", text), name
        assert not re.search(r"(PASSWORD|PGPASSWORD)=(?![\"']?\$\$\(cat /run/secrets/)", text), name
        # every secret file a service reads is one it is given
        used = set(re.findall(r"/run/secrets/([A-Za-z0-9_]+)", text + json.dumps(env)))
        assert used <= set(service.get("secrets") or []), (name, used)
        assert set(service.get("secrets") or []) <= set(declared), name
        for env_file in service.get("env_file") or []:
            path = env_file["path"] if isinstance(env_file, dict) else env_file
            assert path.startswith("./deploy/secrets/"), (name, path)


def test_orthanc_starts_from_the_configuration_the_command_renders(tmp_path: Path) -> None:
    compose = _compose()
    services = compose["services"]
    config_service, orthanc = services["scale-orthanc-config"], services["orthanc-pg"]
    argv = list(map(str, config_service["command"]))
    assert argv[:3] == ["neurosandbox", "pacs", "config"]
    [out_arg] = [a for a in argv if a.startswith("--out=")]
    out_in_container = Path(out_arg.removeprefix("--out="))
    out = tmp_path / "orthanc.json"
    secret = tmp_path / "orthanc_password"
    secret.write_text("rest-password-from-the-secret\n")
    env = {k: str(v) for k, v in config_service["environment"].items()}
    env |= {"NEUROSANDBOX_ORTHANC_PASSWORD_FILE": str(secret),
            "NEUROSANDBOX_DATA_DIR": str(tmp_path / "data")}  # fmt: skip
    result = CliRunner().invoke(
        app, [a if a != out_arg else f"--out={out}" for a in argv[1:]], env=env
    )
    assert result.exit_code == 0, result.output
    cfg = json.loads(out.read_text())
    pg = cfg["PostgreSQL"]
    assert (pg["EnableIndex"], pg["EnableStorage"], pg["Lock"]) == (True, True, False)
    assert pg["IndexConnectionsCount"] > 1
    assert (pg["Host"], pg["Port"], pg["Username"]) == ("postgres", 5432, "neurosandbox")
    # the database Orthanc names is the one the postgres service creates on its first start
    [init] = [v for v in services["postgres"]["volumes"] if "docker-entrypoint-initdb.d" in v]
    init_sql = (ROOT / init.split(":")[0]).read_text()
    assert re.search(rf"CREATE DATABASE {pg['Database']}\b", init_sql)
    # the password is left to Orthanc's environment, which the Orthanc service fills
    [variable] = re.fullmatch(r"\$\{([A-Z0-9_]+)\}", pg["Password"]).groups()  # type: ignore[union-attr]
    assert re.search(rf"\b{variable}=\"\$\$\(cat /run/secrets/", _command(orthanc))
    # Debian's plugin paths, which the Orthanc image installs from Debian's packages
    assert cfg["Plugins"][-2:] == DEBIAN_PG_PLUGINS
    build = orthanc["build"]
    dockerfile = (ROOT / build["context"] / build["dockerfile"]).read_text()
    assert re.search(r"apt-get install[^\n]*\borthanc-postgresql\b", dockerfile)
    assert re.search(r"FROM debian:bookworm", dockerfile)
    # the Orthanc service mounts the rendered file's volume and starts from that file
    [cfg_volume] = [
        v for v in config_service["volumes"] if v.endswith(f":{out_in_container.parent}")
    ]
    volume_name = cfg_volume.split(":")[0]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in orthanc["volumes"]}
    assert mounts[volume_name] == str(out_in_container.parent)
    assert re.search(rf"exec Orthanc {re.escape(str(out_in_container))}$", _command(orthanc))
    # the gateway is the one DICOM peer, at its fixed address on the scale network
    gateway_ip = services["scale-gateway"]["networks"]["scale"]["ipv4_address"]
    [peer] = cfg["DicomModalities"].values()
    assert (peer["AET"], peer["Host"]) == ("NEUROSANDBOX", gateway_ip)
    assert cfg["RegisteredUsers"] == {"neurosandbox": "rest-password-from-the-secret"}


def test_the_worker_unit_restarts_always_and_holds_no_password(tmp_path: Path) -> None:
    unit_file = ROOT / "deploy" / "systemd" / "neurosandbox-worker@.service"
    text = unit_file.read_text()
    keys = dict(line.split("=", 1) for line in text.splitlines() if re.match(r"^[A-Za-z]+=", line))
    assert keys["Restart"] == "always"
    assert keys["ExecStart"].endswith("/neurosandbox worker")
    assert not re.search(r"://[^/@\s]*:[^/@\s]*@", text)  # no password in a URL
    assert "PGPASSFILE=%d/pgpass" in text and keys["LoadCredential"].startswith("pgpass:")
    if shutil.which("systemd-analyze") is None:
        return
    instance = tmp_path / "neurosandbox-worker@1.service"
    shutil.copy(unit_file, tmp_path / unit_file.name)
    instance.symlink_to(tmp_path / unit_file.name)
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(instance)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    # the one complaint here: the install path of the executable does not exist on this host
    complaints = [
        line
        for line in (proc.stdout + proc.stderr).splitlines()
        if line.strip() and "/opt/neurosandbox/.venv/bin/neurosandbox is not executable" not in line
    ]
    assert not complaints, complaints
