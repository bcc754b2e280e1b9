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

from evaluation.case import Case
from evaluation.datasets.suite import load_case_dir, suite_case_dirs
from evaluation.errors import DatasetError


def case_registry(path: Path) -> tuple[dict[str, Case], list[str]]:
    """Cases of a suite folder by the StudyInstanceUIDs they name, and why any was left out
    (unreadable, no study UID, a study UID two cases name)."""
    if not path.is_dir():
        raise DatasetError(f"case registry {path}: not a suite folder")
    by_uid: dict[str, Case] = {}
    problems: list[str] = []
    for folder in suite_case_dirs(path):
        try:
            case, _ = load_case_dir(folder, path, render=False)
        except DatasetError as exc:
            problems.append(f"{folder.name}: {exc}")
            continue
        if not case.provenance.study_uids:
            problems.append(f"{case.case_id}: names no StudyInstanceUID (provenance.study_uids)")
        for uid in case.provenance.study_uids:
            if uid in by_uid:
                problems.append(f"{case.case_id}: study {uid} is also case {by_uid[uid].case_id}")
                continue
            by_uid[uid] = case
    return by_uid, problems
