"""A benchmark case prepared for another site: its record, note and ground truth de-identified,
and written as a one-case manifest (the hospital manifest format, ``evaluation.datasets``) that
the other site loads like any of its own (``neurosandbox eval --suite BUNDLE/manifest.yaml``).

The study's DICOM is de-identified by ``dicom`` (PS3.15 basic profile) and handed in as a
folder; this module treats the rest of the case alike:

* the FHIR record: the Patient keeps gender and a birth date that gives the same age in whole
  years at the encounter (ages over 89 as 90), nothing else; practitioners, related persons,
  organisations, locations and devices are removed whole, and so are identifiers, telecom,
  addresses, photos, contacts, narratives, extensions and resource metadata everywhere;
  references keep only a remapped target inside the bundle; every date moves by the same number
  of days as the images (or is removed with them); text attachments (the note as a
  DocumentReference) are decoded, scrubbed and encoded again, other attachments dropped; every
  remaining free-text string goes through the PHI gate's scrub;
* the note, question and turn texts, and the ground truth's rationale and key findings go
  through the PHI gate's scrub (:func:`evaluation.phi.scrub_text`) with every identifying term
  known: the record's own (``PHIGate.terms_for``: every person it names, read from the typed
  record ``evaluation.ehr.EHRContext``), the names of the organisations, places and devices it
  holds (``EHRContext.entities``), and the identifying strings of the study's source
  headers given by the caller;
* the ground truth loses its list of planted identifiers (they are identifiers).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import hmac
import json
import re
import uuid
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field

from evaluation.case import Case, Provenance
from evaluation.datasets import DatasetSpec, detect_kind, load_dataset
from evaluation.datasets.suite import (
    inside_folder,
    load_case_dir,
    manifest_case,
    raw_label,
    read_manifest,
    suite_case_dirs,
)
from evaluation.ehr import EHRContext, long_enough, resources
from evaluation.errors import DatasetError
from evaluation.phi import PHIGate, scrub_text

MANIFEST_FILE = "manifest.yaml"
STUDY_FOLDER = "dicom"

# Resources that describe a person or a place other than the patient: removed whole.
_DROPPED_TYPES = frozenset(
    {
        "Practitioner",
        "PractitionerRole",
        "RelatedPerson",
        "Person",
        "Organization",
        "Location",
        "Device",
        "HealthcareService",
        "Endpoint",
        "Group",
        "Coverage",
        "Account",
        "Provenance",
        "AuditEvent",
        "Consent",
    }
)
# Keys removed wherever they appear.
_DROPPED_KEYS = frozenset(
    {
        "identifier",
        "telecom",
        "address",
        "photo",
        "contact",
        "meta",
        "extension",
        "modifierExtension",
        "implicitRules",
        "generalPractitioner",
        "managingOrganization",
        "link",
        "signature",
    }
)
_PATIENT_KEPT = frozenset(
    {"resourceType", "id", "gender", "birthDate", "active", "deceasedBoolean"}
)
# Strings kept verbatim: codes, systems, units, statuses (a scrub could break a code).
_VERBATIM_KEYS = frozenset(
    {"resourceType", "system", "code", "unit", "status", "use", "gender", "contentType", "version"}
)
_DATE_KEYS = frozenset(
    {"date", "start", "end", "issued", "timestamp", "recorded", "authoredOn", "created", "creation"}
)
_FULL_DATE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})(T[0-9:.]+(?:Z|[+-]\d{2}:\d{2})?)?$")
_PARTIAL_DATE = re.compile(r"^\d{4}(-\d{2})?$")
_MAX_DEPTH = 64
_OLDEST = 90  # ages over 89 are one group (HIPAA safe harbour)


class SharedCase(BaseModel):
    """A case as it may leave for another site, and what was done to it.

    ``terms`` are the identifying strings it was scrubbed with, for the caller to check what is
    written; excluded from every dump.
    """

    case: Case
    record_removed: dict[str, int] = Field(default_factory=dict)  # what, how many
    redactions: dict[str, int] = Field(default_factory=dict)  # scrub_text counts, all texts
    dates: str = "shifted"  # shifted (with the images), removed, or none (no record)
    terms: list[str] = Field(default_factory=list, exclude=True, repr=False)


# --------------------------------------------------------------------------- finding a case


def find_case(path: Path, case_id: str, cache_dir: Path, kind: str = "auto") -> Case:
    """One case of a suite folder or a case manifest, as stored: its study is not rendered, and
    its ``study_path`` is absolute. Raises DatasetError naming what is wrong."""
    if not path.exists():
        raise DatasetError(f"dataset not found: {path}")
    kind = detect_kind(path) if kind == "auto" else kind
    ids: list[str] = []
    if kind == "suite":
        for folder in suite_case_dirs(path):
            try:
                case, _ = load_case_dir(folder, cache_dir, render=False)
            except DatasetError:
                continue  # a broken case elsewhere in the suite is not this one
            ids.append(case.case_id)
            if case.case_id == case_id:
                if case.study_path:
                    case.study_path = str(inside_folder(folder, case.study_path, "study_path"))
                return case
    elif kind == "manifest":
        data = read_manifest(path)
        if not isinstance(data, dict) or not isinstance(data.get("cases"), list):
            raise DatasetError(f"{path}: a manifest is a mapping with a 'cases' list")
        for n, entry in enumerate(data["cases"]):
            if not isinstance(entry, dict):
                continue
            entry_id = raw_label(entry, n)
            ids.append(entry_id)
            if entry_id == case_id:
                case = manifest_case(entry, path.parent, cache_dir, n)
                case.root = str(path.parent)
                return case
    else:
        raise DatasetError(
            f"{path} is a {kind} dataset: a case to share comes from a suite folder or a case "
            "manifest (cases with a DICOM study)"
        )
    shown = ", ".join(ids[:10]) + (" ..." if len(ids) > 10 else "")
    raise DatasetError(f"{path}: no case {case_id!r} (its cases: {shown or 'none'})")


# --------------------------------------------------------------------------- de-identifying


class _Scrubber:
    """The PHI gate's scrub with one term list, counting every redaction."""

    def __init__(self, terms: list[str]) -> None:
        self.terms = terms
        self.counts: dict[str, int] = {}

    def __call__(self, text: str) -> str:
        if not text:
            return text
        out, counts = scrub_text(text, self.terms)
        for key, n in counts.items():
            self.counts[key] = self.counts.get(key, 0) + n
        return out


