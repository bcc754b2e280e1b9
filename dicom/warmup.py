"""Import ahead what rendering a study loads on first use (a spare evaluation worker calls this
while the gateway is idle, so the first study it renders does not pay for the imports)."""

from __future__ import annotations


def warm_up() -> None:
    """The rendering path (``render.RENDER_MODULES``, and the renderer digest the first render
    computes), the study identity, and Pillow's plugins."""
    from PIL import Image

    from dicom import identity, render  # noqa: F401

    render.renderer_version()
    Image.init()
