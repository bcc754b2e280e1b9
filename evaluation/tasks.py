"""Task families: which tasks a case yields, which images each shows, and the conversation it asks.

Families (``TaskFamily``): differential diagnosis, lesion recognition, rationale generation,
NeuroVLM-Bench structured classification, and L3 multi-turn iterative diagnosis, where each turn
reveals more (text, then series) and the model's earlier answers stay in the conversation.

A :class:`TaskItem` is one (case, family[, dataset question]) unit; :func:`build_turns` gives
its system message and the user message of every turn. The runner appends the model's answers
between turns itself, so that what was really answered is what the next turn builds on.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

from pydantic import BaseModel, Field

from evaluation.case import Case, ImageRef, Question, TaskFamily
from evaluation.ehr import EHRContext
from evaluation.errors import PromptError
from evaluation.modelio import ImagePart, Message, TextPart
from evaluation.prompts import PromptSet, to_parts


class Ablation(StrEnum):
    BOTH = "both"  # images and text (record, note)
    IMAGES = "images"  # images only: no record, no note, no revealed clinical text
    TEXT = "text"  # text only: no images


DEFAULT_QUESTIONS: dict[TaskFamily, str] = {
    TaskFamily.DIFFERENTIAL: "What is the most likely diagnosis, and what else should be considered?",
    TaskFamily.LESION: "Describe every lesion you can see.",
    TaskFamily.RATIONALE: "What is the diagnosis, and what is your reasoning?",
    TaskFamily.CLASSIFICATION: "",
}
TEMPLATES: dict[TaskFamily, str] = {
    TaskFamily.DIFFERENTIAL: "differential.j2",
    TaskFamily.LESION: "lesion.j2",
    TaskFamily.RATIONALE: "rationale.j2",
    TaskFamily.CLASSIFICATION: "classification.j2",
    TaskFamily.MULTITURN: "multiturn_turn.j2",
}
# Keys an answer must carry to count as an answer to this family (else: format failure).
REQUIRED_KEYS: dict[TaskFamily, tuple[str, ...]] = {
    TaskFamily.DIFFERENTIAL: ("differential", "final_diagnosis"),
    TaskFamily.LESION: ("findings",),
    TaskFamily.RATIONALE: ("final_diagnosis", "rationale"),
    TaskFamily.MULTITURN: ("differential", "final_diagnosis"),
    TaskFamily.CLASSIFICATION: (),  # NeuroVLM: a missing field is a safety flag, not a failure
}
# Order in which series are shown when a case has more than the image budget.
SERIES_PRIORITY = ("FLAIR", "DWI", "TRACE", "ADC", "T1C", "T2", "T1", "SWI", "T2STAR", "CT", "PD")
DEFAULT_MAX_IMAGES = 8


def schema_name(family: TaskFamily) -> str:
    return "classification" if family is TaskFamily.CLASSIFICATION else "answer"


class TaskItem(BaseModel):
    """One unit of work on one case: a family and, for dataset cases, the question as worded."""

    case_id: str
    family: TaskFamily
    question: Question | None = None

    @property
    def key(self) -> str:
        if self.question is None:
            return self.family.value
        return f"{self.family.value}#q{self.question.number}"


class Turns(BaseModel):
    system: Message
    turns: list[Message]
    images_per_turn: list[list[str]] = Field(default_factory=list)  # sha256, in order shown


def plan_tasks(case: Case, families: set[TaskFamily] | None = None) -> list[TaskItem]:
    """The task items of a case, restricted to ``families`` when given."""
    wanted = families or set(TaskFamily)
    items: list[TaskItem] = []
    if case.questions:
        for q in case.questions:
            fam = q.family or TaskFamily.DIFFERENTIAL
            if fam in wanted and (fam is not TaskFamily.MULTITURN or case.turns):
                items.append(TaskItem(case_id=case.case_id, family=fam, question=q))
        if TaskFamily.MULTITURN in wanted and case.turns and TaskFamily.MULTITURN in case.tasks:
            items.append(TaskItem(case_id=case.case_id, family=TaskFamily.MULTITURN))
        return _dedupe(items)
    for fam in case.tasks or [f for f in TaskFamily if f is not TaskFamily.MULTITURN]:
        if fam not in wanted:
            continue
        if fam is TaskFamily.MULTITURN and not case.turns:
            continue
        items.append(TaskItem(case_id=case.case_id, family=fam))
    return _dedupe(items)


def _dedupe(items: list[TaskItem]) -> list[TaskItem]:
    seen: dict[str, TaskItem] = {}
    for it in items:
        seen.setdefault(it.key, it)
    return list(seen.values())


def _priority(ref: ImageRef) -> tuple[int, float]:
    cls = (ref.series_class or "").upper()
    rank = SERIES_PRIORITY.index(cls) if cls in SERIES_PRIORITY else len(SERIES_PRIORITY)
    return rank, ref.slice_positions_mm[0] if ref.slice_positions_mm else 0.0


def images_for(
    case: Case, family: TaskFamily, max_images: int = DEFAULT_MAX_IMAGES
) -> list[ImageRef]:
    """The images one task shows: one slice for classification, the montages otherwise."""
    if family is TaskFamily.CLASSIFICATION:
        singles = [i for i in case.images if i.kind == "slice"]
        return (singles or case.images)[:1]
    montages = [i for i in case.images if i.kind == "montage"] or list(case.images)
    if len(montages) <= max_images:
        return montages
    keep = set(id(i) for i in sorted(montages, key=_priority)[:max_images])
    return [i for i in montages if id(i) in keep]  # original order, best series kept


def _parts(refs: list[ImageRef], load: Callable[[ImageRef], bytes]) -> list[ImagePart]:
    return [ImagePart(png=load(r), sha256=r.sha256, label=r.label) for r in refs]


def build_turns(
    case: Case,
    item: TaskItem,
    prompts: PromptSet,
    load_png: Callable[[ImageRef], bytes],
    *,
    ablation: Ablation = Ablation.BOTH,
    max_images: int = DEFAULT_MAX_IMAGES,
) -> Turns:
    """System message and the user message of every turn of one task item."""
    system = Message(role="system", content=[TextPart(text=prompts.render("system.j2"))])
    family = item.family
    schema = prompts.schema_text(schema_name(family))
    with_text = ablation is not Ablation.IMAGES
    with_images = ablation is not Ablation.TEXT
    if family is TaskFamily.MULTITURN:
        return _multiturn(
            case, prompts, load_png, system, schema, with_text, with_images, max_images
        )
    refs = images_for(case, family, max_images) if with_images else []
    question = item.question.text if item.question else DEFAULT_QUESTIONS[family]
    text = prompts.render(
        TEMPLATES[family],
        images=[{"index": n + 1, "label": r.label} for n, r in enumerate(refs)],
        ehr=EHRContext.from_bundle(case.ehr).text() if with_text and case.ehr else "",
        note=case.note if with_text else "",
        question=question,
        schema=schema,
        empty_notice=True,
    )
    parts = to_parts(text, _parts(refs, load_png))
    return Turns(
        system=system,
        turns=[Message(role="user", content=parts)],
        images_per_turn=[[r.sha256 for r in refs]],
    )


def _multiturn(
    case: Case,
    prompts: PromptSet,
    load_png: Callable[[ImageRef], bytes],
    system: Message,
    schema: str,
    with_text: bool,
    with_images: bool,
    max_images: int,
) -> Turns:
    if not case.turns:
        raise PromptError(f"case {case.case_id}: multi-turn task without turns")
    pool = images_for(case, TaskFamily.MULTITURN, max_images=10_000)
    staged = any(t.reveal_series for t in case.turns)
    shown: set[str] = set()
    budget = max_images
    turns, per_turn = [], []
    for n, turn in enumerate(case.turns, start=1):
        if not with_images:
            refs: list[ImageRef] = []
        elif staged:
            wanted = {s.upper() for s in turn.reveal_series}
            refs = [
                r
                for r in pool
                if (r.series_class or "").upper() in wanted and r.sha256 not in shown
            ]
        else:
            refs = [r for r in pool if r.sha256 not in shown] if n == 1 else []
        refs = sorted(refs, key=_priority)[:budget] if len(refs) > budget else refs
        budget -= len(refs)
        shown.update(r.sha256 for r in refs)
        text = prompts.render(
            TEMPLATES[TaskFamily.MULTITURN],
            turn_index=n,
            n_turns=len(case.turns),
            reveal_text=turn.reveal_text if with_text else "",
            images=[{"index": k + 1, "label": r.label} for k, r in enumerate(refs)],
            ehr="",
            note="",
            question=turn.question,
            schema=schema,
            empty_notice=False,
        )
        turns.append(Message(role="user", content=to_parts(text, _parts(refs, load_png))))
        per_turn.append([r.sha256 for r in refs])
    return Turns(system=system, turns=turns, images_per_turn=per_turn)
