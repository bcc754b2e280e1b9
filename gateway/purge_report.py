"""What a purge says it removed, and its audit entry, which names no one (``gateway.purge``).

The audit log gets one entry per purge: the kind, a salted hash of the patient or study (the salt
is ``DATA_DIR/secret/purge.salt``: who holds it can check that a given patient was purged), the
counts, the actor.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from gateway.audit import AuditLog
from gateway.purge_target import PurgeTarget

SALT_FILE = ("secret", "purge.salt")


class PurgeCounts(BaseModel):
    """What a purge removed (or, dry, would remove), per place."""

    runs: int = 0  # gateway runs (their folder and run store)
    studies: int = 0  # distinct studies (UID and patient) any of the places held
    report_bundles: int = 0
    spool_studies: int = 0
    study_states: int = 0
    spool_files: int = 0  # instances in spool/incoming and spool/quarantine
    cache_files: int = 0
    review_events: int = 0
    suite_cases: int = 0  # cases erased from suite runs' stores
    suite_rows: int = 0  # their rows
    registered_cases: int = 0
    pacs_objects: int = 0  # SR and PDF instances the sandbox wrote into Orthanc
    run_log_rows: int = 0  # rows of the purged runs deleted from a PostgreSQL run log
    files: int = 0  # every file deleted, all places together
    bytes: int = 0

    def summary(self) -> str:
        return (
            f"{self.runs} runs, {self.studies} studies, {self.files} files"
            f" ({self.bytes} bytes), {self.review_events} review events,"
            f" {self.suite_cases} suite cases, {self.registered_cases} registered cases,"
            f" {self.pacs_objects} PACS objects"
        )


class PurgeReport(BaseModel):
    kind: Literal["patient", "study", "retention"]
    subject: str = ""  # salted hash of the patient or study ("" for retention)
    dry_run: bool = False
    pacs: bool = False
    at: str = ""
    counts: PurgeCounts = Field(default_factory=PurgeCounts)
    left: list[str] = Field(default_factory=list)  # what was not purged, and why
    run_ids: list[str] = Field(default_factory=list)  # the gateway runs purged
    # a patient's issuers (IssuerOfPatientID) its purged data carried ("": none)
    issuers: list[str] = Field(default_factory=list)


def subject_hash(data_dir: Path, target: PurgeTarget) -> str:
    """A salted hash of the patient or study (the salt: ``DATA_DIR/secret/purge.salt``, made
    on first use, readable by the owner only): the audit entry names no one."""
    if target.kind == "retention":
        return ""
    path = data_dir.joinpath(*SALT_FILE)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(secrets.token_bytes(32))
    text = (
        f"patient:{target.patient_id}\\{target.issuer or ''}"
        if target.kind == "patient"
        else f"study:{target.study_uid}"
    )
    return hmac.new(path.read_bytes(), text.encode(), hashlib.sha256).hexdigest()[:24]


def audit_detail(target: PurgeTarget, report: PurgeReport) -> str:
    if target.kind == "retention":
        what = f"data older than {target.older_than_days:g} days"
    else:
        what = f"1 {target.kind}"
    return f"purged {what}: {report.counts.summary()}"


def write_audit(audit: AuditLog, actor: str, target: PurgeTarget, report: PurgeReport) -> None:
    """The purge's one audit entry: kind, salted subject, counts, actor; never the data."""
    audit.write(
        actor,
        "purge",
        target=f"{target.kind}:{report.subject}" if report.subject else target.kind,
        outcome="done" if not report.left else "partial",
        detail=audit_detail(target, report),
    )
