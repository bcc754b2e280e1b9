"""Findings pointed at on the image (issue 39): the renderer records where every slice sits on a
PNG and where its pixels lie in the patient; a finding's place is scored against the lesion's
label mask; the image-rules baseline points at what it reports.

A synthetic FLAIR study (tests/gateway_synth.py) with one bright lesion in the patient's left
hemisphere and its exact label mask written on the series' own voxel grid."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest
from gateway_synth import make_study
from phantom_fixture import PhantomSuite
from PIL import Image

from dicom import RenderedImage, RenderOptions, index_path, render_path
from evaluation.answers import Answer, Finding, ImagePlace
from evaluation.case import (
    Case,
    Diagnosis,
    GroundTruth,
    ImageRef,
    LesionTruth,
    Provenance,
    TaskFamily,
)
from evaluation.models.reference_image import answer_for
from evaluation.parsing import parse_answer
from evaluation.scores import LesionDetails, LesionMatchResult, ParseStatus
from evaluation.scoring import make_scored_sample

SIZE, SLICES = 64, 6


def _lesion_voxels() -> np.ndarray:
    """(col, row, slice) -> bool: the lesion tests/gateway_synth.py draws (its own rule)."""
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
    c = (SIZE - 1) / 2
    blob = ((xx - (c + SIZE * 0.22)) ** 2 + (yy - c * 0.8) ** 2) <= (SIZE * 0.07) ** 2
    out = np.zeros((SIZE, SIZE, SLICES), dtype=np.uint8)
    for k in range(SLICES):
        if abs(k - SLICES // 2) <= 1:
            out[..., k] = blob.T  # (row, col) -> (col, row)
    return out


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("localisation")
    make_study(root / "dicom", classes=("FLAIR",), n_slices=SLICES, size=SIZE, lesion="left")
    index = index_path(root / "dicom", workers=1)
    (series,) = index.series
    assert series.affine is not None
    (root / "masks").mkdir()
    nib.save(
        nib.Nifti1Image(_lesion_voxels(), np.array(series.affine)),
        root / "masks" / "lesions.nii.gz",
    )
    manifest = render_path(
        root / "dicom",
        root / "png",
        RenderOptions(n_slices=SLICES, singles=True),
        index=index,
    )
    return {"root": root, "series": series, "images": manifest.images}


def _montage(study: dict[str, Any]) -> RenderedImage:
    return next(i for i in study["images"] if i.kind == "montage")


def _case(study: dict[str, Any], *, mask: bool = True) -> Case:
    img = _montage(study)
    ref = ImageRef(
        path=str(study["root"] / "png" / img.file),
        sha256=img.sha256,
        label=f"{img.label}; axial montage",
        series_class="FLAIR",
        kind="montage",
        tiles=img.tiles,
    )
    lesion = LesionTruth(
        id="L1",
        type="demyelinating plaque",
        hemisphere="left",
        region="frontal",
        signal={"FLAIR": "hyperintense"},
        mask_label=1 if mask else None,
    )
    case = Case(
        case_id="loc-1",
        images=[ref],
        ground_truth=GroundTruth(
            final_diagnosis=Diagnosis(name="multiple sclerosis"), lesions=[lesion]
        ),
        tasks=[TaskFamily.LESION],
        provenance=Provenance(source="test"),
    )
    case.root = str(study["root"])
    return case


def _lesion_point(study: dict[str, Any]) -> tuple[float, float]:
    """A PNG pixel of the montage over the lesion: through the recorded maps, inverted."""
    img = _montage(study)
    affine = np.array(study["series"].affine)
    centre = affine @ np.array([(SIZE - 1) / 2 + SIZE * 0.22, (SIZE - 1) / 2 * 0.8, 3, 1.0])
    tile = next(t for t in img.tiles if t.slice_index == 3)
    m = np.array(tile.to_ras)
    # solve to_ras @ (x, y, 1) = centre for the in-plane axes (axial: RAS x and y)
    x, y = np.linalg.solve(m[:2, :2], centre[:2] - m[:2, 2])
    return float(x), float(y)


def _match(case: Case, findings: list[Finding]) -> LesionMatchResult:
    s = make_scored_sample(
        case,
        TaskFamily.LESION,
        "m",
        ParseStatus.OK,
        Answer(findings=findings),
        "",
        bertscore=False,
    )
    score = s.score("lesion_f1")
    assert score is not None
    details = score.details_as(LesionDetails)
    assert details is not None
    return details.match


def _finding(place: ImagePlace | None) -> Finding:
    return Finding(
        description="hyperintense plaque",
        sequence="FLAIR",
        hemisphere="left",
        region="frontal",
        signal="hyperintense",
        place=place,
    )


def test_every_tile_maps_its_pixels_onto_the_lesion_it_shows(study: dict[str, Any]) -> None:
    """The pixels the recorded maps put inside the lesion are the bright ones on the PNG, and
    their left-right mirror (what a flipped map would give) is not."""
    labels = _lesion_voxels()
    inv = np.linalg.inv(np.array(study["series"].affine))
    for img in study["images"]:
        png = np.asarray(Image.open(study["root"] / "png" / img.file).convert("L"), float)
        assert len(img.tiles) == len(img.slice_indices)
        inside, mirrored = [], []
        for t in img.tiles:
            ys, xs = np.mgrid[t.y : t.y + t.size, t.x : t.x + t.size]
            ras = np.array(t.to_ras) @ np.stack(
                [xs.ravel() + 0.5, ys.ravel() + 0.5, np.ones(xs.size)]
            )
            v = np.rint(inv[:3, :3] @ ras + inv[:3, 3:4]).astype(int)
            ok = np.all((v >= 0) & (v < np.array(labels.shape)[:, None]), axis=0)
            hit = np.zeros(xs.size, bool)
            hit[ok] = labels[v[0, ok], v[1, ok], v[2, ok]] > 0
            inside += list(png[ys.ravel()[hit], xs.ravel()[hit]])
            flipped = 2 * t.x + t.size - 1 - xs.ravel()[hit]
            mirrored += list(png[ys.ravel()[hit], flipped])
        if inside:
            assert np.mean(inside) > np.mean(mirrored) + 60, (img.file, np.mean(inside))
    assert any(len(i.tiles) == 1 for i in study["images"])  # the singles were checked too


def test_an_acquired_slice_names_its_instance_and_pixel(study: dict[str, Any]) -> None:
    """The tile of an acquired slice maps a PNG pixel to the stored instance's pixel (DICOM
    image coordinates, what an SR's SCOORD holds)."""
    import pydicom

    img = _montage(study)
    x, y = _lesion_point(study)
    tile = img.tiles[[t.slice_index for t in img.tiles].index(3)]
    by_uid = {
        pydicom.dcmread(p, stop_before_pixels=True).SOPInstanceUID: p
        for p in (study["root"] / "dicom").glob("*.dcm")
    }
    ds = pydicom.dcmread(by_uid[tile.sop_instance_uid], stop_before_pixels=True)
    assert ds.InstanceNumber == 4  # slice k = 3
    col, row = tile.scoord_point(x, y)  # type: ignore[misc]
    c = (SIZE - 1) / 2
    assert abs(col - (c + SIZE * 0.22 + 0.5)) < 0.01 and abs(row - (c * 0.8 + 0.5)) < 0.01


