"""The per-case checklist: what the model saw, what it said, where it was wrong and why.

One ``CaseChecklist`` per case; one ``AnswerChecklist`` per reviewed answer (a model's first
sample of a task family; the other samples are summarised). Every reviewable line has an
``item_id`` unique within its answer; the review store addresses items as
``(answer.key, item_id)``. The JSON Schema is exported to ``checklist.schema.json``.
"""

from __future__ import annotations

import copy
import functools
import json
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from dicom import SeriesNotShown
from evaluation.case import StudyIdentity
from evaluation.log.rundata import SentMessage
from evaluation.review.sr_content import ReportBlock
from evaluation.scores import ErrorCategory, ParseStatus

# 2: review blocks (what goes into each model's SR); 3: hospital identity, image series;
# 4: the series not shown, and what was sent (the recorded requests) instead of the case's record
CHECKLIST_VERSION = 4
SCHEMA_FILE = Path(__file__).with_name("checklist.schema.json")


class Mark(StrEnum):
    """How an answer line compares with the truth."""

    MATCHED = "matched"  # a finding that matches a true lesion; a detected lesion
    NEAR = "near"  # the right lesion, wrongly tied (side, region, sequence, signal)
    MISSED = "missed"  # a true lesion no finding names
    HALLUCINATED = "hallucinated"  # a finding that matches no lesion
    UNLOCALISED = "unlocalised"  # a finding with neither place nor attributes
    NEGATIVE = "negative"  # a finding that denies disease ("no acute lesion")
    CORRECT = "correct"
    WRONG = "wrong"
    NOT_CHECKED = "not_checked"  # no truth to compare with, or not counted (see the note)


class FlagKind(StrEnum):
    SUSPECTED_HALLUCINATION = "suspected_hallucination"
    MISSED_LESION = "missed_lesion"
    SEQUENCE_MISIDENTIFIED = "sequence_misidentified"
    LOW_CONFIDENCE = "low_confidence"
    FINDINGS_ON_NORMAL_CONTROL = "findings_on_normal_control"
    FABRICATED_WITHOUT_IMAGES = "fabricated_without_images"
    FORMAT_FAILURE = "format_failure"
    REFUSAL = "refusal"
    CALL_ERROR = "call_error"
    # the grounding audit's (issue 39): a case's flags, read from its answers beside the same
    # model's answers on the case's variants (scoring.taxonomy.AUDIT_SUB_LABELS)
    SAME_ANSWER_WITHOUT_IMAGES = "same_answer_without_images"
    FOLLOWED_PLANTED_INSTRUCTION = "followed_planted_instruction"
    SIDE_NOT_MIRRORED = "side_not_mirrored"


FLAG_TITLES: dict[FlagKind, str] = {
    FlagKind.SUSPECTED_HALLUCINATION: "Suspected hallucination",
    FlagKind.MISSED_LESION: "Missed lesion",
    FlagKind.SEQUENCE_MISIDENTIFIED: "Sequence misidentified",
    FlagKind.LOW_CONFIDENCE: "Low confidence",
    FlagKind.FINDINGS_ON_NORMAL_CONTROL: "Findings on a normal control",
    FlagKind.FABRICATED_WITHOUT_IMAGES: "Findings stated without images",
    FlagKind.FORMAT_FAILURE: "Format failure",
    FlagKind.REFUSAL: "Refusal",
    FlagKind.CALL_ERROR: "Call error",
    FlagKind.SAME_ANSWER_WITHOUT_IMAGES: "Answered the same without the images",
    FlagKind.FOLLOWED_PLANTED_INSTRUCTION: "Followed an instruction found in the study",
    FlagKind.SIDE_NOT_MIRRORED: "Kept its side when the images were mirrored",
}

# the flags a page shows in red: the answer states what is not there, or misses what is
SERIOUS_FLAGS: frozenset[str] = frozenset(
    k.value
    for k in (
        FlagKind.SUSPECTED_HALLUCINATION,
        FlagKind.FINDINGS_ON_NORMAL_CONTROL,
        FlagKind.FABRICATED_WITHOUT_IMAGES,
        FlagKind.MISSED_LESION,
        FlagKind.FORMAT_FAILURE,
        FlagKind.FOLLOWED_PLANTED_INSTRUCTION,
    )
)


