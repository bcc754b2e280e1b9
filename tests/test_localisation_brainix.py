"""BRAINIX's tumour ROI as a lesion's truth mask (issue 39): a manifest lesion names the mask
series of its own study (``mask_series``: BRAINIX's "FLAIR_ROI", a 0/1 mask on the FLAIR grid),
the lesion scorer localises a finding pointed inside it and not one pointed outside, and the
mask is never among the images a model is shown.

The ROI is read here with pydicom (its own files, matched to the shown FLAIR slice by position),
not through the code under test."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pydicom
import pytest
from scipy import ndimage

from evaluation.answers import Answer, Finding, ImagePlace
from evaluation.case import Case, ImageRef, TaskFamily
from evaluation.datasets import load_manifest
from evaluation.scores import LesionDetails, LesionMatchResult, ParseStatus
from evaluation.scoring import make_scored_sample

pytestmark = pytest.mark.corpus
BRAINIX = "brainix/BRAINIX/DICOM"


def _manifest(folder: Path, corpus: Path, mask_series: str | None) -> Path:
    lesion = {"id": "tumour", "type": "infiltrative mass", "hemisphere": "left",
              "region": "frontal", "signal": {"FLAIR": "hyperintense"}}  # fmt: skip
    if mask_series is not None:
        lesion["mask_series"] = mask_series
    entry = {
        "case_id": "brainix-roi",
        "patient_id": "P-BRAINIX",
        "study": str(corpus / BRAINIX),
        "ground_truth": {"final_diagnosis": {"name": "glioblastoma"}, "lesions": [lesion]},
        "tasks": ["lesion"],
    }
    path = folder / f"manifest-{abs(hash(mask_series))}.json"
    path.write_text(json.dumps({"name": "brainix", "cases": [entry]}), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def brainix(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Case:
    folder = tmp_path_factory.mktemp("brainix-roi")
    _, (case,), _ = load_manifest(_manifest(folder, corpus, "FLAIR_ROI"), folder / "cache")
    return case


def _roi_point(case: Case, corpus: Path) -> tuple[int, tuple[float, float], ImageRef]:
    """(image number, PNG point, image) deep inside the ROI on a shown slice of its grid (the
    FLAIR): the ROI instance at the slice's position, its pixel farthest from the ROI's edge,
    mapped onto the PNG through the tile's recorded pixel map (inverted)."""
    by_uid, roi_at = {}, {}
    for p in (corpus / BRAINIX).rglob("*.dcm"):
        ds = pydicom.dcmread(p, stop_before_pixels=True)
        by_uid[str(ds.SOPInstanceUID)] = ds
        if ds.get("SeriesDescription") == "FLAIR_ROI":
            roi_at[tuple(round(float(v), 2) for v in ds.ImagePositionPatient)] = p
    best: tuple[float, int, tuple[float, float], ImageRef] | None = None
    for n, img in enumerate(case.images, start=1):
        for t in img.tiles:
            src = by_uid.get(t.sop_instance_uid)
            if src is None or t.to_source is None:
                continue
            roi = roi_at.get(tuple(round(float(v), 2) for v in src.ImagePositionPatient))
            if roi is None:
                continue
            roi_ds = pydicom.dcmread(roi)
            grid = ("Rows", "Columns", "PixelSpacing", "ImageOrientationPatient")
            if not all(np.allclose(np.ravel(src.get(k)), np.ravel(roi_ds.get(k)), atol=1e-4)
                       for k in grid):  # fmt: skip
                continue  # another grid at the same position (T2, T1): not the ROI's
            mask = roi_ds.pixel_array > 0
            if not mask.any():
                continue
            depth = ndimage.distance_transform_edt(mask)
            row, col = np.unravel_index(int(np.argmax(depth)), depth.shape)
            m = np.array(t.to_source)  # (x, y, 1) -> (column, row), pixel centres at integers
            x, y = np.linalg.solve(m[:, :2], np.array([col, row], float) - m[:, 2])
            if t.contains(x, y) and (best is None or depth.max() > best[0]):
                best = (float(depth.max()), n, (float(x), float(y)), img)
    assert best is not None, "no shown slice crosses the ROI"
    return best[1], best[2], best[3]


def _match(case: Case, place: ImagePlace | None) -> LesionMatchResult:
    finding = Finding(description="FLAIR hyperintense mass", sequence="FLAIR", hemisphere="left",
                      region="frontal", signal="hyperintense", place=place)  # fmt: skip
    s = make_scored_sample(case, TaskFamily.LESION, "m", ParseStatus.OK,
                           Answer(findings=[finding]), "", bertscore=False)  # fmt: skip
    score = s.score("lesion_f1")
    assert score is not None
    details = score.details_as(LesionDetails)
    assert details is not None
    return details.match


