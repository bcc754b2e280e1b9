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
    if settings.database_url:  # never serve on a run log of an older schema
        from evaluation import EvaluationError
        from evaluation.log import schema_status

        try:
            st = schema_status(settings.database_url)
        except EvaluationError as exc:
            raise fail(str(exc), 2) from None
        if not st.up_to_date:
            raise fail(
                f"the run log at {st.url} is at schema {st.current or 'none'}, this gateway "
                f"needs {st.head}: run `neurosandbox db upgrade` first",
                2,
            )

    from gateway.routing import RoutingError
    from gateway.serve import serve

    try:
        serve(settings)
    except (RoutingError, PortUnavailableError) as exc:
        raise fail(str(exc), 2) from None
