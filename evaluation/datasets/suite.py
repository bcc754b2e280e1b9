"""Case folders (the phantom suite) and a hospital's own case manifests (YAML or JSON).

A suite folder holds ``suite.json`` (optional: name and the ordered case list) and one folder
per case with ``case.json`` (an ``evaluation.case.Case``), ``ehr.json``, ``note.txt`` and the
study (``study_path``, relative to the case folder, or absolute). A manifest lists cases whose
study lives in a folder/zip, in Orthanc (``orthanc: {url, study_uid}``) or on a PACS configured
by name (``pacs: NAME, study_uid, patient_id``: fetched by the ``StudyFetcher`` the caller gives),
with the EHR bundle, the note and the ground truth given inline or as files next to the manifest.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, ValidationError

from dicom import atomic_write, credential
from evaluation.case import Case, Provenance, TaskFamily, names_series
from evaluation.coverage import LoadNotes, SkippedCase
from evaluation.datasets.manifest import (
    ManifestCase,
    ManifestProblem,
    OrthancServer,
    OrthancStudy,
    PacsStudyRef,
    ParsedManifest,
    StudyFetcher,
    StudyFolder,
    case_label,
    files_of,
    parse_case,
    parse_manifest,
    problems_of,
)
from evaluation.datasets.rendering import RenderPlan, render_study
from evaluation.errors import DatasetError, first_error

MAX_JSON_BYTES = 20 * 1024 * 1024
MAX_NOTE_BYTES = 1024 * 1024


def read_json(path: Path) -> Any:
    if path.stat().st_size > MAX_JSON_BYTES:
        raise DatasetError(f"{path} is larger than {MAX_JSON_BYTES >> 20} MiB")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: not valid JSON ({exc})") from exc


def _read_note(path: Path) -> str:
    if path.stat().st_size > MAX_NOTE_BYTES:
        raise DatasetError(f"{path} is larger than {MAX_NOTE_BYTES >> 10} KiB")
    return path.read_text(encoding="utf-8", errors="replace")


def inside_folder(base: Path, rel: str, what: str) -> Path:
    """Resolve a relative path from a dataset file, refusing escapes via '..'."""
    p = Path(rel)
    if p.is_absolute():
        return p
    full = (base / p).resolve()
    if base.resolve() not in (full, *full.parents):
        written = base / p
        link = next(
            (q for q in (written, *written.parents) if q.is_symlink() and base in q.parents), None
        )
        how = f" through the symlink {link}" if link is not None else ""
        raise DatasetError(
            f"{what} {rel!r} resolves{how} to {full}, outside {base}: a relative path must stay "
            "inside the manifest's folder (the rule that keeps a dataset file from reaching "
            f"other files); to use it, write its absolute path ({full})"
        )
    return full


def suite_case_dirs(suite: Path) -> list[Path]:
    """Case folders of a suite, in the order suite.json gives (else sorted by name)."""
    meta = suite / "suite.json"
    if meta.exists():
        data = read_json(meta)
        listed = data.get("cases") if isinstance(data, dict) else None
        if isinstance(listed, list) and listed:
            dirs = []
            for entry in listed:
                if isinstance(entry, dict):
                    name = entry.get("folder") or entry.get("path") or entry.get("case_id")
                else:
                    name = entry
                if not isinstance(name, str):
                    raise DatasetError(f"{meta}: case entry {entry!r} has no folder name")
                dirs.append(inside_folder(suite, name, "case folder"))
            return dirs
    return sorted(p.parent for p in suite.glob("*/case.json"))


def suite_name(suite: Path) -> str:
    meta = suite / "suite.json"
    if meta.exists():
        data = read_json(meta)
        if isinstance(data, dict) and isinstance(data.get("name"), str):
            return str(data["name"])
    return suite.name


def load_case_dir(
    folder: Path, cache_dir: Path, plan: RenderPlan | None = None, render: bool = True
) -> tuple[Case, list[str]]:
    """One case folder: case.json + ehr.json + note.txt, with its study rendered to images."""
    path = folder / "case.json"
    if not path.exists():
        raise DatasetError(f"no case.json in {folder}")
    try:
        case = Case.model_validate(read_json(path))
    except ValidationError as exc:
        raise DatasetError(f"{path}: not a valid case: {first_error(exc, 'the case')}") from exc
    case.root = str(folder)
    if case.ehr is None and (folder / "ehr.json").exists():
        case.ehr = read_json(folder / "ehr.json")
    if not case.note and (folder / "note.txt").exists():
        case.note = _read_note(folder / "note.txt")
    warnings: list[str] = []
    for img in case.images:  # images given with the case: make paths absolute
        img.path = str(inside_folder(folder, img.path, "image path"))
    if render and case.study_path and not case.images:
        study = inside_folder(folder, case.study_path, "study_path")
        rendered = render_study(study, case, cache_dir, plan)
        case.images = rendered.images
        warnings.extend(f"{case.case_id}: {w}" for w in rendered.warnings)
        if rendered.burned_in_series:
            case.provenance.burned_in_series = rendered.burned_in_series
        case.provenance.identity = rendered.identity
    return case, warnings


def load_suite(
    suite: Path, cache_dir: Path, plan: RenderPlan | None = None
) -> tuple[str, list[Case], LoadNotes]:
    """Every case of a suite folder; a case that fails is reported (a SkippedCase), the rest
    load."""
    dirs = suite_case_dirs(suite)
    if not dirs:
        raise DatasetError(f"{suite}: no case folders (no suite.json cases, no */case.json)")
    cases: list[Case] = []
    notes: LoadNotes = []
    for n, d in enumerate(dirs, start=1):
        try:
            case, w = load_case_dir(d, cache_dir, plan)
        except DatasetError as exc:
            notes.append(
                SkippedCase(entry="case folder", position=n, case_id=d.name, reason=str(exc))
            )
            continue
        cases.append(case)
        notes.extend(w)
    if not cases:
        raise DatasetError(f"{suite}: no case could be loaded: " + "; ".join(map(str, notes[:3])))
    return suite_name(suite), cases, notes


# --------------------------------------------------------------------------- manifests


def _orthanc_study(server: OrthancServer, cache_dir: Path) -> Path:
    """Download a study from Orthanc's REST API as a zip into the cache (once)."""
    import hashlib

    import httpx

    url = server.url.rstrip("/")
    uid = server.study_uid or ""
    if not url or not uid:
        raise DatasetError("orthanc study needs 'url' and 'study_uid'")
    target = (
        cache_dir / "orthanc" / (hashlib.sha256(f"{url}|{uid}".encode()).hexdigest()[:32] + ".zip")
    )
    if target.exists():
        return target
    user = credential(server.username_env) or server.username
    password = credential(server.password_env) or ""
    auth = (str(user), password) if user else None
    try:
        with httpx.Client(base_url=url, auth=auth, timeout=server.timeout_s or 120.0) as c:
            found = c.post("/tools/lookup", content=uid)
            found.raise_for_status()
            ids = [r["ID"] for r in found.json() if r.get("Type") == "Study"]
            if not ids:
                raise DatasetError(f"Orthanc at {url} has no study {uid}")
            with (
                c.stream("GET", f"/studies/{ids[0]}/archive") as r,
                atomic_write(target, fsync=False) as fh,
            ):
                r.raise_for_status()
                for chunk in r.iter_bytes():
                    fh.write(chunk)
    except httpx.HTTPError as exc:
        raise DatasetError(f"Orthanc at {url}: could not fetch study {uid}: {exc}") from exc
    return target


