"""The imaging core's public face: index, read headers, classify, load, render, de-identify.

``dicom`` imports nothing of the project. Other packages import these names from ``dicom``
only, never its modules (an import-linter contract in pyproject.toml).
"""

import lazy_loader

# Names load on first use: importing one submodule (a worker process, a header read) does not
# import the package. The list is __init__.pyi.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
