"""Liveness: the only endpoint without a token; says nothing about data."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str = "ok"


@router.get("/health", response_model=Health, summary="Liveness probe (no token needed)")
def health() -> Health:
    return Health()
