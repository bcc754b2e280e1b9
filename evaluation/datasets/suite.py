"""Case folders (the phantom suite) and a hospital's own case manifests (YAML or JSON).

A suite folder holds ``suite.json`` (optional: name and the ordered case list) and one folder
per case with ``case.json`` (an ``evaluation.case.Case``), ``ehr.json``, ``note.txt`` and the
study (``study_path``, relative to the case folder, or absolute). A manifest lists cases whose
study lives in a folder/zip or in Orthanc (``orthanc: {url, study_uid}``), with the EHR bundle,
the note and the ground truth given inline or as files next to the manifest.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from evaluation.case import Case, GroundTruth, Provenance, Question, TaskFamily, Turn
from evaluation.datasets.rendering import RenderPlan, render_study
from evaluation.errors import DatasetError

MAX_JSON_BYTES = 20 * 1024 * 1024
MAX_NOTE_BYTES = 1024 * 1024


def _read_json(path: Path) -> Any:
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


def _inside(base: Path, rel: str, what: str) -> Path:
    """Resolve a relative path from a dataset file, refusing escapes via '..'."""
    p = Path(rel)
    if p.is_absolute():
        return p
    full = (base / p).resolve()
    if base.resolve() not in (full, *full.parents):
        raise DatasetError(f"{what} {rel!r} points outside {base}")
    return full


def suite_case_dirs(suite: Path) -> list[Path]:
    """Case folders of a suite, in the order suite.json gives (else sorted by name)."""
    meta = suite / "suite.json"
    if meta.exists():
        data = _read_json(meta)
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
                dirs.append(_inside(suite, name, "case folder"))
            return dirs
    return sorted(p.parent for p in suite.glob("*/case.json"))


def suite_name(suite: Path) -> str:
    meta = suite / "suite.json"
    if meta.exists():
        data = _read_json(meta)
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
        case = Case.model_validate(_read_json(path))
    except ValidationError as exc:
        raise DatasetError(f"{path}: not a valid case: {exc.errors()[0]['msg']}") from exc
    case.root = str(folder)
    if case.ehr is None and (folder / "ehr.json").exists():
        case.ehr = _read_json(folder / "ehr.json")
    if not case.note and (folder / "note.txt").exists():
        case.note = _read_note(folder / "note.txt")
    warnings: list[str] = []
    for img in case.images:  # images given with the case: make paths absolute
        img.path = str(_inside(folder, img.path, "image path"))
    if render and case.study_path and not case.images:
        study = _inside(folder, case.study_path, "study_path")
        rendered = render_study(study, case, cache_dir, plan)
        case.images = rendered.images
        warnings.extend(f"{case.case_id}: {w}" for w in rendered.warnings)
        if rendered.burned_in_series:
            case.provenance.burned_in_series = rendered.burned_in_series
        case.provenance.identity = rendered.identity
    return case, warnings


def load_suite(
    suite: Path, cache_dir: Path, plan: RenderPlan | None = None
) -> tuple[str, list[Case], list[str]]:
    """Every case of a suite folder; a case that fails is reported, the rest load."""
    dirs = suite_case_dirs(suite)
    if not dirs:
        raise DatasetError(f"{suite}: no case folders (no suite.json cases, no */case.json)")
    cases, warnings = [], []
    for d in dirs:
        try:
            case, w = load_case_dir(d, cache_dir, plan)
        except DatasetError as exc:
            warnings.append(f"skipped case {d.name}: {exc}")
            continue
        cases.append(case)
        warnings.extend(w)
    if not cases:
        raise DatasetError(f"{suite}: no case could be loaded: " + "; ".join(warnings[:3]))
    return suite_name(suite), cases, warnings


# --------------------------------------------------------------------------- manifests


def _orthanc_study(spec: dict[str, Any], cache_dir: Path) -> Path:
    """Download a study from Orthanc's REST API as a zip into the cache (once)."""
    import hashlib

    import httpx

    url = str(spec.get("url") or "").rstrip("/")
    uid = str(spec.get("study_uid") or "")
    if not url or not uid:
        raise DatasetError("orthanc study needs 'url' and 'study_uid'")
    target = (
        cache_dir / "orthanc" / (hashlib.sha256(f"{url}|{uid}".encode()).hexdigest()[:32] + ".zip")
    )
    if target.exists():
        return target
    user = os.environ.get(str(spec.get("username_env") or ""), "") or spec.get("username")
    password = os.environ.get(str(spec.get("password_env") or ""), "")
    auth = (str(user), password) if user else None
    try:
        with httpx.Client(base_url=url, auth=auth, timeout=float(spec.get("timeout_s", 120))) as c:
            found = c.post("/tools/lookup", content=uid)
            found.raise_for_status()
            ids = [r["ID"] for r in found.json() if r.get("Type") == "Study"]
            if not ids:
                raise DatasetError(f"Orthanc at {url} has no study {uid}")
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(f".tmp{os.getpid()}")
            with c.stream("GET", f"/studies/{ids[0]}/archive") as r:
                r.raise_for_status()
                with tmp.open("wb") as fh:
                    for chunk in r.iter_bytes():
                        fh.write(chunk)
            os.replace(tmp, target)
    except httpx.HTTPError as exc:
        raise DatasetError(f"Orthanc at {url}: could not fetch study {uid}: {exc}") from exc
    return target