def test_a_point_inside_the_mask_localises_the_lesion(study: dict[str, Any]) -> None:
    case = _case(study)
    x, y = _lesion_point(study)
    res = _match(case, [_finding(ImagePlace(image=1, point=(x, y)))])
    assert res.n_detected == 1 and res.lesions[0].localised is True
    assert res.localisation_rate == 1.0 and res.n_pointed == 1
    assert res.findings[0].pointed is not None and res.findings[0].pointed.label == 1
    # a box around it points at its centre
    box = ImagePlace(image=1, box=(x - 3, y - 3, x + 3, y + 3))
    assert _match(case, [_finding(box)]).localisation_rate == 1.0


def test_a_point_outside_the_mask_does_not(study: dict[str, Any]) -> None:
    case = _case(study)
    x, y = _lesion_point(study)
    tile = next(t for t in _montage(study).tiles if t.slice_index == 3)
    mirror = 2 * tile.x + tile.size - x  # the same place in the other hemisphere
    res = _match(case, [_finding(ImagePlace(image=1, point=(mirror, y)))])
    assert res.n_detected == 1  # recognised from its words, but pointed at the wrong side
    assert res.lesions[0].localised is False and res.localisation_rate == 0.0
    assert res.findings[0].pointed is not None and res.findings[0].pointed.status == "outside"
    wrong_image = _match(case, [_finding(ImagePlace(image=2, point=(x, y)))])
    assert wrong_image.findings[0].pointed.status == "no_such_image"  # type: ignore[union-attr]
    assert wrong_image.localisation_rate == 0.0
    unplaced = _match(case, [_finding(None)])
    assert unplaced.localisation_rate == 0.0 and unplaced.n_pointed == 0


