"""NeuroVLM-Bench: ``image_mapping.csv`` (dataset, file_path, class, original_class, subclass,
modality, modality_subtype, plane) plus an image root; one classification case per row.

The label fields the scorer needs (sequence, subtype) travel in ``provenance.neurovlm`` (a typed NeuroVLMLabels);
class, modality and plane also fill the ground truth. A row whose image is missing, unreadable
or outside the image root is reported and skipped.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

from evaluation.case import (
    Case,
    Diagnosis,
    DiseaseGroup,
    GroundTruth,
    NeuroVLMLabels,
    Provenance,
    TaskFamily,
    is_neurovlm_subtype,
    neurovlm_subtype,
)
from evaluation.coverage import LoadNotes, SkippedCase
from evaluation.datasets.images import image_ref
from evaluation.errors import DatasetError

COLUMNS = (
    "dataset",
    "file_path",
    "class",
    "original_class",
    "subclass",
    "modality",
    "modality_subtype",
    "plane",
)
CLASS_GROUP = {
    "tumor": DiseaseGroup.TUMOUR,
    "multiple sclerosis": DiseaseGroup.DEMYELINATING,
    "normal": DiseaseGroup.NORMAL,
    "other abnormalities": DiseaseGroup.OTHER,
}
ICD10 = {"multiple sclerosis": "G35", "ischemic": "I63", "hemorrhagic": "I61"}
MAX_ROWS = 200_000


def _norm(value: Any) -> str:
    return " ".join(str(value or "").split()).strip()


def _modality(value: str) -> str | None:
    v = value.upper()
    return "CT" if v == "CT" else "MRI" if v in ("MRI", "MR") else None


def _plane(value: str) -> str | None:
    v = value.lower()
    return v if v in ("axial", "sagittal", "coronal") else None


def _group(cls: str, subclass: str) -> DiseaseGroup | None:
    if cls == "stroke":
        return (
            DiseaseGroup.HAEMORRHAGIC_STROKE
            if subclass.startswith("hem") or subclass.startswith("haem")
            else DiseaseGroup.ISCHAEMIC_STROKE
        )
    return CLASS_GROUP.get(cls)


def _skip(n: int, reason: str) -> SkippedCase:
    """The row at index ``n`` of the mapping (line n + 2: the header is line 1), skipped."""
    return SkippedCase(entry="row", position=n + 2, reason=reason)


def load_neurovlm(
    mapping: Path, image_root: Path | None, cache_dir: Path, limit: int | None = None
) -> tuple[str, list[Case], LoadNotes]:
    """Cases of an image_mapping.csv; image paths are relative to ``image_root``."""
    if mapping.is_dir():
        mapping = mapping / "image_mapping.csv"
    if not mapping.exists():
        raise DatasetError(f"no image_mapping.csv at {mapping}")
    root = (image_root or mapping.parent).resolve()
    with mapping.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in ("file_path", "class") if c not in (reader.fieldnames or [])]
        if missing:
            raise DatasetError(
                f"{mapping}: missing columns {missing}; expected {', '.join(COLUMNS)}"
            )
        rows = []
        for n, row in enumerate(reader):
            if n >= MAX_ROWS:
                raise DatasetError(f"{mapping}: more than {MAX_ROWS} rows")
            rows.append(row)
    cases: list[Case] = []
    warnings: LoadNotes = []
    seen: set[str] = set()
    for n, row in enumerate(rows[:limit] if limit else rows):
        rel = _norm(row.get("file_path"))
        full = (root / rel).resolve()
        if root not in full.parents:
            warnings.append(_skip(n, f"image path {rel!r} is outside {root}"))
            continue
        if not full.is_file():
            warnings.append(_skip(n, f"image {rel!r} not found under {root}"))
            continue
        cls = _norm(row.get("class")).lower()
        stated = _norm(row.get("subclass"))
        subclass = neurovlm_subtype(stated) or ""
        if subclass and not is_neurovlm_subtype(subclass):
            warnings.append(
                f"row {n + 2}: subclass {stated!r} is not one of the "
                "benchmark's subtypes; its subtype is not scored"
            )
        modality = _modality(_norm(row.get("modality")))
        plane = _plane(_norm(row.get("plane")))
        try:
            ref = image_ref(
                full.read_bytes(),
                cache_dir,
                "Image 1",
                source_path=full,
                kind="slice",
                modality="CT" if modality == "CT" else "MR" if modality else None,
                plane=plane,
                series_class=_norm(row.get("modality_subtype")) or None,
            )
        except DatasetError as exc:
            warnings.append(_skip(n, f"{rel}: {exc}"))
            continue
        base = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{_norm(row.get('dataset'))}_{Path(rel).stem}")
        cid = base.strip("_") or f"row{n + 2}"
        if cid in seen:
            cid = f"{cid}_{n + 2}"
        seen.add(cid)
        detail = subclass or None
        gt = GroundTruth(
            final_diagnosis=Diagnosis(
                name=cls,
                icd10=ICD10.get(detail or "") or ICD10.get(cls),
                group=_group(cls, subclass),
            ),
            modality=modality,
            plane=plane,
        )
        cases.append(
            Case(
                case_id=cid,
                images=[ref],
                ground_truth=gt,
                tasks=[TaskFamily.CLASSIFICATION],
                provenance=Provenance(
                    source="neurovlm-bench",
                    dataset=_norm(row.get("dataset")) or None,
                    neurovlm=NeuroVLMLabels.model_validate(
                        {k: _norm(row.get(k)) for k in COLUMNS if k in row}
                    ),
                ),
            )
        )
    if not cases:
        raise DatasetError(f"{mapping}: no usable row: " + "; ".join(map(str, warnings[:3])))
    return mapping.parent.name, cases, warnings
