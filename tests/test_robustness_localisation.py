"""Localisation on the audit's image variants (issue 39): a mirrored variant's images carry
tile maps of the flipped sheet, so a model that points at the lesion it is shown is localised
and one that points where the lesion was before the flip is not; another patient's images say
nothing of this case's mask, so localisation is not measured there.

A synthetic FLAIR study (tests/gateway_synth.py, lesion in the patient's left hemisphere on
the middle three slices) with its exact label mask on the series' voxel grid."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pydicom
import pytest
from gateway_synth import in_lesion, make_study
from PIL import Image

from dicom import RenderOptions, index_path, render_path
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
from evaluation.robustness import make_variant
from evaluation.scores import LesionDetails, LesionMatchResult, ParseStatus
from evaluation.scoring import make_scored_sample

SIZE, SLICES = 64, 6


def _case(root: Path, case_id: str, side: str) -> Case:
    study = make_study(root / "dicom", classes=("FLAIR",), n_slices=SLICES, size=SIZE,
                       lesion=side, patient_id=case_id)  # fmt: skip
    index = index_path(root / "dicom", workers=1)
    (series,) = index.series
    assert series.affine is not None
    headers = sorted(
        (pydicom.dcmread(p, stop_before_pixels=True) for p in study.files),
        key=lambda h: int(h.InstanceNumber),
    )
    mask = np.zeros((SIZE, SIZE, SLICES), np.uint8)  # (col, row, slice), the series' grid
    for k, h in enumerate(headers):
        for col in range(SIZE):
            for row in range(SIZE):
                mask[col, row, k] = in_lesion(h, SLICES, col, row, side)
    (root / "masks").mkdir()
    nib.save(nib.Nifti1Image(mask, np.array(series.affine)), root / "masks" / "lesions.nii.gz")
    manifest = render_path(
        root / "dicom", root / "png", RenderOptions(n_slices=SLICES), index=index
    )
    img = next(i for i in manifest.images if i.kind == "montage")
    ref = ImageRef(path=str(root / "png" / img.file), sha256=img.sha256, label=img.label,
                   series_class="FLAIR", kind="montage", tiles=img.tiles)  # fmt: skip
    lesion = LesionTruth(id="L1", type="plaque", hemisphere=side, region="frontal",
                         signal={"FLAIR": "hyperintense"}, mask_label=1)  # fmt: skip
    case = Case(
        case_id=case_id,
        patient_id=case_id,
        images=[ref],
        ground_truth=GroundTruth(
            final_diagnosis=Diagnosis(name="multiple sclerosis"), lesions=[lesion]
        ),
        tasks=[TaskFamily.LESION],
        provenance=Provenance(source="test"),
    )
    case.root = str(root)
    return case


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("robust-loc")
    return {
        "left": _case(root / "a", "loc-a", "left"),
        "right": _case(root / "b", "loc-b", "right"),
        "out": root / "variants",
    }


def _bright_point(case: Case) -> tuple[float, float]:
    """The centre of the brightest blob on the montage (the lesion, as the image shows it)."""
    png = np.asarray(Image.open(case.images[0].path).convert("L"), float)
    ys, xs = np.nonzero(png >= png.max() - 1)
    return float(np.median(xs)) + 0.5, float(np.median(ys)) + 0.5


def _match(case: Case, point: tuple[float, float]) -> LesionMatchResult:
    gt = case.ground_truth
    assert gt is not None
    finding = Finding(description="hyperintense plaque", sequence="FLAIR",
                      hemisphere=gt.lesions[0].hemisphere, region="frontal",
                      signal="hyperintense", place=ImagePlace(image=1, point=point))  # fmt: skip
    s = make_scored_sample(case, TaskFamily.LESION, "m", ParseStatus.OK,
                           Answer(findings=[finding]), "", bertscore=False)  # fmt: skip
    score = s.score("lesion_f1")
    assert score is not None
    details = score.details_as(LesionDetails)
    assert details is not None
    return details.match


def test_the_source_case_localises_the_point_on_its_lesion(cases: dict[str, Any]) -> None:
    assert _match(cases["left"], _bright_point(cases["left"])).localisation_rate == 1.0


def test_on_the_mirror_the_lesion_it_shows_is_localised_and_the_old_place_is_not(
    cases: dict[str, Any],
) -> None:
    source = cases["left"]
    mirrored, _ = make_variant(source, "mirrored", cases["out"])
    shown = _bright_point(mirrored)  # where the mirrored image shows the lesion
    before = _bright_point(source)
    width = Image.open(mirrored.images[0].path).width
    assert abs(shown[0] - (width - before[0])) <= 1.0 and abs(shown[1] - before[1]) <= 1.0
    res = _match(mirrored, shown)
    assert res.localisation_rate == 1.0, res.findings
    wrong = _match(mirrored, before)  # where it was before the flip: empty on this image
    assert wrong.localisation_rate == 0.0
    assert wrong.findings[0].pointed is not None and wrong.findings[0].pointed.status == "outside"
    # every tile of the flipped sheet still names its slice and instance
    assert [t.sop_instance_uid for t in mirrored.images[0].tiles] == [
        t.sop_instance_uid for t in source.images[0].tiles
    ]


def test_another_patients_images_are_not_measured_against_this_mask(
    cases: dict[str, Any],
) -> None:
    other, _ = make_variant(cases["left"], "other_patient", cases["out"], pool=[cases["right"]])
    res = _match(other, _bright_point(other))
    assert res.localisation_rate is None and res.lesions[0].localised is None
