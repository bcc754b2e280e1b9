"""Index a path: read every header (no pixels), group by study and series, split into stacks,
order slices, find volumes, compute geometry and classify each stack."""

from __future__ import annotations

import functools
import os
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np

from dicom.classify import SeriesContext, classify
from dicom.geometry import (
    affine_problem,
    cluster_positions,
    geometry_problem,
    project,
    slice_normal,
    stack_geometry,
)
from dicom.headers import (
    DEFAULT_MEMORY_CAP,
    FrameHeader,
    ProgressFn,
    read_headers,
    read_headers_keeping,
)
from dicom.records import FileError, FrameRef, IndexResult, Plane, SequenceClass, SeriesInfo
from dicom.sources import iter_sources, source_folder


def index_path(
    path: str | Path,
    memory_cap: int = DEFAULT_MEMORY_CAP,
    workers: int | None = None,
    progress: ProgressFn | None = None,
    cache_dir: Path | None = None,
    keep_headers: bool = False,
) -> IndexResult:
    """Index every DICOM file below ``path`` (file, folder, zip) or a NIfTI file.

    ``cache_dir`` (default: the folder ``configure_header_cache`` set, else none) keeps header
    reads between runs, keyed by path, size and modification time (dicom.headers.cache).
    ``keep_headers`` (one study, read in this process, no cache): the result also holds the
    first header of each series (``IndexResult.series_headers``, a ``KeptHeaders``), so that
    nothing downstream reads a file's header a second time; beyond ``MAX_KEPT_HEADERS``
    series, a series' header is read again when asked for, not held.
    """
    p = Path(path)
    if p.is_file() and (p.name.endswith(".nii") or p.name.endswith(".nii.gz")):
        from dicom.nifti import index_nifti

        return index_nifti(p)
    headers: dict[str, object] = {}
    if keep_headers:
        # the first MAX_KEPT_HEADERS series folders keep their header; the files of any
        # further ones are read as without keep_headers (a study of thousands of one-file
        # series would otherwise hold thousands of parsed headers)
        rest: list[str] = []
        firsts = _first_folders(iter_sources(p), MAX_KEPT_HEADERS, rest)
        frames, errors, n_files, headers = read_headers_keeping(firsts, memory_cap)
        if rest:
            more, more_errors, n_more = read_headers(rest, memory_cap, 1)
            frames, errors, n_files = frames + more, errors + more_errors, n_files + n_more
    else:
        frames, errors, n_files = read_headers(
            iter_sources(p), memory_cap, workers, progress, cache_dir
        )
    non_image = [e for e in errors if e.kind == "non_image"]
    other_errors = [e for e in errors if e.kind != "non_image"]
    series = build_series(frames)
    series.extend(_non_image_series(non_image))
    series.sort(key=_series_sort_key)
    result = IndexResult(series=series, errors=other_errors, n_files=n_files)
    if keep_headers:
        result.series_headers = KeptHeaders(headers, series)
    return result


# Series whose first header index_path(keep_headers=True) holds parsed; the others' is read
# when asked for (KeptHeaders).
MAX_KEPT_HEADERS = 256


def _first_folders(sources: Iterable[str], limit: int, rest: list[str]) -> Iterator[str]:
    """The sources in the first ``limit`` folders (a spool's series); the others into ``rest``."""
    folders: set[str] = set()
    for path in sources:
        folder = source_folder(path)
        if folder in folders or len(folders) < limit:
            folders.add(folder)
            yield path
        else:
            rest.append(path)


