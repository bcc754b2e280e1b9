"""What the run store hands back: typed rows, never dicts (evaluation.store reads them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field

from evaluation.modelio import ModelOutput


class RunRow(BaseModel):
    """The run's own row: identity, status, the config it was started with, its versions."""

    run_id: str
    created_at: str
    updated_at: str
    status: str  # running | complete | incomplete
    dataset_name: str | None = None
    dataset_kind: str | None = None
    dataset_hash: str
    prompt_version: str | None = None
    code_version: str | None = None
    config: dict[str, Any]  # RunConfig as JSON (what resume rebuilds the run from)
    packages: dict[str, str] = Field(default_factory=dict)


class SampleRow(BaseModel):
    """One sample: one model's answer to one task of one case, as stored before scoring."""

    sample_id: str
    case_id: str
    task: str
    family: str
    model: str
    sample: int
    status: str  # a ParseStatus value
    turns: list[dict[str, Any]]  # request/response per turn; grader turns carry "grader"
    parsed: dict[str, Any] | None = None
    parse_error: str | None = None
    image_hashes: list[str] = Field(default_factory=list)
    updated_at: str

    @property
    def answer_turns(self) -> list[dict[str, Any]]:
        """The model's own turns (not the graders')."""
        return [t for t in self.turns if "grader" not in t]

    def grader_replies(
        self, responses: Mapping[str, ModelOutput]
    ) -> tuple[dict[str, str | None], dict[str, str | None]]:
        """Each rubric grader's reply to this answer, and its reply to the canary (None: the
        call failed, nothing stored)."""

        def reply(t: dict[str, Any]) -> str | None:
            out = responses.get(t["cache_key"])
            return out.text if out is not None else None

        graded = [t for t in self.turns if "grader" in t]
        return (
            {t["grader"]: reply(t) for t in graded if not t.get("canary")},
            {t["grader"]: reply(t) for t in graded if t.get("canary")},
        )


class CallErrors(BaseModel):
    """One model's samples that ended in an error (a call that failed after its retries)."""

    model: str
    samples: int
    reasons: int  # distinct error messages among them
    first_error: str  # the first, as stored (untrusted text: escape it to print it)
    retries: int = 0  # extra attempts this model's calls took, in all


class StoreCounts(BaseModel):
    """Row counts of a run store, and its samples by status."""

    requests: int
    responses: int
    failures: int
    samples: int
    scores: int
    audit: int
    by_status: dict[str, int] = Field(default_factory=dict)

    def of_status(self, status: str) -> int:
        return self.by_status.get(status, 0)

    def flat(self) -> dict[str, int]:
        """The counts as one mapping, samples by status as ``samples_<status>`` (JSON output)."""
        out = self.model_dump(exclude={"by_status"})
        out.update({f"samples_{s}": n for s, n in self.by_status.items()})
        return out
