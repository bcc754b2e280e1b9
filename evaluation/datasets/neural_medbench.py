"""Neural-MedBench records: ``{case_id, text, images: [data-URI], questions: [...]}`` + answers.

Records come from JSON (a list, or a mapping holding one), JSON Lines or Parquet. Column names of
the public release are not fixed here, so every field goes through a :class:`ColumnMap`
(e.g. ``case_id=id,text=clinical_text``). Answers live in a separate file (JSON, JSONL or CSV)
keyed by case id and, optionally, question number. Each question becomes a task of the family
its wording suggests (lesion, rationale, else differential); an L3 case's questions become the
turns of one multi-turn task.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from evaluation.case import (
    Case,
    Diagnosis,
    Difficulty,
    GroundTruth,
    Provenance,
    Question,
    TaskFamily,
    Turn,
)
from evaluation.coverage import LoadNotes, SkippedCase
from evaluation.datasets.images import decode_data_uri, image_ref
from evaluation.errors import DatasetError

MAX_FILE_BYTES = 4 * 1024**3
MAX_TEXT_CHARS = 50_000


class ColumnMap(BaseModel):
    """Where each field is in a record (records) and in an answer row (answer_*)."""

    case_id: str = "case_id"
    text: str = "text"
    images: str = "images"
    questions: str = "questions"
    question_number: str = "question_number"
    question_text: str = "question_text"
    answer_case_id: str = "case_id"
    answer_question_number: str = "question_number"
    answer: str = "answer"
    difficulty: str = "difficulty"
    synonyms: str = "synonyms"
    icd10: str = "icd10"
    rationale: str = "rationale"

    @classmethod
    def parse(cls, spec: str | dict[str, str] | None) -> ColumnMap:
        """From ``"field=column,field=column"`` or a mapping."""
        if not spec:
            return cls()
        if isinstance(spec, str):
            pairs = [p.split("=", 1) for p in spec.split(",") if p.strip()]
            if any(len(p) != 2 for p in pairs):
                raise DatasetError(f"column map {spec!r}: use field=column,field=column")
            spec = {k.strip(): v.strip() for k, v in pairs}
        unknown = set(spec) - set(cls.model_fields)
        if unknown:
            raise DatasetError(
                f"unknown column-map fields {sorted(unknown)}; known: {', '.join(cls.model_fields)}"
            )
        return cls(**spec)


def read_records(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSON, JSONL, CSV or Parquet file, as dicts."""
    if not path.exists():
        raise DatasetError(f"no such file: {path}")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise DatasetError(f"{path} is larger than {MAX_FILE_BYTES >> 30} GiB")
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            return [dict(r) for r in pq.read_table(path).to_pylist()]
        if suffix == ".csv":
            with path.open(newline="", encoding="utf-8") as fh:
                return [dict(r) for r in csv.DictReader(fh)]
        text = path.read_text(encoding="utf-8")
        if suffix in (".jsonl", ".ndjson"):
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError, OSError, ValueError) as exc:
        raise DatasetError(f"{path}: cannot read records: {exc}") from exc
    if isinstance(data, dict):
        for key in ("data", "records", "rows", "cases", "train", "test"):
            if isinstance(data.get(key), list):
                data = data[key]
                break
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise DatasetError(f"{path}: expected a list of records")
    return data


def question_family(text: str) -> TaskFamily:
    """The family a question's wording asks for."""
    t = text.lower()
    if re.search(r"\b(why|explain|justify|rationale|reasoning|reason)\b", t):
        return TaskFamily.RATIONALE
    lesion = re.search(r"\b(lesion|lesions|locali[sz]e|location|where|abnormalit|findings?)\b", t)
    if lesion and not re.search(r"\b(diagnos|differential)", t):
        return TaskFamily.LESION
    return TaskFamily.DIFFERENTIAL


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, str):
        s = value.strip()
        if s.startswith("["):
            try:
                loaded = json.loads(s)
            except json.JSONDecodeError:
                return [value]
            return loaded if isinstance(loaded, list) else [loaded]
        return [value] if s else []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _image_bytes(item: Any) -> bytes:
    if isinstance(item, (bytes, bytearray)):
        return bytes(item)
    if isinstance(item, str):
        return decode_data_uri(item)
    if isinstance(item, dict):  # Hugging Face image feature: {"bytes": ..., "path": ...}
        for key in ("bytes", "data", "image", "url"):
            if item.get(key):
                return _image_bytes(item[key])
    raise DatasetError(f"unrecognised image value of type {type(item).__name__}")


def _answers(path: Path | None, cols: ColumnMap) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    if path is None:
        return out
    for row in read_records(path):
        cid = row.get(cols.answer_case_id)
        if cid is not None:
            out.setdefault(str(cid), []).append(row)
    return out


