"""The record as a hospital would export it: a FHIR R4 Bundle and a free-text clinical note.

The Bundle (type collection) holds Patient, Encounter, Conditions, Observations (vital signs,
laboratory, scores), MedicationStatements (an explicit "no known medications" statement when the
patient takes none) and a DocumentReference carrying the note. The note repeats identifiers
the way real notes do; every planted identifier is returned as PlantedPHI.
"""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

import numpy as np

from evaluation.case import PlantedPHI
from evaluation.datasets.phantoms.clinical import Clinical, Obs
from evaluation.datasets.phantoms.dicomio import uid
from evaluation.datasets.phantoms.identity import Identity

_TYPOS = (
    ("weakness", "weaknes"),
    ("headache", "headahce"),
    ("patient", "pateint"),
    ("history", "hx"),
)


def _rid(seed: int, case_id: str, kind: str, n: int = 0) -> str:
    """A stable FHIR resource id (uuid-shaped digits from the UID hash)."""
    digits = uid(seed, case_id, "fhir", kind, n).split(".")[-1].rjust(32, "0")[-32:]
    h = format(int(digits) % (1 << 128), "032x")
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_NO_KNOWN_MEDICATIONS: dict[str, Any] = {
    "coding": [
        {
            "system": "http://hl7.org/fhir/uv/ips/CodeSystem/absent-unknown-uv-ips",
            "code": "no-known-medications",
            "display": "No known medications",
        }
    ],
    "text": "No known medications",
}


def _obs(o: Obs, pid: str, rid: str, when: str) -> dict[str, Any]:
    coding: dict[str, Any] = {"text": o.name}
    if o.loinc:
        coding["coding"] = [{"system": "http://loinc.org", "code": o.loinc, "display": o.name}]
    res: dict[str, Any] = {
        "resourceType": "Observation",
        "id": rid,
        "status": "final",
        "category": [
            {
                "coding": [
                    {
                        "system": "http://terminology.hl7.org/CodeSystem/observation-category",
                        "code": o.category,
                    }
                ]
            }
        ],
        "code": coding,
        "subject": {"reference": f"urn:uuid:{pid}"},
        "effectiveDateTime": when,
    }
    if isinstance(o.value, str):
        res["valueString"] = o.value
    else:
        q: dict[str, Any] = {"value": o.value}
        if o.unit:
            q |= {"unit": o.unit, "system": "http://unitsofmeasure.org", "code": o.unit}
        res["valueQuantity"] = q
    if o.interpretation:
        res["interpretation"] = [
            {
                "coding": [
                    {
                        "system": "http://terminology.hl7.org/CodeSystem/v3-ObservationInterpretation",
                        "code": o.interpretation,
                    }
                ]
            }
        ]
    return res


