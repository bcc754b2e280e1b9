"""What the run log hands back: typed records, never dicts (``evaluation.log.store`` reads them)."""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field

from evaluation.answers import Answer, ClassificationAnswer
from evaluation.coverage import CaseCoverage
from evaluation.errors import StoreError
from evaluation.modelio import ModelOutput
from evaluation.scores import ErrorLabel, Score


class RunLog(BaseModel):
    """The run's own record: identity, status, the config it was started with (what resume
    rebuilds the run from), the dataset's hash, the code, prompt and package versions."""

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
    # the cases evaluated out of the dataset's, and the skipped ones with why
    coverage: CaseCoverage = Field(default_factory=lambda: CaseCoverage(evaluated=0))
    # scored samples per scoring version (None: scored before versions were recorded)
    scoring_versions: dict[str | None, int] = Field(default_factory=dict)


MAX_SENT_TEXT = 400_000  # characters of one text part kept (a prompt is far smaller)


class SentPart(BaseModel):
    """One part of a message as sent: its text, or an image by hash and label (no bytes)."""

    type: Literal["text", "image"]
    text: str = ""
    truncated: bool = False  # text longer than MAX_SENT_TEXT, cut
    sha256: str = ""
    label: str = ""


class SentMessage(BaseModel):
    role: str
    parts: list[SentPart] = Field(default_factory=list)


class SentRequest(BaseModel):
    """What one model call sent, as the run store recorded it before the call
    (``evaluation.call_keys.request_record``: after the PHI gate, exactly what left)."""

    messages: list[SentMessage] = Field(default_factory=list)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> SentRequest:
        """From the stored request JSON (hostile: types checked, text bounded)."""
        messages = []
        for m in record.get("messages") or []:
            parts = []
            for p in (m.get("content") or []) if isinstance(m, dict) else []:
                if not isinstance(p, dict):
                    continue
                if p.get("type") == "image":
                    parts.append(
                        SentPart(
                            type="image",
                            sha256=str(p.get("sha256", ""))[:64],
                            label=str(p.get("label", ""))[:2000],
                        )
                    )
                else:
                    text = str(p.get("text", ""))
                    parts.append(
                        SentPart(
                            type="text",
                            text=text[:MAX_SENT_TEXT],
                            truncated=len(text) > MAX_SENT_TEXT,
                        )
                    )
            if isinstance(m, dict):
                messages.append(SentMessage(role=str(m.get("role", ""))[:32], parts=parts))
        return cls(messages=messages)

    def digest(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:32]


class StoredRecordError(StoreError):
    """A row of the run store that cannot be read back as its record (a file edited or
    damaged by hand, or written by a program that is not this one): names the run, the sample
    and the part at fault."""


class SampleTurn(BaseModel):
    """One call of a sample's conversation: what was sent (``request``, as stored before the
    call), what came back (``output``: the reply, or the failure after its retries; None when
    nothing was stored), and the answer's parse status after this turn (or ``error``)."""

    turn: int = Field(ge=1)
    cache_key: str = Field(min_length=1, max_length=200)
    status: str  # a ParseStatus value
    error: str | None = None
    request: SentRequest | None = None
    output: ModelOutput | None = None

    def stored(self) -> dict[str, Any]:
        """The part the samples row keeps (the request and output live in their own rows)."""
        out: dict[str, Any] = {"turn": self.turn, "cache_key": self.cache_key}
        out["status"] = self.status
        if self.error is not None:
            out["error"] = self.error
        return out


class GraderCall(BaseModel):
    """One rubric grader's call about a sample's answer (``canary``: its call on the fixed
    canary answer, asked once per grader per run), with its request and output as stored."""

    grader: str = Field(min_length=1, max_length=500)
    cache_key: str = Field(min_length=1, max_length=200)
    canary: bool = False
    request: SentRequest | None = None
    output: ModelOutput | None = None

    @property
    def reply(self) -> str | None:
        """The grader's reply (None: the call failed, nothing usable stored)."""
        if self.output is None or self.output.error:
            return None
        return self.output.text

    def stored(self) -> dict[str, Any]:
        out: dict[str, Any] = {"grader": self.grader}
        if self.canary:
            out["canary"] = True
        out["cache_key"] = self.cache_key
        return out