def _difficulty(value: Any) -> Difficulty | None:
    s = str(value or "").strip().upper()
    for d in Difficulty:
        if s == d.value or s.startswith(d.value + " ") or s.startswith(d.value + ":"):
            return d
    words = {"DIRECT": Difficulty.L1, "COMPLEX": Difficulty.L2, "MULTI-TURN": Difficulty.L3}
    return words.get(s.replace("MULTITURN", "MULTI-TURN"))


def _ground_truth(rows: list[dict[str, Any]], cols: ColumnMap) -> GroundTruth | None:
    named = [r for r in rows if str(r.get(cols.answer) or "").strip()]
    if not named:
        return None
    first = named[0]
    syn = _as_list(first.get(cols.synonyms))
    if len(syn) == 1 and isinstance(syn[0], str) and ";" in syn[0]:
        syn = [s.strip() for s in syn[0].split(";")]
    return GroundTruth(
        final_diagnosis=Diagnosis(
            name=str(first[cols.answer]).strip()[:500],
            icd10=str(first.get(cols.icd10) or "").strip() or None,
        ),
        synonyms=[str(s).strip() for s in syn if str(s).strip()],
        rationale=str(first.get(cols.rationale) or "")[:MAX_TEXT_CHARS],
        difficulty=_difficulty(first.get(cols.difficulty)) or Difficulty.L1,
    )


def load_neural_medbench(
    path: Path,
    cache_dir: Path,
    *,
    answers: Path | None = None,
    columns: ColumnMap | None = None,
) -> tuple[str, list[Case], LoadNotes]:
    """Cases of a Neural-MedBench file (JSON/JSONL/Parquet) with an optional answers file."""
    cols = columns or ColumnMap()
    truth = _answers(answers, cols)
    records = read_records(path)
    if records and cols.case_id not in records[0]:
        raise DatasetError(
            f"{path}: no column {cols.case_id!r} (columns: {', '.join(list(records[0])[:12])}); "
            "give a column map, e.g. case_id=id,text=clinical_text"
        )
    cases: list[Case] = []
    warnings: LoadNotes = []
    for n, rec in enumerate(records):
        cid = str(rec.get(cols.case_id) or f"row-{n + 1}")
        try:
            cases.append(_case(rec, cid, truth.get(cid, []), cols, cache_dir, path))
        except (DatasetError, ValidationError) as exc:
            warnings.append(
                SkippedCase(entry="record", position=n + 1, case_id=cid, reason=str(exc))
            )
    if not cases:
        raise DatasetError(
            f"{path}: no record could be loaded: " + "; ".join(map(str, warnings[:3]))
        )
    if answers is None:
        warnings.append("no answers file: cases have no ground truth and will not be scored")
    return path.stem, cases, warnings


def _case(
    rec: dict[str, Any],
    cid: str,
    answer_rows: list[dict[str, Any]],
    cols: ColumnMap,
    cache_dir: Path,
    source: Path,
) -> Case:
    images = []
    for k, item in enumerate(_as_list(rec.get(cols.images)), start=1):
        try:
            images.append(image_ref(_image_bytes(item), cache_dir, f"Image {k}", kind="slice"))
        except DatasetError as exc:
            raise DatasetError(f"image {k}: {exc}") from exc
    questions: list[Question] = []
    for k, q in enumerate(_as_list(rec.get(cols.questions)), start=1):
        if isinstance(q, dict):
            text = str(q.get(cols.question_text) or "").strip()
            number = q.get(cols.question_number, k)
        else:
            text, number = str(q).strip(), k
        if text:
            try:
                num = int(number)
            except (TypeError, ValueError):
                num = k
            text = text[:MAX_TEXT_CHARS]
            questions.append(Question(number=num, text=text, family=question_family(text)))
    gt = _ground_truth(answer_rows, cols)
    by_q = {
        str(r.get(cols.answer_question_number)): r.get(cols.answer)
        for r in answer_rows
        if r.get(cols.answer_question_number) is not None
    }
    turns: list[Turn] = []
    tasks = sorted({q.family for q in questions if q.family}, key=list(TaskFamily).index)
    if gt is not None and gt.difficulty is Difficulty.L3 and len(questions) > 1:
        turns = [Turn(question=q.text) for q in questions]
        questions, tasks = [], [TaskFamily.MULTITURN]
    return Case(
        case_id=cid,
        images=images,
        note=str(rec.get(cols.text) or "")[:MAX_TEXT_CHARS],
        ground_truth=gt,
        tasks=tasks or [TaskFamily.DIFFERENTIAL],
        questions=questions,
        turns=turns,
        provenance=Provenance(
            source="neural-medbench",
            dataset=str(source),
            answers_by_question=by_q,
        ),
    )
