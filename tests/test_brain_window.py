"""The MR window is taken from the brain, not the bright scalp around it.

Before, the 0.5-99.5 percentile window of an MR stack was taken over every voxel of the head,
so the fat of the scalp (the brightest tissue of a T1) set its top and the brain came out dim.
The window is now taken inside the skull (dicom.window.brain_region: the head mask, its slices
filled, its largest component, eroded by BRAIN_EROSION_MM); where no such region is found the
window falls back to the whole head and says so, on the image and in the warnings.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dicom.index import index_path
from dicom.pixels import load_stored
from dicom.render import RenderOptions, render_path
from dicom.window import MR_PERCENTILES, StoredLUT, stored_head_stats

BRAINIX_T1 = "brainix/BRAINIX/DICOM/T1"


def _head_window(folder: Path) -> tuple[float, float]:
    """The old window: percentiles over every head voxel (center, width)."""
    (s,) = index_path(folder).series
    stored = load_stored(s)
    assert stored is not None
    lut = StoredLUT(stored.data.dtype, stored.slope, stored.intercept)
    lo, hi = (
        float(v) for v in stored_head_stats(stored.data, lut, False).percentiles(MR_PERCENTILES)
    )
    return (lo + hi) / 2, hi - lo


def _brain_grey(png: Path, n_tiles: int, tile: int = 256) -> float:
    """Mean grey of the central quarter (by area) of the middle tiles of a montage: brain."""
    sheet = np.asarray(Image.open(png).convert("L")).astype(float)
    bar = max(24, tile // 8)
    cols = sheet.shape[1] // tile
    means = []
    for n in range(n_tiles // 4, n_tiles - n_tiles // 4):
        r, c = bar + (n // cols) * tile, (n % cols) * tile
        q = tile // 4
        means.append(sheet[r + q : r + 3 * q, c + q : c + 3 * q].mean())
    return float(np.mean(means))


def _compare(folder: Path, tmp_path: Path) -> tuple[float, float, str, float, float]:
    after = render_path(folder, tmp_path / "after", RenderOptions())
    (img,) = after.images
    c, w = _head_window(folder)
    before = render_path(folder, tmp_path / "before", RenderOptions(window=f"{c:.4f}/{w:.4f}"))
    (old,) = before.images
    n = len(img.slice_indices)
    return (
        _brain_grey(tmp_path / "before" / old.file, n),
        _brain_grey(tmp_path / "after" / img.file, n),
        img.window,
        c + w / 2,
        img.window_center + img.window_width / 2,
    )


@pytest.mark.corpus
def test_brainix_t1_window_comes_from_the_brain(corpus: Path, tmp_path: Path) -> None:
    before, after, desc, old_top, new_top = _compare(corpus / BRAINIX_T1, tmp_path)
    assert "inside the brain" in desc, desc
    assert new_top < 0.9 * old_top, (old_top, new_top)  # the scalp no longer sets the top
    assert after > before + 5, (before, after)  # measured 57.1 -> 67.7


def test_phantom_t1_window_comes_from_the_brain(phantom_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    folder = phantom_suite.case_dir("gbm") / "dicom" / "MR_08_t1"
    before, after, desc, old_top, new_top = _compare(folder, tmp_path)
    assert "inside the brain" in desc, desc
    assert new_top < 0.6 * old_top, (old_top, new_top)
    assert after > before + 50, (before, after)  # measured 59.2 -> 153.7


def test_no_brain_region_falls_back_to_the_head_and_says_so(tmp_path: Path) -> None:
    """A 20 mm block of tissue: eroding by the scalp's thickness leaves nothing."""
    from tests.test_reslice_plane import _coronal_dwi  # a real series writer

    src = _coronal_dwi(tmp_path / "small", slices=3, spacing=2.0, pixel=0.15)
    manifest = render_path(src, tmp_path / "out", RenderOptions(diffusion="b0"))
    (img,) = manifest.images
    assert "inside the head" in img.window, img.window
    assert any("no brain region" in w for w in manifest.warnings), manifest.warnings


@pytest.mark.corpus
def test_ct_windows_do_not_change(corpus: Path, tmp_path: Path) -> None:
    manifest = render_path(corpus / "hostile/Database/Comunix/Ct", tmp_path / "ct")
    assert (manifest.images[0].window_center, manifest.images[0].window_width) == (40, 80)
    assert not any("brain region" in w for w in manifest.warnings)
