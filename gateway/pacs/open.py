"""Make the client a PACS's configuration names: the composition root's one door to a PACS.

``configured(settings)`` reads the PACS file the settings name (``NEUROSANDBOX_PACS_FILE``; none:
only ``local``); ``open_client(name, settings)`` opens the client of one PACS by name, the
sandbox's own Orthanc for ``local``. Each kind's module is imported only when used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.pacs.client import PacsClient
from gateway.pacs.config import (
    LOCAL,
    DicomwebPacs,
    DimsePacs,
    OrthancPacs,
    PacsEntry,
    PacsFile,
    load_pacs_file,
    pacs_named,
)


def configured(settings: Any) -> PacsFile:
    """The settings' PACS file, checked; an empty one when none is set."""
    path: Path | None = getattr(settings, "pacs_file", None)
    return load_pacs_file(Path(path)) if path else PacsFile()


def open_entry(name: str, entry: PacsEntry, settings: Any = None) -> PacsClient:
    """The client of one configured PACS."""
    if isinstance(entry, DimsePacs):
        from gateway.pacs.dimse import DimseClient

        return DimseClient(name, entry)
    if isinstance(entry, DicomwebPacs):
        from gateway.pacs.dicomweb import DicomwebClient

        return DicomwebClient(name, entry)
    from gateway.pacs.orthanc_rest import OrthancRestClient

    return OrthancRestClient.of_config(name, entry)


def open_client(name: str, settings: Any) -> PacsClient:
    """The client of the PACS called ``name`` (``local``: the settings' Orthanc)."""
    pacs = configured(settings)
    if name == LOCAL and LOCAL not in pacs.pacs:
        from gateway.orthanc import OrthancClient
        from gateway.pacs.orthanc_rest import OrthancRestClient

        return OrthancRestClient(LOCAL, OrthancClient.from_settings(settings))
    return open_entry(name, pacs_named(pacs, name, None), settings)


__all__ = ["OrthancPacs", "configured", "open_client", "open_entry"]
