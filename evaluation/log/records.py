"""What the run store hands back: typed rows, never dicts (evaluation.store reads them)."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
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


# --------------------------------------------------------------------------- the gateway's run


class RunStatus(StrEnum):
    """Where a gateway run stands."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"
    # not evaluated, on purpose: the study names more than one patient, or is registered as
    # a case of another patient; the reason and the identities say which
    HELD = "held"
    # the gateway stopped (killed, crashed) while this run was queued or running
    INTERRUPTED = "interrupted"


class SkipKind(StrEnum):
    """Why a run was skipped; its text is the run's ``error``."""

    # a study no routing rule selects: never evaluated, listed in the review queue
    NOT_ROUTED = "no routing rule selects this study"
    # the same study again (normal: nothing new to evaluate)
    UNCHANGED = "no new instances since the last evaluation by this rule"
    RESTARTED = "evaluated before the gateway restarted"


FINAL_STATUSES = frozenset(
    {RunStatus.DONE, RunStatus.FAILED, RunStatus.SKIPPED, RunStatus.HELD, RunStatus.INTERRUPTED}
)


class RouteRecord(BaseModel):
    """The routing rule that selected a study and what it runs (the gateway builds it from its
    ``Route``; evaluation does not import the gateway)."""

    rule: str
    models: list[str] = Field(default_factory=list)
    tasks: list[str] = Field(default_factory=list)  # TaskFamily values
    series_classes: list[str] = Field(default_factory=list)


class WriteBack(BaseModel):
    """One object the gateway writes back to the PACS for a run."""

    kind: str  # "sr" | "pdf" | "verified-sr" | ...
    sop_instance_uid: str
    model: str | None = None  # the model an SR reports on
    at: str | None = None  # when it was stored (None: still pending)


class EvidenceRef(BaseModel):
    """One instance the SR's evidence names; ``header``: the kept first header of its series
    (DICOM JSON, without pixel data or long values), None for a plain reference."""

    series_uid: str
    sop_instance_uid: str
    sop_class_uid: str
    header: str | None = None


class GatewayRun(BaseModel):
    """The gateway's part of a run: how it started, where it stands, what was written back,
    the study's facts the run evaluated and the SR's evidence (one record, one row)."""

    run_id: str
    trigger: str  # dicom | orthanc | api
    status: RunStatus = RunStatus.QUEUED
    stage: str = "queued"
    progress: float = 0.0
    study_uid: str | None = None
    study_key: str | None = None  # the UID with its patient (the gateway's StudyKey name)
    orthanc_study_id: str | None = None
    route: RouteRecord | None = None
    requested_by: str | None = None  # token id (never the token)
    n_instances: int = 0
    version: int | None = None  # the report version of the study this run wrote
    sr_sop_uids: dict[str, str] = Field(default_factory=dict)  # model -> SR SOP Instance UID
    pdf_sop_uid: str | None = None
    created_at: str = Field(default_factory=lambda: _now_s())
    started_at: str | None = None
    finished_at: str | None = None
    error: str | None = None  # a failed or held run's reason
    skip: SkipKind | None = None
    # a held run: every patient identity involved (for the reviewer; never sent to a model)
    identities: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    timings_s: dict[str, float] = Field(default_factory=dict)  # stage -> seconds since start
    writebacks_pending: list[WriteBack] = Field(default_factory=list)
    writebacks_done: list[WriteBack] = Field(default_factory=list)
    # the study as this run evaluated it (the gateway's StudyState facts of the run)
    evaluated_digest: str | None = None  # the instances and the rule evaluated
    evaluated_instances: str | None = None  # the instances alone
    uploaded: list[str] = Field(default_factory=list)  # SOP Instance UIDs stored in the PACS
    sr_paths: list[str] = Field(default_factory=list)  # local copies of this run's SRs
    evidence: list[EvidenceRef] = Field(default_factory=list)

    @property
    def final(self) -> bool:
        return self.status in FINAL_STATUSES

    @property
    def held(self) -> bool:
        return self.status is RunStatus.HELD


# The columns ``RunStore.set_gateway_stage`` may change beside stage and progress.
STAGE_FIELDS = frozenset({"status", "started_at", "finished_at", "error", "timings_s"})


def _now_s() -> str:
    import datetime as dt

    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
