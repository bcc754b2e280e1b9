"""Render a case's DICOM study into the images a model is shown, through a content-keyed cache.

What is rendered (a :class:`RenderPlan`): one labelled montage per clinical series (evenly spaced
axial slices, radiological convention) for the diagnostic families, and one single slice for
NeuroVLM-style classification (the series that shows the case's main lesion best, at the slice
nearest its centre; the middle of the head for a normal case). The cache key is the hash of the
study's bytes, the plan and the renderer's source, so a second run reuses the PNGs and a changed
study or renderer renders afresh. Every PNG is re-hashed when it is read back.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from dicom import (
    IndexResult,
    NotShownReason,
    RenderedImage,
    SeriesInfo,
    SeriesNotShown,
    series_candidates,
    unshown,
)
from evaluation.case import Case, ImageRef, StudyIdentity, StudyPerson, names_series
from evaluation.errors import DatasetError

if TYPE_CHECKING:
    from dicom import RenderOptions, SequenceClass

MONTAGE_CLASSES = ("FLAIR", "DWI", "ADC", "T1C", "T2", "T1", "SWI", "T2STAR", "CT", "PD", "TRACE")
CLASSIFICATION_PREFERENCE = ("FLAIR", "T1C", "T2", "T1", "CT")
_MAX_STUDY_BYTES = 4 * 1024**3
# What a cached rendered.json records beyond the images; part of the cache key, so an entry
# written before a change is rendered again (2: the persons the study's headers name, which the
# PHI gate scrubs; an older entry would hand the gate none; 3: the series not shown; 4: the
# scanners and PatientAge the headers name, which the subgroups read).
RENDERED_RECORD_VERSION = 4


class RenderPlan(BaseModel):
    """How a study becomes images; part of the cache key."""

    montage_slices: int = 12
    columns: int = 4
    tile_size: int = 256
    max_series: int = 8
    classification_slice: bool = True
    candidate_slices: int = 24  # singles rendered to choose the classification slice from
    # series classes a model may be shown (None: the clinical ones); a routing rule that names
    # others (FMRI, PERFUSION, FIELDMAP...) has them rendered too
    series_classes: list[str] | None = None


class RenderedStudy(BaseModel):
    key: str
    images: list[ImageRef]
    burned_in_series: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    identity: StudyIdentity | None = None  # the hospital's identifiers (for reviewers)
    # the study's series the images leave out, and why (None: a record from before it)
    series_not_shown: SeriesNotShown | None = None


def study_digest(path: Path) -> str:
    """sha256 over the relative names and bytes of every file of a study (folder, zip or file)."""
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    total = 0
    for f in files:
        total += f.stat().st_size
        if total > _MAX_STUDY_BYTES:
            raise DatasetError(f"study {path} is larger than {_MAX_STUDY_BYTES >> 30} GiB")
        rel = f.name if path.is_file() else str(f.relative_to(path))
        h.update(rel.encode("utf-8", "surrogateescape") + b"\0")
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        h.update(b"\0")
    return h.hexdigest()


def _indexed_digest(index: IndexResult) -> str:
    """sha256 over the path, size and modification time of every file an index read (and the
    series it names but did not read)."""
    h = hashlib.sha256()
    paths = sorted({f.path for s in index.series for vol in s.volumes for f in vol})
    for path in paths:
        try:
            st = os.stat(path)
            h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0".encode("utf-8", "surrogateescape"))
        except OSError:  # an archive member or a vanished file: its name alone
            h.update(f"{path}\0".encode("utf-8", "surrogateescape"))
    for s in index.not_fetched:  # listed in the render's record of the series not shown
        h.update(f"{s.key}\0{s.series_class.value}\0{s.n_files}\0".encode())
    return h.hexdigest()


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _cached(folder: Path) -> RenderedStudy | None:
    meta = folder / "rendered.json"
    if not meta.exists():
        return None
    try:
        study = RenderedStudy.model_validate_json(meta.read_text())
    except ValueError:
        return None
    for img in study.images:
        p = Path(img.path)
        if not p.exists() or _sha256_file(p) != img.sha256:
            return None  # damaged cache entry: render again
    return study


def render_study(
    study: Path,
    case: Case,
    cache_dir: Path,
    plan: RenderPlan | None = None,
    memory_cap: int | None = None,
    index: IndexResult | None = None,
) -> RenderedStudy:
    """Images of ``study`` for ``case`` (rendered now, or read back from the cache).

    ``index``: the study already indexed (the gateway's one index of a received study): no
    header is read again, and the cache key is made from the files' names, sizes and times
    instead of their bytes."""
    from dicom import renderer_version

    plan = plan or RenderPlan()
    if not study.exists():
        raise DatasetError(f"case {case.case_id}: study not found at {study}")
    lesion_z = _main_lesion_z(case)
    key_src = json.dumps(
        {
            "study": study_digest(study) if index is None else _indexed_digest(index),
            "plan": plan.model_dump(),
            "renderer": renderer_version(),
            "lesion_z": lesion_z,
            "record": RENDERED_RECORD_VERSION,
            # (only when given: the keys of every other case stay as they were)
            **({"truth_masks": truth_masks(case)} if truth_masks(case) else {}),
        },
        sort_keys=True,
    )
    key = hashlib.sha256(key_src.encode()).hexdigest()[:32]
    folder = cache_dir / "renders" / key
    hit = _cached(folder)
    if hit is not None:
        return hit
    tmp = folder.with_name(f"{key}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    result = _render(study, case, tmp, plan, lesion_z, memory_cap, index)
    # Point the refs at the final folder, then publish atomically.
    for img in result.images:
        img.path = str(folder / Path(img.path).name)
    result.key = key
    (tmp / "rendered.json").write_text(result.model_dump_json(indent=2))
    if folder.exists():
        shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, folder)
    return result


def wanted_classes(plan: RenderPlan) -> frozenset[SequenceClass]:
    """The sequence classes a run's tasks may show (the plan's, else every clinical class)."""
    from dicom import CLINICAL_CLASSES, SequenceClass

    if not plan.series_classes:
        return CLINICAL_CLASSES
    return frozenset(
        SequenceClass(c) for c in plan.series_classes if c in SequenceClass.__members__
    )


def study_candidates(
    index: IndexResult, plan: RenderPlan | None = None, masks: Sequence[str] = ()
) -> tuple[list[SeriesInfo], SeriesNotShown]:
    """The series a case of this study may show, best first, and every other one with why: the
    one selection rule of a run and of ``cases check`` (none: the run skips the case).
    ``masks``: the series the case's truth names as lesion masks (``mask_series``),
    never shown whatever their class."""
    plan = plan or RenderPlan()
    not_shown = SeriesNotShown(limit=plan.max_series)
    out = series_candidates(index, wanted_classes(plan), MONTAGE_CLASSES, not_shown)
    truth = [s for s in out if any(names_series(m, s.series_uid, s.description) for m in masks)]  # fmt: skip
    for s in truth:
        not_shown.add(unshown(s, NotShownReason.DERIVED, "the case's truth: a lesion's mask"))
    return [s for s in out if s not in truth], not_shown


def truth_masks(case: Case) -> list[str]:
    """The series the case's truth names as lesion masks."""
    gt = case.ground_truth
    return sorted({les.mask_series for les in gt.lesions if les.mask_series}) if gt else []


