"""Whether a finding's place on an image falls inside the lesion it was matched to.

A finding may carry a place (``answers.ImagePlace``): the image's number in the request and a
point (or a box, pointed at by its centre) in that image's pixels. The renderer recorded, for
every slice on an image, its box and the affine map of a pixel to the patient
(``dicom.TilePlace``), so the point is a patient position (RAS mm); the case's lesion label mask
(a phantom's ``masks/lesions.nii.gz``, exact by construction; or a mask series of the study the
lesion names, as BRAINIX's tumour ROI) says which lesion, if any, is there. A lesion is *localised* when its best finding points inside its own label.

The localisation rate (localised lesions / lesions) is reported beside recognition only where it
can be measured: a case with a label mask and images whose geometry was recorded. Where it
cannot, it is None, never 0: a model is not marked down for what the sandbox could not check.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel

from evaluation.answers import Finding, ImagePlace
from evaluation.case import Case, GroundTruth, ImageRef, names_series
from evaluation.scores import LesionMatchResult, PointOutcome

MASK_FILE = Path("masks") / "lesions.nii.gz"


class LesionMask:
    """Label volumes, each on its own voxel grid (0 outside every lesion, a lesion's label
    inside it): a phantom's NIfTI, and each mask series a lesion names in its study."""

    def __init__(self, labels: np.ndarray, affine: np.ndarray) -> None:
        self.volumes = [(labels, np.linalg.inv(affine))]

    def joined(self, other: LesionMask) -> LesionMask:
        out = LesionMask.__new__(LesionMask)
        out.volumes = [*self.volumes, *other.volumes]
        return out

    def label_at(self, ras: tuple[float, float, float]) -> int:
        """The label of the voxel nearest to ``ras`` (0 outside every volume)."""
        for labels, to_voxel in self.volumes:
            v = to_voxel[:3, :3] @ np.asarray(ras) + to_voxel[:3, 3]
            ijk = np.rint(v).astype(int)
            if np.any(ijk < 0) or np.any(ijk >= np.asarray(labels.shape[:3])):
                continue
            label = int(labels[tuple(ijk)])
            if label:
                return label
        return 0


@functools.lru_cache(maxsize=16)
def _load(path: str, mtime_ns: int) -> LesionMask:
    import nibabel as nib

    img: Any = nib.load(path)
    return LesionMask(np.asarray(img.dataobj).astype(np.int32), np.asarray(img.affine))


@functools.lru_cache(maxsize=16)
def _series_mask(study: str, name: str, label: int, mtime_ns: int) -> LesionMask | None:
    """The mask series ``name`` of the study (every stack of it) as label ``label`` where it is
    non-zero; None when the study holds no such series, more than one (`cases check` says so),
    or it cannot be read."""
    from dicom import ImagingError, index_path, load_volume

    try:
        index = index_path(study, workers=1)
        hits = [s for s in index.series if names_series(name, s.series_uid, s.description)]
        if len({s.series_uid for s in hits}) != 1 or any(s.affine is None for s in hits):
            return None
        out: LesionMask | None = None
        for stack in hits:
            data = np.asarray(load_volume(stack).data)
            labels = np.where(data[..., 0] if data.ndim == 4 else data, label, 0)
            part = LesionMask(labels.astype(np.int32), np.array(stack.affine))
            out = part if out is None else out.joined(part)
        return out
    except (ImagingError, OSError, ValueError):
        return None


def truth_labels(gt: GroundTruth) -> dict[str, int]:
    """Each lesion's label in the case's masks: its ``mask_label``, else (a lesion whose mask
    is a series of the study) its position in the truth, from 1; a lesion with neither has
    none and cannot be localised."""
    return {
        les.id: les.mask_label or n
        for n, les in enumerate(gt.lesions, start=1)
        if les.mask_label or les.mask_series
    }


def _study_folder(case: Case) -> Path | None:
    if not case.study_path:
        return None
    path = Path(case.study_path)
    if not path.is_absolute():
        if case.root is None:
            return None
        path = Path(case.root) / path
    return path


