"""A request body with numbers JSON does not have (NaN, Infinity) is a 422 with a clear message,
never a 500 (the validation error used to carry the NaN into a response that cannot hold it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from review_server import build_context

from gateway.api import create_app
from gateway.auth import Role


@pytest.mark.parametrize(
    "body", [b'{"models": NaN}', b'{"models": [Infinity]}', b'{"force": -Infinity}']
)
def test_non_finite_numbers_are_a_422_with_a_clear_message(tmp_path: Path, body: bytes) -> None:
    ctx = build_context(tmp_path)
    _, token = ctx.tokens.create(Role.ADMIN, "bad-json")
    with TestClient(create_app(ctx), raise_server_exceptions=False) as c:
        r = c.post(
            "/studies/0123abcd-0123abcd-0123abcd-0123abcd-0123abcd/evaluations",
            content=body,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
    assert r.status_code == 422, r.text
    assert "not a JSON number" in r.json()["detail"] and "finite" in r.json()["detail"]
