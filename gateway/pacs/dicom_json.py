"""DICOM JSON (PS3.18 F.2), as a DICOMweb server answers it, read into our records.

A QIDO-RS study becomes a ``StudyMatch`` (``study_match``), a STOW-RS answer one
``StoreResult`` per object (``store_results``). Nothing in an answer is trusted: a value of the
wrong shape is left out, every text is bounded printable text (``client.pacs_text``, the one
rule for values a PACS returns), counts and dates pass ``pacs_count``/``pacs_date``.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.pacs.client import StoreResult, StudyMatch, pacs_count, pacs_date, pacs_text

# the attributes a study answer is asked to include (QIDO-RS includefield)
INCLUDE = ("NumberOfStudyRelatedSeries", "NumberOfStudyRelatedInstances", "ModalitiesInStudy",
           "StudyDescription", "IssuerOfPatientID", "PatientBirthDate")  # fmt: skip
# tags as DICOM JSON names them
STUDY_UID, SERIES_UID, SOP_UID = "0020000D", "0020000E", "00080018"
PATIENT_ID, ISSUER, DESCRIPTION = "00100020", "00100021", "00081030"
_PATIENT_NAME, _BIRTH_DATE, _ACCESSION = "00100010", "00100030", "00080050"
_STUDY_DATE, _MODALITIES = "00080020", "00080061"
_N_SERIES, _N_INSTANCES = "00201206", "00201208"
_REFERENCED_SOP_SEQ, _FAILED_SOP_SEQ = "00081199", "00081198"
_REFERENCED_SOP_UID, _FAILURE_REASON, _WARNING_REASON = "00081155", "00081197", "00081196"
MAX_ITEMS = 100_000  # items of a sequence read


def values(item: Any, tag: str, limit: int = 64) -> list[Any]:
    """The Value list of ``tag`` in a DICOM JSON object (at most ``limit``), [] if none."""
    el = item.get(tag) if isinstance(item, dict) else None
    vals = el.get("Value") if isinstance(el, dict) else None
    return vals[:limit] if isinstance(vals, list) else []


def has(item: Any, tag: str) -> bool:
    """Whether the object carries ``tag`` at all (empty or not)."""
    return isinstance(item, dict) and tag in item


def text(item: Any, tag: str) -> str:
    """The first value of ``tag`` as bounded printable text (a name: its Alphabetic form)."""
    vals = values(item, tag, 1)
    if not vals:
        return ""
    v = vals[0]
    if isinstance(v, dict):  # PN: {"Alphabetic": ...}
        v = v.get("Alphabetic", "")
    return pacs_text(v if isinstance(v, str | int | float) else "")


def study_match(item: Any, pacs: str) -> StudyMatch | None:
    """A QIDO-RS study answer as a match; None when it has no valid StudyInstanceUID."""
    modalities = {pacs_text(v)[:16] for v in values(item, _MODALITIES) if isinstance(v, str)}
    try:
        return StudyMatch(
            pacs=pacs,
            study_uid=text(item, STUDY_UID),
            patient_id=text(item, PATIENT_ID),
            issuer=text(item, ISSUER),
            patient_name=text(item, _PATIENT_NAME),
            birth_date=text(item, _BIRTH_DATE)[:8],
            accession=text(item, _ACCESSION),
            study_date=pacs_date(text(item, _STUDY_DATE)),
            modalities=sorted(m for m in modalities if m)[:16],
            description=text(item, DESCRIPTION),
            n_series=pacs_count(text(item, _N_SERIES)),
            n_instances=pacs_count(text(item, _N_INSTANCES)),
        )
    except ValueError:
        return None


def store_results(status: int, answer: bytes, uids: list[str]) -> list[StoreResult]:
    """One result per object from a STOW-RS answer (PS3.18 10.5.3): failed when in the
    FailedSOPSequence, stored when in the ReferencedSOPSequence (with its warning, if any)
    or when the answer is 200 and names no failure."""
    try:
        data = json.loads(answer) if answer.strip() else {}
    except ValueError:
        data = {}
    if isinstance(data, list):
        data = data[0] if data else {}
    stored = {
        text(item, _REFERENCED_SOP_UID): pacs_count(text(item, _WARNING_REASON))
        for item in values(data, _REFERENCED_SOP_SEQ, MAX_ITEMS)
    }
    failed = {
        text(item, _REFERENCED_SOP_UID): pacs_count(text(item, _FAILURE_REASON))
        for item in values(data, _FAILED_SOP_SEQ, MAX_ITEMS)
    }
    out = []
    for u in uids:
        if u in failed:
            out.append(StoreResult(sop_instance_uid=u, stored=False,
                                   detail=f"failure reason 0x{failed[u] or 0:04X}"))  # fmt: skip
        elif u in stored:
            warning = stored[u]
            detail = f"stored with warning 0x{warning:04X}" if warning else ""
            out.append(StoreResult(sop_instance_uid=u, stored=True, detail=detail))
        elif status == 200 and not failed:
            out.append(StoreResult(sop_instance_uid=u, stored=True))
        else:
            out.append(StoreResult(sop_instance_uid=u, stored=False,
                                   detail=f"not in the STOW-RS answer (HTTP {status})"))  # fmt: skip
    return out
