"""Published Neural-MedBench results, shown beside a run as context. Not measured here."""

from __future__ import annotations

from pydantic import BaseModel, Field

SOURCE = "Neural-MedBench (arXiv 2509.22258, ICLR 2026)"
LABEL = "published, not measured here"
LEVELS = ("Direct (L1)", "Complex (L2)", "Multi-turn (L3)")


class PublishedRow(BaseModel):
    model: str
    pass_at_1: tuple[float | None, float | None, float | None]  # per level, percent
    pass_at_5: tuple[float | None, float | None, float | None] | None = None


class PublishedBenchmark(BaseModel):
    source: str = SOURCE
    label: str = LABEL
    levels: tuple[str, str, str] = LEVELS
    rows: list[PublishedRow] = Field(default_factory=list)
    error_taxonomy: dict[str, float] = Field(default_factory=dict)  # percent of error responses
    error_note: str = ""


def neural_medbench() -> PublishedBenchmark:
    """The paper's pass@1 / pass@5 per difficulty level, and its error-taxonomy split."""
    return PublishedBenchmark(
        rows=[
            PublishedRow(model="GPT-5", pass_at_1=(36.7, 28.3, 19.5), pass_at_5=(43.3, 45.0, 27.5)),
            PublishedRow(model="GPT-4o", pass_at_1=(20.0, 8.3, 8.5), pass_at_5=(36.7, 40.0, 16.5)),
            PublishedRow(
                model="Gemini 2.5 Pro", pass_at_1=(30.0, 15.0, 11.5), pass_at_5=(50.0, 38.3, 19.5)
            ),
            PublishedRow(
                model="MedGemma-27B", pass_at_1=(30.0, 18.3, 10.5), pass_at_5=(36.7, 38.3, 15.5)
            ),
            PublishedRow(model="Senior clinicians", pass_at_1=(40.0, 35.5, 15.0)),
        ],
        error_taxonomy={
            "reasoning": 51.0,
            "perceptual": 27.0,
            "other (knowledge, grounding, hallucination)": 22.0,
        },
        error_note="100 error responses classified by hand; 13% visual hallucination is quoted in summaries",
    )
