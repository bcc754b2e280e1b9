"""`neurosandbox demo` end to end through the product: real Orthanc, the gateway (DICOM node,
pipeline, API) as a process, real storescu, reference models, reports, SR, review queue."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import httpx
import pytest
from gateway_process import BIN

from gateway.runs import StudyRunStore

NEUROSANDBOX = str(BIN)


def _status(env: dict[str, str]) -> dict[str, str]:
    proc = subprocess.run([NEUROSANDBOX, "pacs", "status", "--json"], env=env,
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.integration
def test_demo_runs_through_the_gateway_and_writes_sr_and_pdf_back_into_orthanc(
    tmp_path: Path,
) -> None:
    env = {
        **os.environ,
        "NEUROSANDBOX_DATA_DIR": str(tmp_path / "var"),
        "NEUROSANDBOX_CACHE_DIR": str(tmp_path / "cache"),
        "NEUROSANDBOX_OUT": str(tmp_path / "out"),
    }
    for name in ("NEUROSANDBOX_MODELS", "NEUROSANDBOX_RUNS_DIR", "NEUROSANDBOX_CASES"):
        env.pop(name, None)
    out = tmp_path / "out" / "demo"  # NEUROSANDBOX_OUT/demo: no --out
    try:
        proc = subprocess.run(
            [NEUROSANDBOX, "demo", "--cases", "2", "--keep"],
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
        for row in board.values():  # scored against the registered cases' truth, with a CI
            acc = row["accuracy"]
            assert row["n_scored"] > 0 and acc["low"] <= acc["value"] <= acc["high"]
        assert len(sorted((out / "report" / "cases").glob("*.pdf"))) == 2

        # The studies went through the gateway's DICOM node: its log has one association per
        # study from the demo's AE, and its pipeline one run per study, from C-STORE.
        log = (tmp_path / "var" / "gateway.log").read_text()
        assert log.count("association released") == 2, log[-2000:]
        runs = StudyRunStore(tmp_path / "var").list()
        assert len(runs) == 2 and {r.trigger for r in runs} == {"dicom"}
        assert {r.status for r in runs} == {"done"}
        suite = {json.loads(c.read_text())["provenance"]["study_uids"][0]
                 for c in (out / "suite").glob("*/case.json")}  # fmt: skip
        assert {r.study_uid for r in runs} == suite

        # Their SR and PDF are in Orthanc ...
        status = _status(env)
        password = status.get("password") or Path(status["password_file"]).read_text().strip()
        auth = (status["username"], password)
        url = status["orthanc_url"]
        studies = httpx.get(f"{url}/studies", auth=auth, timeout=30).json()
        assert len(studies) == 2
        for sid in studies:
            series = httpx.get(f"{url}/studies/{sid}/series", auth=auth, timeout=30).json()
            modalities = {s["MainDicomTags"].get("Modality") for s in series}
            assert {"SR", "DOC"} <= modalities, modalities  # the phantom images, plus ours
        instances = len(httpx.get(f"{url}/instances", auth=auth, timeout=30).json())
        # ... and their cases in the review queue, for the reviewer token the demo printed.
        token = re.search(r"reviewer token (nsbx_[A-Za-z0-9_-]+)", printed)
        api = re.search(r"review queue: (http://127\.0\.0\.1:\d+)/review", printed)
        assert token and api, printed[-1500:]
        queue = httpx.get(
            f"{api.group(1)}/review",
            headers={"Authorization": f"Bearer {token.group(1)}"},
            timeout=30,
        )
        assert queue.status_code == 200
        for r in runs:
            assert r.run_id in queue.text
        # `runs list` finds the gateway's runs (the runs folder defaults to NEUROSANDBOX_OUT)
        listed = subprocess.run([NEUROSANDBOX, "runs", "list"], env=env, capture_output=True,
                                text=True, timeout=60, check=False)  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        for r in runs:
            assert r.run_id[:12] in listed.stdout + listed.stderr

        # A second run with the same inputs reuses everything and sends nothing; without KEEP
        # it stops the gateway and Orthanc at the end.
        env.pop("KEEP", None)
        again = subprocess.run(
            [NEUROSANDBOX, "demo", "--cases", "2"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert again.returncode == 0, again.stderr[-3000:]
        text = " ".join(again.stderr.split())
        assert "reusing 2 cases" in text and "2 studies already evaluated" in text
        assert "(0 sent and evaluated, 2 reused)" in text
        assert "already written: reusing it" in text
        assert "gateway and Orthanc stopped" in text
        assert len(StudyRunStore(tmp_path / "var").list()) == 2
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
