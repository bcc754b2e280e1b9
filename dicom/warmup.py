"""Import ahead what rendering a study loads on first use (a spare evaluation worker calls this
while the gateway is idle, so the first study it renders does not pay for the imports)."""

from __future__ import annotations


def warm_up() -> None:
    """Import the rendering path: pixels, orientation (nibabel), montage and PNG (Pillow and
    its plugins)."""
    from nibabel.orientations import apply_orientation  # noqa: F401
    from PIL import Image

    from dicom import display, identity, montage, png, render, selection  # noqa: F401

    Image.init()
