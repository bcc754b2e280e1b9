"""Any PACS in and out: configured by name (``config``), found, pulled and stored through one
Protocol (``client``) over DIMSE (``dimse``), DICOMweb (``dicomweb``) or Orthanc's REST API
(``orthanc_rest``); ``open`` makes the client a name stands for."""

from gateway.pacs.client import (
    PacsClient,
    PacsRequestError,
    Progress,
    RetrievedStudy,
    StoreResult,
    StudyMatch,
    StudyQuery,
    keep_the_study,
)
from gateway.pacs.config import (
    LOCAL,
    DicomwebPacs,
    DimsePacs,
    OrthancPacs,
    PacsConfigError,
    PacsEntry,
    PacsFile,
    TlsConfig,
    known_names,
    load_pacs_file,
    pacs_named,
)
from gateway.pacs.open import configured, open_client, open_entry

__all__ = [
    "LOCAL",
    "DicomwebPacs",
    "DimsePacs",
    "OrthancPacs",
    "PacsClient",
    "PacsConfigError",
    "PacsEntry",
    "PacsFile",
    "PacsRequestError",
    "Progress",
    "RetrievedStudy",
    "StoreResult",
    "StudyMatch",
    "StudyQuery",
    "TlsConfig",
    "configured",
    "keep_the_study",
    "known_names",
    "load_pacs_file",
    "open_client",
    "open_entry",
    "pacs_named",
]
