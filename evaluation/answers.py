"""What a model must return: the answer schema (the checklist the clinician reviews)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class SequenceIdentified(BaseModel):
    image: str | None = None  # image label or index the model refers to
    sequence: str


class Finding(BaseModel):
    description: str = ""
    sequence: str | None = None
    hemisphere: str | None = None
    region: str | None = None
    signal: str | None = None
    size_mm: float | None = None
    enhancement: str | None = None


class DifferentialItem(BaseModel):
    diagnosis: str
    icd10: str | None = None
    likelihood: float | None = None
    evidence_for: list[str] = Field(default_factory=list)
    evidence_against: list[str] = Field(default_factory=list)


class Answer(BaseModel):
    """The answer every diagnostic task asks for; this schema IS the reviewed checklist."""

    sequences_identified: list[SequenceIdentified] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)
    differential: list[DifferentialItem] = Field(default_factory=list)
    final_diagnosis: str | None = None
    rationale: str = ""
    confidence: float | None = Field(default=None, ge=0, le=1)
    next_steps: list[str] = Field(default_factory=list)


class ClassificationAnswer(BaseModel):
    """NeuroVLM-Bench's strict JSON answer (null = abstain)."""

    modality: Literal["CT", "MRI"] | None = None
    specialized_sequence: Literal["FLAIR", "T1", "T2", "T1C+"] | None = None
    plane: Literal["axial", "sagittal", "coronal"] | None = None
    diagnosis_name: (
        Literal["tumor", "stroke", "multiple sclerosis", "normal", "other abnormalities"] | None
    ) = None
    diagnosis_detailed: str | None = None
    icd10_code: str | None = None
    severity_score: float | None = Field(default=None, ge=0, le=1)
    diagnosis_confidence: float | None = Field(default=None, ge=0, le=1)
    severity_confidence: float | None = Field(default=None, ge=0, le=1)
