"""Dependencies: the shared context and bearer-token authentication with roles."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

from gateway.api.context import GatewayContext
from gateway.auth import Role, TokenRecord

_bearer = HTTPBearer(auto_error=False, description="a token from `neurosandbox tokens create`")


def get_ctx(request: Request) -> GatewayContext:
    ctx: GatewayContext = request.app.state.ctx
    return ctx


Ctx = Annotated[GatewayContext, Depends(get_ctx)]


def _unauthorized(why: str) -> HTTPException:
    return HTTPException(
        status.HTTP_401_UNAUTHORIZED, detail=why, headers={"WWW-Authenticate": "Bearer"}
    )


def _verified(
    request: Request, ctx: GatewayContext, creds: HTTPAuthorizationCredentials | None
) -> TokenRecord:
    """The record of the request's bearer token, of any role (401 without a valid one); the
    audit log's actor is set from it."""
    if creds is None or creds.scheme.lower() != "bearer":
        raise _unauthorized("a bearer token is required")
    rec = ctx.tokens.verify(creds.credentials, sending=True)
    if rec is None:
        raise _unauthorized("invalid or revoked token")
    request.state.actor = rec.id
    return rec


def require_token(
    request: Request,
    ctx: Ctx,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> TokenRecord:
    rec = _verified(request, ctx, creds)
    if rec.role is Role.SENDER:  # known, but not allowed here: say what it may do
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            detail="a sender token may only send studies (POST /dicomweb/studies)",
        )
    return rec


def require_sender(
    request: Request,
    ctx: Ctx,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> TokenRecord:
    """Sending a study (STOW-RS): an admin or a ``sender`` token."""
    rec = _verified(request, ctx, creds)
    if rec.role not in (Role.ADMIN, Role.SENDER):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN, detail="sending studies needs an admin or sender token"
        )
    return rec


def require_admin(token: Annotated[TokenRecord, Depends(require_token)]) -> TokenRecord:
    if token.role is not Role.ADMIN:
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail="this needs an admin token")
    return token


def require_evaluation_starter(
    ctx: Ctx, token: Annotated[TokenRecord, Depends(require_token)]
) -> TokenRecord:
    """Starting an evaluation is an admin action; a reviewer may when the routing file says
    ``api: {reviewers_may_evaluate: true}`` (gateway.routing)."""
    if token.role is Role.ADMIN:
        return token
    if ctx.pipeline is not None and ctx.pipeline.router.reviewers_may_evaluate:
        return token
    raise HTTPException(
        status.HTTP_403_FORBIDDEN,
        detail="starting an evaluation needs an admin token (the routing file may grant "
        "reviewers: api: reviewers_may_evaluate: true)",
    )


Token = Annotated[TokenRecord, Depends(require_token)]
Sender = Annotated[TokenRecord, Depends(require_sender)]
Admin = Annotated[TokenRecord, Depends(require_admin)]
Starter = Annotated[TokenRecord, Depends(require_evaluation_starter)]


class ErrorBody(BaseModel):
    detail: str


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for the error codes a route may answer."""
    text = {
        400: "bad request",
        401: "missing, invalid or revoked bearer token",
        403: "the token's role may not do this",
        404: "not found",
        409: "refused by a review rule (the message says which)",
        413: "request body too large",
        422: "the request body does not validate",
        502: "Orthanc failed or is unreachable",
        503: "the evaluation worker is not running",
    }
    return {c: {"model": ErrorBody, "description": text[c]} for c in codes}
