"""The review block: exactly what goes into one model's DICOM SR for one case.

A model answers a case in several tasks (lesion, differential, multi-turn...); each answer may
carry the same finding or diagnosis. :func:`report_blocks` merges a model's answers into one
block of items (findings, differential, final diagnosis, error category), each reviewed once:

- findings are the same when location (side and region), sequence and signal agree;
- diagnoses (differential entries, final diagnoses) are the same when they name the same
  lexicon concept (else the same normalised words);
- error categories are the same when the category is.

Each item remembers the answers and answer items it came from (its sources): a verdict on the
item is recorded for every source, so per-answer statistics keep working. The UNVERIFIED SR
written after a run and the VERIFIED SR re-issued after sign-off are both built from this one
merge (``BlockItem.content`` -> :class:`ReportContent`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from enum import StrEnum

from pydantic import BaseModel, Field

from evaluation.answers import Answer, DifferentialItem, Finding
from evaluation.case import ImageRef, TaskFamily
from evaluation.log.rundata import FULL_INPUT, SampleResult
from evaluation.review.coding import corrected_finding
from evaluation.scores import ErrorLabel
from evaluation.scoring import anatomy as A
from evaluation.scoring.lexicon import default_lexicon
from evaluation.scoring.localisation import FindingRegion, finding_region
from evaluation.scoring.text import normalise

# Which task's answer speaks first for an item both carry (the task that asks for it).
_FINDING_ORDER = (TaskFamily.LESION, TaskFamily.DIFFERENTIAL, TaskFamily.MULTITURN)
_DIAGNOSIS_ORDER = (TaskFamily.DIFFERENTIAL, TaskFamily.MULTITURN, TaskFamily.LESION)
NO_FINDINGS = "finding.none"


class ItemKind(StrEnum):
    FINDING = "finding"
    NO_FINDING = "no_finding"  # the model reported no lesion (an SR "Absent" statement)
    DIFFERENTIAL = "differential"
    FINAL = "final"
    ERROR = "error"


class ItemSource(BaseModel):
    """One answer item a block item merges: the answer (checklist key, task) and its item id."""

    answer_key: str
    task: str
    item_id: str


class BlockItem(BaseModel):
    item_id: str  # unique in the block: finding.1, finding.none, dx.1, final, final.2, error.1
    kind: ItemKind
    text: str  # what the SR says: description, diagnosis, category
    finding: Finding | None = None
    diagnosis: DifferentialItem | None = None
    error: ErrorLabel | None = None
    sources: list[ItemSource] = Field(default_factory=list)
    # where the finding's first answer pointed in the study (report_blocks with the images);
    # left out of dumps, so a block's digest and its checklist stay as they were
    region: FindingRegion | None = Field(default=None, exclude=True)

    @property
    def label(self) -> str:
        """How a page and an error message name the item."""
        names = {
            ItemKind.FINDING: "finding",
            ItemKind.NO_FINDING: "no lesion reported",
            ItemKind.DIFFERENTIAL: "differential",
            ItemKind.FINAL: "final diagnosis",
            ItemKind.ERROR: "error category",
        }
        n = self.item_id.split(".", 1)[1] if "." in self.item_id else ""
        return f"{names[self.kind]} {n}".strip() if n.isdigit() else names[self.kind]

    @property
    def origin(self) -> str:
        """Which answers carried the item, e.g. "lesion finding 2; differential finding 1"."""
        return "; ".join(f"{s.task} {s.item_id.replace('.', ' ')}" for s in self.sources)


class ReportBlock(BaseModel):
    """One model's report for one case: the items of its SR, in SR order."""

    model: str
    answer_keys: list[str] = Field(default_factory=list)  # the answers merged
    items: list[BlockItem] = Field(default_factory=list)

    def item(self, item_id: str) -> BlockItem:
        for it in self.items:
            if it.item_id == item_id:
                return it
        raise KeyError(f"{self.model} has no item {item_id!r}")

    def of(self, *kinds: ItemKind) -> list[BlockItem]:
        return [it for it in self.items if it.kind in kinds]


