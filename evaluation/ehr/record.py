"""The EHR as one typed record: ``EHRContext``, a FHIR-R4-shaped subset parsed once from a Bundle.

It holds what the prompt's record block shows (the Patient's age and sex, the encounter's
reason, conditions, observations: vital signs, laboratory values and scores, medication), the
clinical notes (DocumentReference text), and, for the PHI gate and case sharing only, what
identifies someone: the Patient's names, identifiers and birth date, every person the record
names in any element (practitioners, related persons, contacts, the display of every Reference
to a person), every contact point and address, and the names of the organisations, places and
devices it holds.

A Reference names a person when its target is one (its ``type``, a ``Type/id`` reference, or the
fullUrl of an entry of the Bundle or a contained resource), or, when its target is unknown, when
the element's FHIR R4B definition lets it reference a person (``evaluation.ehr.spec``) or its
name is one of the usual person elements.

Every string is bounded, every list capped; a malformed resource or element is skipped and said
in ``issues``; a resource that does not validate as FHIR R4B is still read, and noted.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from evaluation.ehr import spec
from evaluation.ehr.values import (
    as_dict,
    as_list,
    codes,
    codes_of_all,
    concept,
    date,
    text,
    word_set,
)

MAX_NAME_CHARS = 200  # a name, display, contact point or address part
MAX_NOTE_CHARS = 20_000  # one clinical note
MAX_NOTES = 20
MAX_PERSONS = 1000
MAX_ADDRESSES = 200
MAX_TELECOM = 500
MAX_ISSUES = 50
MAX_NODES = 50_000  # elements visited looking for persons, contact points and addresses
MAX_DEPTH = 24
_SCORE_WORDS = ("nihss", "edss", "gcs", "glasgow", "mrs", "rankin", "moca", "mmse")

# FHIR resources that are people
PERSON_RESOURCES = frozenset({"Patient", "Practitioner", "PractitionerRole", "RelatedPerson", "Person"})  # fmt: skip
# Elements that reference a person in most resources: the rule when neither the target nor the
# element's definition is known.
PERSON_ELEMENTS = word_set(
    """author authenticator attester party performer participant individual actor requester
    recorder asserter informant enterer who onBehalfOf generalPractitioner verifier sender
    recipient interpreter resultsInterpreter referrer orderer agent collector practitioner
    attender consultant responsible responsibleParty careManager reporter witness contact
    signer custodianPerson"""
)


class _Value(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class HumanName(_Value):
    family: str = ""
    given: list[str] = Field(default_factory=list)
    text: str = ""


class Address(_Value):
    text: str = ""
    lines: list[str] = Field(default_factory=list)
    city: str = ""
    district: str = ""
    state: str = ""
    postal_code: str = ""


class Person(_Value):
    """One mention of a person: a HumanName, or the display of a Reference to a person."""

    role: str = ""  # Patient, Practitioner, RelatedPerson...; "" when only the element says
    where: str  # the element that names them: "Encounter.participant.individual"
    name: HumanName | None = None
    display: str = ""


class Patient(_Value):
    age: int | None = None  # whole years at the encounter (else the Bundle's timestamp)
    sex: str = ""
    # for the PHI gate only: never shown
    birth_date: dt.date | None = None
    names: list[HumanName] = Field(default_factory=list)
    identifiers: list[str] = Field(default_factory=list)


class Encounter(_Value):
    class_code: str = ""
    reasons: list[str] = Field(default_factory=list)
    start: dt.date | None = None


class Condition(_Value):
    name: str
    codes: list[str] = Field(default_factory=list)
    clinical_status: str = ""  # first code of clinicalStatus, "" when none

    @property
    def active(self) -> bool:
        return self.clinical_status in ("", "active", "recurrence", "relapse")


class Observation(_Value):
    name: str
    value: str
    flags: list[str] = Field(default_factory=list)  # interpretation codes (H, L...)
    section: str  # Vital signs, Scores, Laboratory, Other findings
    status: str = ""

    @property
    def valid(self) -> bool:
        return self.status not in ("entered-in-error", "cancelled")


class Medication(_Value):
    name: str
    status: str = ""

    @property
    def current(self) -> bool:
        return self.status not in ("entered-in-error", "not-taken", "stopped")


class ClinicalNote(_Value):
    """The text of a DocumentReference's text attachment."""

    text: str
    content_type: str = "text/plain"