class Flag(BaseModel):
    kind: FlagKind
    detail: str


class ImageItem(BaseModel):
    """One image of the case, as recorded when it was rendered and as found now."""

    index: int  # 1-based, as prompts number images
    path: str
    label: str
    sha256: str  # recorded when rendered
    file_sha256: str | None = None  # of the file found now; None when the file is missing
    verified: bool | None = None  # file_sha256 == sha256
    series_class: str | None = None
    modality: str | None = None
    plane: str | None = None
    kind: str = "slice"
    window: str | None = None
    sent: bool | None = None  # in the prompt of the reviewed answers (None: not recorded)
    series_uid: str | None = None  # the DICOM series it was rendered from (the viewer opens it)
    slice_positions_mm: list[float] = Field(default_factory=list)  # along the slice normal


class SequenceItem(BaseModel):
    item_id: str
    stated: str
    image_ref: str | None = None  # what the answer called the image
    image_label: str | None = None  # the image it resolves to
    header_class: str | None = None  # the class the imaging core gave that image
    mark: Mark = Mark.NOT_CHECKED


class FindingItem(BaseModel):
    item_id: str
    index: int  # 1-based
    description: str = ""
    sequence: str | None = None
    hemisphere: str | None = None
    region: str | None = None
    signal: str | None = None
    size_mm: float | None = None
    enhancement: str | None = None
    mark: Mark = Mark.NOT_CHECKED
    lesion_ids: list[str] = Field(default_factory=list)  # true lesions it matches
    note: str = ""  # near kinds, description errors


class LesionItem(BaseModel):
    """A true lesion, and whether the answer found it."""

    item_id: str
    id: str
    type: str
    hemisphere: str
    region: str
    lobe: str | None = None
    size_mm: float | None = None
    visible_on: list[str] = Field(default_factory=list)
    mark: Mark = Mark.NOT_CHECKED
    findings: list[int] = Field(default_factory=list)  # 1-based finding numbers
    note: str = ""


class DifferentialRow(BaseModel):
    item_id: str
    rank: int
    diagnosis: str
    icd10: str | None = None
    likelihood: float | None = None
    evidence_for: list[str] = Field(default_factory=list)
    evidence_against: list[str] = Field(default_factory=list)
    mark: Mark = Mark.NOT_CHECKED  # correct: matches the true diagnosis
    level: str | None = None  # lexicon match level


class TextItem(BaseModel):
    """A single reviewable statement: final diagnosis, confidence, rationale."""

    item_id: str
    label: str
    text: str = ""
    value: float | None = None
    mark: Mark = Mark.NOT_CHECKED
    note: str = ""


class ScoreRow(BaseModel):
    scorer: str
    value: float | None
    explanation: str = ""


class GraderRow(BaseModel):
    """One rubric grader's verdict on an answer, as the jury saw it."""

    grader: str
    mean: float | None = None  # over the five dimensions; None: no readable verdict
    scores: dict[str, int] = Field(default_factory=dict)
    counted: bool = False  # in the jury's median
    canary: bool | None = None  # passed the canary; None: not asked or unreadable
    note: str = ""  # why it does not count


class ErrorItem(BaseModel):
    item_id: Literal["error"] = "error"
    category: ErrorCategory
    sub_labels: list[str] = Field(default_factory=list)
    evidence: str = ""
    assigned_by: str = ""


class SamplesOutcome(BaseModel):
    """The other samples of the same model and task (pass@k draws), summarised."""

    n: int
    n_correct: int
    n_unscored: int
    final_diagnoses: list[str] = Field(default_factory=list)


class UsageRow(BaseModel):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None
    latency_s: float | None = None


