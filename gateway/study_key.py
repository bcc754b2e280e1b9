"""What a received study is found by: its StudyInstanceUID **and** its patient.

A UID is not an identity: archives hold copies, re-sends and badly anonymised exports in which
two patients share a StudyInstanceUID. The spool folder, the quiet time, the study state (what
was uploaded and evaluated, the report version) and the pipeline's queue are keyed by
``StudyKey``: the UID with the PatientID and its issuer, as Orthanc keys a study by PatientID
and StudyInstanceUID. Names and birth dates are checked when the study is indexed
(``dicom.one_patient``).
"""

from __future__ import annotations

import hashlib
import re

from pydantic import BaseModel, ConfigDict

from dicom import check_uid

_NAME = re.compile(r"^([0-9.]{1,64})_([0-9a-f]{12})$")


class StudyKey(BaseModel):
    """A study as the sandbox finds it: UID and patient together."""

    model_config = ConfigDict(frozen=True)

    study_uid: str
    patient_id: str = ""
    issuer: str = ""

    @property
    def patient_hash(self) -> str:
        """A short, non-reversible handle of the patient (folder and file names hold no PHI)."""
        text = f"{self.patient_id}\\{self.issuer}"
        return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:12]

    @property
    def name(self) -> str:
        """``<StudyInstanceUID>_<patient hash>``: the spool folder's and the state's name."""
        return f"{check_uid(self.study_uid)}_{self.patient_hash}"

    @staticmethod
    def parse_name(name: str) -> tuple[str, str] | None:
        """(StudyInstanceUID, patient hash) of a spool folder name, None if not one."""
        m = _NAME.match(name)
        return (m.group(1), m.group(2)) if m else None


def orthanc_id(*parts: str) -> str:
    """Orthanc's identifier of a resource: SHA-1 of ``PatientID|StudyInstanceUID|...`` in five
    groups of eight hex digits (patient: the ID alone; study: ID and study UID; and so on)."""
    h = hashlib.sha1("|".join(parts).encode("utf-8", "replace")).hexdigest()
    return "-".join(h[i : i + 8] for i in range(0, 40, 8))