class Entity(_Value):
    """A named organisation, place, device... of the record (for case sharing's scrub)."""

    kind: str
    name: str


class EHRContext(_Value):
    """The record, typed (see the module docstring). ``EHRContext.from_bundle`` builds it."""

    patients: list[Patient] = Field(default_factory=list)
    encounters: list[Encounter] = Field(default_factory=list)
    conditions: list[Condition] = Field(default_factory=list)
    observations: list[Observation] = Field(default_factory=list)
    medications: list[Medication] = Field(default_factory=list)
    notes: list[ClinicalNote] = Field(default_factory=list)
    at: dt.date | None = None  # the encounter's start, else the Bundle's timestamp
    # what identifies someone: for the PHI gate and case sharing, never shown
    persons: list[Person] = Field(default_factory=list)
    telecom: list[str] = Field(default_factory=list)
    addresses: list[Address] = Field(default_factory=list)
    entities: list[Entity] = Field(default_factory=list)
    issues: list[str] = Field(default_factory=list)  # what was skipped or does not validate

    @property
    def patient(self) -> Patient | None:
        return self.patients[0] if self.patients else None

    @property
    def note(self) -> str:
        """The first clinical note ("" when the record has none)."""
        return self.notes[0].text if self.notes else ""

    def text(self, max_chars: int | None = None) -> str:
        """The compact record block a prompt shows (``ehr_text``)."""
        return ehr_text(self, MAX_BLOCK_CHARS if max_chars is None else max_chars)

    @classmethod
    def from_bundle(cls, bundle: Any) -> EHRContext:
        """The record of a FHIR R4 Bundle (or a bare list of resources); never raises."""
        return _Reader(bundle).context()


# --------------------------------------------------------------------------- reading a bundle


def resources(bundle: Any) -> list[dict[str, Any]]:
    """The resources of a Bundle (or a bare list of resources), skipping anything malformed."""
    return [r for _, r in _entries(bundle)[0]]


def _entries(bundle: Any) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """(fullUrl, resource) of each entry, and what was skipped."""
    if isinstance(bundle, list):
        raw = [{"resource": r} for r in bundle]
    else:
        raw = as_list(as_dict(bundle).get("entry"))
        if bundle is not None and not isinstance(bundle, dict):
            return [], [f"the record is a {type(bundle).__name__}, not a FHIR Bundle"]
    skipped = []
    if isinstance(bundle, dict) and isinstance(bundle.get("entry"), list):
        if len(bundle["entry"]) > len(raw):
            skipped.append(f"{len(bundle['entry']) - len(raw)} entries past the first {len(raw)}")
    elif isinstance(bundle, dict) and "entry" in bundle:
        skipped.append("Bundle.entry is not a list")
    out = []
    for n, e in enumerate(raw):
        r = as_dict(as_dict(e).get("resource"))
        if isinstance(r.get("resourceType"), str):
            url = as_dict(e).get("fullUrl")
            out.append((url if isinstance(url, str) else "", r))
        else:
            skipped.append(f"entry {n}: not a resource")
    return out, skipped


def _human_name(node: dict[str, Any]) -> HumanName:
    return HumanName(
        family=text(node.get("family"), MAX_NAME_CHARS),
        given=[
            g
            for g in (
                text(x, MAX_NAME_CHARS)
                for x in as_list(node.get("given"), 20)
                if isinstance(x, str)
            )
            if g
        ],
        text=text(node.get("text"), MAX_NAME_CHARS),
    )


def _address(node: dict[str, Any]) -> Address:
    return Address(
        text=text(node.get("text"), MAX_NAME_CHARS),
        lines=[x for x in (text(v, MAX_NAME_CHARS) for v in as_list(node.get("line"), 10)) if x],
        city=text(node.get("city"), MAX_NAME_CHARS),
        district=text(node.get("district"), MAX_NAME_CHARS),
        state=text(node.get("state"), MAX_NAME_CHARS),
        postal_code=text(node.get("postalCode"), MAX_NAME_CHARS),
    )


def _target_type(ref: dict[str, Any], targets: dict[str, str], local: dict[str, str]) -> str:
    """The resource type a Reference points at, when it says or the record holds the target."""
    kind = ref.get("type")
    if isinstance(kind, str) and kind.strip("/"):
        return kind.rstrip("/").rsplit("/", 1)[-1][:60]
    target = ref.get("reference")
    if not isinstance(target, str):
        return ""
    if target in local or target in targets:
        return local.get(target) or targets[target]
    if not target.startswith(("urn:", "#")):
        parts = target.split("?")[0].rstrip("/").split("/")
        return parts[-2][:60] if len(parts) >= 2 else ""
    return ""