class ReportContent(BaseModel):
    """What an SR states, in order: the input of the SR writer (UNVERIFIED or VERIFIED)."""

    findings: list[Finding] = Field(default_factory=list)
    no_findings: bool = False  # the report states that no lesion was found
    differential: list[DifferentialItem] = Field(default_factory=list)
    final_diagnoses: list[DifferentialItem] = Field(default_factory=list)
    error_categories: list[str] = Field(default_factory=list)
    comments: list[str] = Field(default_factory=list)  # reviewers' comments and diagnoses
    # the block item of each finding, differential entry and final diagnosis, in that order
    # ("finding.2", "dx.1", "final"): the UNVERIFIED and VERIFIED SR number them alike. Left
    # out of dumps (the sign-off digest): the verified items carry their ids already.
    item_ids: list[str] = Field(default_factory=list, exclude=True)
    # where each finding was pointed at in the study (scoring.finding_region), aligned with
    # ``findings``; empty when not known. The SR writes a SCOORD/SCOORD3D for each one given.
    regions: list[FindingRegion | None] = Field(default_factory=list, exclude=True)


def review_order(s: SampleResult) -> tuple[int, int]:
    """Which of a task's samples a clinician reviews first: the first sample, its last turn."""
    return (s.scored.sample_index, -(s.turn or 0))


def answer_key(s: SampleResult) -> str:
    sc = s.scored
    key = f"{sc.model}::{sc.family.value}::{sc.sample_index}"
    return key if s.ablation == FULL_INPUT else f"{key}::{s.ablation}"


def finding_identity(f: Finding) -> tuple[str, ...] | None:
    """Same location (side, region), sequence and signal: the same finding. None when the
    finding does not state all four (it is never merged with another)."""
    side = A.side_in(f.hemisphere) or normalise(f.hemisphere or "")
    regions = A.regions_in(f.region) if f.region else set()
    region = ",".join(sorted(regions)) if regions else normalise(f.region or "")
    seq = A.sequence_class(f.sequence) or normalise(f.sequence or "")
    direction = A.signal_direction(f.signal, f.sequence) if f.signal else None
    signal = direction or normalise(f.signal or "")
    ident = (side, region, seq, signal)
    return ident if all(ident) else None


def _same_size(a: Finding, b: Finding) -> bool:
    return a.size_mm is None or b.size_mm is None or A.sizes_compatible(a.size_mm, b.size_mm)


def diagnosis_identity(text: str) -> str:
    """Same lexicon concept (else the same normalised words): the same diagnosis."""
    hit = default_lexicon().lookup(text)
    if hit.concept_id is not None and hit.whole:
        return f"concept:{hit.concept_id}"
    return f"text:{normalise(text)}"


def _finding_text(f: Finding) -> str:
    return f.description.strip() or " ".join(
        x for x in (f.hemisphere, f.region, f.sequence, f.signal) if x
    )


def _ordered(
    answers: Sequence[tuple[str, TaskFamily, Answer]], order: Sequence[TaskFamily]
) -> list[tuple[str, TaskFamily, Answer]]:
    rank = {t: i for i, t in enumerate(order)}
    return sorted(answers, key=lambda a: rank.get(a[1], len(rank)))


def _merge(
    table: dict[str, BlockItem], ident: str, src: ItemSource, prefix: str, **fields: object
) -> None:
    """Merge ``src`` into the item of ``ident``, or add that item (numbered ``prefix.n``; the
    first final diagnosis is plain "final")."""
    if ident not in table:
        n = len(table) + 1
        item_id = "final" if prefix == "final" and n == 1 else f"{prefix}.{n}"
        table[ident] = BlockItem(item_id=item_id, **fields)
    table[ident].sources.append(src)