class KeptHeaders(dict[str, Any]):
    """SeriesInstanceUID -> the header (pixels excepted) of the series' first file: held for
    the series whose header the index kept, read when asked for (and not held) for the others.
    Pickles with the index (the paths of the others go with it)."""

    def __init__(self, kept: dict[str, Any], series: list[SeriesInfo]) -> None:
        super().__init__(kept)
        self.paths = {
            s.series_uid: s.volumes[0][0].path
            for s in series
            if s.volumes and s.volumes[0] and s.series_uid not in kept
        }

    def __contains__(self, uid: object) -> bool:
        return super().__contains__(uid) or uid in self.paths

    def __missing__(self, uid: str) -> Any:
        ds = self._read(uid)
        if ds is None:
            raise KeyError(uid)
        return ds

    def get(self, uid: str, default: Any = None) -> Any:
        if super().__contains__(uid):
            return super().__getitem__(uid)
        ds = self._read(uid)
        return default if ds is None else ds

    def _read(self, uid: str) -> Any:
        import pydicom

        from dicom.sources import HEADER_PREFIX, open_source

        path = self.paths.get(uid)
        if path is None:
            return None
        try:
            with open_source(path, prefix=HEADER_PREFIX) as fh:
                return pydicom.dcmread(fh, stop_before_pixels=True)
        except (OSError, ValueError, TypeError, EOFError, pydicom.errors.InvalidDicomError):
            return None


def _series_sort_key(s: SeriesInfo) -> tuple[str, int, str, int]:
    return (
        s.study_uid,
        s.series_number if s.series_number is not None else 1 << 30,
        s.series_uid,
        s.stack,
    )


def _non_image_series(errors: list[FileError]) -> list[SeriesInfo]:
    """Non-image objects (SR, Raw Data) are listed as NON_IMAGE series, one per folder."""
    by_folder: dict[str, list[FileError]] = defaultdict(list)
    for e in errors:
        by_folder[source_folder(e.path)].append(e)
    out = []
    for folder, errs in sorted(by_folder.items()):
        out.append(
            SeriesInfo(
                path=folder,
                study_uid="",
                series_uid="",
                series_class=SequenceClass.NON_IMAGE,
                reason="; ".join(sorted({e.message.split(": ", 1)[-1] for e in errs})),
                confidence=1.0,
                n_files=len(errs),
                warnings=[f"{len(errs)} non-image object(s) skipped: nothing to render"],
            )
        )
    return out


@functools.lru_cache(maxsize=4096)
def _round3(values: tuple[float, ...]) -> tuple[float, ...]:
    """Direction cosines to 3 decimals (one tuple is shared by the frames of a series or volume,
    so most calls are a cache hit)."""
    return tuple(round(v, 3) for v in values)


def _stack_key(f: FrameHeader) -> tuple[object, ...]:
    orient = _round3(f.orientation) if f.orientation else None
    echo: object = (
        f.echo_number
        if f.echo_number is not None
        else (round(f.echo_time, 2) if f.echo_time is not None else None)
    )
    b = round(f.b_value) if f.b_value is not None else None
    # Derived frame types (phase, field map) differ from magnitude frames of one object.
    ftype = tuple(
        t for t in f.frame_type if t not in ("ORIGINAL", "DERIVED", "PRIMARY", "SECONDARY")
    )
    return (
        f.sop_class_uid,
        f.rows,
        f.cols,
        f.samples_per_pixel,
        orient,
        echo,
        b,
        ftype,
        f.mosaic_slices or 0,
        f.extras.get("stack_id", ""),
        # how the stored values are read: a file laid out otherwise is decoded as its stack is
        (f.bits_allocated, f.bits_stored, f.pixel_representation, f.photometric),
    )


def _sortable(key: tuple[object, ...]) -> tuple[str, ...]:
    return tuple("" if v is None else repr(v) for v in key)


