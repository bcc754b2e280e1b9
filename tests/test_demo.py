"""`neurosandbox demo` end to end: real Orthanc, real storescu, reference models, reports, SR."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

NEUROSANDBOX = str(Path(sys.executable).with_name("neurosandbox"))


@pytest.mark.slow
@pytest.mark.integration
def test_demo_runs_every_step_and_writes_sr_and_pdf_back_into_orthanc(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "NEUROSANDBOX_DATA_DIR": str(tmp_path / "var"),
        "NEUROSANDBOX_CACHE_DIR": str(tmp_path / "cache"),
        "NEUROSANDBOX_RUNS_DIR": str(tmp_path / "runs"),
    }
    env.pop("NEUROSANDBOX_MODELS", None)
    out = tmp_path / "demo"
    try:
        proc = subprocess.run(
            [NEUROSANDBOX, "demo", "--cases", "2", "--out", str(out), "--keep"],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "demo finished" in proc.stderr
        summary = out / "report" / "summary.html"
        assert summary.exists() and (out / "report" / "summary.pdf").exists()
        cases = sorted((out / "report" / "cases").glob("*.pdf"))
        assert len(cases) == 2
        status = json.loads(
            subprocess.run(
                [NEUROSANDBOX, "pacs", "status", "--json"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout
        )
        password = status.get("password") or Path(status["password_file"]).read_text().strip()
        auth = (status["username"], password)
        url = status["orthanc_url"]
        studies = httpx.get(f"{url}/studies", auth=auth, timeout=30).json()
        assert len(studies) == 2
        for sid in studies:
            series = httpx.get(f"{url}/studies/{sid}/series", auth=auth, timeout=30).json()
            modalities = {s["MainDicomTags"].get("Modality") for s in series}
            # the phantom images, plus what the sandbox wrote back
            assert {"SR", "DOC"} <= modalities, modalities
        instances = len(httpx.get(f"{url}/instances", auth=auth, timeout=30).json())

        # A second run with the same inputs reuses everything and writes nothing twice.
        again = subprocess.run(
            [NEUROSANDBOX, "demo", "--cases", "2", "--out", str(out), "--keep"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert again.returncode == 0, again.stderr[-3000:]
        text = " ".join(again.stderr.split())
        assert "reusing 2 cases" in text and "0 sent, 2 already in Orthanc" in text
        assert "reusing run" in text and "already written: reusing it" in text
        assert "instances from this run already in Orthanc" in text
        assert len(httpx.get(f"{url}/instances", auth=auth, timeout=30).json()) == instances
        assert len(list((out / "runs").iterdir())) == 1
        assert (out / "report" / "summary.pdf").exists()
    finally:
        subprocess.run(
            [NEUROSANDBOX, "pacs", "down"], env=env, capture_output=True, timeout=60, check=False
        )