def _iso(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S+00:00")


# How clinicians write units and names in notes (the Bundle keeps UCUM codes and full names).
_UNIT = {"Cel": " °C", "mm[Hg]": " mmHg", "10*9/L": " x10^9/L", "/min": "/min", "%": "%", "": ""}
_SHORT = {
    "Body temperature": "T",
    "Heart rate": "HR",
    "Systolic blood pressure": "SBP",
    "Diastolic blood pressure": "DBP",
    "Oxygen saturation (pulse oximetry)": "SpO2",
    "C reactive protein": "CRP",
    "Leukocytes": "WCC",
    "Hemoglobin": "Hb",
    "NIH Stroke Scale total score": "NIHSS",
    "Glasgow coma score total": "GCS",
}


def note_text(idn: Identity, c: Clinical, when: dt.datetime, rng: np.random.Generator) -> str:
    """The admission note, with identifiers in its header the way real notes carry them."""
    dob = idn.birth_date.strftime("%d/%m/%Y")
    doctor = idn.referring.split("^")
    sex_word = "woman" if c.sex == "F" else "man"
    lines = [
        "ADMISSION NOTE" if c.encounter_class == "EMER" else "CLINIC LETTER",
        f"Patient: {idn.note_name}    DOB: {dob}    MRN: {idn.mrn}    {idn.other_id}",
        f"Address: {idn.address}    Tel: {idn.phone}",
        f"Date: {when.strftime('%d/%m/%Y %H:%M')}",
        "",
        f"PC: {c.age} y/o {sex_word} with {c.complaint}.",
        "HPC: " + " ".join(c.history),
        "PMH: " + ("; ".join(t for t, _ in c.conditions) or "nil of note") + ".",
        "DH: " + ("; ".join(c.medications) or "no regular medication") + ". NKDA.",
        "O/E: " + c.exam,
    ]
    shown = [
        o for o in c.observations if not isinstance(o.value, str) or o.category != "laboratory"
    ]
    obs = ", ".join(
        f"{_SHORT.get(o.name, o.name)} {o.value:g}{_UNIT.get(o.unit or '', ' ' + (o.unit or ''))}".rstrip()
        if not isinstance(o.value, str)
        else f"{o.name}: {o.value}"
        for o in shown
    )
    if obs:
        lines.append("Obs/bloods: " + obs + ".")
    lines += [
        "Plan: imaging as per protocol; review with results.",
        f"{doctor[1][:1]}. {doctor[0]} ({'ED registrar' if c.encounter_class == 'EMER' else 'neurology'})",
    ]
    text = "\n".join(lines) + "\n"
    # A busy clinician's note: now and then one misspelt word.
    if rng.random() < 0.5:
        right, wrong = _TYPOS[int(rng.integers(len(_TYPOS)))]
        head, sep, tail = text.partition("PC: ")
        text = head + sep + tail.replace(right, wrong, 1)
    return text


def build_bundle(
    idn: Identity, c: Clinical, when: dt.datetime, note: str, seed: int, case_id: str
) -> tuple[dict[str, Any], list[PlantedPHI]]:
    """A FHIR R4 collection Bundle for the case and the identifiers it plants."""
    pid = _rid(seed, case_id, "patient")
    eid = _rid(seed, case_id, "encounter")
    t = _iso(when - dt.timedelta(minutes=45))
    patient = {
        "resourceType": "Patient",
        "id": pid,
        "identifier": [
            {"system": "urn:oid:2.25.1000.1", "value": idn.mrn, "type": {"text": "MRN"}},
            {
                "system": "https://fhir.nhs.uk/Id/nhs-number",
                "value": idn.other_id.replace("NHS ", "").replace(" ", ""),
            },
        ],
        "name": [
            {"use": "official", "family": idn.family, "given": [idn.given], "text": idn.note_name}
        ],
        "gender": "female" if idn.sex == "F" else "male",
        "birthDate": idn.birth_date.isoformat(),
        "telecom": [{"system": "phone", "value": idn.phone, "use": "home"}],
        "address": [{"text": idn.address}],
    }
    entries: list[dict[str, Any]] = [patient]
    entries.append(
        {
            "resourceType": "Encounter",
            "id": eid,
            "status": "in-progress",
            "class": {
                "system": "http://terminology.hl7.org/CodeSystem/v3-ActCode",
                "code": c.encounter_class,
            },
            "subject": {"reference": f"urn:uuid:{pid}"},
            "period": {"start": t},
            "reasonCode": [{"text": c.reason}],
        }
    )
    for n, (text, code) in enumerate(c.conditions):
        cond: dict[str, Any] = {
            "resourceType": "Condition",
            "id": _rid(seed, case_id, "condition", n),
            "clinicalStatus": {
                "coding": [
                    {
                        "system": "http://terminology.hl7.org/CodeSystem/condition-clinical",
                        "code": "active",
                    }
                ]
            },
            "code": {"text": text},
            "subject": {"reference": f"urn:uuid:{pid}"},
        }
        if code:
            cond["code"]["coding"] = [
                {"system": "http://hl7.org/fhir/sid/icd-10", "code": code, "display": text}
            ]
        entries.append(cond)
    for n, o in enumerate(c.observations):
        entries.append(_obs(o, pid, _rid(seed, case_id, "observation", n), t))
    # A record that lists no drug says so explicitly (the IPS "no known medications" code), as
    # an export does when the medication list was reviewed and found empty.
    meds = [{"text": m} for m in c.medications] or [_NO_KNOWN_MEDICATIONS]
    for n, med in enumerate(meds):
        entries.append(
            {
                "resourceType": "MedicationStatement",
                "id": _rid(seed, case_id, "medication", n),
                "status": "active",
                "medicationCodeableConcept": med,
                "subject": {"reference": f"urn:uuid:{pid}"},
            }
        )
    entries.append(
        {
            "resourceType": "DocumentReference",
            "id": _rid(seed, case_id, "note"),
            "status": "current",
            "type": {"text": "Clinical note"},
            "subject": {"reference": f"urn:uuid:{pid}"},
            "date": _iso(when - dt.timedelta(minutes=30)),
            "content": [
                {
                    "attachment": {
                        "contentType": "text/plain; charset=utf-8",
                        "data": base64.b64encode(note.encode("utf-8")).decode("ascii"),
                    }
                }
            ],
        }
    )
    bundle = {
        "resourceType": "Bundle",
        "id": _rid(seed, case_id, "bundle"),
        "type": "collection",
        "timestamp": _iso(when),
        "entry": [{"fullUrl": f"urn:uuid:{r['id']}", "resource": r} for r in entries],
    }
    phi = [
        PlantedPHI(where="ehr:Patient.name", value=idn.note_name),
        PlantedPHI(where="ehr:Patient.identifier", value=idn.mrn),
        PlantedPHI(where="ehr:Patient.birthDate", value=idn.birth_date.isoformat()),
        PlantedPHI(where="ehr:Patient.telecom", value=idn.phone),
        PlantedPHI(where="ehr:Patient.address", value=idn.address),
        PlantedPHI(where="note", value=idn.note_name),
        PlantedPHI(where="note", value=idn.birth_date.strftime("%d/%m/%Y")),
        PlantedPHI(where="note", value=idn.mrn),
        PlantedPHI(where="note", value=idn.other_id),
        PlantedPHI(where="note", value=idn.address),
        PlantedPHI(where="note", value=idn.phone),
    ]
    return bundle, phi


def later_text(c: Clinical) -> str:
    """What the last turn of an L3 case reveals."""
    return c.later_text