def _pacs_study(ref: PacsStudyRef, cache_dir: Path, fetch_study: StudyFetcher | None) -> Path:
    """The folder of a study on a configured PACS, fetched (once) by the caller's fetcher."""
    if fetch_study is None:
        raise DatasetError(
            f"study {ref.study_uid} is on the PACS {ref.pacs!r}, and this command cannot fetch "
            "from a PACS: load the manifest with `neurosandbox eval` (it fetches from the PACS "
            "file's PACS), or write the study's folder instead"
        )
    folder = fetch_study(ref, cache_dir)
    if not folder.is_dir() or not any(p.is_file() for p in folder.rglob("*")):
        raise DatasetError(f"study {ref.study_uid} on the PACS {ref.pacs!r}: nothing was fetched")
    return folder


def _note_file(value: str) -> bool:
    """Whether a note names a file (one short line ending in .txt) rather than being the text."""
    return len(value) < 500 and "\n" not in value and Path(value).suffix == ".txt"


def _local_study(study: Any) -> tuple[str, str] | None:
    """A study's path as written and its field, when it is on disk (not in Orthanc)."""
    if isinstance(study, str):
        return study, "study"
    if isinstance(study, StudyFolder):
        return study.path, "study.path"
    return None


def _unusable_study(study: Path) -> str | None:
    """Why a run would skip this local study (its headers indexed, no pixel read): no series
    the tasks use, by the run's own selection rule (``rendering.study_candidates``)."""
    from dicom import ImagingError, index_path
    from evaluation.datasets.rendering import study_candidates

    try:
        index = index_path(study)
    except (ImagingError, OSError) as exc:
        return f"cannot be indexed, so a run skips this case: {exc}"
    shown, not_shown = study_candidates(index)
    if shown:
        return None
    classes = sorted({s.series_class.value for s in index.series})
    found = f"{len(index.series)} series ({', '.join(classes)})" if classes else "no image series"
    return f"no series the tasks use, so a run skips this case: {found}; {not_shown.counts_text()}"


