"""One stuck evaluation never stops the queue: each runs in a worker process that is stopped at
the run deadline (NEUROSANDBOX_RUN_DEADLINE_S); the run fails saying so, in the API and in the
review queue, and the next study is evaluated.

Real peers: dcmtk storescu -> `neurosandbox serve` -> the session's Orthanc. Study A comes from
an AE the routing file sends to a model whose (loopback, OpenAI-compatible) server never
answers; study B, sent right after, goes to the reference model. The worker process alone
(ProcessEvaluator): tests/test_run_deadline_worker.py.
"""

from __future__ import annotations

import html
import re
import time
from pathlib import Path
from typing import Any

import pytest
from gateway_process import Gateway, running_gateway, send
from gateway_synth import make_study
from guard import procs, spawned_workers
from openai_server import OpenAIServer, Script
from orthanc_fixture import OrthancServer

from gateway.auth import Role, TokenStore

QUIET = 1.5
DEADLINE = 35.0  # s: A's worker imports ~6 s, litellm ~7 s more (busy 2 cores); B's is warm by then
REASON = f"evaluation exceeded the {DEADLINE:g} s deadline: worker stopped"
ROUTING = """rules:
  - name: stuck-model
    match: {calling_aet: ["HANG_*"]}
    evaluate: {models: [stuck-vlm], tasks: [differential], series_classes: [FLAIR, T2]}
  - name: mr
    match: {modality: [MR]}
    evaluate: {models: [reference/image-rules], tasks: [differential], series_classes: [FLAIR, T2]}
"""


def _runs_of(gw: Gateway, study_uid: str) -> list[dict[str, Any]]:
    return [r for r in gw.get("/runs", gw.reviewer).json() if r["study_uid"] == study_uid]


@pytest.mark.integration
def test_a_stuck_evaluation_is_stopped_at_the_deadline_and_the_next_study_goes_on(
    orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    tokens = TokenStore(orthanc_server.settings.data_dir / "secret" / "tokens.json")
    reviewer = tokens.create(Role.REVIEWER, "deadline-reviewer", "Reviewer^Deadline")[1]
    admin = tokens.create(Role.ADMIN, "deadline-admin")[1]
    routing = tmp_path / "routing.yaml"
    routing.write_text(ROUTING)
    a = make_study(tmp_path / "a", lesion="left", patient_id="NSBX-STUCK-A")
    b = make_study(tmp_path / "b", lesion="right", patient_id="NSBX-NEXT-B")
    with OpenAIServer(Script(hold_after=0)) as server:  # holds every request, never answers
        models = tmp_path / "models.yaml"
        models.write_text(
            f"models:\n  - name: stuck-vlm\n    model: openai/stuck\n"
            f"    api_base: {server.url}\n    max_retries: 0\n"
        )
        with running_gateway(
            orthanc_server, tmp_path / "serve.log", reviewer, admin,
            NEUROSANDBOX_STUDY_QUIET_S=str(QUIET), NEUROSANDBOX_ROUTING_FILE=str(routing),
            NEUROSANDBOX_MODELS_FILE=str(models), NEUROSANDBOX_RUN_DEADLINE_S=str(DEADLINE),
        ) as gw:  # fmt: skip
            t0 = time.monotonic()
            send(gw, a.files, "-aet", "HANG_SCANNER")  # the last -aet wins
            send(gw, b.files)
            # A's run, and the worker processes seen while it is not finished
            seen: set[int] = set()
            run_a: dict[str, Any] = {}
            until = t0 + QUIET + DEADLINE + 60
            while time.monotonic() < until:
                found = _runs_of(gw, a.study_uid)
                run_a = found[0] if found else {}
                if run_a.get("status") in ("done", "failed", "skipped"):
                    break
                seen |= spawned_workers(gw.proc.pid)
                time.sleep(0.2)
            took_a = time.monotonic() - t0
            log = gw.log.read_text()[-3000:]
            assert run_a.get("status") == "failed", (run_a, log)
            assert run_a["error"] == REASON, (run_a, log)
            assert server.stats.calls >= 1  # it was stuck in the model call
            assert seen, "the evaluation did not run in a worker process"

            # The next study was evaluated after it, with the reference model.
            run_b = gw.wait_run(_runs_of(gw, b.study_uid)[0]["run_id"], timeout=DEADLINE + 60)
            took_b = time.monotonic() - t0
            assert run_b["status"] == "done", (run_b, gw.log.read_text()[-3000:])
            assert run_b["route"]["models"] == ["reference/image-rules"]
            assert run_b["started_at"] >= run_a["finished_at"]

            # No worker left but the idle gateway's one spare (NEUROSANDBOX_WARM_WORKER): A's
            # was stopped with its process group, B's ended.
            until = time.monotonic() + 15
            while len(spawned_workers(gw.proc.pid)) > 1 and time.monotonic() < until:
                time.sleep(0.2)
            left = spawned_workers(gw.proc.pid)
            assert len(left) <= 1 and not left & seen, (left, seen)
            alive = procs()
            assert not [p for p in alive if p[0] in seen or p[2] in seen], alive

            # The review queue lists A's run as failed, with the reason.
            page = gw.get("/review", gw.reviewer)
            assert page.status_code == 200
            row = re.search(rf'data-gateway-run="{run_a["run_id"]}".*?</tr>', page.text, flags=re.S)
            assert row and REASON in html.unescape(row.group(0)), page.text[-3000:]
    print(f"A failed after {took_a:.1f} s (deadline {DEADLINE:g} s), B done after {took_b:.1f} s")
    assert took_a < QUIET + DEADLINE + 30
