"""A finding pointed at on the image goes into the SR as a spatial coordinate (issue 39): a
SCOORD POINT on the acquired slice's instance (TID 1410 planar ROI group, what OHIF's SR display
draws), a SCOORD3D POINT in patient coordinates when that instance is not in the evidence; an
unpointed finding stays as before. Each SR passes dciodvfy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pydicom
import pytest
from dciodvfy import assert_dciodvfy_clean
from gateway_synth import in_lesion, make_study

from dicom import RenderOptions, index_path, render_path
from evaluation import Finding, ImageRef
from evaluation.answers import ImagePlace
from evaluation.case import TaskFamily
from evaluation.review import FindingRegion, ReportContent, finding_region
from gateway.sr import build_sr

SIZE, SLICES = 64, 6
_TILES: dict[str, Any] = {}  # the montage's tiles and the lesion's place, from the fixture


@pytest.fixture(scope="module")
def pointed(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[list[pydicom.Dataset], FindingRegion]:
    root = tmp_path_factory.mktemp("sr-loc")
    study = make_study(root / "dicom", classes=("FLAIR",), n_slices=SLICES, size=SIZE)
    index = index_path(root / "dicom", workers=1)
    manifest = render_path(
        root / "dicom", root / "png", RenderOptions(n_slices=SLICES), index=index
    )
    (img,) = manifest.images
    ref = ImageRef(
        path=img.file,
        sha256=img.sha256,
        label=img.label,
        series_uid=img.series_uid,
        tiles=img.tiles,
    )
    tile = next(t for t in img.tiles if t.slice_index == 3)
    headers = [pydicom.dcmread(p, stop_before_pixels=True) for p in study.files]
    # the lesion's centre pixel on slice 3, through the recorded map, inverted
    c = (SIZE - 1) / 2
    affine = np.array(index.series[0].affine)
    centre = affine @ np.array([c + SIZE * 0.22, c * 0.8, 3, 1.0])
    m = np.array(tile.to_ras)
    x, y = np.linalg.solve(m[:2, :2], centre[:2] - m[:2, 2])
    place = ImagePlace(image=1, point=(float(x), float(y)))
    region = finding_region(place, [ref])
    assert region is not None
    _TILES.update(tiles=img.tiles, place=place)
    return headers, region


def _finding() -> Finding:
    return Finding(description="FLAIR hyperintense plaque", hemisphere="left", region="frontal")


def _scoords(sr: pydicom.Dataset, vr: str) -> list[pydicom.Dataset]:
    out: list[pydicom.Dataset] = []

    def walk(items: pydicom.Sequence) -> None:
        for it in items:
            if it.get("ValueType") == vr:
                out.append(it)
            if "ContentSequence" in it:
                walk(it.ContentSequence)

    walk(sr.ContentSequence)
    return out


def test_a_pointed_finding_is_a_scoord_on_its_slice(
    pointed: tuple[list[pydicom.Dataset], FindingRegion],
) -> None:
    headers, region = pointed
    slice4 = next(h for h in headers if h.InstanceNumber == 4)
    assert region.sop_instance_uid == slice4.SOPInstanceUID
    sr = build_sr(headers, ReportContent(findings=[_finding()], regions=[region]), "m", "v", 1)
    (scoord,) = _scoords(sr, "SCOORD")
    assert scoord.GraphicType == "POINT"
    c = (SIZE - 1) / 2
    assert np.allclose(scoord.GraphicData, [c + SIZE * 0.22 + 0.5, c * 0.8 + 0.5], atol=0.01)
    (image,) = _scoords(sr, "IMAGE")
    assert image.ReferencedSOPSequence[0].ReferencedSOPInstanceUID == slice4.SOPInstanceUID
    assert_dciodvfy_clean(sr)


def test_without_its_instance_in_the_evidence_it_is_a_scoord3d(
    pointed: tuple[list[pydicom.Dataset], FindingRegion],
) -> None:
    headers, region = pointed
    others = [h for h in headers if h.SOPInstanceUID != region.sop_instance_uid]
    sr = build_sr(others, ReportContent(findings=[_finding()], regions=[region]), "m", "v", 1)
    assert not _scoords(sr, "SCOORD")
    (s3d,) = _scoords(sr, "SCOORD3D")
    x, y, z = region.ras_mm
    assert np.allclose(s3d.GraphicData, [-x, -y, z], atol=0.01)  # LPS
    assert s3d.ReferencedFrameOfReferenceUID == headers[0].FrameOfReferenceUID
    assert_dciodvfy_clean(sr)


def test_an_unpointed_finding_stays_as_it_was(
    pointed: tuple[list[pydicom.Dataset], FindingRegion],
) -> None:
    headers, _ = pointed
    sr = build_sr(headers, ReportContent(findings=[_finding()]), "m", "v", 1)
    assert not _scoords(sr, "SCOORD") and not _scoords(sr, "SCOORD3D")
    assert_dciodvfy_clean(sr)


def test_a_review_block_carries_the_point_into_the_unverified_sr(
    pointed: tuple[list[pydicom.Dataset], FindingRegion],
) -> None:
    """report_blocks with the case's images: the finding's place, read on the images its answer
    was sent, becomes the UNVERIFIED SR's SCOORD; without the images nothing changes."""
    from evaluation.answers import Answer
    from evaluation.case import TaskFamily
    from evaluation.log.rundata import SampleResult
    from evaluation.review import report_blocks, unverified_content
    from evaluation.scores import ParseStatus
    from evaluation.scoring import ScoredSample

    headers, region = pointed
    ref = ImageRef(path="m.png", sha256="a" * 64, label="FLAIR", series_uid=region.series_uid)
    ref = ref.model_copy(update={"tiles": _TILES["tiles"]})
    f = _finding().model_copy(update={"place": _TILES["place"]})
    sample = SampleResult(
        scored=ScoredSample(
            case_id="c", patient_id="p", family=TaskFamily.LESION, model="m", status=ParseStatus.OK
        ),
        answer=Answer(findings=[f]),
        images_sent=[ref.sha256],
    )
    (block,) = report_blocks([sample], {ref.sha256: ref})
    content = unverified_content(block)
    assert content.regions == [region]
    sr = build_sr(headers, content, "m", "v", 1)
    assert len(_scoords(sr, "SCOORD")) == 1
    (plain,) = report_blocks([sample])
    assert unverified_content(plain).regions == [None]