def _dropped_names(record: EHRContext) -> list[str]:
    """The names of the organisations, places and devices the record holds (the record's people
    are already among ``PHIGate.terms_for``)."""
    return [e.name for e in record.entities if e.kind in _DROPPED_TYPES]


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _new_id(salt: str, value: str) -> str:
    """A stable UUID for a record id under the export's secret (ids may name a server)."""
    digest = hmac.new(salt.encode("utf-8"), b"fhir-id\0" + value.encode("utf-8"), hashlib.sha256)
    return str(uuid.UUID(bytes=digest.digest()[:16], version=4))


def _shift_date(value: str, days: int | None) -> str | None:
    """A FHIR date/dateTime moved by `days` (None: removed); None when it cannot be."""
    match = _FULL_DATE.match(value)
    if days is None or not match:
        return None
    try:
        day = dt.date(int(match[1]), int(match[2]), int(match[3])) + dt.timedelta(days=days)
    except (ValueError, OverflowError):
        return None
    return day.isoformat() + (match[4] or "")


class _RecordCleaner:
    """One pass over a FHIR Bundle (see the module docstring)."""

    def __init__(
        self, bundle: Any, record: EHRContext, scrub: _Scrubber, days: int | None, salt: str
    ) -> None:
        self.record = record
        self.scrub = scrub
        self.days = days
        self.salt = salt
        self.removed: dict[str, int] = {}
        self.targets: dict[str, str | None] = {}  # original reference -> new (None: dropped)
        for entry in _list(_dict(bundle).get("entry")):
            res = _dict(_dict(entry).get("resource"))
            kind = res.get("resourceType")
            rid = res.get("id")
            url = _dict(entry).get("fullUrl")
            key = str(url or f"{kind}/{rid}")
            new = None if kind in _DROPPED_TYPES else "urn:uuid:" + _new_id(salt, key)
            for ref in (url, f"{kind}/{rid}" if kind and rid else None):
                if isinstance(ref, str):
                    self.targets[ref] = new

    def count(self, what: str, n: int = 1) -> None:
        self.removed[what] = self.removed.get(what, 0) + n

    def bundle(self, bundle: Any) -> dict[str, Any]:
        source = _dict(bundle)
        patient = self.record.patient
        age = patient.age if patient else None
        real_birth = patient.birth_date if patient else None
        out: dict[str, Any] = {"resourceType": source.get("resourceType", "Bundle")}
        if isinstance(source.get("id"), str):
            out["id"] = _new_id(self.salt, "bundle:" + source["id"])
        if isinstance(source.get("type"), str):
            out["type"] = source["type"]
        if isinstance(source.get("timestamp"), str):
            stamp = _shift_date(source["timestamp"], self.days)
            if stamp:
                out["timestamp"] = stamp
        for key in sorted(set(source) - {"resourceType", "id", "type", "timestamp", "entry"}):
            self.count(f"Bundle.{key}")
        entries = []
        for entry in _list(source.get("entry")):
            res = _dict(_dict(entry).get("resource"))
            kind = str(res.get("resourceType") or "")
            if not kind or kind in _DROPPED_TYPES:
                self.count(kind or "malformed entry")
                continue
            url = _dict(entry).get("fullUrl")
            key = str(url or f"{kind}/{res.get('id')}")
            clean = self.patient(res) if kind == "Patient" else self.value(res, 0, "")
            clean["id"] = _new_id(self.salt, key)
            entries.append({"fullUrl": f"urn:uuid:{clean['id']}", "resource": clean})
        if isinstance(source.get("entry"), list):
            out["entry"] = entries
        self._birth_date(out, age, real_birth)
        return out

    def patient(self, res: dict[str, Any]) -> dict[str, Any]:
        for key in sorted(set(res) - (_PATIENT_KEPT - {"birthDate"})):
            self.count(f"Patient.{key}")  # a birth date comes back as its age only
        return {
            k: res[k] for k in ("resourceType", "gender", "active", "deceasedBoolean") if k in res
        }

    def _birth_date(self, bundle: dict[str, Any], age: int | None, real: dt.date | None) -> None:
        """The Patient's birth date: one giving `age` at the (shifted) encounter, never the
        real one (a day earlier when the anniversary falls on it)."""
        patients = [r for r in resources(bundle) if r.get("resourceType") == "Patient"]
        day = EHRContext.from_bundle(bundle).at  # the shifted encounter (else timestamp)
        if not patients or age is None or day is None:
            return
        years = min(age, _OLDEST)
        try:
            born = day.replace(year=day.year - years)
        except ValueError:  # 29 February
            born = day.replace(year=day.year - years, day=28)
        if real == born:
            born -= dt.timedelta(days=1)
        patients[0]["birthDate"] = born.isoformat()

    def value(self, node: Any, depth: int, key: str) -> Any:
        if depth > _MAX_DEPTH:
            self.count("nested too deeply")
            return None
        if isinstance(node, dict):
            return self.mapping(node, depth)
        if isinstance(node, list):
            items = [self.value(v, depth + 1, key) for v in node]
            return [v for v in items if v not in (None, {}, [])]
        if isinstance(node, str):
            return self.string(node, key)
        return node

    def mapping(self, node: dict[str, Any], depth: int) -> dict[str, Any] | None:
        if "reference" in node or ("display" in node and not {"code", "system"} & node.keys()):
            return self.reference(node)
        out: dict[str, Any] = {}
        if "contentType" in node or "data" in node:
            node = self.attachment(node)
        for key, value in node.items():
            if key in _DROPPED_KEYS:
                self.count(key)
                continue
            if key == "text" and isinstance(value, dict):  # a Narrative: free XHTML
                self.count("narrative")
                continue
            clean = self.value(value, depth + 1, key)
            if clean is not None and clean != {} and clean != []:
                out[key] = clean
        return out

    def reference(self, node: dict[str, Any]) -> dict[str, Any] | None:
        target = node.get("reference")
        if "display" in node:
            self.count("reference display")
        if not isinstance(target, str):
            return None
        if target.startswith("#"):
            return {"reference": target}
        new = self.targets.get(target)
        if new is None:
            self.count("reference outside the record or to a person")
            return None
        return {"reference": new}

    def attachment(self, node: dict[str, Any]) -> dict[str, Any]:
        node = dict(node)
        for key in ("url", "hash", "size"):
            if node.pop(key, None) is not None:
                self.count(f"attachment {key}")
        data = node.get("data")
        if not isinstance(data, str):
            return node
        text_type = str(node.get("contentType", "text/plain")).startswith("text/")
        try:
            raw = base64.b64decode(data, validate=True)
            text = raw.decode("utf-8") if text_type else None
        except (binascii.Error, ValueError):
            text = None
        if text is None:
            node.pop("data")
            self.count("attachment data (not text)")
            return node
        node["data"] = base64.b64encode(self.scrub(text).encode("utf-8")).decode("ascii")
        return node

    def string(self, value: str, key: str) -> str | None:
        if _FULL_DATE.match(value):
            shifted = _shift_date(value, self.days)
            if shifted is None:
                self.count("date")
            return shifted
        if _PARTIAL_DATE.match(value) and (key in _DATE_KEYS or key.endswith(("Date", "DateTime"))):
            self.count("partial date")  # a year or month cannot be shifted faithfully
            return None
        if key in _VERBATIM_KEYS:
            return value
        return self.scrub(value)


