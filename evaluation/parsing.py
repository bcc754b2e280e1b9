"""Answer parsing: find the JSON object in a model's reply and validate it against the schema.

The JSON may sit in a fenced block or in prose; reasoning traces (``<think>...</think>``) are
skipped. The object is validated against the family's answer schema (JSON Schema file of the
prompt set), with the keys the family requires, then built into the typed record. A reply with
no valid object is a FORMAT_FAILURE: stored, counted, never scored as a wrong answer. A reply
that declines is a REFUSAL. Small, unambiguous repairs are made and listed in ``repairs``
(a number given for a string field, "60%" for 0.6, "MRI" spelled "mri").
"""

from __future__ import annotations

import json
import re
import unicodedata
from functools import lru_cache
from typing import Any

import jsonschema
from pydantic import BaseModel, Field, ValidationError

from evaluation.answers import Answer, ClassificationAnswer, ImagePlace
from evaluation.case import TaskFamily, neurovlm_subtype
from evaluation.prompts import PromptSet, default_prompts
from evaluation.scores import ParseStatus
from evaluation.scoring.text import clean
from evaluation.scoring.untrusted import json_candidates
from evaluation.tasks import REQUIRED_KEYS, schema_name

# A refusal by its structure: a first-person subject, a declining verb phrase (a negated modal,
# "unable to", "decline", "not comfortable"), then an act of answering; matched on cleaned text
# (text.clean: NFKC, ASCII quotes and dashes), and only when the reply holds no answer JSON.
_SUBJECT = r"(?:\bI|\bwe)"
_ACT = (
    r"(?:provid|giv|offer|mak|render|help|assist|compl|diagnos|interpret|answer|read|assess|"
    r"evaluat|analy[sz]|review|determin|identif|shar|respond)\w*"
)
_REFUSAL = re.compile(
    rf"{_SUBJECT}\s*(?:'m|'ve| am| have| will| would| must| do| can)?\s*"
    rf"(?:cannot|can't|can not|won't|will not|wouldn't|don't|do not|am not|'m not|"
    rf"unable to|not able to|must decline|have to decline|must respectfully decline|"
    rf"respectfully decline|decline|refuse|not comfortable|don't feel comfortable|"
    rf"do not feel comfortable|not in a position to|am not in a position to)"
    rf"(?:\s+(?:to|be able to|in a position to|feel comfortable|comfortable|respectfully|"
    rf"help with|assist with|provide a|offer a|give a|with))*\s+{_ACT}"
    rf"|\bas an ai(?: language)? model\b"
    rf"|\b(?:cannot|can't|unable to|not able to) (?:provide|give|offer|make) (?:a |any )?"
    rf"(?:medical )?(?:diagnos|advice|opinion|interpretation)",
    re.I,
)
_CLASS_ENUMS: dict[str, dict[str, str]] = {
    "modality": {"ct": "CT", "mri": "MRI", "mr": "MRI"},
    "specialized_sequence": {
        "flair": "FLAIR",
        "t1": "T1",
        "t2": "T2",
        "t1c+": "T1C+",
        "t1c": "T1C+",
        "t1+c": "T1C+",
        "t1 post-contrast": "T1C+",
    },
    "plane": {"axial": "axial", "sagittal": "sagittal", "coronal": "coronal"},
    "diagnosis_name": {
        "tumor": "tumor",
        "tumour": "tumor",
        "stroke": "stroke",
        "multiple sclerosis": "multiple sclerosis",
        "ms": "multiple sclerosis",
        "normal": "normal",
        "other abnormalities": "other abnormalities",
        "other abnormality": "other abnormalities",
        "other": "other abnormalities",
    },
}
# NeuroVLM-Bench's abstention: null, or a word saying the field cannot be told (its evaluator
# reads every such answer as "undetermined")
_ABSTAIN = frozenset(
    {"", "null", "none", "n/a", "na", "unknown", "undetermined", "indeterminate", "uncertain",
     "unclear", "not determined", "cannot be determined", "cannot determine", "can't determine",
     "not determinable", "not applicable", "not assessable", "unable to determine"}
)  # fmt: skip
_UNIT_FIELDS = ("confidence", "likelihood", "severity_score", "diagnosis_confidence")
MAX_REASON = 200  # characters of a format failure's reason shown beside it
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
_TITLES = {
    "answer": (
        "NeuroSandbox answer",
        "What a model must return for the diagnostic tasks (differential, lesion, rationale, "
        "multiturn): one JSON object. Keys not listed are ignored; each task requires the keys "
        "x-required-by-task names. docs/answer-format.md explains each field.",
    ),
    "classification": (
        "NeuroSandbox classification answer (NeuroVLM-Bench)",
        "What a model must return for the classification task: one JSON object with every key; "
        "null abstains.",
    ),
}


