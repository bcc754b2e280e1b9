"""Rendering what a model sees: orientation, windows, slice choice, determinism, manifest."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from dicom.index import index_path
from dicom.pixels import load_volume
from dicom.render import RenderOptions, display_volume, render_path, slice_2d
from gateway.cli import app

BRAINIX = "brainix/BRAINIX/DICOM"


@pytest.fixture(scope="module")
def brainix_index(corpus: Path):  # type: ignore[no-untyped-def]
    return index_path(corpus / BRAINIX)


def _uid(index, cls: str) -> str:  # type: ignore[no-untyped-def]
    return next(s.series_uid for s in index.series if s.series_class.value == cls)


def test_lesion_slices_show_the_tumour_on_the_image_right_for_a_left_sided_lesion(
    corpus: Path, brainix_index, tmp_path: Path
) -> None:
    opts = RenderOptions(n_slices=4, columns=4, tile_size=256, montage=False, singles=True)
    manifest = render_path(
        corpus / BRAINIX,
        tmp_path,
        opts,
        series_uid=_uid(brainix_index, "FLAIR"),
        mask_uid=_uid(brainix_index, "MASK"),
        index=brainix_index,
    )
    assert len(manifest.images) == 4
    # The ROI lies from about z=28 to z=73 mm: every chosen slice passes through it.
    assert all(28 <= img.slice_positions_mm[0] <= 74 for img in manifest.images)
    for img in manifest.images:
        assert "radiological" in img.orientation
    # Through the same display path as the PNGs: the mask lands on the image right, and the
    # FLAIR signal is brighter there than in the mirrored (patient right) region.
    flair = next(s for s in brainix_index.series if s.series_class.value == "FLAIR")
    mask = next(s for s in brainix_index.series if s.series_class.value == "MASK")
    fdv = display_volume(flair, load_volume(flair).data, True, "")
    mdv = display_volume(mask, load_volume(mask).data, True, "")
    inside, mirror = [], []
    for img in manifest.images:
        k = img.slice_indices[0]
        f2d, m2d = slice_2d(fdv, k), slice_2d(mdv, k) > 0
        cols = np.nonzero(m2d.any(axis=0))[0]
        assert cols.mean() > m2d.shape[1] / 2, f"slice {k}: lesion not on the image right"
        inside.append(f2d[m2d])
        mirror.append(f2d[m2d[:, ::-1]])
    assert np.concatenate(inside).mean() > 1.2 * np.concatenate(mirror).mean()


def test_default_render_covers_the_clinical_series_with_labels_and_a_manifest(
    corpus: Path, brainix_index, tmp_path: Path
) -> None:
    manifest = render_path(corpus / BRAINIX, tmp_path, RenderOptions(), index=brainix_index)
    classes = sorted(i.series_class for i in manifest.images)
    assert classes == ["FLAIR", "T1", "T2"]  # the ROI mask is not shown to a model
    saved = json.loads((tmp_path / "manifest.json").read_text())
    for img in saved["images"]:
        data = (tmp_path / img["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == img["sha256"]
        assert img["window"].startswith("MR p0.5-p99.5")
        assert len(img["slice_indices"]) == 12
        assert "BRAINIX" not in img["label"]  # never the patient's name


def test_identical_input_gives_byte_identical_pngs(
    corpus: Path, brainix_index, tmp_path: Path
) -> None:
    a = render_path(
        corpus / BRAINIX, tmp_path / "a", RenderOptions(n_slices=6), index=brainix_index
    )
    b = render_path(corpus / BRAINIX, tmp_path / "b", RenderOptions(n_slices=6))
    assert [i.sha256 for i in a.images] == [i.sha256 for i in b.images]


def test_rendering_in_threads_gives_the_serial_bytes(
    corpus: Path, brainix_index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dicom.render

    monkeypatch.setattr(dicom.render, "idle_cpus", lambda: 4)  # threads even on a busy machine
    threaded = render_path(corpus / BRAINIX, tmp_path / "t", RenderOptions(), index=brainix_index)
    monkeypatch.setattr(dicom.render, "_RENDER_THREADS", 1)
    serial = render_path(corpus / BRAINIX, tmp_path / "s", RenderOptions(), index=brainix_index)
    assert len(threaded.images) == 3
    assert threaded.model_dump(exclude={"source"}) == serial.model_dump(exclude={"source"})
    for img in serial.images:
        assert (tmp_path / "t" / img.file).read_bytes() == (tmp_path / "s" / img.file).read_bytes()


def test_percentiles_from_a_sort_or_a_histogram_equal_numpys(corpus: Path, brainix_index) -> None:
    from dicom.percentile import counts_u16, percentile_of_counts, percentile_of_sorted
    from dicom.window import head_mask, head_stats

    rng = np.random.default_rng(3)
    samples = [rng.standard_normal(n).astype(np.float32) * 500 for n in (1, 2, 7, 1000, 99_999)]
    samples.append(np.round(rng.gamma(2.0, 300.0, 200_001)).astype(np.float32))  # MR-like
    for x in samples:
        for q in (99.0, (0.5, 99.5), 0, 100, (25.0, 50.0, 75.0)):
            want, got = np.percentile(x, q), percentile_of_sorted(np.sort(x), q)
            assert type(want) is type(got) and np.asarray(want).dtype == np.asarray(got).dtype
            assert np.array_equal(want, got)
    stored = np.round(rng.gamma(2.0, 300.0, 100_003)).astype(np.uint16)
    counts = counts_u16(stored)
    values = np.arange(counts.size, dtype=np.float32) * np.float32(0.25) - np.float32(7)
    for q in (99.0, (0.5, 99.5), 0, 100):
        want = np.percentile(values[stored], q)
        got = percentile_of_counts(values, counts, q)
        assert type(want) is type(got) and np.array_equal(want, got)
    # The head mask and the window percentiles, from a real (transposed, flipped) volume.
    s = brainix_index.series[0]
    dv = display_volume(s, load_volume(s).data, True, "")
    stats = head_stats(dv.data, ct=False)
    positive = dv.data[dv.data > 0]
    mask = dv.data > 0.1 * float(np.percentile(positive, 99.0))
    assert stats.threshold is not None and np.array_equal(dv.data > stats.threshold, mask)
    assert np.array_equal(mask, head_mask(dv.data, False))
    assert np.array_equal(stats.percentiles((0.5, 99.5)), np.percentile(dv.data[mask], (0.5, 99.5)))


def test_sagittal_3d_t1_is_resliced_to_axial_by_default(corpus: Path, tmp_path: Path) -> None:
    src = corpus / "siemens_xa30/In/5001_anat-T1w_acq-tfl"
    axial = render_path(src, tmp_path / "ax", RenderOptions(n_slices=6))
    native = render_path(src, tmp_path / "sag", RenderOptions(n_slices=6, reslice_axial=False))
    assert axial.images[0].orientation.startswith("axial")
    assert native.images[0].orientation.startswith("sagittal")
    assert axial.images[0].sha256 != native.images[0].sha256


def test_ct_presets_window_hounsfield_units(corpus: Path, tmp_path: Path) -> None:
    src = corpus / "hostile/Database/Comunix/Ct"
    brain = render_path(src, tmp_path / "brain", RenderOptions(window="brain"))
    bone = render_path(src, tmp_path / "bone", RenderOptions(window="bone"))
    assert (brain.images[0].window_center, brain.images[0].window_width) == (40, 80)
    assert (bone.images[0].window_center, bone.images[0].window_width) == (600, 2800)
    a = np.asarray(Image.open(tmp_path / "brain" / brain.images[0].file).convert("L"))
    b = np.asarray(Image.open(tmp_path / "bone" / bone.images[0].file).convert("L"))
    # Bone is saturated white in the brain window but not in the bone window.
    assert (a == 255).sum() > (b == 255).sum()


def test_dwi_trace_is_the_geometric_mean_over_directions(corpus: Path, tmp_path: Path) -> None:
    src = corpus / "ge_pioneer/In/01_Ax_DWI_TENSOR_R2"
    trace = render_path(src, tmp_path / "t", RenderOptions(diffusion="trace"))
    b0 = render_path(src, tmp_path / "b0", RenderOptions(diffusion="b0"))
    assert len(trace.images) == 1 and "trace (6 directions)" in trace.images[0].volume
    assert b0.images[0].volume == "b=0"


def test_cli_inspect_json_and_render(corpus: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["inspect", str(corpus / BRAINIX), "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert {r["class"] for r in rows} == {"T1", "T2", "FLAIR", "MASK"}
    for r in rows:
        for key in (
            "path",
            "series_uid",
            "class",
            "reason",
            "plane",
            "shape",
            "spacing",
            "affine",
            "n_files",
            "errors",
        ):
            assert key in r
        assert len(r["affine"]) == 4 and all(len(row) == 4 for row in r["affine"])
    res = runner.invoke(
        app,
        [
            "render",
            str(corpus / BRAINIX),
            "--out",
            str(tmp_path),
            "--slices",
            "4",
            "--window",
            "stroke",
        ],
    )
    assert res.exit_code == 1  # a CT preset on MR is refused, with a reason per series
    res = runner.invoke(
        app, ["render", str(corpus / BRAINIX), "--out", str(tmp_path), "--slices", "4"]
    )
    assert res.exit_code == 0, res.output
    assert len(json.loads((tmp_path / "manifest.json").read_text())["images"]) == 3


def test_cli_inspect_lists_per_file_errors(corpus: Path) -> None:
    res = CliRunner().invoke(app, ["inspect", str(corpus / "hostile"), "--json"])
    rows = json.loads(res.stdout)
    errors = [r for r in rows if r["class"] == "ERROR"]
    assert len(errors) == 8 and all(r["errors"] for r in errors)