def _mask_problems(case: ManifestCase, base: Path, n: int) -> list[ManifestProblem]:
    """Each lesion's ``mask_series`` that names no series of its local study, or several (the
    scorer could not localise the lesion: said here, not found out from a "–" in a summary).
    Headers only; a study that cannot be read has its own problem already."""
    from dicom import ImagingError, index_path

    gt, local = case.ground_truth, _local_study(case.study)
    named = [(i, les.mask_series) for i, les in enumerate(gt.lesions) if les.mask_series] if gt else []  # fmt: skip
    if not named or local is None:
        return []
    try:
        index = index_path(inside_folder(base, local[0], local[1]))
    except (DatasetError, ImagingError, OSError):
        return []
    out = []
    for i, name in named:
        hits = {s.series_uid for s in index.series if names_series(name, s.series_uid, s.description)}  # fmt: skip
        if len(hits) == 1:
            continue
        listed = sorted({_printable(s.description or s.series_uid) for s in index.series})
        what = "names no series" if not hits else f"names {len(hits)} series (give a UID)"
        out.append(
            ManifestProblem(
                path=f"cases[{n}].ground_truth.lesions[{i}].mask_series",
                message=f"{_printable(name)!r} {what} of the study, so the lesion cannot be "
                f"localised (its series: {', '.join(listed[:20])})",
                case=n,
            )
        )
    return out


def _printable(text: str, limit: int = 64) -> str:
    """Header text for a message: printable characters only, bounded."""
    return "".join(ch for ch in text if ch.isprintable())[:limit]


def _file_problems(
    files: tuple[Any, Any, str | None], base: Path, n: int, index_studies: bool = False
) -> tuple[list[ManifestProblem], dict[str, Any] | None]:
    """What the files a case names (its study, record and note, from ``files_of`` or a parsed
    case) lack: not there, outside the manifest's folder, empty, not JSON; with
    ``index_studies``, a local study with no series the tasks use (its headers are indexed); and
    the record file as read, when it is a JSON object (so that it is read once). Reads no pixel
    data."""
    study, ehr_ref, note = files
    problems: list[ManifestProblem] = []
    record: dict[str, Any] | None = None

    def problem(field: str, message: str) -> None:
        problems.append(ManifestProblem(path=f"cases[{n}].{field}", message=message, case=n))

    def existing(rel: str, field: str) -> Path | None:
        try:
            full = inside_folder(base, rel, field)
        except DatasetError as exc:
            problem(field, str(exc))
            return None
        if not full.exists():
            problem(field, f"{rel!r} not found (looked for {full})")
            return None
        return full

    local = _local_study(study)
    if local is not None:
        found = existing(*local)
        if found is not None and found.is_dir() and not any(p.is_file() for p in found.rglob("*")):
            problem(local[1], f"{local[0]!r} holds no file")
        elif found is not None and index_studies:
            unusable = _unusable_study(found)
            if unusable:
                problem(local[1], f"{local[0]!r}: {unusable}")
    if isinstance(ehr_ref, str):
        ehr = existing(ehr_ref, "ehr")
        if ehr is not None:
            try:
                read = read_json(ehr)
            except (DatasetError, OSError) as exc:
                problem("ehr", str(exc))
            else:
                if isinstance(read, dict):
                    record = read
                else:
                    problem("ehr", f"{ehr_ref!r} is not a FHIR Bundle (a JSON object)")
    if note and _note_file(note):
        existing(note, "note")
    return problems, record


