"""The HTTP API (FastAPI): one router per resource, bearer-token auth, OpenAPI contract."""

from gateway.api.app import create_app
from gateway.api.context import GatewayContext

__all__ = ["GatewayContext", "create_app"]