def _findings(answers: Sequence[tuple[str, TaskFamily, Answer]]) -> list[BlockItem]:
    """Findings merged across answers: never two of one answer, never without a full place."""
    items: list[BlockItem] = []
    idents: list[tuple[str, ...] | None] = []  # finding_identity of each item, computed once
    for key, task, ans in _ordered(answers, _FINDING_ORDER):
        merged: set[int] = set()  # items this answer already merged into: never two of its own
        for n, f in enumerate(ans.findings, start=1):
            src = ItemSource(answer_key=key, task=task.value, item_id=f"finding.{n}")
            fid = finding_identity(f)
            hit = next(
                (
                    i
                    for i, it in enumerate(items)
                    if fid is not None
                    and i not in merged
                    and idents[i] == fid
                    and _same_size(it.finding, f)  # type: ignore[arg-type]
                    and all(s.answer_key != key for s in it.sources)
                ),
                None,
            )
            if hit is not None:
                items[hit].sources.append(src)
                merged.add(hit)
                continue
            items.append(
                BlockItem(
                    item_id=f"finding.{len(items) + 1}",
                    kind=ItemKind.FINDING,
                    text=_finding_text(f),
                    finding=f,
                    sources=[src],
                )
            )
            idents.append(fid)
    return items


def report_block(
    model: str,
    answers: Sequence[tuple[str, TaskFamily, Answer]],
    errors: Sequence[tuple[str, TaskFamily, ErrorLabel]] = (),
) -> ReportBlock:
    """Merge one model's answers ((answer key, task, answer), in run order) and their error
    labels into its review block: the one rule by which every SR of the model is built."""
    block = ReportBlock(model=model, answer_keys=[k for k, _, _ in answers])
    findings = _findings(answers)
    block.items += findings
    if answers and not findings:
        block.items.append(
            BlockItem(
                item_id=NO_FINDINGS,
                kind=ItemKind.NO_FINDING,
                text="No lesion reported",
                sources=[
                    ItemSource(answer_key=k, task=t.value, item_id=NO_FINDINGS)
                    for k, t, _ in answers
                ],
            )
        )
    dx: dict[str, BlockItem] = {}
    finals: dict[str, BlockItem] = {}
    for key, task, ans in _ordered(answers, _DIAGNOSIS_ORDER):
        # each differential entry's concept, looked up once (the final diagnosis's code too)
        idents = [diagnosis_identity(d.diagnosis) if d.diagnosis.strip() else "" for d in ans.differential]  # fmt: skip
        for n, (d, ident) in enumerate(zip(ans.differential, idents, strict=True), start=1):
            if ident:
                src = ItemSource(answer_key=key, task=task.value, item_id=f"dx.{n}")
                _merge(dx, ident, src, "dx",
                       kind=ItemKind.DIFFERENTIAL, text=d.diagnosis.strip(), diagnosis=d)  # fmt: skip
        final = (ans.final_diagnosis or "").strip()
        if final:
            ident = diagnosis_identity(final)
            icd = next(
                (d.icd10 for d, i in zip(ans.differential, idents, strict=True) if d.icd10 and i == ident),
                None,
            )  # fmt: skip
            src = ItemSource(answer_key=key, task=task.value, item_id="final")
            _merge(finals, ident, src, "final", kind=ItemKind.FINAL, text=final,
                   diagnosis=DifferentialItem(diagnosis=final, icd10=icd))  # fmt: skip
    by_category: dict[str, BlockItem] = {}
    for key, task, label in errors:
        src = ItemSource(answer_key=key, task=task.value, item_id="error")
        _merge(by_category, label.category.value, src, "error",
               kind=ItemKind.ERROR, text=label.category.value, error=label)  # fmt: skip
    block.items += [*dx.values(), *finals.values(), *by_category.values()]
    return block


