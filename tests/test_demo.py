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


def _status(env: dict[str, str]) -> dict[str, str]:
    proc = subprocess.run([NEUROSANDBOX, "pacs", "status", "--json"], env=env,
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


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
        printed = " ".join((proc.stdout + proc.stderr).split())
        assert "leaderboard (bootstrap 95% CI over patients)" in printed
        assert "Orthanc keeps running: http://127.0.0.1:" in printed  # --keep: URL and user
        summary = out / "report" / "summary.html"
        assert summary.exists() and (out / "report" / "summary.pdf").exists()
        data = json.loads((out / "report" / "summary.json").read_text())
        assert data["models"] == ["reference/image-rules", "reference/text-prior"]
        # every task family ran (the demo's small suite has no L3 case, so no multi-turn)
        assert {"classification", "differential", "lesion", "rationale"} <= set(data["families"])
        board = {row["model"]: row for row in data["summary"]["leaderboard"]}
        for row in board.values():  # scored, with a confidence interval over patients
            acc = row["accuracy"]
            assert row["n_scored"] > 0 and acc["low"] <= acc["value"] <= acc["high"]
        cases = sorted((out / "report" / "cases").glob("*.pdf"))
        assert len(cases) == 2
        assert len(list((out / "report" / "cases").glob("*.json"))) == 2
        status = _status(env)
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

        # A second run with the same inputs reuses everything and writes nothing twice; without
        # KEEP it stops Orthanc at the end.
        env.pop("KEEP", None)
        again = subprocess.run(
            [NEUROSANDBOX, "demo", "--cases", "2", "--out", str(out)],
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
        assert "Orthanc stopped" in text
        assert len(list((out / "runs").iterdir())) == 1
        assert (out / "report" / "summary.pdf").exists()
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/instances", auth=auth, timeout=5)
        # Orthanc's storage outlives it: started again, it holds the same instances.
        subprocess.run([NEUROSANDBOX, "pacs", "up"], env=env, capture_output=True, timeout=120,
                       check=True)  # fmt: skip
        url = _status(env)["orthanc_url"]  # the ports are chosen afresh at each start
        assert len(httpx.get(f"{url}/instances", auth=auth, timeout=30).json()) == instances
    finally:
        subprocess.run(
            [NEUROSANDBOX, "pacs", "down"], env=env, capture_output=True, timeout=60, check=False
        )