def _main_lesion_z(case: Case) -> float | None:
    gt = case.ground_truth
    if gt is None or not gt.lesions:
        return None
    biggest = max(gt.lesions, key=lambda les: les.size_mm or 0.0)
    return float(biggest.center_mm[2]) if biggest.center_mm else None


def _classification_series(case: Case, classes: list[str]) -> str | None:
    gt = case.ground_truth
    visible: list[str] = []
    if gt is not None and gt.lesions:
        biggest = max(gt.lesions, key=lambda les: les.size_mm or 0.0)
        visible = [s.upper() for s in biggest.visible_on]
    for pref in CLASSIFICATION_PREFERENCE:
        if pref in classes and (not visible or pref in visible):
            return pref
    for pref in CLASSIFICATION_PREFERENCE:
        if pref in classes:
            return pref
    return classes[0] if classes else None


def _render(
    study: Path,
    case: Case,
    out: Path,
    plan: RenderPlan,
    lesion_z: float | None,
    memory_cap: int | None,
    index: IndexResult | None = None,
) -> RenderedStudy:
    from dicom import (
        DEFAULT_MEMORY_CAP,
        ImagingError,
        RenderOptions,
        default_targets,
        index_path,
        render_path,
    )

    cap = memory_cap or DEFAULT_MEMORY_CAP
    if index is None:
        try:
            index = index_path(study, memory_cap=cap)
        except (ImagingError, OSError) as exc:
            raise DatasetError(f"case {case.case_id}: cannot index study {study}: {exc}") from exc
    wanted = wanted_classes(plan)
    clinical = default_targets(index, wanted)
    burned = sorted({s.series_uid for s in clinical if s.burned_in_annotation})
    modality = {s.series_uid: ("CT" if s.modality == "CT" else "MR") for s in clinical}
    options = RenderOptions(
        n_slices=plan.montage_slices,
        tile_size=plan.tile_size,
        columns=plan.columns,
        montage=True,
        singles=False,
        memory_cap=cap,
    )
    # The series are chosen before anything is rendered (the best classes first, up to the
    # plan's limit; one that fails to render is replaced by the next), and every other one
    # is recorded with why: a study of thousands of series renders a handful.
    pending, not_shown = study_candidates(index, plan, truth_masks(case))
    broken = [e for s in index.series for e in s.errors if e.kind == "geometry"]
    warnings = [e.message for e in [*index.errors, *broken]]
    rendered: list[RenderedImage] = []
    shown: list[SeriesInfo] = []
    rounds = 0
    while pending and len(shown) < plan.max_series:
        take = pending[: plan.max_series - len(shown)]
        pending = pending[len(take) :]
        made, failed, more = _render_round(study, out, rounds, options, index, take, wanted)
        rounds += 1
        rendered += made
        warnings += more
        for s in take:
            if s.key in failed:
                not_shown.add(unshown(s, NotShownReason.UNREADABLE, failed[s.key]))
            else:
                shown.append(s)
    for s in pending:
        not_shown.add(unshown(s, NotShownReason.OVER_LIMIT, f"{len(shown)} series shown"))
    not_shown.n_shown = len(shown)
    # the prompt shows the images in the study's order, as indexed
    position = {(s.series_uid, s.stack): k for k, s in enumerate(index.series)}
    rendered.sort(key=lambda i: position.get((i.series_uid, i.stack), len(position)))
    images = [_ref(out, i, modality) for i in rendered]
    by_class = {s.series_uid: s.series_class.value for s in shown}
    if plan.classification_slice and shown:
        chosen = _classification_series(case, sorted(set(by_class.values())))
        target = next((s for s in shown if s.series_class.value == chosen), None)
        if target is not None:
            single_opts = RenderOptions(
                n_slices=plan.candidate_slices,
                tile_size=plan.tile_size,
                montage=False,
                singles=True,
                memory_cap=cap,
            )
            try:
                singles = render_path(
                    study, out / "singles", single_opts, series_uid=target.series_uid, index=index
                )
            except ImagingError as exc:
                warnings.append(f"classification slice not rendered: {exc}")
            else:
                pick = _pick_slice(singles.images, lesion_z)
                if pick is not None:
                    src = out / "singles" / pick.file
                    dst = out / f"classification_{pick.file}"
                    shutil.copyfile(src, dst)
                    pick.file = dst.name
                    images.append(_ref(out, pick, modality))
            shutil.rmtree(out / "singles", ignore_errors=True)
    if not images:
        raise DatasetError(
            f"case {case.case_id}: nothing could be rendered from {study}: "
            + ("; ".join(warnings[:3]) or "no clinical series found")
        )
    return RenderedStudy(
        key="",
        images=images,
        burned_in_series=burned,
        warnings=warnings,
        identity=_identity(index),
        series_not_shown=not_shown,
    )