class SampleRecord(BaseModel):
    """One sample: one model's answer to one task of one case, typed: its turns (request and
    output of each call), the parsed answer, the graders' calls, the scores."""

    sample_id: str
    case_id: str
    task: str
    family: str
    model: str
    sample: int
    status: str  # a ParseStatus value
    turns: list[SampleTurn] = Field(default_factory=list)  # the model's conversation, in order
    graders: list[GraderCall] = Field(default_factory=list)
    # the answer as parsed (ClassificationAnswer for the classification family); None when the
    # reply gave none (an error, a refusal, a format failure)
    parsed: Answer | ClassificationAnswer | None = None
    parse_error: str | None = None
    missing_fields: list[str] = Field(default_factory=list)
    repairs: list[str] = Field(default_factory=list)  # what parsing repaired in the reply
    image_hashes: list[str] = Field(default_factory=list)
    updated_at: str
    scores: list[Score] = Field(default_factory=list)
    error_label: ErrorLabel | None = None
    scoring_version: str | None = None

    @property
    def final_output(self) -> ModelOutput | None:
        """The reply of the last turn (None: that call failed or nothing is stored)."""
        out = self.turns[-1].output if self.turns else None
        return out if out is not None and not out.error else None

    def grader_replies(self) -> tuple[dict[str, str | None], dict[str, str | None]]:
        """Each rubric grader's reply to this answer, and its reply to the canary (None: the
        call failed, nothing stored)."""
        return (
            {g.grader: g.reply for g in self.graders if not g.canary},
            {g.grader: g.reply for g in self.graders if g.canary},
        )

    def stored_turns(self) -> list[dict[str, Any]]:
        """The turns and grader calls as the samples row keeps them (``turns_json``)."""
        return [*(t.stored() for t in self.turns), *(g.stored() for g in self.graders)]


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
    # queued while the study's evaluation still waited for a worker (gateway/jobs.py): that
    # evaluation reads the study from the PACS when it starts, this run's instances with it
    MERGED = "merged into the study's evaluation waiting for a worker"


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
    robustness: list[str] = Field(default_factory=list)  # the audit's VariantKind values, if any


class VerifiedBy(BaseModel):
    """Whose sign-off a VERIFIED object carries: once stored, the review log records it as
    the sign-off's send would have (a REISSUE event of that reviewer on that case)."""

    review_run_id: str  # the run the review log names (the evaluation run of the report)
    case_id: str
    reviewer: str
    person: str = ""
    passed_over: str = ""  # a superseded version verified knowingly: the newer one


class WriteBack(BaseModel):
    """One object the gateway writes back to the PACS for a run. Pending (``at`` None), it is
    kept on disk (``kept``) and tried again at ``next_at`` until the destination stores it."""

    kind: str  # "sr" | "pdf" | "verified-sr" | "verified-pdf"
    sop_instance_uid: str
    model: str | None = None  # the model an SR reports on
    at: str | None = None  # when it was stored (None: still pending)
    destination: str | None = None  # the PACS by its configured name (None: the local Orthanc)
    attempts: int = 0  # stores tried (each with its quick retries)
    last_error: str | None = None  # why the last attempt failed (bounded)
    next_at: str | None = None  # when a pending object is tried again
    kept: str | None = None  # the object's file, kept until it is stored
    verified: VerifiedBy | None = None  # a VERIFIED object: the sign-off it carries


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
    # how the runs index lists the run: a gateway's, or one of the gateway `neurosandbox demo`
    # starts (its Settings.run_source)
    source: Literal["gateway", "demo"] = "gateway"
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


def gateway_run_of_note(text: str) -> GatewayRun:
    """A gateway run as versions before the run log wrote it (the run store's ``gateway`` note,
    or ``run.json``): the SRs a list of UIDs without model names. Raises ``ValueError``."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("not a run record")
    if isinstance(data.get("sr_sop_uids"), list):  # the note kept no model names
        data["sr_sop_uids"] = {f"#{n + 1}": u for n, u in enumerate(data["sr_sop_uids"])}
    data.pop("unverified_sr", None)
    return GatewayRun.model_validate(data)


# --------------------------------------------------------------------------- the canary's mark

CANARY_NOTE = "canary"  # the run note key a canary run carries (RunStore.set_note)
CanaryVerdict = Literal["first", "quiet", "alarm"]
MAX_CANARY_DETAIL = 2000  # characters of the detail kept (a note written by hand is hostile)


class CanaryMark(BaseModel):
    """What ``neurosandbox canary FILE`` writes on its run (note ``canary``): the canary's name,
    the sha256 of its file, the verdict against the canary's last run ("first" when there was
    none) and one line of detail. The index and ``/metrics`` read it back with
    ``canary_mark_of_note``, which never raises."""

    name: str = Field(min_length=1, max_length=200)
    file_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    verdict: CanaryVerdict
    detail: str = Field(default="", max_length=MAX_CANARY_DETAIL)

    def note(self) -> str:
        return self.model_dump_json()


def canary_mark_of_note(text: str | None) -> CanaryMark | None:
    """The canary mark of a run's ``canary`` note; None when there is none or it does not
    read as one (a note written by hand, another program's, damaged): never raises."""
    if not text or len(text) > 4 * MAX_CANARY_DETAIL:
        return None
    try:
        return CanaryMark.model_validate_json(text)
    except ValueError:
        return None
