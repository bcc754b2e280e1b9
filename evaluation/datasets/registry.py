"""The hospital's known cases, found by the study they are about.

A study that reaches the gateway (by C-STORE, from Orthanc, from the API) is a clinical study:
no truth, no record. When the team has registered cases (a suite folder: one folder per case
with ``case.json``, ``ehr.json``, ``note.txt``), a received study whose StudyInstanceUID a case
names (``provenance.study_uids``) is evaluated as that case: its EHR and note go into the
prompts, its ground truth scores the answers, its scripted turns allow the multi-turn task.
Nothing is rendered here: the gateway renders the study it received.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from evaluation.case import Case
from evaluation.datasets.suite import load_case_dir, read_json, suite_case_dirs
from evaluation.errors import DatasetError


def case_registry(path: Path) -> tuple[dict[str, Case], list[str]]:
    """The registered cases by the StudyInstanceUIDs they name (each ``case.json`` only, its
    ``root`` set: no record or note read), and why any was left out (unreadable, no study
    UID, a study UID two cases name)."""
    if not path.is_dir():
        raise DatasetError(f"case registry {path}: not a suite folder")
    by_uid: dict[str, Case] = {}
    problems: list[str] = []
    for folder in suite_case_dirs(path):
        try:
            case = Case.model_validate(read_json(folder / "case.json"))
        except (OSError, DatasetError, ValidationError) as exc:
            problems.append(f"{folder.name}: not a valid case ({exc})"[:500])
            continue
        case.root = str(folder)
        if not case.provenance.study_uids:
            problems.append(f"{case.case_id}: names no StudyInstanceUID (provenance.study_uids)")
        for uid in case.provenance.study_uids:
            if uid in by_uid:
                problems.append(f"{case.case_id}: study {uid} is also case {by_uid[uid].case_id}")
                continue
            by_uid[uid] = case
    return by_uid, problems


def registered_case(
    path: Path, study_uid: str, patient_id: str | None = None
) -> tuple[Case | None, list[str]]:
    """The registered case of this study of this patient, whole (record and note too), if
    any; and the registry's problems. A UID is not an identity: a case whose ``patient_id``
    is not the arriving study's PatientID (``patient_id``) is not this study's case."""
    cases, problems = case_registry(path)
    found = cases.get(study_uid)
    if found is None or found.root is None:
        return None, problems
    if patient_id is not None and not found.is_of_patient(patient_id):
        problems.append(
            f"{found.case_id}: registered for this StudyInstanceUID but another patient's: not used"
        )
        return None, problems
    case, _ = load_case_dir(Path(found.root), path, render=False)
    return case, problems