def report_blocks(
    samples: Sequence[SampleResult], images: Mapping[str, ImageRef] | None = None
) -> list[ReportBlock]:
    """Every model's review block for one case (its diagnostic answers with full input; the
    first sample of each task, the last turn of a multi-turn answer), by model name.

    With ``images`` (the case's images by sha256), a finding the model pointed at carries its
    study region (``BlockItem.region``), read on the images its answer was sent, in order."""
    firsts: dict[tuple[str, TaskFamily], SampleResult] = {}
    for s in sorted(samples, key=review_order):
        if s.ablation != FULL_INPUT or not isinstance(s.answer, Answer):
            continue
        firsts.setdefault((s.scored.model, s.scored.family), s)
    by_model: dict[str, list[SampleResult]] = {}
    for (model, _), s in firsts.items():
        by_model.setdefault(model, []).append(s)
    out = []
    for model in sorted(by_model):
        chosen = by_model[model]
        answers = [(answer_key(s), s.scored.family, s.answer) for s in chosen]
        errors = [
            (answer_key(s), s.scored.family, s.scored.effective_error)
            for s in chosen
            if s.scored.effective_error is not None
        ]
        block = report_block(model, answers, errors)  # type: ignore[arg-type]
        if images:
            _regions(block, {answer_key(s): s for s in chosen}, images)
        out.append(block)
    return out


def _regions(
    block: ReportBlock, by_key: Mapping[str, SampleResult], images: Mapping[str, ImageRef]
) -> None:
    """Each pointed finding's region, on the images its (first) answer was sent."""
    for it in block.of(ItemKind.FINDING):
        if it.finding is None or it.finding.place is None or not it.sources:
            continue
        s = by_key.get(it.sources[0].answer_key)
        if s is None or not s.images_sent or s.scored.family is TaskFamily.MULTITURN:
            continue  # a multi-turn answer's images are numbered per turn
        shown = [images[h] for h in s.images_sent if h in images]
        it.region = finding_region(it.finding.place, shown)


def unverified_content(block: ReportBlock) -> ReportContent:
    """The block as the model gave it: every item (the UNVERIFIED SR)."""
    content = ReportContent()
    for it in block.items:
        put_item(content, it, None)
    return content


def put_item(content: ReportContent, it: BlockItem, corrected: str | None) -> None:
    """Add one kept item to an SR's content (``corrected``: the reviewer's text)."""
    if it.kind is ItemKind.FINDING and it.finding is not None:
        # a corrected finding is the clinician's text, at the site it names, else the model's
        f = it.finding if corrected is None else corrected_finding(it.finding, corrected)
        # the model's point stands for the model's finding, not for the clinician's text
        content.regions += [None] * (len(content.findings) - len(content.regions))
        content.findings.append(f)
        content.regions.append(it.region if corrected is None else None)
        content.item_ids.append(it.item_id)  # block items come in SR order
    elif it.kind is ItemKind.NO_FINDING and corrected is None:  # never corrected (a rule)
        content.no_findings = True
    elif it.kind in (ItemKind.DIFFERENTIAL, ItemKind.FINAL) and it.diagnosis is not None:
        d = it.diagnosis
        if corrected is not None:  # a corrected diagnosis keeps no code the model gave
            d = DifferentialItem(diagnosis=corrected)
        target = (
            content.differential if it.kind is ItemKind.DIFFERENTIAL else content.final_diagnoses
        )
        target.append(d)
        content.item_ids.append(it.item_id)
    elif it.kind is ItemKind.ERROR:
        content.error_categories.append(corrected or it.text)


def reviewed_samples(samples: list[SampleResult]) -> list[tuple[SampleResult, list[SampleResult]]]:
    """Per (model, family, ablation): the answer a clinician reviews (the first sample, last
    turn) and all samples of that group, in a stable order."""
    groups: dict[tuple[str, str, str], list[SampleResult]] = defaultdict(list)
    for s in samples:
        groups[(s.scored.model, s.scored.family.value, s.ablation)].append(s)
    out = []
    for key in sorted(groups, key=lambda k: (k[0], k[1], k[2] != FULL_INPUT, k[2])):
        group = sorted(groups[key], key=review_order)
        out.append((group[0], group))
    return out
