"""Phantom physics and ground truth, read back through the imaging core like any study.

Images are decoded with dicom.index + dicom.pixels (so the DICOM geometry is what the tests
trust), lesions come from masks/lesions.nii.gz, and each check would fail if the simulation,
the headers or the mask were wrong.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from phantom_fixture import PHANTOM_CASES, PhantomSuite, Study, centres, flat, sample
from scipy import ndimage

from dicom.pixels import load_volume
from evaluation.case import Difficulty, DiseaseGroup, Signal, TaskFamily


@pytest.fixture(scope="module")
def studies(phantom_suite: PhantomSuite) -> dict[str, Study]:
    return {k: Study(phantom_suite.case_dir(k)) for k in PHANTOM_CASES}


def test_case_json_is_a_valid_case_with_tasks_turns_and_provenance(
    studies: dict[str, Study],
) -> None:
    for key, st in studies.items():
        c, gt = st.case, st.case.ground_truth
        assert gt is not None and gt.final_diagnosis.icd10 and gt.final_diagnosis.group is not None
        assert c.study_path == "dicom" and c.images == [] and c.provenance.source == "phantom"
        assert c.provenance.seed is not None and c.provenance.generator
        assert set(c.tasks) >= {
            TaskFamily.DIFFERENTIAL,
            TaskFamily.LESION,
            TaskFamily.RATIONALE,
            TaskFamily.CLASSIFICATION,
        }
        assert gt.differential[0].name == gt.final_diagnosis.name and len(gt.differential) >= 3
        assert gt.synonyms and gt.key_findings and gt.final_diagnosis.name in gt.rationale
        assert json.loads((st.folder / "ehr.json").read_text(encoding="utf-8")) == c.ehr
        assert (st.folder / "note.txt").read_text(encoding="utf-8") == c.note
        assert c.ehr and c.ehr["resourceType"] == "Bundle"
        kinds = {e["resource"]["resourceType"] for e in c.ehr["entry"]}
        assert {"Patient", "Encounter", "Observation", "DocumentReference"} <= kinds, key
        uids = {s.study_uid for s in st.index.series}
        assert uids == set(c.provenance.study_uids)
    l3 = studies["l3"].case
    assert l3.ground_truth is not None and l3.ground_truth.difficulty is Difficulty.L3
    assert TaskFamily.MULTITURN in l3.tasks and len(l3.turns) == 3
    assert l3.turns[0].reveal_series == ["CT"] and "DWI" in l3.turns[1].reveal_series
    assert l3.turns[2].reveal_text and not l3.turns[2].reveal_series
    assert TaskFamily.MULTITURN not in studies["ms"].case.tasks and not studies["ms"].case.turns


def test_every_series_is_classified_from_headers_as_the_generator_intended(
    studies: dict[str, Study],
) -> None:
    for key, st in studies.items():
        intended = {s.series_uid: s.series_class for s in st.case.provenance.phantom.series}
        found = {(s.series_uid, s.series_class.value) for s in st.index.series}
        assert st.index.errors == [], key
        assert {uid for uid, _ in found} == set(intended), key
        for uid, cls in found:
            assert cls == intended[uid], (
                f"{key}: series {uid} classified {cls}, intended {intended[uid]}"
            )
    dwi = [s for s in studies["stroke"].index.series if s.series_class.value == "DWI"]
    assert sorted(s.b_values[0] for s in dwi) == [0.0, 1000.0]
    t1c = studies["gbm"].series("T1C")
    assert t1c.contrast_agent and all(
        not s.contrast_agent for s in studies["gbm"].index.series if s.series_class.value != "T1C"
    )


def test_mask_labels_are_the_lesions_and_lie_where_the_truth_says(
    studies: dict[str, Study],
) -> None:
    for key, st in studies.items():
        gt = st.case.ground_truth
        assert gt is not None
        assert np.allclose(np.diag(st.mask_affine)[:3], 1.0), "mask affine must be RAS, 1 mm"
        assert set(np.unique(st.mask)) - {0} == {les.mask_label for les in gt.lesions}, key
        for les in gt.lesions:
            pts = np.argwhere(st.mask == les.mask_label) + st.mask_affine[:3, 3]
            assert les.center_mm is not None and les.size_mm is not None
            assert np.allclose(pts.mean(axis=0), les.center_mm, atol=0.1)
            if les.hemisphere.value in ("left", "right"):
                assert (les.center_mm[0] > 0) == (les.hemisphere.value == "right"), (key, les.id)
            extent = pts.max(axis=0) - pts.min(axis=0) + 1
            assert extent.max() <= les.size_mm + 1 and les.size_mm <= np.linalg.norm(extent) + 1
    assert studies["l3"].case.ground_truth.lesions == []  # type: ignore[union-attr]


def test_flair_inside_ms_plaques_is_brighter_than_surrounding_white_matter(
    studies: dict[str, Study],
) -> None:
    from evaluation.datasets.phantoms.anatomy import get_anatomy

    st = studies["ms"]
    flair, aff = st.volume("FLAIR")
    pts = centres(flair.shape, aff)
    labels = st.mask_at(pts)
    anatomy = get_anatomy()
    wm = anatomy.sample(anatomy.fraction("wm"), pts)
    lesion_any = st.mask > 0
    dist_out = ndimage.distance_transform_edt(~lesion_any)
    vox = np.clip(np.rint(pts - st.mask_affine[:3, 3]).astype(int), 0, np.array(st.mask.shape) - 1)
    d = dist_out[vox[:, 0], vox[:, 1], vox[:, 2]]
    values = flat(flair)
    checked = brighter = 0
    for les in st.case.ground_truth.lesions:  # type: ignore[union-attr]
        inside = labels == les.mask_label
        if inside.sum() < 3:
            continue  # thinner than the 6 mm slice spacing here
        near = np.linalg.norm(pts - np.array(les.center_mm), axis=1) < les.size_mm + 12  # type: ignore[operator]
        shell = near & (d >= 3) & (d <= 10) & (wm > 0.8)
        if shell.sum() < 5:
            continue  # no white matter around (a brainstem plaque)
        checked += 1
        brighter += values[inside].mean() > 1.2 * values[shell].mean()
        assert les.signal["FLAIR"] is Signal.HYPER and les.signal["T2"] is Signal.HYPER
    assert checked >= 3 and brighter == checked


def test_adc_in_the_acute_infarct_is_below_the_mirror_region(studies: dict[str, Study]) -> None:
    st = studies["stroke"]
    adc, aff = st.volume("ADC")
    dwi, daff = st.volume("DWI", b=1000)
    pts = centres(adc.shape, aff)
    core = st.mask_at(pts, depth=2.0) == 1
    assert core.sum() > 20
    mirror = pts[core] * np.array([-1.0, 1.0, 1.0])
    assert flat(adc)[core].mean() < 0.75 * sample(adc, aff, mirror).mean()
    assert sample(dwi, daff, pts[core]).mean() > 1.3 * sample(dwi, daff, mirror).mean()
    les = st.case.ground_truth.lesions[0]  # type: ignore[union-attr]
    assert (
        les.diffusion_restriction
        and les.signal["ADC"] is Signal.HYPO
        and les.signal["DWI"] is Signal.HYPER
    )


def test_haematoma_is_60_to_85_hu_on_ct_and_dark_with_no_mr_here(studies: dict[str, Study]) -> None:
    st = studies["ich"]
    ct, aff = st.volume("CT")
    pts = centres(ct.shape, aff)
    core = st.mask_at(pts, depth=3.0) == 1
    hu = flat(ct)
    assert core.sum() > 30
    assert 60 <= hu[core].mean() <= 85
    mirror = sample(ct, aff, pts[core] * np.array([-1.0, 1.0, 1.0]))
    assert 15 <= mirror.mean() <= 45  # normal brain on the other side
    assert st.case.ground_truth.lesions[0].signal == {"CT": Signal.HYPERDENSE}  # type: ignore[union-attr]
    assert st.case.ground_truth.modality == "CT"  # type: ignore[union-attr]


def test_enhancement_shows_only_on_t1c(studies: dict[str, Study]) -> None:
    from evaluation.datasets.phantoms.tissue import TissueParams, protocols, signal

    st = studies["gbm"]
    pre = [
        s
        for s in st.index.series
        if s.series_class.value == "T1" and s.plane and s.plane.value == "axial"
    ]
    assert len(pre) == 1
    t1 = np.asarray(load_volume(pre[0]).data)
    aff = np.array(pre[0].affine)
    t1c, caff = st.volume("T1C")
    assert np.allclose(aff, caff) and t1.shape == t1c.shape
    pts = centres(t1.shape, aff)
    a, b = flat(t1), flat(t1c)
    lesion = st.mask_at(pts, depth=1.0) == 1
    far = np.linalg.norm(pts - np.array(st.case.ground_truth.lesions[0].center_mm), axis=1) > 60  # type: ignore[union-attr]
    brain = far & (a > np.percentile(a[a > 0], 40)) & (a < np.percentile(a, 99))
    gain_lesion = (b[lesion] - a[lesion]).mean() / a[lesion].mean()
    gain_brain = (b[brain] - a[brain]).mean() / a[brain].mean()
    assert gain_lesion > 0.4 and abs(gain_brain) < 0.1, (gain_lesion, gain_brain)
    # Gadolinium changes the signal equation only for the post-contrast protocol.
    enhancing = TissueParams(1700, 120, 50, 0.85, 1.0, 35, gd=0.45)
    plain = TissueParams(1700, 120, 50, 0.85, 1.0, 35, gd=0.0)
    for field_t in (1.5, 3.0):
        for role, proto in protocols(field_t).items():
            same = signal(enhancing, proto, field_t) == signal(plain, proto, field_t)
            assert same == (role != "t1c"), role
    les = st.case.ground_truth.lesions[0]  # type: ignore[union-attr]
    assert les.enhancement.value == "ring" and les.signal["T1C"] in (Signal.HYPER, Signal.MIXED)
    assert not les.diffusion_restriction


def test_abscess_restricts_diffusion_in_its_core_and_glioblastoma_does_not(
    studies: dict[str, Study],
) -> None:
    st = studies["abscess"]
    dwi, daff = st.volume("DWI", b=1000)
    adc, aaff = st.volume("ADC")
    pts = centres(adc.shape, aaff)
    core = st.mask_at(pts, depth=4.0) == 1
    assert core.sum() > 5
    mirror = pts[core] * np.array([-1.0, 1.0, 1.0])
    assert sample(adc, aaff, pts[core]).mean() < 0.8 * sample(adc, aaff, mirror).mean()
    assert sample(dwi, daff, pts[core]).mean() > 1.3 * sample(dwi, daff, mirror).mean()
    gt = st.case.ground_truth
    assert gt is not None and gt.lesions[0].diffusion_restriction
    assert (
        gt.final_diagnosis.group is DiseaseGroup.INFECTION and gt.final_diagnosis.icd10 == "G06.0"
    )


def test_lesion_is_on_the_image_side_radiology_expects(studies: dict[str, Study]) -> None:
    """Axial images: patient right on the image left (low column index), anterior on top."""
    st = studies["stroke"]
    s = st.series("DWI", b=1000)
    dwi = np.asarray(load_volume(s).data)
    les = st.case.ground_truth.lesions[0]  # type: ignore[union-attr]
    aff = np.array(s.affine)
    assert les.center_mm is not None
    k = int(np.argmin(np.abs(aff[2, 3] + np.arange(dwi.shape[2]) * aff[2, 2] - les.center_mm[2])))
    img = dwi[:, :, k]  # (column, row)
    half = img.shape[0] // 2
    right_brighter = img[:half].sum() > img[half:].sum()
    assert right_brighter == (les.hemisphere.value == "right")
    assert aff[0, 0] < 0  # column index runs towards the patient's left
