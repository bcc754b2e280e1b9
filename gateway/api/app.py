"""The FastAPI application: routers per resource, auth on all but /health, size limits."""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import APIRouter, FastAPI

from gateway.api.context import GatewayContext
from gateway.api.middleware import AccessLog, BodyLimit
from gateway.api.routers import admin, health, review, review_api, runs, studies, viewer

DESCRIPTION = """NeuroSandbox gateway: studies from Orthanc, evaluations of vision-language
models on them, their reports, and the audit log. Every endpoint except `/health` needs
`Authorization: Bearer <token>` (create one with `neurosandbox tokens create --role reviewer --person Family^Given`).
Everything written back to PACS is marked UNVERIFIED until a clinician signs."""


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
    routers = (
        health.router,
        studies.router,
        runs.router,
        admin.router,
        review.router,
        review_api.router,
        viewer.router,
    )
    for r in (*routers, *extra_routers):
        app.include_router(r)
    app.add_middleware(BodyLimit, max_bytes=ctx.settings.api_max_body_bytes)
    app.add_middleware(AccessLog, audit=ctx.audit)
    return app
