"""What scoring gives: parse status, scores and error labels.

A ``Score`` carries, beside its value, a typed record of what its scorer found
(``Score.details``, one ``Details`` kind per scorer family, picked by ``kind``; read it with
``Score.details_as(Kind)`` or its fields, never by string key). Stored scores are JSON (the run
store, ``rundata.json``): the record's dump under the key ``details``, as it always was. A stored
dict written before these records were typed (no ``kind``) is read by its scorer's name and
shape; keys this version does not know are kept in ``extra`` and written back beside the known
ones, never lost.
"""

from __future__ import annotations

import logging
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core.core_schema import SerializerFunctionWrapHandler

log = logging.getLogger(__name__)

# Validation context marking data read back from storage (JSON written by any version).
STORED = "stored_score"


class ParseStatus(StrEnum):
    OK = "ok"
    FORMAT_FAILURE = "format_failure"  # no valid JSON for the schema: unscored, counted
    REFUSAL = "refusal"
    ERROR = "error"  # the call failed


class Record(BaseModel):
    """A part of a score's details. Written by our code: unknown fields are an error. Read back
    from storage (validation context ``STORED``): unknown keys go to ``extra`` and are written
    back beside the known ones, so a store written by another version loses nothing."""

    model_config = ConfigDict(extra="forbid")

    extra: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _keep_unknown(cls, data: Any, info: ValidationInfo) -> Any:
        if not (isinstance(data, dict) and info.context and info.context.get(STORED)):
            return data
        known = set(cls.model_fields) - {"extra"}
        unknown = {k: v for k, v in data.items() if k not in known and k != "extra"}
        if not unknown:
            return data
        kept = dict(data.get("extra") or {}) if isinstance(data.get("extra"), dict) else {}
        return {k: v for k, v in data.items() if k in known} | {"extra": kept | unknown}

    @model_serializer(mode="wrap")
    def _flat(self, handler: SerializerFunctionWrapHandler) -> Any:
        out = handler(self)
        if isinstance(out, dict):
            for k, v in (out.pop("extra", None) or {}).items():
                out.setdefault(k, v)
        return out


# --------------------------------------------------------------------------- lesion matching


class ReadFinding(Record):
    """What scoring understood of one finding."""

    side: str | None = None
    regions: list[str] = Field(default_factory=list)
    sequence: str | None = None
    direction: str | None = None
    enhancement: str | None = None
    size_mm: float | None = None

    @property
    def has_attributes(self) -> bool:
        return bool(self.sequence or self.direction or self.enhancement)


class PointOutcome(Record):
    """Where a finding's place on an image landed (scoring.localisation)."""

    status: Literal["lesion", "outside", "no_such_image", "off_slice", "unmapped"]
    why: str = ""
    ras_mm: tuple[float, float, float] | None = None  # the patient position pointed at
    label: int = 0  # the lesion mask's label there (0: no lesion)
    slice_index: int | None = None  # the display slice of the stack


class FindingMatch(Record):
    index: int
    status: Literal["matched", "redundant", "near", "hallucinated", "unlocalised", "negative"]
    read: ReadFinding
    lesions: list[str] = Field(default_factory=list)  # lesions it detects, or restates
    near: dict[str, list[str]] = Field(default_factory=dict)  # lesion id -> near kinds
    description_errors: list[str] = Field(default_factory=list)
    pointed: PointOutcome | None = None  # where its place landed (None: no place, or unchecked)


class LesionOutcome(Record):
    lesion_id: str
    status: Literal["detected", "near", "missed"]
    finding: int | None = None  # index of its best finding
    near_kinds: list[str] = Field(default_factory=list)
    findings: list[int] = Field(default_factory=list)  # best finding first, then restatements
    description_errors: list[str] = Field(default_factory=list)
    # detected, and its best finding points inside its label mask (None: not measurable)
    localised: bool | None = None


class LesionMatchResult(Record):
    findings: list[FindingMatch]
    lesions: list[LesionOutcome]
    normal_control: bool
    n_positive: int
    n_matched: int
    n_redundant: int = 0
    n_hallucinated: int
    n_detected: int
    n_near: int
    n_missed: int
    precision: float | None
    recall: float | None
    f1: float | None
    recall_location: float | None  # lesions found in the right place, signal/sequence aside
    hallucination_rate: float | None
    missed_rate: float | None
    normal_false_positive: bool | None
    images_shown: int | None = None  # images the request carried (None: not recorded)
    # why missed lesions do not count against this answer ("" when they do)
    missed_not_counted: str = ""
    # findings pointed at on an image, lesions localised (scoring.localisation); the rate is
    # None where it cannot be measured (no label mask, no recorded image geometry)
    n_pointed: int = 0
    n_localised: int = 0
    localisation_rate: float | None = None


# --------------------------------------------------------------------------- details kinds


