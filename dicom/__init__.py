"""The imaging core's public face: index, read headers, classify, load, render, de-identify.

``dicom`` imports nothing of the project. Other packages import these names from ``dicom``
only, never its modules (an import-linter contract in pyproject.toml).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dicom.classify import classify
    from dicom.deid import Deidentifier, DeidPolicy
    from dicom.errors import ImagingError
    from dicom.headers.batch import read_headers
    from dicom.headers.frame import DEFAULT_MEMORY_CAP
    from dicom.index import index_path
    from dicom.pixels import load_volume
    from dicom.records import (
        CLINICAL_CLASSES,
        FileError,
        IndexResult,
        RenderedImage,
        SequenceClass,
        SeriesInfo,
    )
    from dicom.render import RenderOptions, render_path, renderer_version

# Public name -> the module that defines it. Loaded on first use (PEP 562): importing one
# submodule (a worker process, a header read) must not import the whole package.
_EXPORTS: dict[str, str] = {
    "CLINICAL_CLASSES": "dicom.records",
    "DEFAULT_MEMORY_CAP": "dicom.headers.frame",
    "DeidPolicy": "dicom.deid",
    "Deidentifier": "dicom.deid",
    "FileError": "dicom.records",
    "ImagingError": "dicom.errors",
    "IndexResult": "dicom.records",
    "RenderOptions": "dicom.render",
    "RenderedImage": "dicom.records",
    "SequenceClass": "dicom.records",
    "SeriesInfo": "dicom.records",
    "classify": "dicom.classify",
    "index_path": "dicom.index",
    "load_volume": "dicom.pixels",
    "read_headers": "dicom.headers.batch",
    "render_path": "dicom.render",
    "renderer_version": "dicom.render",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "CLINICAL_CLASSES",
    "DEFAULT_MEMORY_CAP",
    "DeidPolicy",
    "Deidentifier",
    "FileError",
    "ImagingError",
    "IndexResult",
    "RenderOptions",
    "RenderedImage",
    "SequenceClass",
    "SeriesInfo",
    "classify",
    "index_path",
    "load_volume",
    "read_headers",
    "render_path",
    "renderer_version",
]
