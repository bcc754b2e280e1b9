"""What the gateway's evaluation of one study gives: per-model answers and the engine's run."""

from __future__ import annotations

from pydantic import BaseModel, Field

from evaluation import Answer, Finding, ImageRef, ParseStatus, RunData, Score, TaskFamily
from gateway.routing import Route


class CaseResult(BaseModel):
    """One model's answer to one task on the study."""

    case_id: str
    model: str
    task: TaskFamily
    answer: Answer | None = None
    final_diagnosis: str | None = None
    findings: list[Finding] = Field(default_factory=list)
    scores: list[Score] = Field(default_factory=list)
    parse_status: ParseStatus = ParseStatus.OK
    error: str | None = None


class EvaluationResult(BaseModel):
    evaluator: str
    study_uid: str
    route: Route
    cases: list[CaseResult] = Field(default_factory=list)
    images: list[ImageRef] = Field(default_factory=list)  # paths relative to the work folder
    evaluated_series_uids: list[str] = Field(default_factory=list)
    modality: str = "MR"
    warnings: list[str] = Field(default_factory=list)
    # The engine's run as the report bundle reads it; the pipeline writes its checklist.
    run: RunData = Field(exclude=True, repr=False)