def build_series(frames: list[FrameHeader]) -> list[SeriesInfo]:
    """Group frames into series and stacks and describe each stack."""
    by_series: dict[tuple[str, str], list[FrameHeader]] = defaultdict(list)
    for f in frames:
        by_series[(f.study_uid, f.series_uid)].append(f)
    out: list[SeriesInfo] = []
    for (_study, _series), all_frames in by_series.items():
        # every patient the series' files name, duplicates included (before they are dropped)
        patients = sorted(set({id(f.patient): f.patient for f in all_frames}.values()), key=repr)
        sframes, duplicates = _deduplicate(all_frames)
        stacks: dict[tuple[object, ...], list[FrameHeader]] = defaultdict(list)
        for f in sframes:
            stacks[_stack_key(f)].append(f)
        keys = sorted(stacks, key=_sortable)
        labels = _stack_labels(keys)
        ctx = SeriesContext(
            b_values=sorted({round(f.b_value) for f in sframes if f.b_value is not None}),
            n_stacks=len(keys),
            n_files=len({f.path for f in sframes}),
        )
        for idx, key in enumerate(keys):
            info = _describe_stack(stacks[key], idx, labels[idx], ctx)
            info.patients = patients
            if duplicates:
                info.warnings.append(
                    f"{duplicates} duplicate file(s) of the same SOP instance in this series ignored"
                )
            out.append(info)
    return out


def _deduplicate(frames: list[FrameHeader]) -> tuple[list[FrameHeader], int]:
    """Keep one frame per (SOP Instance UID, frame): the same instance sent twice is one image."""
    seen: set[tuple[str, int | None]] = set()
    kept: list[FrameHeader] = []
    dup_files: set[str] = set()
    for f in sorted(frames, key=lambda f: (f.path, f.frame or 0)):
        key = (f.sop_instance_uid, f.frame)
        if f.sop_instance_uid and key in seen:
            dup_files.add(f.path)
            continue
        seen.add(key)
        kept.append(f)
    return kept, len(dup_files)


_KEY_NAMES = (
    "SOP class",
    "rows",
    "columns",
    "samples",
    "orientation",
    "echo",
    "b",
    "type",
    "mosaic",
    "stack",
    "pixel layout",
)


def _stack_labels(keys: list[tuple[object, ...]]) -> list[str]:
    """Name each stack by what distinguishes it from the other stacks of its series."""
    if len(keys) == 1:
        return [""]
    varying = [i for i in range(len(keys[0])) if len({k[i] for k in keys}) > 1]
    labels = []
    for n, key in enumerate(keys):
        parts = []
        for i in varying:
            name, value = _KEY_NAMES[i], key[i]
            if name == "b":
                parts.append(f"b={value}")
            elif name == "echo":
                parts.append(f"echo {value}")
            elif name == "type":
                parts.append("/".join(value) if value else "magnitude")  # type: ignore[arg-type]
            elif name == "orientation":
                parts.append(f"orientation {n + 1}")
            elif name == "samples":
                parts.append("RGB" if value == 3 else "greyscale")
            elif name == "SOP class":
                from pydicom.uid import UID

                parts.append(UID(str(value)).name)
            elif name == "pixel layout":
                ba, bs, pr, pi = cast(tuple[int, int, int, str], value)
                parts.append(f"{bs} of {ba} bits {'signed' if pr else 'unsigned'} {pi}".strip())
            elif name in ("rows", "columns"):
                parts.append(f"{key[2]}x{key[1]}")
            else:
                parts.append(f"{name} {value}")
        labels.append(", ".join(dict.fromkeys(parts)))
    return labels


def _frame_order_key(f: FrameHeader) -> tuple[int, int, str]:
    return (
        f.instance_number if f.instance_number is not None else 0,
        f.frame if f.frame is not None else 0,
        f.path,
    )


def _volume_key(f: FrameHeader) -> tuple[object, ...]:
    d = _round3(f.direction) if f.direction else None
    return (d, f.temporal_index, f.acquisition_number)


