"""compose.yaml and deploy/Dockerfile, checked where they can be without a container engine.

No container engine can pull images here, so neither file is run. What is ours in them is
checked for real: every NEUROSANDBOX_* variable is a setting the gateway reads, every file they
name exists, host ports stay on loopback, and the one-shot `orthanc-config` service's command is
run through our own CLI with the compose environment, giving the Orthanc configuration the
orthanc service would start with.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from gateway.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
NEUROSANDBOX = str(Path(sys.executable).with_name("neurosandbox"))


def _compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())  # type: ignore[no-any-return]


def _env(service: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in (service.get("environment") or {}).items()}


def test_every_gateway_variable_in_compose_and_dockerfile_is_a_setting() -> None:
    known = {f"NEUROSANDBOX_{name.upper()}" for name in Settings.model_fields}
    compose = _compose()
    used = set()
    for service in compose["services"].values():
        used |= {k for k in _env(service) if k.startswith("NEUROSANDBOX_")}
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    used |= set(re.findall(r"\b(NEUROSANDBOX_[A-Z0-9_]+)=", dockerfile))
    assert used, "no settings found: the parser is wrong"
    assert used <= known, f"not settings of gateway/settings.py: {sorted(used - known)}"


def test_compose_files_exist_and_host_ports_stay_on_loopback() -> None:
    compose = _compose()
    for name, service in compose["services"].items():
        build = service.get("build")
        if build:
            assert (ROOT / build["context"] / build["dockerfile"]).is_file(), name
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
    for secret in compose["secrets"].values():  # created by the operator, never committed
        assert secret["file"].startswith("./deploy/secrets/")
    assert "deploy/secrets" in (ROOT / ".gitignore").read_text()
    for line in (ROOT / "deploy" / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                assert (ROOT / src).exists(), f"Dockerfile copies {src}, which does not exist"


def test_the_orthanc_config_service_renders_a_locked_down_orthanc(tmp_path: Path) -> None:
    compose = _compose()
    service = compose["services"]["orthanc-config"]
    secret = tmp_path / "orthanc_password"
    secret.write_text("s3cret-from-the-secret-file\n")
    env = {**os.environ, **_env(service)}
    env["NEUROSANDBOX_ORTHANC_PASSWORD_FILE"] = str(secret)  # /run/secrets/... in the container
    env["NEUROSANDBOX_DATA_DIR"] = str(tmp_path / "data")
    out = tmp_path / "orthanc.json"
    argv = [a.replace("--out=/config/orthanc.json", f"--out={out}") for a in service["command"]]
    assert argv[0] == "neurosandbox"
    proc = subprocess.run(
        [NEUROSANDBOX, *argv[1:]], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_mode & 0o077 == 0  # the password is in it
    cfg = json.loads(out.read_text())
    assert cfg["AuthenticationEnabled"] is True
    assert cfg["RegisteredUsers"] == {"neurosandbox": "s3cret-from-the-secret-file"}
    assert cfg["RemoteAccessAllowed"] is True  # the gateway calls REST over the private network
    assert cfg["DicomAlwaysAllowStore"] is False
    assert cfg["DicomAet"] == env["NEUROSANDBOX_ORTHANC_AET"]
    assert int(cfg["DicomPort"]) == int(env["NEUROSANDBOX_ORTHANC_DICOM_PORT"])
    assert int(cfg["StableAge"]) == int(env["NEUROSANDBOX_ORTHANC_STABLE_AGE"])
    # The gateway is the one peer, at its fixed address on the compose network.
    gateway_ip = compose["services"]["gateway"]["networks"]["pacs"]["ipv4_address"]
    [(aet, host, port, *_rest)] = [
        (v["AET"], v["Host"], v["Port"]) if isinstance(v, dict) else tuple(v)
        for v in cfg["DicomModalities"].values()
    ]
    assert (aet, host, int(port)) == ("NEUROSANDBOX", gateway_ip, 11112)
    assert cfg["StorageDirectory"] == "/var/lib/orthanc/db"
    assert any("/usr/local/share/orthanc/plugins" in p for p in cfg["Plugins"])