def share_case(
    case: Case,
    *,
    case_id: str,
    patient_id: str,
    terms: list[str],
    date_shift_days: int | None,
    salt: str,
) -> SharedCase:
    """The case de-identified for another site (see the module docstring).

    ``terms``: identifying strings from elsewhere (the study's source headers); ``patient_id``:
    the pseudonym the images carry; ``date_shift_days``: the images' date shift, or None when
    their dates were removed (then the record's are too).
    """
    record = EHRContext.from_bundle(case.ehr) if case.ehr is not None else None
    known = list(PHIGate().terms_for(case, record))
    if record is not None:
        known.extend(_dropped_names(record))
    known.extend(terms)
    unique = sorted(
        {t.strip() for t in known if long_enough(t.strip())}, key=lambda t: (-len(t), t)
    )
    scrub = _Scrubber(unique)
    removed: dict[str, int] = {}
    ehr: dict[str, Any] | None = None
    if case.ehr is not None and record is not None:
        cleaner = _RecordCleaner(case.ehr, record, scrub, date_shift_days, salt)
        ehr = cleaner.bundle(case.ehr)
        removed = cleaner.removed
    gt = None
    if case.ground_truth is not None:
        gt = case.ground_truth.model_copy(deep=True)
        if gt.phi:
            removed["ground_truth.phi"] = len(gt.phi)
        gt.phi = []
        gt.rationale = scrub(gt.rationale)
        gt.key_findings = [scrub(k) for k in gt.key_findings]
    questions = [q.model_copy(update={"text": scrub(q.text)}) for q in case.questions]
    turns = [
        t.model_copy(update={"reveal_text": scrub(t.reveal_text), "question": scrub(t.question)})
        for t in case.turns
    ]
    shared = Case(
        case_id=case_id,
        patient_id=patient_id or None,
        study_path=STUDY_FOLDER,
        ehr=ehr,
        note=scrub(case.note),
        ground_truth=gt,
        tasks=list(case.tasks),
        questions=questions,
        turns=turns,
        provenance=Provenance(source="folder"),
    )
    dates = "none" if ehr is None else ("shifted" if date_shift_days is not None else "removed")
    return SharedCase(
        case=shared, record_removed=removed, redactions=scrub.counts, dates=dates, terms=unique
    )