def _split_volumes(
    frames: list[FrameHeader],
) -> tuple[list[list[FrameHeader]], list[str], list[str]]:
    """Order frames along the normal and split repeated positions into volumes.

    Returns volumes (each a list of frames, one per slice position), their labels, warnings.
    """
    warnings: list[str] = []
    ref = frames[0]
    if ref.orientation is None or any(f.position is None for f in frames):
        warnings.append(
            "no patient geometry (ImagePositionPatient missing): ordered by InstanceNumber"
        )
        return [sorted(frames, key=_frame_order_key)], [""], warnings
    normal = slice_normal(ref.orientation)
    proj = project([f.position for f in frames], normal)  # type: ignore[misc]
    labels = cluster_positions(proj)
    n_pos = int(labels.max()) + 1
    counts = np.bincount(labels, minlength=n_pos)
    if counts.max() == 1:
        order = np.argsort(labels)
        return [[frames[i] for i in order]], [""], warnings
    # Repeated positions: time points or diffusion directions.
    groups: dict[tuple[object, ...], list[int]] = defaultdict(list)
    for i, f in enumerate(frames):
        groups[_volume_key(f)].append(i)
    consistent = all(
        len(idx) == n_pos and len({labels[i] for i in idx}) == n_pos for idx in groups.values()
    )
    volumes: list[list[FrameHeader]] = []
    vol_labels: list[str] = []
    if consistent and len(groups) == counts.max():
        ordered_groups = sorted(
            groups.items(), key=lambda kv: min(_frame_order_key(frames[i]) for i in kv[1])
        )
        for key, idx in ordered_groups:
            volumes.append([frames[i] for i in sorted(idx, key=lambda i: labels[i])])
            d, t, _acq = key
            if d is not None:
                vol_labels.append("direction (" + ", ".join(f"{v:.3f}" for v in d) + ")")  # type: ignore[attr-defined]
            elif t is not None:
                vol_labels.append(f"time point {t}")
            else:
                vol_labels.append(f"volume {len(volumes)}")
        return volumes, vol_labels, warnings
    # Fallback: the i-th image (in acquisition order) at each position belongs to volume i.
    per_pos: list[list[int]] = [[] for _ in range(n_pos)]
    for i in sorted(range(len(frames)), key=lambda i: _frame_order_key(frames[i])):
        per_pos[labels[i]].append(i)
    n_complete = int(counts.min())
    if counts.min() != counts.max():
        warnings.append(
            f"slice positions hold {counts.min()} to {counts.max()} images each: kept "
            f"{n_complete} complete volume(s), dropped {int(counts.sum()) - n_complete * n_pos} image(s)"
        )
    for v in range(n_complete):
        volumes.append([frames[per_pos[p][v]] for p in range(n_pos)])
        vol_labels.append(f"volume {v + 1}")
    return volumes, vol_labels, warnings


def _plane_from_patient_orientation(po: tuple[str, ...] | None) -> Plane | None:
    """Plane from PatientOrientation (0020,0020), e.g. ('LPF', 'PFR'): row and column directions."""
    if not po or len(po) != 2 or not po[0] or not po[1]:
        return None
    axis = {"L": 0, "R": 0, "A": 1, "P": 1, "H": 2, "F": 2}
    try:
        used = {axis[po[0][0]], axis[po[1][0]]}
    except KeyError:
        return None
    if len(used) != 2:
        return None
    (normal,) = {0, 1, 2} - used
    return (Plane.SAGITTAL, Plane.CORONAL, Plane.AXIAL)[normal]


def _common_folder(paths: Iterable[str]) -> str:
    # Path(f).parent depends only on the text before the last "/" when the last component is
    # a name: build it once per directory text (pathlib costs ~20 us a path; a DWI has 819).
    by_dir: dict[str, str] = {}
    for f in (p.split("::")[0] for p in paths):
        named = os.path.basename(f) not in ("", ".")
        by_dir.setdefault(os.path.dirname(f) if named else f, f)
    folders = {str(Path(f).parent) for f in by_dir.values()}
    if len(folders) == 1:
        return folders.pop()
    return os.path.commonpath(sorted(folders))