def test_the_roi_is_never_shown_to_the_model(brainix: Case) -> None:
    assert brainix.images and all(i.series_class != "MASK" for i in brainix.images)
    assert all("ROI" not in i.label for i in brainix.images)


def test_a_point_inside_brainix_roi_localises_the_tumour(brainix: Case, corpus: Path) -> None:
    n, (x, y), img = _roi_point(brainix, corpus)
    assert img.series_class == "FLAIR"
    res = _match(brainix, ImagePlace(image=n, point=(x, y)))
    assert res.n_detected == 1 and res.lesions[0].localised is True, res.findings
    assert res.localisation_rate == 1.0
    assert res.findings[0].pointed is not None and res.findings[0].pointed.status == "lesion"


def test_a_point_outside_brainix_roi_does_not(brainix: Case, corpus: Path) -> None:
    n, (x, y), img = _roi_point(brainix, corpus)
    tile = next(t for t in img.tiles if t.contains(x, y))
    mirror = 2 * tile.x + tile.size - x  # the same place in the right hemisphere
    res = _match(brainix, ImagePlace(image=n, point=(mirror, y)))
    assert res.n_detected == 1 and res.lesions[0].localised is False
    assert res.localisation_rate == 0.0
    assert res.findings[0].pointed is not None and res.findings[0].pointed.status == "outside"


def test_without_the_mask_series_localisation_is_not_measured(
    brainix: Case, corpus: Path, tmp_path: Path
) -> None:
    """The same case without ``mask_series``: None, never 0 (BRAINIX has no lesions.nii.gz)."""
    n, point, _ = _roi_point(brainix, corpus)
    gt = brainix.ground_truth
    assert gt is not None
    plain = gt.model_copy(
        update={"lesions": [les.model_copy(update={"mask_series": None}) for les in gt.lesions]}
    )
    case = brainix.model_copy(update={"ground_truth": plain})
    case.root = brainix.root
    res = _match(case, ImagePlace(image=n, point=point))
    assert res.localisation_rate is None and res.lesions[0].localised is None


def test_a_series_the_truth_names_as_a_mask_is_never_shown(corpus: Path, tmp_path: Path) -> None:
    """Whatever its class: a manifest naming BRAINIX's T1 as the lesion's mask keeps the T1 out
    of every image (the FLAIR and T2 still shown), by description or by UID alike."""
    t1 = pydicom.dcmread(next((corpus / BRAINIX / "T1").iterdir()), stop_before_pixels=True)
    for name in (" t1/se/EXTRP ", str(t1.SeriesInstanceUID)):
        _, (case,), _ = load_manifest(_manifest(tmp_path, corpus, name), tmp_path / "cache")
        shown = {i.series_class for i in case.images}
        assert "T1" not in shown and {"FLAIR", "T2"} <= shown, (name, shown)


def test_cases_check_names_a_mask_series_the_study_does_not_hold(
    corpus: Path, tmp_path: Path
) -> None:
    """A typo in ``mask_series`` would leave localisation unmeasured without a word: `cases
    check` names the field, what it looked for and the study's series."""
    from evaluation.datasets import check_manifest

    assert check_manifest(_manifest(tmp_path, corpus, "FLAIR_ROI")).problems == []
    check = check_manifest(_manifest(tmp_path, corpus, "FLAIR_RIO"))
    (problem,) = check.problems
    assert problem.path == "cases[0].ground_truth.lesions[0].mask_series"
    assert "'FLAIR_RIO' names no series" in problem.message and "FLAIR_ROI" in problem.message
    assert check.cases_ok == 0


def test_the_docs_brainix_example_checks_clean_as_its_comment_sets_it_up(
    corpus: Path, tmp_path: Path
) -> None:
    """docs/brainix.example.yaml is the manifest a user copies for BRAINIX with its ROI: set up
    as its comment says (the study copied beside it), `cases check` finds the study and the
    mask series, and the lesion's truth names the ROI."""
    import shutil

    import yaml

    from evaluation.datasets import check_manifest

    example = Path(__file__).resolve().parents[1] / "docs" / "brainix.example.yaml"
    assert "cp -r ../shared/data/dicom/brainix/BRAINIX/DICOM brainix/study" in example.read_text()
    shutil.copy(example, tmp_path / "manifest.yaml")
    shutil.copytree(corpus / BRAINIX, tmp_path / "study")
    check = check_manifest(tmp_path / "manifest.yaml")
    assert check.problems == [] and check.cases_ok == 1
    (lesion,) = yaml.safe_load(example.read_text())["cases"][0]["ground_truth"]["lesions"]
    assert lesion["mask_series"] == "FLAIR_ROI" and lesion["hemisphere"] == "left"
