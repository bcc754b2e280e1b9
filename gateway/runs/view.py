"""What the HTTP API says of a run: its status, progress and what was written back. The run's
record (``GatewayRun``) also holds the SR's evidence (first headers, with the patient's name),
local paths and the instances uploaded; none of that is the API's to hand out."""

from __future__ import annotations

from pydantic import BaseModel, Field

from evaluation.log import GatewayRun, RouteRecord, RunStatus, SkipKind, WriteBack


class RunView(BaseModel):
    run_id: str
    trigger: str
    status: RunStatus
    stage: str
    progress: float
    study_uid: str | None = None
    orthanc_study_id: str | None = None
    route: RouteRecord | None = None
    requested_by: str | None = None  # token id (never the token)
    n_instances: int = 0
    version: int | None = None
    sr_sop_uids: dict[str, str] = Field(default_factory=dict)  # model -> SR SOP Instance UID
    pdf_sop_uid: str | None = None
    created_at: str
    started_at: str | None = None
    finished_at: str | None = None
    error: str | None = None
    skip: SkipKind | None = None
    # a held run: every patient identity involved (for the reviewer)
    identities: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    timings_s: dict[str, float] = Field(default_factory=dict)
    writebacks_pending: list[WriteBack] = Field(default_factory=list)
    writebacks_done: list[WriteBack] = Field(default_factory=list)

    @classmethod
    def of(cls, run: GatewayRun) -> RunView:
        return cls.model_validate(run.model_dump(include=set(cls.model_fields)))