# --------------------------------------------------------------------------- writing, loading


def write_case_manifest(folder: Path, shared: SharedCase) -> Path:
    """Write ``manifest.yaml`` (one case; record in ``ehr.json``, note in ``note.txt``) into
    `folder`, where the de-identified study already is (``dicom/``). Returns the manifest."""
    case = shared.case
    entry: dict[str, Any] = {"case_id": case.case_id}
    if case.patient_id:
        entry["patient_id"] = case.patient_id
    entry["study"] = STUDY_FOLDER
    if case.ehr is not None:
        (folder / "ehr.json").write_text(
            json.dumps(case.ehr, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        entry["ehr"] = "ehr.json"
    if case.note:
        (folder / "note.txt").write_text(case.note, encoding="utf-8")
        entry["note"] = "note.txt"
    if case.ground_truth is not None:
        entry["ground_truth"] = case.ground_truth.model_dump(mode="json")
    if case.tasks:
        entry["tasks"] = [t.value for t in case.tasks]
    if case.questions:
        entry["questions"] = [q.model_dump(mode="json") for q in case.questions]
    if case.turns:
        entry["turns"] = [t.model_dump(mode="json") for t in case.turns]
    path = folder / MANIFEST_FILE
    text = yaml.safe_dump(
        {"name": case.case_id, "cases": [entry]}, sort_keys=False, allow_unicode=True, width=1 << 30
    )
    path.write_text(text, encoding="utf-8")
    return path


def load_shared_case(manifest: Path, expected: SharedCase, cache_dir: Path) -> Case:
    """Load a written manifest as the other site will (its study rendered into `cache_dir`), and
    check it is the case that was written. Raises DatasetError saying what differs."""
    dataset = load_dataset(DatasetSpec(path=str(manifest), kind="manifest"), cache_dir)
    if len(dataset.cases) != 1:
        raise DatasetError(f"{manifest}: {len(dataset.cases)} cases load, expected 1")
    loaded = dataset.cases[0]
    want = expected.case
    problems = [
        what
        for what, same in (
            ("case id", loaded.case_id == want.case_id),
            ("patient id", loaded.patient_id == want.patient_id),
            ("record", loaded.ehr == want.ehr),
            ("note", loaded.note == want.note),
            ("ground truth", loaded.ground_truth == want.ground_truth),
            ("tasks", loaded.tasks == want.tasks),
            ("questions", loaded.questions == want.questions),
            ("turns", loaded.turns == want.turns),
        )
        if not same
    ]
    if problems:
        raise DatasetError(f"{manifest}: loads with a different " + ", ".join(problems))
    if not loaded.images:
        raise DatasetError(f"{manifest}: its study renders no image")
    return loaded
