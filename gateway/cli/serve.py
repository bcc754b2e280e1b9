"""``neurosandbox serve``: the gateway service."""

from __future__ import annotations

from gateway.cli.console import fail
from gateway.settings import get_settings


def serve_command() -> None:
    """Run the HTTP API and the DICOM node together (settings: NEUROSANDBOX_* variables)."""
    from gateway.routing import RoutingError
    from gateway.serve import serve

    try:
        serve(get_settings())
    except RoutingError as exc:
        raise fail(str(exc), 2) from None