def format_reason(error: str, limit: int = MAX_REASON) -> str:
    """A format failure's reason as shown to people: one line, no control or format characters
    (the reason quotes the model's text), at most ``limit`` characters."""
    text = "".join(
        " " if unicodedata.category(c).startswith("C") else c for c in (error or "")[: limit * 4]
    )
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "\u2026"


def answer_schema(kind: str = "answer", prompts: PromptSet | None = None) -> dict[str, Any]:
    """The published JSON Schema of an answer (``answer``: the diagnostic tasks,
    ``classification``: NeuroVLM-Bench's): the prompt set's schema that answers are validated
    against, with its version and, for the diagnostic tasks, the keys each task requires."""
    if kind not in _TITLES:
        raise ValueError(f"answer schema {kind!r}: one of {', '.join(_TITLES)}")
    schema = (prompts or default_prompts()).schema(kind)
    sid = str(schema.pop("$id"))
    title, description = _TITLES[kind]
    out: dict[str, Any] = {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": sid,
        "version": sid.rsplit("/", 1)[-1],
        "title": title,
        "description": description,
        **schema,
    }
    if kind == "answer":
        out["x-required-by-task"] = {
            f.value: list(keys) for f, keys in REQUIRED_KEYS.items() if schema_name(f) == kind
        }
    return out


class ParsedAnswer(BaseModel):
    status: ParseStatus
    answer: Answer | ClassificationAnswer | None = None
    data: dict[str, Any] | None = None  # the JSON object found (after repairs)
    error: str = ""  # why it failed, for a format failure
    missing_fields: list[str] = Field(default_factory=list)
    repairs: list[str] = Field(default_factory=list)


@lru_cache(maxsize=8)
def _validator(prompts: PromptSet, name: str, required: tuple[str, ...]) -> Any:
    schema = dict(prompts.schema(name))
    schema["required"] = list(required)
    return jsonschema.Draft202012Validator(schema)


@lru_cache(maxsize=8)
def _required(prompts: PromptSet, name: str) -> tuple[str, ...]:
    return tuple(prompts.schema(name).get("required", []))


def _unit(value: Any, where: str, repairs: list[str]) -> Any:
    if isinstance(value, str):
        s = value.strip().rstrip("%").strip()
        try:
            number = float(s)
        except ValueError:
            return value
        repairs.append(f"{where}: text {value!r} read as a number")
        value = number / 100 if value.strip().endswith("%") else number
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 1 < value <= 100:
        repairs.append(f"{where}: {value} read as a percentage")
        return value / 100
    return value


