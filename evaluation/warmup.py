"""Import ahead what evaluating a received study loads on first use (see ``dicom.warm_up``):
the engine (the rendering with it), the registered cases, the built-in reference models and
the run's read-back."""

from __future__ import annotations


def warm_up() -> None:
    """Import the evaluation path of one study (not litellm: it loads when a litellm model
    is first asked)."""
    from dicom import warm_up as warm_dicom
    from evaluation import engine  # noqa: F401
    from evaluation.datasets import registry  # noqa: F401
    from evaluation.models import reference_image, reference_text  # noqa: F401
    from evaluation.reports import storeread  # noqa: F401

    warm_dicom()