def _observation(r: dict[str, Any]) -> Observation | None:
    name = concept(r.get("code"))
    if not name:
        return None
    q = as_dict(r.get("valueQuantity"))
    if isinstance(q.get("value"), (int, float)) and not isinstance(q.get("value"), bool):
        unit = text(q.get("unit"), 20) or text(q.get("code"), 20)
        value = f"{q['value']:g}" + (f" {unit}" if unit else "")
    elif "valueString" in r:
        value = text(r.get("valueString"))
    elif "valueCodeableConcept" in r:
        value = concept(r.get("valueCodeableConcept"))
    elif isinstance(r.get("valueInteger"), int) and not isinstance(r.get("valueInteger"), bool):
        value = str(r["valueInteger"])
    elif "component" in r:  # blood pressure: systolic/diastolic components
        parts = []
        for comp in as_list(r.get("component"))[:4]:
            cq = as_dict(as_dict(comp).get("valueQuantity"))
            if isinstance(cq.get("value"), (int, float)) and not isinstance(cq.get("value"), bool):
                parts.append(f"{cq['value']:g}")
        value = "/".join(parts)
    else:
        return None
    if not value:
        return None
    flags = [f for f in (text(c, 10) for c in codes_of_all(r.get("interpretation"))) if f]
    categories = " ".join(
        c for cat in as_list(r.get("category")) for c in [*codes(cat), concept(cat)]
    ).lower()
    lname = name.lower()
    if any(w in lname for w in _SCORE_WORDS) or "survey" in categories:
        section = "Scores"
    elif "vital" in categories:
        section = "Vital signs"
    elif "laboratory" in categories:
        section = "Laboratory"
    else:
        section = "Other findings"
    return Observation(
        name=name, value=value, flags=flags, section=section, status=text(r.get("status"), 20)
    )


def _notes(doc: dict[str, Any]) -> list[ClinicalNote]:
    out = []
    for content in as_list(doc.get("content")):
        att = as_dict(as_dict(content).get("attachment"))
        kind = str(att.get("contentType", "text/plain"))[:100]
        if not kind.startswith("text/"):
            continue
        data = att.get("data")
        if isinstance(data, str) and len(data) < MAX_NOTE_CHARS * 2:
            try:
                raw = base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError):
                continue
            out.append(
                ClinicalNote(
                    text=raw.decode("utf-8", "replace")[:MAX_NOTE_CHARS], content_type=kind
                )
            )
    return out