class Details(Record):
    """What a scorer recorded beside its value; ``kind`` names which record it is."""

    kind: str


class NoDetails(Details):
    """The scorer recorded nothing beyond value and explanation."""

    kind: Literal["none"] = "none"


class OtherDetails(Details):
    """A stored dict of a scorer this version does not know: every key is in ``extra``."""

    kind: Literal["other"] = "other"


class DiagnosisDetails(Details):
    """``diagnosis_match``: the final diagnosis against the truth (lexicon or judge)."""

    kind: Literal["diagnosis"] = "diagnosis"
    abstained: bool
    truth: str
    confidence: float | None = None
    answer: str | None = None  # None: abstained
    level: str | None = None  # the lexicon's MatchLevel
    credit: float | None = None
    correct: bool | None = None
    answer_concept: str | None = None
    truth_concept: str | None = None
    judge: bool = False  # decided by the LLM judge, not the lexicon
    hedged: bool = False
    partial_reading: bool = False


class RankDetails(Details):
    """``differential_rank``: where the truth stands in the ranked differential."""

    kind: Literal["rank"] = "rank"
    rank: int | None
    length: int
    ranked: list[str] = Field(default_factory=list)
    levels: list[str] = Field(default_factory=list)
    judge_used: bool = False


class LesionDetails(Details):
    """``lesion_f1``: the whole finding-to-lesion matching."""

    kind: Literal["lesions"] = "lesions"
    match: LesionMatchResult


class KnowledgeDetails(Details):
    """``knowledge_consistency``: stated ICD-10 codes against the lexicon."""

    kind: Literal["knowledge"] = "knowledge"
    contradictions: list[str] = Field(default_factory=list)
    checked: int


class BertScoreDetails(Details):
    """``bertscore``: the model, layer and versions the figure depends on; P and R."""

    kind: Literal["bertscore"] = "bertscore"
    model_path: str
    model_name: str
    num_layers: int
    idf: bool = False
    rescale_with_baseline: bool = False
    versions: dict[str, str] = Field(default_factory=dict)
    precision: float | None = None  # None: not computed (an empty candidate or reference)
    recall: float | None = None
    hash: str | None = None


class BenchLabels(Details):
    """``neurovlm_bench``: one answer read the benchmark's way, each field's truth and label."""

    kind: Literal["neurovlm_bench"] = "neurovlm_bench"
    truth: dict[str, str]  # task -> label ("undetermined" where the truth is unknown)
    known: list[str]  # tasks whose truth is known (the only ones scored)
    predicted: dict[str, str]  # task -> label ("undetermined": abstained)
    confidence: float = 0.0
    call_error: bool = False  # a failed call: left out of every figure but json_valid


class FieldDetails(Details):
    """A classification field (diagnosis, subtype, modality, plane, sequence): stated vs truth."""

    kind: Literal["field"] = "field"
    stated: str | None
    truth: str
    abstained: bool
    confidence: float | None = None  # the answer's stated confidence (the diagnosis field)


class FlagsDetails(Details):
    """``safety_flags``: each flag raised on a classification answer."""

    kind: Literal["flags"] = "flags"
    flags: list[str] = Field(default_factory=list)


class Misidentified(Record):
    """A sequence the answer named wrongly (per image: which image and its header's class)."""

    image: str | None = None
    stated: str | None
    header: str | None = None


class SequenceDetails(Details):
    """``sequence_recognition`` of a free-text answer: per image, or as a set (Jaccard)."""

    kind: Literal["sequences"] = "sequences"
    mode: Literal["per_image", "set"]
    misidentified: list[Misidentified] = Field(default_factory=list)
    not_named: list[str] = Field(default_factory=list)


class CanaryResult(Record):
    """How a grader did on the canary answer: its mean and passed (None: no readable verdict)."""

    mean: float | None
    passed: bool | None
    max: float


class GraderEntry(Record):
    """One grader's verdict on one answer, and whether it counts."""

    canary: CanaryResult | None = None
    scored: bool
    counted: bool = True
    reply: str | None = None  # the raw reply, cut, when no verdict could be read
    why: str | None = None  # why it is not scored or not counted
    scores: dict[str, int] = Field(default_factory=dict)  # dimension -> 1..5
    comments: str = ""
    error_category: str | None = None
    mean: float | None = None


class RubricDetails(Details):
    """``rubric``: every grader's verdict, the jury's per-dimension medians and agreement."""

    kind: Literal["rubric"] = "rubric"
    prompt_version: str
    jury: str = "median"
    graders: dict[str, GraderEntry] = Field(default_factory=dict)
    raw: dict[str, str | None] = Field(default_factory=dict)
    canary_raw: dict[str, str | None] = Field(default_factory=dict)
    n_scored: int = 0
    canary_failed: list[str] = Field(default_factory=list)
    per_dimension: dict[str, float] | None = None  # None: no verdict counted
    jury_mean: float | None = None
    alpha: float | None = None
    error_category: str | None = None