def _render_round(
    study: Path,
    out: Path,
    rounds: int,
    options: RenderOptions,
    index: IndexResult,
    take: list[SeriesInfo],
    wanted: frozenset[SequenceClass],
) -> tuple[list[RenderedImage], dict[str, str], list[str]]:
    """Render the stacks ``take`` (a DWI series with its other stacks, which the diffusion
    choice reads) into ``out``: their images, the stacks that rendered nothing (key -> why)
    and the render's warnings. A later round renders apart, then moves its files into
    ``out`` under names no earlier round used."""
    from dicom import render_path

    ids = {id(s) for s in take}
    dwi = {s.series_uid for s in take if s.series_class.value == "DWI"}
    subset = IndexResult(
        series=[s for s in index.series if id(s) in ids or s.series_uid in dwi],
        n_files=index.n_files,
    )
    folder = out if rounds == 0 else out / f".round{rounds}"
    manifest = render_path(study, folder, options, index=subset, classes=wanted)
    why = {e.path: e.message for e in manifest.errors}
    done = {(i.series_uid, i.stack) for i in manifest.images}
    done_dwi = {i.series_uid for i in manifest.images}
    failed = {
        s.key: why.get(s.path, "nothing rendered")
        for s in take
        if (s.series_uid, s.stack) not in done
        and not (s.series_uid in dwi and s.series_uid in done_dwi)
    }
    if folder is not out:
        for img in manifest.images:
            name = img.file if not (out / img.file).exists() else f"r{rounds}_{img.file}"
            os.replace(folder / img.file, out / name)
            img.file = name
        shutil.rmtree(folder, ignore_errors=True)
    return manifest.images, failed, list(manifest.warnings)