def test_the_gateway_unverified_sr_points_at_the_lesion_of_a_run(tmp_path: Path) -> None:
    """What the gateway writes back after a run (build_unverified on the run's RunData): the
    image-rules finding's point is a SCOORD on a slice that carries the lesion, inside it. The
    case's images (run.images) are what the place is read on; before, none were passed."""
    from gateway.routing import Route
    from gateway.settings import Settings
    from gateway.study_run import DefaultEvaluator
    from gateway.writeback import build_unverified

    n = 12
    study = make_study(tmp_path / "study", classes=("FLAIR",), n_slices=n, size=SIZE)
    route = Route(rule="t", models=["reference/image-rules"], tasks=[TaskFamily.LESION],
                  series_classes=["FLAIR"])  # fmt: skip
    run = (
        DefaultEvaluator(Settings(data_dir=tmp_path))
        .evaluate(tmp_path / "study", route, tmp_path / "runs" / ("0" * 32))
        .run
    )
    headers = [pydicom.dcmread(p, stop_before_pixels=True) for p in study.files]
    sr = build_unverified(run, route.models, headers, 1, "v").srs["reference/image-rules"]
    (scoord,) = _scoords(sr, "SCOORD")
    (image,) = _scoords(sr, "IMAGE")
    uid = image.ReferencedSOPSequence[0].ReferencedSOPInstanceUID
    (target,) = [h for h in headers if h.SOPInstanceUID == uid]
    col, row = (float(v) - 0.5 for v in scoord.GraphicData)  # SCOORD: a pixel's centre is +0.5
    assert in_lesion(target, n, col, row, "left"), (target.InstanceNumber, col, row)
    assert_dciodvfy_clean(sr)