def _describe_stack(
    frames: list[FrameHeader], idx: int, label: str, ctx: SeriesContext
) -> SeriesInfo:
    volumes, vol_labels, warnings = _split_volumes(frames)
    first = volumes[0][0]
    n_slices = len(volumes[0])
    shape = [first.cols, first.rows, n_slices] + ([len(volumes)] if len(volumes) > 1 else [])
    affine = None
    spacing: list[float] = []
    plane = None
    oblique = None
    uniform = True
    gaps: list[str] = []
    errors: list[FileError] = []
    problem = (
        geometry_problem(first.orientation, first.pixel_spacing)
        if first.orientation is not None
        else None
    )
    if first.pixel_spacing and min(first.pixel_spacing) < 0 and problem is None:
        warnings.append(
            f"PixelSpacing {first.pixel_spacing[0]:g}\\{first.pixel_spacing[1]:g} is negative: "
            "its absolute value is used (orientation comes from ImageOrientationPatient)"
        )
    geo = None
    if (
        problem is None
        and first.orientation is not None
        and all(f.position is not None for f in volumes[0])
    ):
        geo = stack_geometry(
            first.orientation,
            first.pixel_spacing,
            [f.position for f in volumes[0]],  # type: ignore[misc]
            first.spacing_between_slices or first.slice_thickness,
        )
        problem = affine_problem(geo.affine)
    if problem is not None:
        errors.append(
            FileError(
                path=_common_folder({f.path for f in frames}),
                kind="geometry",
                message=f"series {first.series_uid} stack {label or idx}: {problem}; "
                "this stack is not rendered",
            )
        )
    elif geo is not None:
        affine = [[round(float(v), 6) for v in row] for row in geo.affine]
        spacing = [round(v, 6) for v in geo.spacing]
        plane, oblique, uniform, gaps = geo.plane, geo.obliquity_deg, geo.uniform, geo.gaps
        if gaps:
            warnings.append(f"non-uniform slice spacing: {len(gaps)} irregular step(s)")
    else:
        if first.pixel_spacing:
            dr, dc = (abs(v) for v in first.pixel_spacing[:2])
            spacing = [dc, dr, first.slice_thickness or 0.0]
        plane = _plane_from_patient_orientation(first.extras.get("patient_orientation"))
        if plane is not None:
            warnings.append(f"plane {plane} inferred from PatientOrientation; no affine available")
    result = classify(frames, replace(ctx, n_volumes=len(volumes)), plane)
    b_values = sorted({float(round(f.b_value)) for f in frames if f.b_value is not None})
    directions = {_round3(f.direction) for f in frames if f.direction and any(f.direction)}
    echoes = sorted({f.echo_number for f in frames if f.echo_number is not None})
    files = {f.path for f in frames}
    refs = [
        [
            FrameRef(
                path=f.path,
                frame=f.frame,
                position=f.position,
                rescale_slope=f.rescale_slope,
                rescale_intercept=f.rescale_intercept,
                pixel_offset=f.pixel_offset,
                mosaic_slices=f.mosaic_slices,
                sop_instance_uid=f.sop_instance_uid,
                sop_class_uid=f.sop_class_uid,
            )
            for f in vol
        ]
        for vol in volumes
    ]
    return SeriesInfo(
        path=_common_folder(files),
        study_uid=first.study_uid,
        series_uid=first.series_uid,
        series_number=first.series_number,
        description=first.description,
        modality=first.modality,
        manufacturer=first.manufacturer,
        sop_class_uid=first.sop_class_uid,
        stack=idx,
        stack_label=label,
        series_class=result.series_class,
        detail=result.detail,
        reason=result.reason,
        confidence=result.confidence,
        plane=plane,
        obliquity_deg=oblique,
        shape=shape,
        spacing=spacing,
        affine=affine,
        slice_spacing_uniform=uniform,
        slice_gaps=gaps,
        b_values=b_values,
        n_directions=len(directions),
        echo_numbers=echoes,
        contrast_agent=first.contrast_agent,
        acquisition_3d=first.mr_acquisition_type == "3D",
        photometric=first.photometric,
        samples_per_pixel=first.samples_per_pixel,
        bits_allocated=first.bits_allocated,
        bits_stored=first.bits_stored,
        pixel_representation=first.pixel_representation,
        burned_in_annotation=any(f.burned_in_annotation for f in frames),
        n_files=len(files),
        volume_labels=vol_labels if len(volumes) > 1 else [],
        volumes=refs,
        warnings=warnings,
        errors=errors,
    )
