"""The FastAPI application: routers per resource, auth on all but /health, size limits."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from gateway.api.context import GatewayContext
from gateway.api.middleware import AccessLog, BodyLimit, StrictJson
from gateway.api.routers import admin, dicomweb, health, review, review_api, runs, studies, viewer

DESCRIPTION = """NeuroSandbox gateway: studies from Orthanc, evaluations of vision-language
models on them, their reports, and the audit log. Every endpoint except `/health` needs
`Authorization: Bearer <token>` (create one with `neurosandbox tokens create --role reviewer --person Family^Given`).
Everything written back to PACS is marked UNVERIFIED until a clinician signs."""


def _finite(value: Any) -> Any:
    """A validation error's content with every non-finite number written as text."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


async def _invalid_request(request: Request, exc: Exception) -> JSONResponse:
    """422 for a request that fails validation; a body holding NaN or Infinity (numbers JSON
    does not have, which Python's parser lets through) says so instead of failing with 500."""
    assert isinstance(exc, RequestValidationError)
    raw = jsonable_encoder(exc.errors())
    errors = _finite(raw)
    if errors != raw or any(
        isinstance(e.get("input"), str) and e["input"] in ("nan", "inf", "-inf") for e in errors
    ):
        errors.insert(0, {"loc": ["body"], "type": "json_invalid",
                          "msg": "NaN and Infinity are not JSON numbers: send finite numbers"})  # fmt: skip
    return JSONResponse(status_code=422, content={"detail": errors})


def create_app(ctx: GatewayContext, extra_routers: Iterable[APIRouter] = ()) -> FastAPI:
    """Build the app around ``ctx``; ``extra_routers`` lets other parts (review pages) join."""
    app = FastAPI(
        title="NeuroSandbox",
        version="0.1.0",
        description=DESCRIPTION,
        docs_url=None,  # served by the admin router, behind the token
        redoc_url=None,
        openapi_url=None,
    )
    app.state.ctx = ctx
    app.add_exception_handler(RequestValidationError, _invalid_request)
    routers = (
        health.router,
        studies.router,
        runs.router,
        admin.router,
        review.router,
        review_api.router,
        viewer.router,
        dicomweb.router,
    )
    for r in (*routers, *extra_routers):
        app.include_router(r)
    app.add_middleware(StrictJson)
    app.add_middleware(
        BodyLimit,
        max_bytes=ctx.settings.api_max_body_bytes,
        timeout_s=ctx.settings.api_body_timeout_s,
        # studies sent by STOW-RS: their own bound and time
        wider={"/dicomweb/": (ctx.settings.stow_max_body_bytes, ctx.settings.stow_body_timeout_s)},
    )
    app.add_middleware(AccessLog, audit=ctx.audit)
    return app
