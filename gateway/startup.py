"""What the libraries are given at start: the settings they use with no caller in between.

Library code never reads the environment (``tests/test_no_env_reads.py``). A value that every
call of a library needs and no caller holds (the header cache folder, the Chromium binary) is
set once here from the one settings object: by the CLI before any command, by the service when
it is built, and in each evaluation worker process it spawns (a spawned process starts from the
module defaults). Everything else is passed down as a parameter (the phantoms' cache, say).
"""

from __future__ import annotations

from dicom import configure_header_cache
from evaluation.reports import configure_chromium
from gateway.settings import Settings


def configure_libraries(settings: Settings) -> None:
    """Set each library's start-time configuration from ``settings``."""
    configure_header_cache(settings.header_cache)
    configure_chromium(settings.chromium)