class CalibrationDetails(Details):
    """``grader_calibration``: Pearson r of automatic vs clinician scores."""

    kind: Literal["calibration"] = "calibration"
    n: int
    source: str
    p_value: float | None = None
    bar: float | None = None  # the r to beat (None: no bar applies)
    ci95: tuple[float, float] | None = None  # Fisher z interval (None: n <= 3 or |r| = 1)
    meets_paper_bar: bool | None = None  # None: no bar, or r undefined


ScoreDetails = Annotated[
    NoDetails
    | OtherDetails
    | DiagnosisDetails
    | RankDetails
    | LesionDetails
    | KnowledgeDetails
    | BertScoreDetails
    | BenchLabels
    | FieldDetails
    | FlagsDetails
    | SequenceDetails
    | RubricDetails
    | CalibrationDetails,
    Field(discriminator="kind"),
]

_KINDS: dict[str, type[Details]] = {
    c.model_fields["kind"].default: c
    for c in (
        NoDetails,
        OtherDetails,
        DiagnosisDetails,
        RankDetails,
        LesionDetails,
        KnowledgeDetails,
        BertScoreDetails,
        BenchLabels,
        FieldDetails,
        FlagsDetails,
        SequenceDetails,
        RubricDetails,
        CalibrationDetails,
    )
}

# The scorers whose stored dicts carry no ``kind`` (written before the records were typed).
_KIND_BY_SCORER = {
    "diagnosis_match": "diagnosis",
    "differential_rank": "rank",
    "lesion_f1": "lesions",
    "knowledge_consistency": "knowledge",
    "bertscore": "bertscore",
    "neurovlm_bench": "neurovlm_bench",
    "classification_correct": "field",
    "classification_subtype": "field",
    "modality_accuracy": "field",
    "plane_accuracy": "field",
    "sequence_recognition": "field",  # a classification field; "sequences" when it has a mode
    "safety_flags": "flags",
    "rubric": "rubric",
    "grader_calibration": "calibration",
}


def _untagged_kind(scorer: str, data: dict[str, Any]) -> str:
    if not data:
        return "none"
    if scorer == "sequence_recognition" and "mode" in data:
        return "sequences"
    return _KIND_BY_SCORER.get(scorer, "other")


def read_details(scorer: str, data: dict[str, Any]) -> Details:
    """A stored details dict (any version's JSON) as its typed record; nothing in it is lost."""
    tag = data.get("kind")
    data = {k: v for k, v in data.items() if k != "kind"}
    if isinstance(tag, str) and tag in _KINDS:
        kind = tag
    elif tag is not None:  # a kind this version does not know (a newer store): kept untyped
        return OtherDetails(extra=data | {"unknown_kind": tag})
    else:
        kind = _untagged_kind(scorer, data)
    if kind == "other":
        return OtherDetails(extra=data)
    try:
        return _KINDS[kind].model_validate({**data, "kind": kind}, context={STORED: True})
    except ValidationError as e:
        # Written by a version whose fields differed in type: readable, all of it kept, untyped.
        log.warning("score %s: stored details are not a %s record (%s)", scorer, kind, e)
        return OtherDetails(extra=data)


D = TypeVar("D", bound=Details)


class Score(BaseModel):
    """A scorer's value for one answer and its typed ``details`` record. Written to storage as
    its JSON (``model_dump(mode="json")``, or ``details.model_dump_json()`` for the details
    alone); a stored dict of any version reads back as its record (``read_details``)."""

    scorer: str  # e.g. "diagnosis_match", "lesion_f1", "bertscore", "rubric"
    value: float | None  # None = unscored (never zero for "could not score")
    explanation: str = ""
    details: ScoreDetails = Field(default_factory=NoDetails)

    @field_validator("details", mode="before")
    @classmethod
    def _stored(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, dict):
            return read_details(str(info.data.get("scorer", "")), v)
        return v

    def details_as(self, kind: type[D]) -> D | None:
        """The details if they are a ``kind`` record, else None (another scorer's, or none)."""
        return self.details if isinstance(self.details, kind) else None


class ErrorCategory(StrEnum):
    PERCEPTUAL = "perceptual"
    REASONING = "reasoning"
    KNOWLEDGE_GAP = "knowledge_gap"
    GROUNDING = "grounding"
    VISUAL_HALLUCINATION = "visual_hallucination"
    FORMAT_FAILURE = "format_failure"
    REFUSAL = "refusal"


class ErrorLabel(BaseModel):
    category: ErrorCategory
    sub_labels: list[str] = Field(default_factory=list)  # missed_lesion, hallucinated_finding...
    evidence: str
    assigned_by: str  # "rule", "grader:<model>", "clinician:<name>"
    assigned_at: str | None = None  # ISO 8601
