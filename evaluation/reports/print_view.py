"""The printed checklist of a case: what a clinician reads on paper (and what goes to PACS as
the Encapsulated PDF beside the SRs), in 2 to 4 pages.

One source of the content (the ``CaseChecklist``), two presentations: the HTML page keeps every
detail (each answer, its scores, what the model saw, the raw output; collapsed in ``<details>``),
the print keeps, per model, its review block (what goes into its SR, each item with boxes to
tick), a line per answer (status, diagnosis, confidence, error category, the key scores), its
flags, and the key images with their side marks. Nothing is cut silently: a text cut for paper
says so, with the length and the SHA-256 of the whole text (which the HTML shows in full);
items and images left out of the print are counted and named.
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, Field

from dicom import side_marks
from evaluation.reports.checklist_view import (
    FLAG_TITLES,
    SERIOUS_FLAGS,
    AnswerChecklist,
    CaseChecklist,
    ImageItem,
)
from evaluation.review.sr_content import BlockItem, ReportBlock
from evaluation.scoring.anatomy import sequence_class

# Bounds of the paper copy (the HTML holds everything): with three models, long answers, many
# findings and every flag, the print stays within four A4 pages (tests/test_checklist_print.py).
ITEM_CHARS = 100  # the text of a block item
EVIDENCE_CHARS = 140  # an error item's evidence
FLAG_CHARS = 220  # a model's flag detail (all its answers)
DIAGNOSIS_CHARS = 90  # an answer's final diagnosis in its one-line summary
LABEL_CHARS = 110  # an image's label
MAX_ITEMS = 25  # block items per model on paper; the rest are counted and named
MAX_KEY_IMAGES = 4
MAX_OTHERS_NAMED = 12  # images not printed, named by number and label; the rest counted
KEY_SCORES = ("diagnosis_match", "lesion_f1", "classification_correct", "rubric")


class Clipped(BaseModel):
    """A text as printed: whole, or cut with the length and digest of the whole."""

    text: str
    cut: bool = False
    chars: int = 0  # of the whole text
    sha256: str = ""  # of the whole text (UTF-8), when cut

    @property
    def digest(self) -> str:
        return self.sha256[:12]


def clip(text: str, limit: int) -> Clipped:
    """``text`` cut at ``limit`` characters (at a space when one is near), saying so."""
    if len(text) <= limit:
        return Clipped(text=text, chars=len(text))
    head = text[:limit]
    space = head.rfind(" ")
    if space > limit * 3 // 4:
        head = head[:space]
    return Clipped(
        text=head.rstrip() + "…",
        cut=True,
        chars=len(text),
        sha256=hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(),
    )


class PrintItem(BaseModel):
    """One item of a model's review block as printed (the SR says the whole text)."""

    item_id: str
    label: str
    text: Clipped
    evidence: Clipped | None = None  # an error item's evidence
    where: str = ""


class PrintAnswer(BaseModel):
    """One answer in one line."""

    family: str
    sample: int  # 1-based
    ablation: str = "both"
    status: str
    final_diagnosis: Clipped | None = None
    mark: str | None = None
    confidence: float | None = None
    error: str | None = None
    scores: list[tuple[str, float]] = Field(default_factory=list)
    n_scores: int = 0


class PrintFlag(BaseModel):
    kind: str
    title: str
    detail: Clipped
    serious: bool = False


class ModelPrint(BaseModel):
    """One model: its answers, its flags, its review block."""

    model: str
    answers: list[PrintAnswer] = Field(default_factory=list)
    flags: list[PrintFlag] = Field(default_factory=list)
    items: list[PrintItem] = Field(default_factory=list)
    left_out: list[str] = Field(default_factory=list)  # labels of block items not printed
    has_block: bool = False


class KeyImage(BaseModel):
    """An image printed large enough to read, with its side marks (None: unknown plane)."""

    index: int
    label: Clipped
    series_class: str | None = None
    plane: str | None = None
    left: str | None = None
    right: str | None = None
    why: str = ""  # the findings that point at it


class ChecklistPrint(BaseModel):
    models: list[ModelPrint] = Field(default_factory=list)
    key_images: list[KeyImage] = Field(default_factory=list)
    other_images: list[str] = Field(default_factory=list)  # "5. ADC" of images not printed
    n_cut: int = 0  # texts cut for paper


def print_view(c: CaseChecklist) -> ChecklistPrint:
    """The paper copy of checklist ``c`` (see the module's docstring)."""
    blocks = {b.model: b for b in c.blocks}
    models = list(dict.fromkeys([*(b.model for b in c.blocks), *(a.model for a in c.answers)]))
    out = ChecklistPrint(
        models=[_model(m, [a for a in c.answers if a.model == m], blocks.get(m)) for m in models]
    )
    out.key_images, out.other_images = _key_images(c)
    out.n_cut = sum(
        1
        for mp in out.models
        for t in [
            *(it.text for it in mp.items),
            *(it.evidence for it in mp.items if it.evidence),
            *(f.detail for f in mp.flags),
            *(a.final_diagnosis for a in mp.answers if a.final_diagnosis),
        ]
        if t.cut
    )
    return out


