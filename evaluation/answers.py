"""What a model must return: the answer schema (the checklist the clinician reviews)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

MAX_IMAGE_INDEX = 1000  # no prompt shows more images; a larger index is not an image of it
MAX_PIXEL = 100_000.0  # a coordinate past this is on no image the sandbox renders


class SequenceIdentified(BaseModel):
    image: str | None = None  # image label or index the model refers to
    sequence: str


class ImagePlace(BaseModel):
    """Where a finding is on an image the model was shown: the image's number in the prompt
    (1 = the first) and a point and/or a box in that image's pixels (x to the right, y down,
    the top-left corner at 0, 0). A box without a point is pointed at by its centre."""

    image: int = Field(ge=1, le=MAX_IMAGE_INDEX)
    point: tuple[float, float] | None = None
    box: tuple[float, float, float, float] | None = None  # x0, y0, x1, y1

    @model_validator(mode="after")
    def _bounded(self) -> ImagePlace:
        values = [*(self.point or ()), *(self.box or ())]
        if self.point is None and self.box is None:
            raise ValueError("a place needs a point or a box")
        if any(not (0.0 <= v <= MAX_PIXEL) for v in values):  # also rejects NaN
            raise ValueError(f"coordinates must be pixels from 0 to {MAX_PIXEL:.0f}")
        if self.box is not None and not (self.box[0] < self.box[2] and self.box[1] < self.box[3]):
            raise ValueError("a box is x0, y0, x1, y1 with x0 < x1 and y0 < y1")
        return self

    @property
    def xy(self) -> tuple[float, float]:
        """The pixel the finding points at: its point, else its box's centre."""
        if self.point is not None:
            return self.point
        assert self.box is not None
        return (self.box[0] + self.box[2]) / 2, (self.box[1] + self.box[3]) / 2


class Finding(BaseModel):
    description: str = ""
    sequence: str | None = None
    hemisphere: str | None = None
    region: str | None = None
    signal: str | None = None
    size_mm: float | None = None
    enhancement: str | None = None
    place: ImagePlace | None = None  # where on an image shown it is (optional)


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
