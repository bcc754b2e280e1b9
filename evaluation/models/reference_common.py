"""What the reference baselines share: reading the task off the prompt, shaping the answer JSON."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from evaluation.answers import Answer, ClassificationAnswer, DifferentialItem
from evaluation.case import TaskFamily
from evaluation.modelio import ImagePart, Message, TextPart
from evaluation.prompts import data_blocks, outside_data

_TASKS = {
    "differential diagnosis": TaskFamily.DIFFERENTIAL,
    "lesion recognition": TaskFamily.LESION,
    "diagnostic rationale": TaskFamily.RATIONALE,
    "structured classification": TaskFamily.CLASSIFICATION,
    "iterative diagnosis": TaskFamily.MULTITURN,
}


@dataclass(frozen=True)
class Dx:
    """A diagnosis a baseline can name, with how NeuroVLM-Bench would classify it."""

    name: str
    icd10: str
    neurovlm: str  # diagnosis_name
    detailed: str | None = None  # diagnosis_detailed


DX: dict[str, Dx] = {
    d.name: d
    for d in (
        Dx("acute ischaemic stroke", "I63.9", "stroke", "ischemic"),
        Dx("intracerebral haemorrhage", "I61.9", "stroke", "hemorrhagic"),
        Dx("multiple sclerosis", "G35", "multiple sclerosis"),
        Dx("glioblastoma", "C71.9", "tumor", "glioma"),
        Dx("brain metastases", "C79.3", "tumor", "carcinoma"),
        Dx("meningioma", "D32.0", "tumor", "meningioma"),
        Dx("cerebral abscess", "G06.0", "other abnormalities"),
        Dx("normal study", "Z03.3", "normal"),
    )
}


@dataclass
class Hypothesis:
    dx: Dx
    weight: float
    evidence: list[str] = field(default_factory=list)


def user_text(messages: list[Message]) -> str:
    return "\n".join(
        p.text for m in messages if m.role == "user" for p in m.content if isinstance(p, TextPart)
    )


_CLINICAL = ("clinical-record", "clinical-note", "clinical-information")
_QUESTION = re.compile(r"^Question: (.*?)(?:\n\n|\Z)", re.S | re.M)


def clinical_text(messages: list[Message]) -> str:
    """Only the clinical content of the prompts (record, note, revealed facts: the data
    containers; and the questions, outside them)."""
    chunks: list[str] = []
    for m in messages:
        if m.role != "user":
            continue
        for p in m.content:
            if isinstance(p, TextPart):
                chunks.extend(b.text for b in data_blocks(p.text) if b.kind in _CLINICAL)
                chunks.extend(hit.group(1) for hit in _QUESTION.finditer(outside_data(p.text)))
    return "\n".join(chunks)


def last_user(messages: list[Message]) -> Message | None:
    return next((m for m in reversed(messages) if m.role == "user"), None)


def task_of(messages: list[Message]) -> TaskFamily:
    """The family the conversation asks (the first "Task:" line of the user messages, outside
    the data containers: a note cannot set it)."""
    for m in messages:
        if m.role != "user":
            continue
        for p in m.content:
            if isinstance(p, TextPart):
                hit = re.search(r"^Task:\s*([^.\n]+)", outside_data(p.text), re.M)
                if hit:
                    words = hit.group(1).lower()
                    for key, fam in _TASKS.items():
                        if key in words:
                            return fam
    return TaskFamily.DIFFERENTIAL


def images_of(messages: list[Message]) -> list[ImagePart]:
    return [p for m in messages if m.role == "user" for p in m.content if isinstance(p, ImagePart)]


def ranked(hypotheses: list[Hypothesis]) -> list[Hypothesis]:
    return sorted(hypotheses, key=lambda h: -h.weight)


def differential(hypotheses: list[Hypothesis], k: int = 3) -> list[DifferentialItem]:
    top = ranked(hypotheses)[:k]
    total = sum(h.weight for h in top) or 1.0
    return [
        DifferentialItem(
            diagnosis=h.dx.name,
            icd10=h.dx.icd10,
            likelihood=round(h.weight / total, 3),
            evidence_for=h.evidence[:6],
        )
        for h in top
    ]


def classification(
    best: Hypothesis, *, modality: str | None, sequence: str | None, plane: str | None
) -> ClassificationAnswer:
    normal = best.dx.neurovlm == "normal"
    return ClassificationAnswer(
        modality=modality,
        specialized_sequence=sequence if modality == "MRI" else None,
        plane=plane,
        diagnosis_name=best.dx.neurovlm,
        diagnosis_detailed=best.dx.detailed,
        icd10_code=None if normal else best.dx.icd10,
        severity_score=0.0 if normal else 0.5,
        diagnosis_confidence=round(min(0.95, 0.3 + 0.1 * best.weight), 2),
        severity_confidence=0.3,
    )


def reply(answer: Answer | ClassificationAnswer) -> str:
    """The JSON reply, as a model would write it."""
    return json.dumps(answer.model_dump(mode="json"), ensure_ascii=False)
