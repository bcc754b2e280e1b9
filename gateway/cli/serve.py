"""``neurosandbox serve``: the gateway service."""

from __future__ import annotations

from gateway.cli.console import fail
from gateway.settings import get_settings


def serve_command() -> None:
    """Run the HTTP API and the DICOM node together (settings: NEUROSANDBOX_* variables)."""
    from gateway.pacs_local import resolve_endpoints
    from gateway.ports import PortUnavailableError, check_free, serve_ports

    settings = get_settings()
    try:  # a port taken is said at once, before the service's imports (seconds)
        for listen in serve_ports(settings.api_host, resolve_endpoints(settings)):
            check_free(*listen)
    except PortUnavailableError as exc:
        raise fail(str(exc), 2) from None

    from gateway.routing import RoutingError
    from gateway.serve import serve

    try:
        serve(settings)
    except (RoutingError, PortUnavailableError) as exc:
        raise fail(str(exc), 2) from None
