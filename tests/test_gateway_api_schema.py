"""The OpenAPI contract, fuzzed by schemathesis (bounded: a few examples per operation).

The app runs in-process against the session's real Orthanc, with its own data folder; checks
include no server errors, documented status codes and content types, response schemas, and
that endpoints refuse requests without the token.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from orthanc_fixture import OrthancServer

from gateway.api import GatewayContext, create_app
from gateway.audit import AuditLog
from gateway.auth import Role, TokenStore
from gateway.cache import InstanceCache
from gateway.orthanc import OrthancClient
from gateway.pipeline import StudyPipeline
from gateway.routing import Router
from gateway.runs import StudyRunStore
from gateway.settings import Settings
from gateway.study_run import DefaultEvaluator

pytestmark = pytest.mark.integration
TOKEN: dict[str, str] = {}


@pytest.fixture(scope="module")
def api_schema(orthanc_server: OrthancServer, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    data: Path = tmp_path_factory.mktemp("schema-data")
    ep = orthanc_server.endpoints
    orthanc = OrthancClient(ep.orthanc_url, ep.username, orthanc_server.password, timeout_s=30)
    runs, audit = StudyRunStore(data), AuditLog(data / "audit.jsonl")
    tokens = TokenStore(data / "tokens.json")
    TOKEN["admin"] = tokens.create(Role.ADMIN, "schemathesis")[1]
    settings_ = orthanc_server.settings.model_copy(update={"data_dir": data})
    ctx = GatewayContext(settings_, orthanc, runs, audit, tokens)
    # A pipeline that is never started: evaluations are accepted and stay queued.
    ctx.pipeline = StudyPipeline(
        orthanc,
        DefaultEvaluator(Settings(data_dir=data)),
        Router(),
        runs,
        audit,
        InstanceCache(data / "cache"),
    )
    app = create_app(ctx)
    return schemathesis.openapi.from_asgi(
        "/openapi.json", app, headers={"Authorization": f"Bearer {TOKEN['admin']}"}
    )


def test_api_conforms_to_its_openapi_contract(api_schema) -> None:  # type: ignore[no-untyped-def]
    # schemathesis' pytest plugin (from_fixture) does not run under pytest 9, so each
    # operation's strategy is driven by hypothesis directly.
    headers = {"Authorization": f"Bearer {TOKEN['admin']}"}
    # The review pages (/review, issue 7) are HTML forms with their own session auth; their
    # owner fuzzes them. This test covers the gateway's JSON API. STOW-RS (/dicomweb) takes
    # multipart/related DICOM bodies no schema generator makes: tests/test_multipart.py and
    # tests/test_stow_receive.py send it hostile ones.
    operations = [
        op
        for op in (r.ok() for r in api_schema.get_all_operations())
        if not op.path.startswith(("/review", "/dicomweb"))
    ]
    assert len(operations) >= 10
    for op in operations:

        @given(case=op.as_strategy())
        @settings(
            max_examples=6, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        def check(case) -> None:  # type: ignore[no-untyped-def]
            case.call_and_validate(headers=headers)

        check()