def _identity(index: IndexResult) -> StudyIdentity | None:
    """The study's identifiers and every person its headers name (for the PHI gate)."""
    from dicom import study_identity_and_persons

    found, named = study_identity_and_persons(index)
    persons = [StudyPerson(role=p.keyword, name=p.name) for p in named]
    if found is None:
        return StudyIdentity(persons=persons) if persons else None
    return StudyIdentity.model_validate(found.model_dump() | {"persons": persons})


def _pick_slice(images: list[RenderedImage], lesion_z: float | None) -> RenderedImage | None:
    slices = [i for i in images if i.slice_positions_mm]
    if not slices:
        return None
    if lesion_z is None:
        return slices[len(slices) // 2]
    return min(slices, key=lambda i: abs(i.slice_positions_mm[0] - lesion_z))


def _ref(folder: Path, img: RenderedImage, modality: dict[str, str]) -> ImageRef:
    plane = img.orientation.split(",")[0].strip() if img.orientation else None
    if plane not in ("axial", "sagittal", "coronal"):
        plane = None
    pos = img.slice_positions_mm
    if img.kind == "montage" and pos:
        where = f"{len(pos)} slices, {_mm(pos[0], plane)} to {_mm(pos[-1], plane)}"
        label = f"{img.label}; {plane or 'native'} montage, {where}; patient right on image left"
    else:
        label = img.label
    return ImageRef(
        path=str(folder / img.file),
        sha256=img.sha256,
        label=label,
        series_class=img.series_class,
        modality=modality.get(img.series_uid),
        plane=plane,
        slice_positions_mm=pos,
        kind=img.kind,
        window=img.window,
        series_uid=img.series_uid,
        tiles=img.tiles,
    )


def _mm(z: float, plane: str | None = None) -> str:
    """A position along the plane's slice axis (RAS mm), lettered as dicom labels the tiles."""
    pos, neg = {"sagittal": ("R", "L"), "coronal": ("A", "P")}.get(plane or "", ("S", "I"))
    return f"{pos if z >= 0 else neg} {abs(z):.0f} mm"
