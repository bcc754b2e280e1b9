"""Operations: the audit log (admin), Prometheus metrics, the OpenAPI contract and docs."""

from __future__ import annotations

import html
import json
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response

from gateway.api.deps import Admin, Ctx, Token, errors
from gateway.audit import AuditEvent
from gateway.metrics import METRICS

router = APIRouter(tags=["operations"], responses=errors(400, 401, 413))


@router.get(
    "/audit",
    response_model=list[AuditEvent],
    summary="Audit log, newest first (admin)",
    responses=errors(403),
)
def audit_log(
    ctx: Ctx, _a: Admin, limit: Annotated[int, Query(ge=1, le=10000)] = 100
) -> list[AuditEvent]:
    return ctx.audit.tail(limit)


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    summary="Prometheus metrics (text exposition format)",
    responses={200: {"content": {"text/plain": {}, "application/openmetrics-text": {}}}},
)
def metrics(ctx: Ctx, request: Request, _t: Token) -> Response:
    """Prometheus text format; OpenMetrics when the scraper's ``Accept`` asks for it. The
    canaries' gauges are read from their runs' marks now (gateway/canary.py)."""
    from gateway.canary import export_marks

    export_marks(METRICS, ctx.settings)
    body, content_type = METRICS.exposition(request.headers.get("accept", ""))
    return Response(body, media_type=content_type)


@router.get("/openapi.json", include_in_schema=False)
def openapi(request: Request, _t: Token) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/docs", include_in_schema=False, response_class=HTMLResponse)
def docs(request: Request, _t: Token) -> HTMLResponse:
    """The API reference without any remote script (hospital networks are often offline)."""
    spec = request.app.openapi()
    rows = []
    for path, ops in spec.get("paths", {}).items():
        for method, op in ops.items():
            rows.append(
                f"<tr><td>{html.escape(method.upper())}</td><td><code>{html.escape(path)}</code>"
                f"</td><td>{html.escape(op.get('summary', ''))}</td></tr>"
            )
    body = (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>NeuroSandbox API"
        "</title></head><body><h1>NeuroSandbox API</h1><p>Every endpoint but /health needs "
        "<code>Authorization: Bearer TOKEN</code>. Machine-readable contract: "
        "<code>/openapi.json</code>.</p><table border='1'>"
        + "".join(rows)
        + "</table><h2>OpenAPI</h2><pre>"
        + html.escape(json.dumps(spec, indent=2))
        + "</pre></body></html>"
    )
    return HTMLResponse(body, headers={"Content-Security-Policy": "default-src 'none'"})