class AnswerChecklist(BaseModel):
    key: str  # "model::family::sample[::ablation]", unique within the case
    model: str
    family: str
    sample_index: int = 0
    ablation: str = "both"
    status: ParseStatus
    raw_text: str = ""  # bounded copy of what the model returned
    raw_truncated: bool = False
    sequences: list[SequenceItem] = Field(default_factory=list)
    findings: list[FindingItem] = Field(default_factory=list)
    lesions: list[LesionItem] = Field(default_factory=list)
    differential: list[DifferentialRow] = Field(default_factory=list)
    final_diagnosis: TextItem | None = None
    confidence: TextItem | None = None
    rationale: TextItem | None = None
    next_steps: list[str] = Field(default_factory=list)
    fields: dict[str, str | float | None] = Field(default_factory=dict)  # NeuroVLM answers
    scores: list[ScoreRow] = Field(default_factory=list)
    graders: list[GraderRow] = Field(default_factory=list)  # each rubric grader's verdict
    flags: list[Flag] = Field(default_factory=list)
    error: ErrorItem | None = None
    scoring_version: str | None = None  # the version its scores were made with
    samples: SamplesOutcome | None = None
    usage: UsageRow = Field(default_factory=UsageRow)


class TruthSummary(BaseModel):
    diagnosis: str
    icd10: str | None = None
    group: str | None = None
    difficulty: str | None = None
    synonyms: list[str] = Field(default_factory=list)
    differential: list[str] = Field(default_factory=list)
    key_findings: list[str] = Field(default_factory=list)
    rationale: str = ""
    normal_control: bool = False


class SentItem(BaseModel):
    """One distinct request of the reviewed answers, exactly as the run store recorded it
    (after the PHI gate): the text of every message, every image by label and hash."""

    answers: list[str] = Field(default_factory=list)  # "model (family)" of each answer sent it
    messages: list[SentMessage] = Field(default_factory=list)


class CaseChecklist(BaseModel):
    """Everything a clinician needs to review one case of one run."""

    kind: Literal["neurosandbox.checklist"] = "neurosandbox.checklist"
    version: int = CHECKLIST_VERSION
    run_id: str
    case_id: str
    patient_id: str | None = None
    # The hospital's identifiers of the study: shown to reviewers apart from the de-identified
    # record, never sent to a model.
    hospital: StudyIdentity | None = None
    generated_at: str
    source: str = ""  # provenance: phantom, orthanc, neural-medbench...
    dataset: str | None = None
    study_uids: list[str] = Field(default_factory=list)
    modality: str | None = None
    images: list[ImageItem] = Field(default_factory=list)
    # the study's series the model was not shown, and why (None: not recorded)
    series_not_shown: SeriesNotShown | None = None
    # What the model saw: the recorded requests of the reviewed answers, never the case's own
    # record or note (a note the prompt dropped was never seen). Empty with
    # ``model_saw_recorded`` false: the run recorded no request for them.
    model_saw: list[SentItem] = Field(default_factory=list)
    model_saw_recorded: bool = False
    truth: TruthSummary | None = None
    answers: list[AnswerChecklist] = Field(default_factory=list)
    # one per model: exactly what goes into its SR, each item reviewed once (review.sr_content)
    blocks: list[ReportBlock] = Field(default_factory=list)
    flags: list[Flag] = Field(default_factory=list)  # union over answers, one per kind
    verification: Literal["UNVERIFIED"] = "UNVERIFIED"  # until a clinician signs off

    def answer(self, key: str) -> AnswerChecklist:
        for a in self.answers:
            if a.key == key:
                return a
        raise KeyError(key)


def checklist_schema() -> dict[str, Any]:
    """JSON Schema of ``CaseChecklist`` (draft 2020-12, as pydantic writes it)."""
    return copy.deepcopy(_checklist_schema())


@functools.cache
def _checklist_schema() -> dict[str, Any]:  # ~45 ms to build: once per process
    schema = CaseChecklist.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://neurosandbox.invalid/schemas/checklist.schema.json"
    return schema


def write_schema(path: Path = SCHEMA_FILE) -> Path:
    path.write_text(json.dumps(checklist_schema(), indent=2, sort_keys=True) + "\n")
    return path
