"""A real Orthanc (the Debian package) for the test session, on free loopback ports.

Started once through ``gateway.pacs_local`` (the code under test for ``neurosandbox pacs``),
stopped by PID at the end of the session. Skips when Orthanc is not installed.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.pacs_local import Endpoints, LocalPacs, free_port
from gateway.settings import Settings

STABLE_AGE = 2  # seconds; Orthanc's default (60) would make every test wait a minute


@dataclass
class OrthancServer:
    settings: Settings
    endpoints: Endpoints
    password: str
    pacs: LocalPacs

    @property
    def env(self) -> dict[str, str]:
        """Environment for a ``neurosandbox`` subprocess using this Orthanc and data folder."""
        ep = self.endpoints
        return {
            "NEUROSANDBOX_DATA_DIR": str(self.settings.data_dir),
            "NEUROSANDBOX_ORTHANC_STABLE_AGE": str(STABLE_AGE),
            "NEUROSANDBOX_GATEWAY_DICOM_PORT": str(ep.gateway_dicom_port),
            "NEUROSANDBOX_API_PORT": str(ep.api_port),
        }


@pytest.fixture(scope="session")
def orthanc_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OrthancServer]:
    if shutil.which("Orthanc") is None:
        pytest.skip("Orthanc is not installed (apt-get install orthanc orthanc-dicomweb)")
    data = tmp_path_factory.mktemp("nsbx-data")
    settings = Settings(
        data_dir=data,
        orthanc_stable_age=STABLE_AGE,
        orthanc_http_port=free_port(),
        orthanc_dicom_port=free_port(),
        gateway_dicom_port=free_port(),
        api_port=free_port(),
    )
    pacs = LocalPacs(settings)
    endpoints = pacs.up(timeout_s=60)
    try:
        yield OrthancServer(settings, endpoints, pacs.password(), pacs)
    finally:
        pacs.down()


def orthanc_log(server: OrthancServer) -> str:
    path: Path = server.pacs.log_file
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""