class _Reader:
    """One pass over a Bundle, building an EHRContext."""

    def __init__(self, bundle: Any) -> None:
        self.bundle = bundle
        self.entries, self.issues = _entries(bundle)
        raw = bundle if isinstance(bundle, list) else as_list(as_dict(bundle).get("entry"))
        # entries not read as a resource: who they name is still named
        self.malformed = [
            e
            for e in raw
            if isinstance(e, dict)
            and not isinstance(
                (e if isinstance(bundle, list) else as_dict(e.get("resource"))).get("resourceType"),
                str,
            )
        ]
        self.targets: dict[str, str] = {}  # fullUrl or Type/id -> resource type
        for url, r in self.entries:
            kind = r["resourceType"][:60]
            if url:
                self.targets[url] = kind
            if isinstance(r.get("id"), str):
                self.targets[f"{kind}/{r['id']}"] = kind
        self.persons: list[Person] = []
        self.telecom: list[str] = []
        self.addresses: list[Address] = []
        self.budget = MAX_NODES
        self.persons_cut = False

    def issue(self, what: str) -> None:
        if len(self.issues) < MAX_ISSUES:
            self.issues.append(what[: spec.MAX_PROBLEM_CHARS])

    def context(self) -> EHRContext:
        of: dict[str, list[dict[str, Any]]] = {}
        for n, (_, r) in enumerate(self.entries):
            of.setdefault(r["resourceType"], []).append(r)
            self.validate(n, r)
        at = None
        for enc in of.get("Encounter", []):
            at = date(as_dict(enc.get("period")).get("start"))
            if at:
                break
        at = at or date(self.bundle.get("timestamp") if isinstance(self.bundle, dict) else None)
        patients = [self.patient(p, at) for p in of.get("Patient", [])]
        encounters = [
            Encounter(
                class_code=text(as_dict(enc.get("class")).get("code"), 20),
                reasons=[
                    c for c in (concept(rc) for rc in as_list(enc.get("reasonCode"), 40)) if c
                ],
                start=date(as_dict(enc.get("period")).get("start")),
            )
            for enc in of.get("Encounter", [])
        ]
        conditions = []
        for cond in of.get("Condition", []):
            name = concept(cond.get("code"))
            if name:
                status = codes(cond.get("clinicalStatus"))
                conditions.append(
                    Condition(
                        name=name,
                        codes=codes(cond.get("code")),
                        clinical_status=status[0] if status else "",
                    )
                )
        observations = [o for o in (_observation(r) for r in of.get("Observation", [])) if o]
        medications = [
            Medication(name=name, status=text(med.get("status"), 20))
            for med in of.get("MedicationStatement", [])
            for name in [concept(med.get("medicationCodeableConcept"))]
            if name
        ]
        notes = [n for doc in of.get("DocumentReference", []) for n in _notes(doc)][:MAX_NOTES]
        entities = [
            Entity(kind=r["resourceType"][:60], name=text(r["name"], MAX_NAME_CHARS))
            for _, r in self.entries
            if r["resourceType"] not in PERSON_RESOURCES and isinstance(r.get("name"), str)
        ]
        for _, r in self.entries:
            self.walk(r, r["resourceType"][:60], (), self.contained(r), 1)
        for r in self.malformed:  # not read as a resource, but who it names is still named
            self.walk(r, "", (), {}, 1)
        if self.budget < 0:
            self.issue(
                f"persons, contact points and addresses read from the first {MAX_NODES} elements"
            )
        return EHRContext(
            patients=patients,
            encounters=encounters,
            conditions=conditions,
            observations=observations,
            medications=medications,
            notes=notes,
            at=at,
            persons=self.persons,
            telecom=[t for t in dict.fromkeys(self.telecom) if t][:MAX_TELECOM],
            addresses=list({a.model_dump_json(): a for a in self.addresses}.values())[
                :MAX_ADDRESSES
            ],
            entities=[e for e in entities if e.name],
            issues=self.issues,
        )

    def validate(self, n: int, r: dict[str, Any]) -> None:
        try:
            dumped = json.dumps(r, default=str, sort_keys=True)
        except (ValueError, TypeError, RecursionError):
            self.issue(f"{r['resourceType'][:40]} (entry {n}): not JSON")
            return
        problem = spec.validation_problem(r, dumped)
        if problem:
            self.issue(f"{r['resourceType'][:40]} (entry {n}): {problem}")

    def patient(self, p: dict[str, Any], at: dt.date | None) -> Patient:
        born = date(p.get("birthDate"))
        age = None
        if born is not None and at is not None:
            years = at.year - born.year - ((at.month, at.day) < (born.month, born.day))
            age = years if 0 <= years < 130 else None
        return Patient(
            age=age,
            sex=text(p.get("gender"), 20),
            birth_date=born,
            names=[_human_name(n) for n in as_list(p.get("name"), 20) if isinstance(n, dict)],
            identifiers=[
                i
                for i in (
                    text(as_dict(x).get("value"), MAX_NAME_CHARS)
                    for x in as_list(p.get("identifier"), 50)
                )
                if i
            ],
        )

    def contained(self, r: dict[str, Any]) -> dict[str, str]:
        """'#id' -> resource type of a resource's contained resources."""
        out = {}
        for c in as_list(r.get("contained"), 100):
            c = as_dict(c)
            if isinstance(c.get("id"), str) and isinstance(c.get("resourceType"), str):
                out["#" + c["id"]] = c["resourceType"][:60]
        return out

    def walk(
        self, node: Any, kind: str, path: tuple[str, ...], local: dict[str, str], depth: int
    ) -> None:
        """Persons, contact points and addresses in ``node`` (an element at ``kind.path``)."""
        self.budget -= 1
        if self.budget < 0 or depth > MAX_DEPTH:
            return
        if isinstance(node, list):
            for item in node[:500]:
                self.walk(item, kind, path, local, depth + 1)
            return
        if not isinstance(node, dict):
            return
        key = path[-1] if path else ""
        where = ".".join((kind, *path))[:200]
        if (key == "name" or "family" in node or "given" in node) and "coding" not in node:
            name = _human_name(node)
            if name.family or name.given or name.text:
                self.person(
                    kind if kind in PERSON_RESOURCES and len(path) == 1 else "", where, name=name
                )
        if isinstance(node.get("display"), str) and "coding" not in node and "code" not in node:
            target = _target_type(node, self.targets, local)
            if target:
                is_person = target in PERSON_RESOURCES
            else:
                allowed = spec.reference_types(kind, path) if path else None
                is_person = key in PERSON_ELEMENTS or bool(allowed and allowed & PERSON_RESOURCES)
            if is_person:
                self.person(target, where, display=text(node["display"], MAX_NAME_CHARS))
        if key == "telecom" and isinstance(node.get("value"), str):
            self.telecom.append(text(node["value"], MAX_NAME_CHARS))
        if key == "address":
            self.addresses.append(_address(node))
        for k, v in node.items():
            if isinstance(v, dict | list):
                if isinstance(v, dict) and isinstance(v.get("resourceType"), str):
                    self.walk(v, v["resourceType"][:60], (), local, depth + 1)  # contained
                elif k == "contained" and isinstance(v, list):
                    for c in v[:100]:
                        c = as_dict(c)
                        ckind = c.get("resourceType")
                        if isinstance(ckind, str):
                            self.walk(c, ckind[:60], (), local, depth + 2)
                else:
                    self.walk(v, kind, (*path, str(k)[:60]), local, depth + 1)

    def person(
        self, role: str, where: str, name: HumanName | None = None, display: str = ""
    ) -> None:
        if len(self.persons) < MAX_PERSONS:
            self.persons.append(Person(role=role, where=where, name=name, display=display))
        elif not self.persons_cut:
            self.persons_cut = True
            self.issue(f"persons past the first {MAX_PERSONS} not read")


