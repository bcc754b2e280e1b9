"""The API's dry run, ``POST /studies/{id}/evaluations/estimate``, against a real Orthanc: the
routed series fetched and rendered as an evaluation would, nothing sent, no run recorded; its
calls are the calls the gateway's own evaluation of that study sends (counted at the loopback
server, through litellm), its tokens within 10% of what the server counted."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from gateway_synth import make_study
from openai_server import OpenAIServer, Script
from openai_usage import openai_usage
from orthanc_fixture import OrthancServer

from evaluation import TaskFamily
from gateway.api import GatewayContext, create_app
from gateway.audit import AuditLog
from gateway.auth import Role, TokenStore
from gateway.cache import InstanceCache
from gateway.orthanc import OrthancClient
from gateway.pipeline import StudyPipeline
from gateway.routing import CLINICAL, Route, Router
from gateway.runs import StudyRunStore
from gateway.study_run import DefaultEvaluator

pytestmark = pytest.mark.integration
MODELS_FILE = """models:
  - name: ward-vlm
    model: openai/gpt-4o
    api_base: {url}
    concurrency: 2
"""


def test_the_api_dry_run_counts_what_the_evaluation_sends(
    orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    ep = orthanc_server.endpoints
    orthanc = OrthancClient(ep.orthanc_url, ep.username, orthanc_server.password, timeout_s=60)
    study = make_study(tmp_path / "src", lesion="right", patient_id="NSBX-BUDGET-1")
    orthanc.upload_many(study.files)
    (orthanc_id,) = [
        s.orthanc_id for s in orthanc.list_studies() if s.patient_id == "NSBX-BUDGET-1"
    ]
    data = tmp_path / "data"
    with OpenAIServer(Script(usage=openai_usage)) as server:
        models = tmp_path / "models.yaml"
        models.write_text(MODELS_FILE.format(url=server.url))
        settings = orthanc_server.settings.model_copy(
            update={"data_dir": data, "models_file": models, "cache_dir": tmp_path / "cache"}
        )
        runs, tokens = StudyRunStore(data), TokenStore(data / "tokens.json")
        admin = tokens.create(Role.ADMIN, "budget")[1]
        reviewer = tokens.create(Role.REVIEWER, "budget")[1]
        ctx = GatewayContext(settings, orthanc, runs, AuditLog(data / "audit.jsonl"), tokens)
        evaluator = DefaultEvaluator(settings)
        # a pipeline that is never started: nothing is evaluated behind the test's back
        ctx.pipeline = StudyPipeline(
            orthanc, evaluator, Router(), runs, ctx.audit, InstanceCache(data / "cache")
        )
        body = {
            "models": ["ward-vlm", "reference/image-rules"],
            "tasks": ["differential", "lesion"],
        }
        url = f"/studies/{orthanc_id}/evaluations/estimate"
        with TestClient(create_app(ctx)) as http:
            r = http.post(url, json=body, headers={"Authorization": f"Bearer {admin}"})
            assert r.status_code == 200, r.text
            estimate = r.json()
            # the same rules as starting an evaluation: a reviewer is refused, a model the
            # server does not configure too, a study Orthanc does not hold is a 404
            who = {"Authorization": f"Bearer {reviewer}"}
            assert http.post(url, json=body, headers=who).status_code == 403
            other = {**body, "models": ["openai/gpt-4o"]}
            bearer = {"Authorization": f"Bearer {admin}"}
            assert http.post(url, json=other, headers=bearer).status_code == 403
            missing = "/studies/" + "-".join(["0123abcd"] * 5) + "/evaluations/estimate"
            assert http.post(missing, json=body, headers=bearer).status_code == 404
        assert server.stats.calls == 0 and runs.list() == []  # nothing sent, no run recorded
        assert not [p for p in data.iterdir() if p.name.startswith("estimate-")]
        by_model = {m["model"]: m for m in estimate["models"]}
        vlm, rules = by_model["ward-vlm"], by_model["reference/image-rules"]
        assert vlm["images"] > 0 and vlm["input_tokens"] > 0 and vlm["cost_usd"] > 0
        assert rules["cost_usd"] == 0 and rules["input_tokens"] is None
        assert estimate["calls"] == vlm["calls"] + rules["calls"]
        # the gateway's own evaluation of the study, with the same route
        route = Route(
            rule="api",
            models=body["models"],
            tasks=[TaskFamily.DIFFERENTIAL, TaskFamily.LESION],
            series_classes=list(CLINICAL),
        )
        study_dir = tmp_path / "src"
        evaluator.evaluate(study_dir, route, tmp_path / "run")
    assert server.stats.calls == vlm["calls"]
    counted = sum(openai_usage(b, Script().default_reply)[0] for b in server.stats.bodies)
    assert abs(vlm["input_tokens"] - counted) <= 0.10 * counted, (vlm, counted)
