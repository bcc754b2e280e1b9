"""An Orthanc as a ``PacsClient``, over its REST API (``gateway.orthanc.OrthancClient``).

Finding is one ``/tools/find`` per listed value (case-insensitive, at most the query's limit),
then one expanded series listing per study for its modalities and counts; pulling streams each
instance of the patient's study (Orthanc keys a study by PatientID and UID) into the folder
under a name of its own; storing uploads each object.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydicom.dataset import Dataset

from dicom import pacs_credential
from gateway.orthanc import OrthancClient, OrthancError
from gateway.pacs.client import (
    PacsRequestError,
    Progress,
    RetrievedStudy,
    StoreResult,
    StudyMatch,
    StudyQuery,
    keep_the_study,
    pacs_date,
    pacs_text,
)
from gateway.pacs.config import OrthancPacs
from gateway.pacs.tls import client_context
from gateway.study_key import orthanc_id

MAX_INSTANCE_BYTES = 2 * 1024**3  # one instance pulled


class OrthancRestClient:
    """Find, pull and store on an Orthanc by its REST API."""

    def __init__(self, name: str, orthanc: OrthancClient) -> None:
        self.name = name
        self.orthanc = orthanc

    @classmethod
    def of_config(cls, name: str, cfg: OrthancPacs) -> OrthancRestClient:
        user = pacs_credential(cfg.username_env) or cfg.username
        password = pacs_credential(cfg.password_env)
        client = OrthancClient(
            cfg.url, user, password, timeout_s=cfg.timeout_s, verify=client_context(cfg.tls)
        )
        return cls(name, client)

    def close(self) -> None:
        self.orthanc.close()

    def _fail(self, what: str, exc: Exception) -> PacsRequestError:
        return PacsRequestError(f"PACS {self.name!r} (Orthanc {self.orthanc.url}): {what}: {exc}")

    # ----------------------------------------------------------------- finding

    def _queries(self, query: StudyQuery) -> list[dict[str, str]]:
        base: dict[str, str] = {}
        if query.dicom_date_range():
            base["StudyDate"] = query.dicom_date_range()
        if query.description:
            base["StudyDescription"] = query.description
        if len(query.modalities) == 1:
            base["ModalitiesInStudy"] = query.modalities[0]
        out = [base]
        for key, values in (
            ("AccessionNumber", query.accession_numbers),
            ("PatientID", query.patient_ids),
            ("StudyInstanceUID", query.study_uids),
        ):
            if values:
                out = [{**q, key: v} for q in out for v in values]
        return out[: query.limit * 4]

    def find_studies(self, query: StudyQuery) -> list[StudyMatch]:
        found: dict[tuple[str, str], StudyMatch] = {}
        for q in self._queries(query):
            body = {"Level": "Study", "Query": q, "Expand": True, "CaseSensitive": False,
                    "Limit": query.limit}  # fmt: skip
            try:
                studies = self.orthanc.post_json("/tools/find", body)
            except OrthancError as exc:
                raise self._fail("find", exc) from None
            for s in studies[: query.limit] if isinstance(studies, list) else []:
                m = self._match(s)
                if m is not None and query.matches(m):
                    found.setdefault((m.study_uid, m.patient_id), m)
            if len(found) >= query.limit:
                break
        return sorted(found.values(), key=lambda m: (m.study_date or dt.date.min, m.study_uid))[
            : query.limit
        ]

    def _match(self, s: Any) -> StudyMatch | None:
        if not isinstance(s, dict):
            return None
        t, pt = s.get("MainDicomTags") or {}, s.get("PatientMainDicomTags") or {}
        try:
            series = self.orthanc.get_json(
                f"/studies/{pacs_text(s.get('ID'))}/series", {"expand": ""}
            )
        except OrthancError:
            series = []
        modalities = sorted(
            {pacs_text((x.get("MainDicomTags") or {}).get("Modality")) for x in series[:1000]}
            - {""}
        )
        try:
            return StudyMatch(
                pacs=self.name,
                study_uid=str(t.get("StudyInstanceUID", "")),
                patient_id=pacs_text(pt.get("PatientID")),
                issuer=pacs_text(pt.get("IssuerOfPatientID")),
                patient_name=pacs_text(pt.get("PatientName")),
                birth_date=pacs_text(pt.get("PatientBirthDate"))[:8],
                accession=pacs_text(t.get("AccessionNumber")),
                study_date=pacs_date(t.get("StudyDate")),
                modalities=modalities,
                description=pacs_text(t.get("StudyDescription")),
                n_series=len(series),
                n_instances=sum(len(x.get("Instances") or []) for x in series[:1000]),
            )
        except ValueError:  # not a valid UID: not a study the sandbox can name
            return None

    # ----------------------------------------------------------------- pulling

    def retrieve(
        self, match: StudyMatch, dest: Path, progress: Progress | None = None
    ) -> RetrievedStudy:
        started = time.monotonic()
        sid = orthanc_id(match.patient_id, match.study_uid)
        try:
            instances = self.orthanc.study_instances(sid)
        except OrthancError as exc:
            raise self._fail(f"study {match.study_uid} of the patient", exc) from None
        dest.mkdir(parents=True, exist_ok=True)
        failed: list[str] = []
        total = len(instances)
        for n, inst in enumerate(instances, 1):
            iid = pacs_text(inst.get("ID") if isinstance(inst, dict) else "")
            name = hashlib.sha256(iid.encode()).hexdigest()[:32] + ".dcm"
            try:
                self.orthanc.download_instance(iid, dest / name, MAX_INSTANCE_BYTES)
            except OrthancError as exc:
                failed.append(f"instance {iid}: {str(exc)[:200]}")
            if progress:
                progress(n, total)
        out = keep_the_study(match, dest, started)
        out.failed = failed[:50]
        return out

    # ----------------------------------------------------------------- storing

    def store(self, objects: Sequence[Dataset]) -> list[StoreResult]:
        from gateway.sr import encode

        out = []
        for ds in objects:
            uid = str(ds.get("SOPInstanceUID", ""))
            try:
                self.orthanc.upload(encode(ds))
                out.append(StoreResult(sop_instance_uid=uid, stored=True))
            except OrthancError as exc:
                if exc.status is None:  # not reached at all: the caller retries later
                    raise self._fail("store", exc) from None
                out.append(StoreResult(sop_instance_uid=uid, stored=False, detail=str(exc)[:300]))
        return out