def _case_files(case: ManifestCase) -> tuple[Any, Any, str | None]:
    return case.study, case.ehr, case.note


def _manifest_problems(
    data: Any, base: Path, index_studies: bool = False
) -> tuple[ParsedManifest, list[ManifestProblem], dict[int, dict[str, Any]]]:
    """A manifest's cases and every problem: fields, files, and case ids given twice; and the
    record files read meanwhile, by case position."""
    parsed = parse_manifest(data)
    problems = list(parsed.problems)
    records: dict[int, dict[str, Any]] = {}
    first: dict[str, int] = {}
    for n, case in enumerate(parsed.cases):
        if case is None:
            problems.extend(_file_problems(files_of(data["cases"][n]), base, n)[0])
            continue
        found, record = _file_problems(_case_files(case), base, n, index_studies)
        problems.extend(found)
        if index_studies and not found:
            problems.extend(_mask_problems(case, base, n))
        if record is not None:
            records[n] = record
        label = case.label(n)
        if label in first:
            field = "case_id" if case.case_id else "id"
            problems.append(
                ManifestProblem(
                    path=f"cases[{n}].{field}",
                    message=f"{label!r} is also the id of cases[{first[label]}]",
                    case=n,
                )
            )
        first.setdefault(label, n)
    # the manifest's own problems first, then each case's, in order (the sort is stable)
    return parsed, sorted(problems, key=lambda p: -1 if p.case is None else p.case), records


def read_manifest(path: Path) -> Any:
    if not path.is_file():
        raise DatasetError(f"{path}: not found")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: not valid YAML/JSON: {exc}") from exc


class ManifestCheck(BaseModel):
    """What ``neurosandbox cases check`` reports of a manifest."""

    manifest: str
    name: str | None = None
    cases: int = 0
    cases_ok: int = 0
    problems: list[ManifestProblem] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)  # not errors: what will not happen

    @property
    def ok(self) -> bool:
        return not self.problems


def _unknown_pacs(name: str, n: int, known: Collection[str]) -> ManifestProblem:
    listed = ", ".join(sorted(known)[:20]) or "none"
    return ManifestProblem(
        path=f"cases[{n}].study.pacs",
        message=f"no PACS named {name!r} is configured (NEUROSANDBOX_PACS_FILE; known: {listed})",
        case=n,
    )


def check_manifest(path: Path, known_pacs: Collection[str] | None = None) -> ManifestCheck:
    """Check a case manifest without loading its studies: every field (by the loader's rule),
    every local study, record and note file, and the case ids; with ``known_pacs`` (the
    configured PACS names), that each study named on a PACS names one of them."""
    try:
        data = read_manifest(path)
    except DatasetError as exc:
        return ManifestCheck(
            manifest=str(path), problems=[ManifestProblem(path="", message=str(exc))]
        )
    parsed, problems, _ = _manifest_problems(data, path.parent, index_studies=True)
    bad = {p.case for p in problems}
    notes = []
    for n, case in enumerate(parsed.cases):
        if case is None or n in bad:
            continue
        if isinstance(case.study, OrthancStudy):
            notes.append(f"cases[{n}].study: in Orthanc ({case.study.server().url}), not fetched")
        if isinstance(case.study, PacsStudyRef):
            if known_pacs is not None and case.study.pacs not in known_pacs:
                problems.append(_unknown_pacs(case.study.pacs, n, known_pacs))
                bad.add(n)
                continue
            else:
                notes.append(f"cases[{n}].study: on the PACS {case.study.pacs!r}, not fetched")
        if case.ground_truth is None:
            notes.append(f"cases[{n}]: no ground_truth, so its answers are stored but not scored")
        if TaskFamily.MULTITURN in (case.tasks or []) and not case.turns:
            notes.append(f"cases[{n}].tasks: 'multiturn' has no turns to ask, so it will not run")
    total = len(parsed.cases)
    problems.sort(key=lambda p: -1 if p.case is None else p.case)
    return ManifestCheck(
        manifest=str(path),
        name=parsed.name or path.stem,
        cases=total,
        cases_ok=sum(1 for n, c in enumerate(parsed.cases) if c is not None and n not in bad),
        problems=problems,
        notes=notes,
    )


