"""What the libraries are given at start: the settings they use with no caller in between.

Library code never reads the environment (``tests/test_no_env_reads.py``). A value that every
call of a library needs and no caller holds (the header cache folder, the Chromium binary) is
set once here from the one settings object: by the CLI before any command, by the service when
it is built, and in each evaluation worker process it spawns (a spawned process starts from the
module defaults). Everything else is passed down as a parameter (the phantoms' cache, say).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dicom import configure_header_cache
from evaluation.log import SchemaOutOfDateError, schema_status
from evaluation.reports import configure_chromium
from gateway.settings import Settings

if TYPE_CHECKING:
    from gateway.pacs import PacsClient


def configure_libraries(settings: Settings) -> None:
    """Set each library's start-time configuration from ``settings``."""
    configure_header_cache(settings.header_cache)
    configure_chromium(settings.chromium)


def check_run_log(settings: Settings) -> None:
    """The install's PostgreSQL run log (``NEUROSANDBOX_DATABASE_URL``) is at this code's
    schema, else ``SchemaOutOfDateError`` saying to run ``neurosandbox db upgrade``."""
    if not settings.database_url:
        return
    st = schema_status(settings.database_url)
    if not st.up_to_date:
        raise SchemaOutOfDateError(
            f"the run log at {st.url} is at schema {st.current or 'none'}, this gateway needs "
            f"{st.head}: run `neurosandbox db upgrade` first"
        )


def writeback_client(settings: Settings) -> PacsClient | None:
    """Where SR and PDF go: the PACS file's ``writeback:`` (None: the local Orthanc)."""
    from gateway.pacs import LOCAL, configured, open_client

    target = configured(settings).writeback
    return open_client(target, settings) if target and target != LOCAL else None
