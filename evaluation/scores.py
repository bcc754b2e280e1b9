"""What scoring gives: parse status, scores and error labels."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field


class ParseStatus(StrEnum):
    OK = "ok"
    FORMAT_FAILURE = "format_failure"  # no valid JSON for the schema: unscored, counted
    REFUSAL = "refusal"
    ERROR = "error"  # the call failed


class Score(BaseModel):
    scorer: str  # e.g. "diagnosis_match", "lesion_f1", "bertscore", "rubric"
    value: float | None  # None = unscored (never zero for "could not score")
    explanation: str = ""
    details: dict[str, Any] = Field(default_factory=dict)


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