def load_manifest(
    path: Path,
    cache_dir: Path,
    plan: RenderPlan | None = None,
    fetch_study: StudyFetcher | None = None,
) -> tuple[str, list[Case], LoadNotes]:
    """A hospital's case manifest (YAML or JSON). A case with a bad field or a missing file is
    skipped (a SkippedCase) with every problem named by its path; a problem of the manifest
    itself raises. ``fetch_study`` fetches a study named on a configured PACS (none: such a
    case is skipped, saying so)."""
    base = path.parent
    data = read_manifest(path)
    parsed, problems, records = _manifest_problems(data, base)
    top = [str(p) for p in problems if p.case is None]
    if top:
        raise DatasetError(f"{path}: " + "; ".join(top))
    cases: list[Case] = []
    warnings: LoadNotes = []
    for n, entry in enumerate(parsed.cases):
        mine = [str(p) for p in problems if p.case == n]
        label = entry.label(n) if entry is not None else raw_label(data["cases"][n], n)
        reason = "; ".join(mine)
        if entry is not None and not mine:
            try:
                case = _build_case(entry, base, cache_dir, n, records.get(n), fetch_study)
                case, w = _finish(case, base, cache_dir, plan)
            except DatasetError as exc:
                reason = str(exc)
            else:
                cases.append(case)
                warnings.extend(w)
                continue
        warnings.append(
            SkippedCase(entry="manifest case", position=n + 1, case_id=label, reason=reason)
        )
    if not cases:
        raise DatasetError(f"{path}: no case could be loaded: " + "; ".join(map(str, warnings[:3])))
    return parsed.name or path.stem, cases, warnings


def raw_label(entry: Any, n: int) -> str:
    """The id of a case that did not validate, as far as it can be read (``case_label``'s rule)."""
    fields = entry if isinstance(entry, dict) else {}
    return case_label(fields.get("case_id"), fields.get("id"), n)


def manifest_case(entry: Any, base: Path, cache_dir: Path, n: int) -> Case:
    """The ``n``-th (0-based) case of a manifest in folder `base`, its study not rendered;
    DatasetError naming every bad field and missing file by its path."""
    try:
        case = parse_case(entry)
    except ValidationError as exc:
        raise DatasetError("; ".join(map(str, problems_of(exc, ("cases", n))))) from None
    problems, record = _file_problems(_case_files(case), base, n)
    if problems:
        raise DatasetError("; ".join(map(str, problems)))
    return _build_case(case, base, cache_dir, n, record)


def _build_case(
    entry: ManifestCase,
    base: Path,
    cache_dir: Path,
    n: int,
    record: dict[str, Any] | None = None,
    fetch_study: StudyFetcher | None = None,
) -> Case:
    """The case of a checked manifest entry; ``record``: its record file as already read."""
    study_path: str | None = None
    source = "folder"
    uids: list[str] = []
    local = _local_study(entry.study)
    if local is not None:
        study_path = str(inside_folder(base, local[0], "study"))
    elif isinstance(entry.study, OrthancStudy):
        server = entry.study.server()
        study_path = str(_orthanc_study(server, cache_dir))
        source, uids = "orthanc", [str(server.study_uid)]
    elif isinstance(entry.study, PacsStudyRef):
        study_path = str(_pacs_study(entry.study, cache_dir, fetch_study))
        source, uids = "pacs", [entry.study.study_uid]
    ehr = entry.ehr
    if isinstance(entry.ehr, str):
        ehr = record if record is not None else read_json(inside_folder(base, entry.ehr, "ehr"))
    note = entry.note or ""
    if _note_file(note):
        note = _read_note(inside_folder(base, note, "note"))
    return Case(
        case_id=entry.label(n),
        patient_id=entry.patient_id or None,
        study_path=study_path,
        ehr=ehr,
        note=note,
        ground_truth=entry.ground_truth,
        tasks=entry.tasks or [],
        questions=entry.questions or [],
        turns=entry.turns or [],
        provenance=Provenance(source=source, study_uids=uids, dataset=str(base)),
    )


def _finish(
    case: Case, base: Path, cache_dir: Path, plan: RenderPlan | None
) -> tuple[Case, list[str]]:
    case.root = str(base)
    warnings: list[str] = []
    if case.study_path:
        rendered = render_study(Path(case.study_path), case, cache_dir, plan)
        case.images = rendered.images
        warnings.extend(f"{case.case_id}: {w}" for w in rendered.warnings)
        if rendered.burned_in_series:
            case.provenance.burned_in_series = rendered.burned_in_series
        case.provenance.identity = rendered.identity
    return case, warnings