def _field_or_file(base: Path, value: Any, what: str, as_json: bool) -> Any:
    if isinstance(value, str) and not as_json:
        p = base / value
        if len(value) < 500 and "\n" not in value and p.suffix == ".txt" and p.exists():
            return _read_note(_inside(base, value, what))
        return value
    if isinstance(value, str):
        return _read_json(_inside(base, value, what))
    return value


def load_manifest(
    path: Path, cache_dir: Path, plan: RenderPlan | None = None
) -> tuple[str, list[Case], list[str]]:
    """A hospital's case manifest (YAML or JSON)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise DatasetError(f"{path}: not valid YAML/JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("cases"), list):
        raise DatasetError(f"{path}: a manifest is a mapping with a 'cases' list")
    base = path.parent
    cases, warnings = [], []
    for n, entry in enumerate(data["cases"]):
        try:
            case = _manifest_case(entry, base, cache_dir, n)
            case, w = _finish(case, base, cache_dir, plan)
        except (DatasetError, ValidationError) as exc:
            msg = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
            warnings.append(f"skipped manifest case {n + 1}: {msg}")
            continue
        cases.append(case)
        warnings.extend(w)
    if not cases:
        raise DatasetError(f"{path}: no case could be loaded: " + "; ".join(warnings[:3]))
    return str(data.get("name") or path.stem), cases, warnings


def _manifest_case(entry: Any, base: Path, cache_dir: Path, n: int) -> Case:
    if not isinstance(entry, dict):
        raise DatasetError(f"case {n + 1} is not a mapping")
    case_id = str(entry.get("case_id") or entry.get("id") or f"case-{n + 1:03d}")
    study = entry.get("study")
    study_path: str | None = None
    source = "folder"
    uids: list[str] = []
    if isinstance(study, str):
        study_path = str(_inside(base, study, "study"))
    elif isinstance(study, dict) and "orthanc" in study:
        spec = study["orthanc"] if isinstance(study["orthanc"], dict) else {"url": study["orthanc"]}
        spec = {**spec, **{k: v for k, v in study.items() if k != "orthanc"}}
        study_path = str(_orthanc_study(spec, cache_dir))
        source, uids = "orthanc", [str(spec.get("study_uid"))]
    elif isinstance(study, dict) and "path" in study:
        study_path = str(_inside(base, str(study["path"]), "study"))
    elif study is not None:
        raise DatasetError(f"case {case_id}: 'study' must be a path or {{orthanc: ...}}")
    ehr = _field_or_file(base, entry.get("ehr"), "ehr", as_json=True)
    note = _field_or_file(base, entry.get("note", ""), "note", as_json=False)
    gt = entry.get("ground_truth")
    return Case(
        case_id=case_id,
        patient_id=str(entry["patient_id"]) if entry.get("patient_id") else None,
        study_path=study_path,
        ehr=ehr,
        note=note if isinstance(note, str) else "",
        ground_truth=GroundTruth.model_validate(gt) if gt else None,
        tasks=[TaskFamily(t) for t in entry.get("tasks") or []],
        questions=[Question.model_validate(q) for q in entry.get("questions") or []],
        turns=[Turn.model_validate(t) for t in entry.get("turns") or []],
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