def _list(data: dict[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    return value if isinstance(value, list) else []


def _repair_answer(data: dict[str, Any], repairs: list[str]) -> dict[str, Any]:
    if "confidence" in data:
        data["confidence"] = _unit(data["confidence"], "confidence", repairs)
    for n, seq in enumerate(_list(data, "sequences_identified")):
        if isinstance(seq, dict) and isinstance(seq.get("image"), (int, float)):
            seq["image"] = str(seq["image"])
            repairs.append(f"sequences_identified[{n}].image: number read as text")
    differential = _list(data, "differential")
    for n, item in enumerate(differential):
        if isinstance(item, str):
            differential[n] = item = {"diagnosis": item}
            repairs.append(f"differential[{n}]: a bare name read as a diagnosis")
        if not isinstance(item, dict):
            continue
        if "likelihood" in item:
            item["likelihood"] = _unit(item["likelihood"], f"differential[{n}].likelihood", repairs)
        for key in ("evidence_for", "evidence_against"):
            if isinstance(item.get(key), str):
                item[key] = [item[key]]
    for n, item in enumerate(_list(data, "findings")):
        if isinstance(item, dict) and item.get("place") is not None:
            _repair_place(item, f"findings[{n}].place", repairs)
        if isinstance(item, dict) and isinstance(item.get("size_mm"), str):
            m = re.match(r"\s*(\d+(?:\.\d+)?)", item["size_mm"])
            if m:
                item["size_mm"] = float(m.group(1))
                repairs.append("findings.size_mm: text read as a number")
    if isinstance(data.get("next_steps"), str):
        data["next_steps"] = [data["next_steps"]]
    return data


def _repair_place(item: dict[str, Any], where: str, repairs: list[str]) -> None:
    """A finding's place as the record reads it (numbers given as text read as numbers), or
    dropped with a repair when it is no place on an image (the finding itself is kept: a bad
    pointer never costs the answer)."""
    try:
        place = ImagePlace.model_validate(item["place"])
    except ValidationError as exc:
        del item["place"]
        why = exc.errors()[0]["msg"] if exc.errors() else "invalid"
        repairs.append(format_reason(f"{where}: dropped, not a place on an image ({why})"))
        return
    fixed = place.model_dump(mode="json", exclude_none=True)
    if fixed != item["place"]:
        repairs.append(f"{where}: read as {fixed}")
    item["place"] = fixed


def _repair_classification(data: dict[str, Any], repairs: list[str]) -> dict[str, Any]:
    for key in (*_CLASS_ENUMS, "diagnosis_detailed", "icd10_code"):
        value = data.get(key)
        if not isinstance(value, str):
            continue
        low = clean(value).lower().strip(" .")  # clean collapses the whitespace
        table = _CLASS_ENUMS.get(key, {})
        if low in _ABSTAIN:
            data[key] = None
            repairs.append(f"{key}: {value!r} read as an abstention (null)")
        elif low in table and table[low] != value:
            data[key] = table[low]
            repairs.append(f"{key}: {value!r} read as {table[low]!r}")
        elif key == "diagnosis_detailed":
            sub = neurovlm_subtype(value)
            if sub != value:
                data[key] = sub
                repairs.append(f"{key}: {value!r} read as {sub!r}")
    for key in ("severity_score", "diagnosis_confidence", "severity_confidence"):
        if key in data:
            data[key] = _unit(data[key], key, repairs)
    return data


def parse_answer(
    text: str,
    family: TaskFamily,
    *,
    refusal: bool = False,
    error: str | None = None,
    prompts: PromptSet | None = None,
) -> ParsedAnswer:
    """Status and typed answer of one reply (``refusal``/``error`` come from the model call)."""
    if error:
        return ParsedAnswer(status=ParseStatus.ERROR, error=error)
    if refusal:
        return ParsedAnswer(status=ParseStatus.REFUSAL, error="the provider reported a refusal")
    prompts = prompts or default_prompts()
    name = schema_name(family)
    validator = _validator(prompts, name, REQUIRED_KEYS[family])
    last_error = "no JSON object found in the reply"
    candidates = json_candidates(text)
    for candidate in reversed(candidates):  # the final object is the answer
        repairs: list[str] = []
        data = json.loads(json.dumps(candidate))  # a private copy to repair
        data = (
            _repair_classification(data, repairs)
            if family is TaskFamily.CLASSIFICATION
            else _repair_answer(data, repairs)
        )
        errors = sorted(validator.iter_errors(data), key=lambda e: list(e.path))
        if errors:
            e = errors[0]
            where = "/".join(str(p) for p in e.path) or "(top level)"
            last_error = format_reason(f"schema: {where}: {e.message}")
            continue
        try:
            answer: Answer | ClassificationAnswer = (
                ClassificationAnswer.model_validate(data)
                if family is TaskFamily.CLASSIFICATION
                else Answer.model_validate(data)
            )
        except ValidationError as exc:
            last_error = format_reason(f"record: {exc.errors()[0]['msg']}")
            continue
        missing = [k for k in _required(prompts, name) if k not in data]
        return ParsedAnswer(
            status=ParseStatus.OK, answer=answer, data=data, missing_fields=missing, repairs=repairs
        )
    if _REFUSAL.search(clean(text[:4000])) and not candidates:
        return ParsedAnswer(status=ParseStatus.REFUSAL, error="the reply declines to answer")
    return ParsedAnswer(status=ParseStatus.FORMAT_FAILURE, error=last_error)
