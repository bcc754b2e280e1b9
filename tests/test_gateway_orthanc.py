"""The PACS side against a real Orthanc (Debian package): CLI status, REST client, /changes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pydicom
import pytest
from gateway_synth import make_study
from orthanc_fixture import OrthancServer

from gateway.cache import InstanceCache
from gateway.follower import ChangesFollower
from gateway.orthanc import OrthancClient, OrthancError
from gateway.pacs_local import dcmtk_env

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def client(orthanc_server: OrthancServer) -> OrthancClient:
    ep = orthanc_server.endpoints
    return OrthancClient(ep.orthanc_url, ep.username, orthanc_server.password, timeout_s=60)


@pytest.fixture(scope="module")
def stored(client: OrthancClient, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    study = make_study(
        tmp_path_factory.mktemp("orthanc-src"), lesion="right", patient_id="NSBX-ORTHANC"
    )
    ids = client.upload_many(study.files)
    assert len(set(ids)) == len(study.files)
    return study


def test_pacs_status_json_tells_scripts_where_everything_is(orthanc_server: OrthancServer) -> None:
    env = dict(os.environ, **orthanc_server.env)
    r = subprocess.run(
        [str(Path(sys.executable).parent / "neurosandbox"), "pacs", "status", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout)
    for key in (
        "orthanc_url",
        "username",
        "password_file",
        "orthanc_dicom_port",
        "orthanc_aet",
        "gateway_aet",
        "gateway_dicom_port",
        "api_url",
    ):
        assert key in status, key
    assert status["running"] and status["reachable"] and status["orthanc_version"]
    assert "password" not in status
    secret = Path(status["password_file"])
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert secret.read_text().strip() == orthanc_server.password
    # Authentication is on: no credentials, no data.
    assert httpx.get(f"{status['orthanc_url']}/studies", timeout=10).status_code == 401


def test_client_lists_with_series_classes_and_fetches_by_sop_uid(
    client: OrthancClient,
    stored,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    patients = client.list_patients()
    assert "NSBX-ORTHANC" in [p.patient_id for p in patients]
    study_id = client.find_study(stored.study_uid)
    assert study_id is not None
    series = client.list_series(study_id)
    assert sorted(s.series_class for s in series) == ["FLAIR", "T2"]
    flair = next(s for s in series if s.series_class == "FLAIR")
    assert flair.n_instances == 6 and "TI 2500" in flair.stacks[0].reason
    cache = InstanceCache(tmp_path / "cache")
    paths = client.fetch_series(flair.orthanc_id, cache, tmp_path / "task")
    assert len(paths) == 6
    for p in paths:
        ds = pydicom.dcmread(p)
        assert p.name == f"{ds.SOPInstanceUID}.dcm" and ds.SeriesInstanceUID == flair.series_uid
        key = next(
            k for k in client.series_instances(flair.orthanc_id) if k.sop_uid == ds.SOPInstanceUID
        )
        assert cache.path(key).stat().st_ino == p.stat().st_ino  # linked, not copied
    with pytest.raises(OrthancError) as exc:
        client.study("00000000-00000000-00000000-00000000-00000000")
    assert exc.value.status == 404


def test_changes_follower_sees_a_study_become_stable(client: OrthancClient, tmp_path: Path) -> None:
    since = int(client.get_json("/changes", {"last": ""})["Last"])
    study = make_study(tmp_path / "src", classes=("T1",), n_slices=2, patient_id="NSBX-STABLE")
    client.upload_many(study.files)
    seen: list[str] = []
    follower = ChangesFollower(client, seen.append, tmp_path / "changes.json")
    deadline = time.monotonic() + 30
    target = client.find_study(study.study_uid)
    while target not in seen and time.monotonic() < deadline:
        since, _done = follower.poll_once(since)
        time.sleep(0.5)
    assert target in seen
    assert json.loads((tmp_path / "changes.json").read_text())["last"] == since


def test_orthanc_runs_without_nagle_stalls(orthanc_server: OrthancServer) -> None:
    """Debian's dcmtk inside Orthanc keeps Nagle on unless TCP_NODELAY=1 (60 ms per C-STORE)."""
    pid = orthanc_server.pacs.pid()
    assert pid is not None
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert b"TCP_NODELAY=1" in environ


def test_rendered_orthanc_config_is_locked_down_and_refuses_unknown_senders(
    orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    env = dict(os.environ, **orthanc_server.env)
    out = tmp_path / "orthanc.json"
    r = subprocess.run(
        [str(Path(sys.executable).parent / "neurosandbox"), "pacs", "config", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    config = json.loads(out.read_text())
    assert stat.S_IMODE(out.stat().st_mode) == 0o600  # it holds the password
    assert config["AuthenticationEnabled"] is True
    assert config["RegisteredUsers"] == {orthanc_server.endpoints.username: orthanc_server.password}
    assert config["RemoteAccessAllowed"] is False
    assert config["DicomAlwaysAllowStore"] is False and config["DicomCheckCalledAet"] is True
    (gateway,) = config["DicomModalities"].values()  # the only peer Orthanc accepts
    assert gateway["AET"] == "NEUROSANDBOX" and gateway["AllowStore"] is True

    # The running Orthanc (same template, `pacs up`): an unknown calling AE stores nothing,
    # the gateway's AE does.
    ep = orthanc_server.endpoints
    client = OrthancClient(ep.orthanc_url, ep.username, orthanc_server.password, timeout_s=60)
    intruder = make_study(tmp_path / "intruder", n_slices=1, classes=("T1",))
    friend = make_study(tmp_path / "friend", n_slices=1, classes=("T1",))

    def storescu(aet: str, files: list[Path]) -> subprocess.CompletedProcess[str]:
        cmd = ["/usr/bin/storescu", "-aet", aet, "-aec", ep.orthanc_aet, "127.0.0.1"]
        return subprocess.run(
            [*cmd, str(ep.orthanc_dicom_port), *map(str, files)],
            capture_output=True,
            text=True,
            timeout=60,
            env=dcmtk_env(),
        )

    refused = storescu("INTRUDER", intruder.files)
    assert client.find_study(intruder.study_uid) is None, refused.stderr
    assert refused.returncode != 0 and "Store Failed" in refused.stderr  # Orthanc aborts it
    accepted = storescu(ep.gateway_aet, friend.files)
    assert accepted.returncode == 0, accepted.stderr
    assert client.find_study(friend.study_uid) is not None
    client.close()
