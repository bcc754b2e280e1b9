"""The fast render paths give what the straightforward ones give, pixel for pixel."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

import dicom.render
from dicom.display import display_volume, head_extent, select_slices
from dicom.index import index_path
from dicom.montage import _font, draw_text
from dicom.pixels import load_stored, load_volume
from dicom.png import encode_png
from dicom.records import SeriesInfo
from dicom.render import RenderOptions, choose_diffusion_volume, render_path
from dicom.window import StoredLUT, head_stats, stats_sample, stored_head_stats

BRAINIX = "brainix/BRAINIX/DICOM"
T1 = "siemens_xa30/In/5001_anat-T1w_acq-tfl"
CT = "hostile/Database/Comunix/Ct"


def _pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)))


def test_png_encoder_round_trips_greyscale_and_rgb_exactly() -> None:
    rng = np.random.default_rng(0)
    for shape in [(1, 1), (1, 7, 3), (5, 3), (33, 17), (200, 300, 3)]:
        img = rng.integers(0, 256, shape, dtype=np.uint8)
        img[: shape[0] // 2] = 0  # runs of black, as around a head
        decoded = _pixels(encode_png(img))
        assert decoded.shape == img.shape and np.array_equal(decoded, img)
    with pytest.raises(ValueError):
        encode_png(np.zeros((4, 4), dtype=np.uint16))
    with pytest.raises(ValueError):
        encode_png(np.zeros((4, 4, 4), dtype=np.uint8))


def test_cached_label_bitmaps_draw_what_imagedraw_draws() -> None:
    base = Image.fromarray((np.arange(256 * 256) % 251).astype(np.uint8).reshape(256, 256))
    for text, xy, anchor, size in [
        ("R", (4, 128), "lm", 16),
        ("L", (252, 128), "rm", 16),
        ("S 12.3 mm", (4, 252), "ls", 16),
        ("FLAIR | long TI (nulls fluid)", (6, 10), "lm", 11),
        ("cut by the right edge", (200, 128), "lm", 16),
        ("cut by the top", (4, 2), "lm", 16),
        ("outside", (300, 300), "lm", 16),
    ]:
        want = base.convert("RGB")
        got = np.array(want)
        ImageDraw.Draw(want).text(xy, text, fill=(255, 255, 0), font=_font(size), anchor=anchor)
        draw_text(got, xy, text, (255, 255, 0), size, anchor)
        draw_text(got, (0, 0), "", (255, 255, 0), size, anchor)  # nothing to draw
        assert np.array_equal(np.asarray(want), got), text


def _clinical(index) -> list[SeriesInfo]:  # type: ignore[no-untyped-def]
    return dicom.render.default_targets(index)


@pytest.mark.parametrize("rel", [BRAINIX, T1, CT])
def test_stored_values_through_the_lut_are_the_float_volume(corpus: Path, rel: str) -> None:
    for s in _clinical(index_path(corpus / rel)):
        stored = load_stored(s)
        assert stored is not None, s.key
        lut = StoredLUT(stored.data.dtype, stored.slope, stored.intercept)
        as_float = lut.values[lut.index(stored.data)]
        assert np.array_equal(as_float, load_volume(s).data)


@pytest.mark.parametrize("rel", [BRAINIX, T1, CT])
def test_head_statistics_from_a_histogram_equal_those_from_a_sort(corpus: Path, rel: str) -> None:
    for s in _clinical(index_path(corpus / rel)):
        ct = s.modality == "CT"
        fdv = display_volume(s, load_volume(s).data, True, "")
        stored = load_stored(s)
        assert stored is not None
        sdv = display_volume(s, stored.data, True, "")
        lut = StoredLUT(stored.data.dtype, stored.slope, stored.intercept)
        want, got = head_stats(fdv.data, ct), stored_head_stats(sdv.data, lut, ct)
        assert want.threshold is not None and got.threshold is not None
        assert np.array_equal(fdv.data > want.threshold, sdv.data > got.threshold)
        q = (0.5, 99.5)
        assert np.array_equal(want.percentiles(q), got.percentiles(q))


@pytest.mark.parametrize("rel", [BRAINIX, T1, CT])
def test_probing_the_head_extent_picks_what_the_full_mask_picks(corpus: Path, rel: str) -> None:
    for s in _clinical(index_path(corpus / rel)):
        for reslice in (True, False):
            dv = display_volume(s, load_volume(s).data, reslice, "")
            threshold = head_stats(dv.data, s.modality == "CT").threshold
            assert threshold is not None
            mask = dv.data > threshold
            other = tuple(a for a in range(3) if a != dv.axis)
            area = mask.mean(axis=other)
            above = np.nonzero(area > 0.02)[0]
            lo, hi = int(above[0]), int(above[-1])
            assert head_extent(dv, threshold) == (lo, hi)
            trim = round((hi - lo) * 0.06)
            candidates = np.arange(lo + trim, hi - trim + 1)
            want = [int(c) for c in candidates]
            if candidates.size > 12:
                want = [want[round(p)] for p in np.linspace(0, candidates.size - 1, 12)]
            assert select_slices(dv, threshold, 12, None, None) == want


def test_extent_without_head_spans_every_slice() -> None:
    s = SeriesInfo(path="x", study_uid="1", series_uid="2", shape=[8, 8, 5], n_files=5)
    dv = display_volume(s, np.zeros((8, 8, 5), dtype=np.float32), True, "")
    assert head_extent(dv, head_stats(dv.data, ct=False).threshold) == (0, 4)
    faint = np.zeros((8, 8, 5), dtype=np.float32)
    faint[0, 0, 2] = 1.0  # one voxel of head: no slice reaches 2%
    dv = display_volume(s, faint, True, "")
    assert head_extent(dv, head_stats(dv.data, ct=False).threshold) is None
    assert select_slices(dv, head_stats(dv.data, ct=False).threshold, 3, None, None) == [0, 2, 4]


@pytest.mark.parametrize("rel", [BRAINIX, T1])
def test_stored_and_float_routes_render_the_same_bytes(
    corpus: Path, rel: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opts = RenderOptions(singles=True)
    stored = render_path(corpus / rel, tmp_path / "stored", opts)
    monkeypatch.setattr(dicom.render, "load_stored", lambda *a: None)
    floated = render_path(corpus / rel, tmp_path / "float", opts)
    assert stored.model_dump(exclude={"source"}) == floated.model_dump(exclude={"source"})
    assert len(stored.images) > 12


def test_dwi_trace_is_the_geometric_mean_computed_volume_by_volume(corpus: Path) -> None:
    index = index_path(corpus / "ge_pioneer/In/01_Ax_DWI_TENSOR_R2")
    _, trace, label, _ = choose_diffusion_volume(index.series, "trace", 1 << 30)
    pick = next(s for s in index.series if s.b_values and s.b_values[0] > 0)
    logs = [np.log(np.maximum(load_volume(pick, v).data, 1e-3)) for v in range(len(pick.volumes))]
    total = logs[0]
    for lg in logs[1:]:
        total = total + lg
    assert "trace (6 directions)" in label
    assert np.array_equal(trace, np.exp(total / len(logs)).astype(np.float32))


@pytest.mark.parametrize(
    ("rel", "grey_levels"),
    [(BRAINIX, 1.0), (T1, 1.0), ("ge_pioneer/In/05_3D_Ax_T1_MP_RAGE_R22", 8.0)],
)
def test_window_from_the_sample_is_the_whole_volume_window_within_a_few_grey_levels(
    corpus: Path, rel: str, grey_levels: float
) -> None:
    # The GE MP-RAGE is the corpus's hardest case: mostly positive background noise, so its
    # head threshold sits in a sparse tail of the histogram and the window moves most there.
    sampled_any = False
    for s in _clinical(index_path(corpus / rel)):
        stored = load_stored(s)
        assert stored is not None
        lut = StoredLUT(stored.data.dtype, stored.slope, stored.intercept)
        sample, step = stats_sample(stored.data)
        sampled_any = sampled_any or step > 1
        full, part = (
            stored_head_stats(stored.data, lut, False),
            stored_head_stats(sample, lut, False),
        )
        assert part.threshold == full.threshold, s.key
        want = np.asarray(full.percentiles((0.5, 99.5)), dtype=float)
        got = np.asarray(part.percentiles((0.5, 99.5)), dtype=float)
        assert np.abs(got - want).max() / (want[1] - want[0]) * 255 <= grey_levels, s.key
    assert sampled_any or rel == T1  # the 96 x 128 x 128 T1 is small enough to use whole