def test_without_a_mask_localisation_is_not_measured(study: dict[str, Any]) -> None:
    x, y = _lesion_point(study)
    res = _match(_case(study, mask=False), [_finding(ImagePlace(image=1, point=(x, y)))])
    assert res.localisation_rate is None and res.lesions[0].localised is None


@pytest.mark.parametrize(
    "place",
    [
        {"image": 0, "point": [1, 2]},
        {"image": 1, "point": [1e12, 2]},
        {"image": 1, "box": [5, 5, 1, 1]},
        {"image": 1},
        "the left frontal lobe",
        {"image": 1, "point": [1, 2, 3]},
    ],
)
def test_a_hostile_place_is_dropped_and_the_answer_kept(place: object) -> None:
    text = json.dumps({"findings": [{"description": "plaque", "place": place}]})
    parsed = parse_answer(text, TaskFamily.LESION)
    assert parsed.status is ParseStatus.OK and isinstance(parsed.answer, Answer)
    assert parsed.answer.findings[0].place is None
    assert any("place" in r for r in parsed.repairs), parsed.repairs


def test_a_place_given_as_text_numbers_is_read() -> None:
    text = json.dumps(
        {"findings": [{"description": "x", "place": {"image": "2", "point": ["3", 4]}}]}
    )
    parsed = parse_answer(text, TaskFamily.LESION)
    assert isinstance(parsed.answer, Answer)
    assert parsed.answer.findings[0].place == ImagePlace(image=2, point=(3.0, 4.0))


def test_the_image_rules_baseline_points_at_the_lesion_it_reports(
    phantom_suite: PhantomSuite, tmp_path: Path
) -> None:
    """On the phantom glioblastoma (exact mask), the baseline's finding of the mass points
    inside it: the whole path (render, point, map, mask) runs offline."""
    from evaluation.datasets import load_dataset
    from evaluation.prompts import default_prompts
    from evaluation.tasks import TaskItem, build_turns, images_for

    (case,) = [c for c in load_dataset(phantom_suite.root, tmp_path).cases if "gbm" in c.case_id]
    item = TaskItem(case_id=case.case_id, family=TaskFamily.LESION)
    turns = build_turns(case, item, default_prompts(), lambda r: Path(r.path).read_bytes())
    parsed = parse_answer(answer_for([turns.system, *turns.turns]), TaskFamily.LESION)
    assert isinstance(parsed.answer, Answer)
    assert parsed.answer.findings and all(f.place for f in parsed.answer.findings)
    shown = case.model_copy(update={"images": images_for(case, TaskFamily.LESION)})
    res = _match(shown, parsed.answer.findings)
    assert res.n_detected == 1 and res.localisation_rate == 1.0, res.findings