# --------------------------------------------------------------------------- the record block

MAX_ITEMS = 40  # per section
MAX_BLOCK_CHARS = 4000
_SECTIONS = ("Conditions", "Vital signs", "Scores", "Laboratory", "Other findings", "Medication")


def _encounter_class(code: str) -> str:
    return {"EMER": "emergency", "AMB": "outpatient", "IMP": "inpatient"}.get(code, code.lower())


def ehr_text(record: EHRContext | None, max_chars: int = MAX_BLOCK_CHARS) -> str:
    """The compact record block a prompt shows: what a neurologist reads first (age and sex, the
    reason for the encounter, active conditions, vital signs, laboratory values and scores,
    current medication), never names, identifiers, addresses, telecom or absolute dates (age is
    computed at the encounter); empty when there is nothing to show."""
    if record is None:
        return ""
    lines: list[str] = []
    patient = record.patient
    if patient is not None:
        bits = []
        if patient.age is not None:
            bits.append(f"{patient.age} years" if patient.age < 90 else "90 years or older")
        if patient.sex:
            bits.append(patient.sex)
        if bits:
            lines.append("Patient: " + ", ".join(bits))
    reasons = [
        reason + (f" ({_encounter_class(enc.class_code)})" if enc.class_code else "")
        for enc in record.encounters
        for reason in enc.reasons
    ]
    if reasons:
        lines.append("Encounter reason: " + "; ".join(reasons[:5]))
    sections: dict[str, list[str]] = {}
    for cond in record.conditions:
        if cond.active:
            icd = [c for c in cond.codes if c != cond.name]
            sections.setdefault("Conditions", []).append(
                cond.name + (f" [{icd[0]}]" if icd else "")
            )
    for obs in record.observations:
        if obs.valid:
            flag = f" ({', '.join(obs.flags)})" if obs.flags else ""
            sections.setdefault(obs.section, []).append(text(f"{obs.name}: {obs.value}{flag}"))
    for med in record.medications:
        if med.current:
            sections.setdefault("Medication", []).append(med.name)
    for key in _SECTIONS:
        items = list(dict.fromkeys(sections.get(key, [])))
        if not items:
            continue
        shown = items[:MAX_ITEMS]
        more = f"; and {len(items) - len(shown)} more" if len(items) > len(shown) else ""
        lines.append(f"{key}: " + "; ".join(shown) + more)
    block = "\n".join(lines)
    if len(block) > max_chars:
        block = block[: max_chars - 24].rsplit("\n", 1)[0] + "\n[record truncated]"
    return block