def lesion_mask(case: Case) -> LesionMask | None:
    """The case's lesion masks, or None (no case folder, no labelled lesion, or a mask named
    by the truth that cannot be read: localisation is then not measured)."""
    gt = case.ground_truth
    if gt is None or case.root is None:
        return None
    labels = truth_labels(gt)
    if not labels:
        return None
    out: LesionMask | None = None
    if any(les.mask_label and not les.mask_series for les in gt.lesions):
        path = Path(case.root) / MASK_FILE
        try:
            stat = path.stat()
        except OSError:
            return None
        out = _load(str(path), stat.st_mtime_ns)
    for les in gt.lesions:
        if not les.mask_series:
            continue
        study = _study_folder(case)
        try:
            stamp = study.stat().st_mtime_ns if study is not None else None
        except OSError:
            stamp = None
        if study is None or stamp is None:
            return None
        part = _series_mask(str(study), les.mask_series, labels[les.id], stamp)
        if part is None:
            return None
        out = part if out is None else out.joined(part)
    return out


def point_outcome(case: Case, mask: LesionMask, place: ImagePlace) -> PointOutcome:
    """Where a place lands: which image and slice, the patient position and the mask's label."""
    if place.image > len(case.images):
        return PointOutcome(
            status="no_such_image", why=f"image {place.image} of {len(case.images)} shown"
        )
    x, y = place.xy
    tile = case.images[place.image - 1].tile_at(x, y)
    if tile is None:
        return PointOutcome(status="off_slice", why=f"({x:.0f}, {y:.0f}) is on no slice")
    ras = tile.ras(x, y)
    if ras is None:
        return PointOutcome(status="unmapped", why="the slice has no patient geometry")
    label = mask.label_at(ras)
    return PointOutcome(
        status="lesion" if label else "outside",
        ras_mm=(round(ras[0], 2), round(ras[1], 2), round(ras[2], 2)),
        label=label,
        slice_index=tile.slice_index,
    )


def localise(case: Case, findings: list[Finding], res: LesionMatchResult) -> LesionMatchResult:
    """``res`` with each placed finding's outcome and each lesion's ``localised`` (None when
    the case has no mask or shows no image with recorded geometry)."""
    mask = lesion_mask(case)
    if mask is None or not any(i.tiles for i in case.images):
        return res
    gt = case.ground_truth
    assert gt is not None  # lesion_mask returned one
    label_of = truth_labels(gt)
    matches = [
        m.model_copy(update={"pointed": point_outcome(case, mask, p)})
        if (p := findings[m.index].place) is not None
        else m
        for m in res.findings
    ]
    lesions = []
    for o in res.lesions:
        m = matches[o.finding] if o.finding is not None and o.status == "detected" else None
        pointed = m.pointed if m is not None else None
        localised = pointed is not None and pointed.label == label_of.get(o.lesion_id)
        lesions.append(o.model_copy(update={"localised": localised}))
    n_localised = sum(bool(o.localised) for o in lesions)
    return res.model_copy(
        update={
            "findings": matches,
            "lesions": lesions,
            "n_pointed": sum(m.pointed is not None for m in matches),
            "n_localised": n_localised,
            "localisation_rate": n_localised / len(lesions) if lesions else None,
        }
    )


class FindingRegion(BaseModel):
    """Where a finding's place lies in the study, as an SR references it: the stored instance
    and its pixel (SCOORD) when the slice shown is an acquired one, and always the patient
    position (RAS mm; an SR's SCOORD3D is in LPS, the writer turns it)."""

    series_uid: str
    ras_mm: tuple[float, float, float]
    sop_instance_uid: str = ""  # "" when the slice shown was resliced
    sop_class_uid: str = ""
    frame: int | None = None  # 1-based, of a multi-frame instance
    pixel: tuple[float, float] | None = None  # (column, row), DICOM image coordinates


def finding_region(place: ImagePlace, images: list[ImageRef]) -> FindingRegion | None:
    """The study position of ``place`` on the request's ``images``; None when it points at no
    image, no slice or a slice without patient geometry."""
    if place.image > len(images):
        return None
    ref = images[place.image - 1]
    x, y = place.xy
    tile = ref.tile_at(x, y)
    ras = tile.ras(x, y) if tile is not None else None
    if tile is None or ras is None or not ref.series_uid:
        return None
    pixel = tile.scoord_point(x, y)
    return FindingRegion(
        series_uid=ref.series_uid,
        ras_mm=(round(ras[0], 3), round(ras[1], 3), round(ras[2], 3)),
        sop_instance_uid=tile.sop_instance_uid if pixel is not None else "",
        sop_class_uid=tile.sop_class_uid if pixel is not None else "",
        frame=tile.frame if pixel is not None else None,
        pixel=(round(pixel[0], 3), round(pixel[1], 3)) if pixel is not None else None,
    )