def _model(model: str, answers: list[AnswerChecklist], block: ReportBlock | None) -> ModelPrint:
    mp = ModelPrint(model=model, answers=[_answer(a) for a in answers], has_block=block is not None)
    by_kind: dict[str, list[str]] = {}
    for a in answers:
        for f in a.flags:
            by_kind.setdefault(f.kind.value, []).append(f"{a.family}: {f.detail}")
    mp.flags = [
        PrintFlag(
            kind=kind,
            title=FLAG_TITLES[next(k for k in FLAG_TITLES if k.value == kind)],
            detail=clip("; ".join(details), FLAG_CHARS),
            serious=kind in SERIOUS_FLAGS,
        )
        for kind, details in by_kind.items()
    ]
    if block is not None:
        items = block.items
        mp.items = [_item(it) for it in items[:MAX_ITEMS]]
        mp.left_out = [it.label for it in items[MAX_ITEMS:]]
    return mp


def _item(it: BlockItem) -> PrintItem:
    where = ""
    if it.finding is not None:
        f = it.finding
        where = " · ".join(x or "–" for x in (f.hemisphere, f.region, f.sequence, f.signal))
    elif it.diagnosis is not None and it.diagnosis.icd10:
        where = f"ICD-10 {it.diagnosis.icd10}"
    evidence = clip(it.error.evidence, EVIDENCE_CHARS) if it.error and it.error.evidence else None
    return PrintItem(
        item_id=it.item_id,
        label=it.label,
        text=clip(it.text, ITEM_CHARS),
        evidence=evidence,
        where=clip(where, ITEM_CHARS).text,
    )


def _answer(a: AnswerChecklist) -> PrintAnswer:
    scores = {s.scorer: s.value for s in a.scores if s.value is not None}
    fd = a.final_diagnosis
    return PrintAnswer(
        family=a.family,
        sample=a.sample_index + 1,
        ablation=a.ablation,
        status=a.status.value,
        final_diagnosis=clip(fd.text or "(none given)", DIAGNOSIS_CHARS) if fd else None,
        mark=fd.mark.value if fd else None,
        confidence=a.confidence.value if a.confidence else None,
        error=a.error.category.value if a.error else None,
        scores=[(k, scores[k]) for k in KEY_SCORES if k in scores],
        n_scores=len(a.scores),
    )


def _key_images(c: CaseChecklist) -> tuple[list[KeyImage], list[str]]:
    """One image for each series class the blocks' findings point at (by their sequence; a
    montage before a single slice), then one for each other class sent, up to
    ``MAX_KEY_IMAGES``; the images not printed are named."""
    pointing: dict[str, dict[str, list[str]]] = {}  # class -> model -> finding numbers
    for b in c.blocks:
        for it in b.items:
            cls = sequence_class(it.finding.sequence) if it.finding else None
            if cls is not None:
                number = it.item_id.split(".", 1)[-1]
                pointing.setdefault(cls, {}).setdefault(b.model, []).append(number)
    shown = [i for i in c.images if i.sent is not False]
    classes = list(pointing) + [
        i.series_class or "" for i in shown if (i.series_class or "") not in pointing
    ]
    chosen: list[ImageItem] = []
    for cls in dict.fromkeys(classes):
        cands = sorted(
            (i for i in shown if (i.series_class or "") == cls),
            key=lambda i: (i.kind != "montage", i.index),
        )
        if cands and len(chosen) < MAX_KEY_IMAGES:
            chosen.append(cands[0])
    chosen.sort(key=lambda i: i.index)
    keys = []
    for img in chosen:
        marks = side_marks(img.plane)
        why = "; ".join(
            f"{model} finding{'s' if len(ns) > 1 else ''} {', '.join(ns)}"
            for model, ns in pointing.get(img.series_class or "", {}).items()
        )
        keys.append(
            KeyImage(
                index=img.index,
                label=clip(img.label, LABEL_CHARS),
                series_class=img.series_class,
                plane=img.plane,
                left=marks[0] if marks else None,
                right=marks[1] if marks else None,
                why=clip(why, 2 * LABEL_CHARS).text,
            )
        )
    taken = {i.index for i in chosen}
    others = [f"{i.index}. {clip(i.label, 40).text}" for i in c.images if i.index not in taken]
    if len(others) > MAX_OTHERS_NAMED:
        more = len(others) - MAX_OTHERS_NAMED
        others = [*others[:MAX_OTHERS_NAMED], f"and {more} more"]
    return keys, others
