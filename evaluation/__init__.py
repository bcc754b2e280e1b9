"""The benchmark's public face: the case vocabulary, datasets (phantoms included), running an
evaluation, opening a run, scoring, reports and the review log.

``evaluation`` imports ``dicom`` only. The gateway and the command line import these names
from ``evaluation`` only, never its modules (an import-linter contract in pyproject.toml).
"""

import lazy_loader

# Names load on first use: importing one submodule (a worker process, a header read) does not
# import the package. The list is __init__.pyi.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
