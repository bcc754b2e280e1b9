"""The typed EHR record (``evaluation.ehr.EHRContext``) that the prompt's record block, the PHI
gate's identifying terms and case sharing all read: parsed once from a FHIR Bundle, every person
it names found whatever element names them, hostile input bounded and noted, never fatal."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from evaluation.case import Case, Provenance
from evaluation.ehr import EHRContext, identifying_terms
from evaluation.phi import PHIGate, scrub_text


def _bundle(*resources: dict[str, object]) -> dict[str, object]:
    entries = []
    for r in resources:
        rid = r.get("id")
        entries.append({"fullUrl": f"urn:uuid:{rid}", "resource": r} if rid else {"resource": r})
    return {"resourceType": "Bundle", "type": "collection", "entry": entries}


PATIENT = {
    "resourceType": "Patient",
    "id": "pat-1",
    "name": [{"family": "Quixote", "given": ["Alonso"]}],
    "gender": "male",
    "birthDate": "1950-03-04",
}
# Bare resources a reference may point at: their names are only in the reference's display.
PRACTITIONER = {"resourceType": "Practitioner", "id": "prac-1"}
RELATED = {"resourceType": "RelatedPerson", "id": "rel-1"}


# Each: a resource naming one person only in a Reference's display, under an element the old
# hand-made list of person keys did not hold (the target resolved in the Bundle by its fullUrl,
# or, with no target, the element's FHIR R4B definition allowing a person).
PERSON_ONLY_IN_A_REFERENCE = [
    pytest.param(
        {
            "resourceType": "CareTeam",
            "participant": [
                {"member": {"reference": "urn:uuid:prac-1", "display": "Dr Pedro Recio"}}
            ],
        },
        ("Recio", "Pedro"),
        id="CareTeam.participant.member-to-a-Practitioner-of-the-bundle",
    ),
    pytest.param(
        {
            "resourceType": "MedicationStatement",
            "status": "active",
            "medicationCodeableConcept": {"text": "aspirin"},
            "informationSource": {"reference": "urn:uuid:rel-1", "display": "Teresa Panza"},
        },
        ("Panza", "Teresa"),
        id="MedicationStatement.informationSource-to-a-RelatedPerson-of-the-bundle",
    ),
    pytest.param(
        {
            "resourceType": "Encounter",
            "subject": {"reference": "urn:uuid:pat-1", "display": "Mrs Aldonza Lorenzo"},
        },
        ("Aldonza", "Lorenzo"),
        id="Encounter.subject-to-the-Patient-of-the-bundle",
    ),
    pytest.param(
        {"resourceType": "Media", "operator": {"display": "Sansón Carrasco"}},
        ("Carrasco", "Sansón", "Sanson"),
        id="Media.operator-display-only-the-definition-allows-a-person",
    ),
    pytest.param(
        {
            "resourceType": "ClinicalImpression",
            "status": "completed",
            "subject": {"reference": "urn:uuid:pat-1"},
            "assessor": {"display": "Ginés Pasamonte"},
        },
        ("Pasamonte", "Ginés"),
        id="ClinicalImpression.assessor-display-only",
    ),
    pytest.param(
        {
            "resourceType": "Encounter",
            "contained": [
                {
                    "resourceType": "Task",
                    "status": "requested",
                    "intent": "order",
                    "owner": {"display": "Maritornes Venteril"},
                }
            ],
        },
        ("Maritornes", "Venteril"),
        id="Task.owner-in-a-contained-resource",
    ),
]


@pytest.mark.parametrize(("resource", "names"), PERSON_ONLY_IN_A_REFERENCE)
def test_a_person_named_only_in_a_reference_reaches_the_phi_gate(
    resource: dict[str, object], names: tuple[str, ...]
) -> None:
    bundle = _bundle(PATIENT, PRACTITIONER, RELATED, resource)
    record = EHRContext.from_bundle(bundle)
    assert any(n in " ".join(p.display for p in record.persons) for n in names), record.persons
    case = Case(case_id="c1", ehr=bundle, provenance=Provenance(source="folder"))
    terms = PHIGate().terms_for(case)
    for name in names:
        assert name in terms, (name, terms)
    full = " ".join(n for n in names if n != "Sanson")
    text, _ = scrub_text(f"Seen with {full} today; NIHSS 4.", terms)
    assert names[0] not in text and "NIHSS 4" in text


def test_a_reference_to_an_organisation_is_not_a_person() -> None:
    bundle = _bundle(
        PATIENT,
        {"resourceType": "Organization", "id": "org-1", "name": "Rocinante Clinic"},
        {
            "resourceType": "Encounter",
            "serviceProvider": {"reference": "urn:uuid:org-1", "display": "Barataria Infirmary"},
        },
    )
    record = EHRContext.from_bundle(bundle)
    assert not any("Barataria" in p.display for p in record.persons)
    assert [e.name for e in record.entities] == ["Rocinante Clinic"]


def test_the_record_is_typed_and_holds_the_parts_the_design_names() -> None:
    note = "Seen in clinic. Left arm weakness for two days."
    bundle = _bundle(
        PATIENT,
        {
            "resourceType": "Encounter",
            "status": "in-progress",
            "class": {"code": "EMER"},
            "period": {"start": "2024-05-02T09:00:00Z"},
            "reasonCode": [{"text": "Sudden weakness"}],
            "participant": [{"individual": {"reference": "urn:uuid:prac-1"}}],
        },
        {"resourceType": "Practitioner", "id": "prac-1", "name": [{"text": "Dr Marta Alvarez"}]},
        {
            "resourceType": "Condition",
            "code": {"text": "Atrial fibrillation", "coding": [{"code": "I48.9"}]},
            "subject": {"reference": "urn:uuid:pat-1"},
        },
        {
            "resourceType": "Observation",
            "status": "final",
            "category": [{"coding": [{"code": "survey"}]}],
            "code": {"text": "NIHSS total"},
            "valueQuantity": {"value": 7},
        },
        {
            "resourceType": "MedicationStatement",
            "status": "active",
            "medicationCodeableConcept": {"text": "apixaban 5 mg"},
            "subject": {"reference": "urn:uuid:pat-1"},
        },
        {
            "resourceType": "DocumentReference",
            "status": "current",
            "content": [
                {
                    "attachment": {
                        "contentType": "text/plain",
                        "data": base64.b64encode(note.encode()).decode(),
                    }
                }
            ],
        },
    )
    record = EHRContext.from_bundle(bundle)
    assert record.patient is not None
    assert (record.patient.age, record.patient.sex) == (74, "male")
    assert record.encounters[0].reasons == ["Sudden weakness"]
    assert record.conditions[0].name == "Atrial fibrillation"
    assert record.conditions[0].codes == ["I48.9"]
    assert record.observations[0].section == "Scores"
    assert record.medications[0].name == "apixaban 5 mg"
    assert record.note == note
    assert {p.role for p in record.persons} >= {"Patient", "Practitioner"}
    assert record.issues == []  # every resource validates as FHIR R4B
    text = record.text()
    assert "Patient: 74 years, male" in text and "Scores: NIHSS total: 7" in text
    assert "Alvarez" not in text and "Quixote" not in text and "1950" not in text
    # The record is a value: frozen, and it dumps and loads as itself.
    assert EHRContext.model_validate_json(record.model_dump_json()) == record
    with pytest.raises(ValueError, match="frozen"):
        record.patient.age = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "bundle",
    [
        None,
        [],
        {},
        {"entry": "x"},
        {"entry": [None, 3, {"resource": {"resourceType": ["P"]}}]},
        [{"resourceType": "Patient", "birthDate": 5}],
        {"entry": [{"resource": {"resourceType": "Patient", "name": "x" * 10**6}}]},
        {"entry": [{"resource": {"resourceType": "Observation", "code": {"text": 42}}}]},
        {"entry": [{"resource": {"resourceType": "Encounter", "participant": [[[[{}]]]]}}]},
    ],
)
def test_hostile_bundles_give_a_record_with_notes_never_an_exception(bundle: object) -> None:
    record = EHRContext.from_bundle(bundle)
    assert isinstance(record.text(), str)
    assert all(len(n) <= 300 for n in record.issues)
    assert all(len(t) <= 200 for t in identifying_terms(record))


def test_a_resource_that_is_not_fhir_r4b_is_noted_and_still_read() -> None:
    bundle = _bundle(
        {"resourceType": "Patient", "gender": "female", "birthDate": "1980-06-15", "bogus": 1},
        {"resourceType": "Condition", "code": {"text": "Migraine"}, "clinicalStatus": "active"},
        {"resourceType": "NoSuchResource"},
    )
    record = EHRContext.from_bundle(bundle)
    assert "Conditions: Migraine" in record.text()
    assert any(n.startswith("Patient (entry 0)") for n in record.issues), record.issues
    assert any(n.startswith("Condition (entry 1)") for n in record.issues), record.issues
    assert any("NoSuchResource" in n for n in record.issues), record.issues


def test_deep_and_wide_records_are_bounded() -> None:
    deep: dict[str, object] = {"display": "Deep Person"}
    for _ in range(200):
        deep = {"extension": [deep]}
    wide = [
        {"resourceType": "Practitioner", "name": [{"text": f"Name{i} Person"}]} for i in range(5000)
    ]
    record = EHRContext.from_bundle(_bundle(PATIENT, {"resourceType": "Basic", **deep}, *wide))
    assert len(record.persons) <= 1000
    assert record.issues  # what was cut is said


# The record block of the phantom suite's cases, as the code before the typed record wrote it
# (sha256 of the text): the prompt, its hash and the run's cache keys do not change.
PHANTOM_BLOCKS = {
    "ms": "c9e1a970c45621e56e02bc619802830d9f56662b7fa33bbced803feb8867a004",
    "stroke": "aaf25d6550aefe24ed90ee6e8f083c3acb0de4f61a963c8192d60f6044ab04ad",
    "ich": "8b308b7f74f1f5678d4ebfeb49b91604d0d7597e447e81bb75447b0c10ba8ba8",
    "gbm": "dcdaba46ba4d1f84c3c945100c562438d98401cc02d1779f9290fd113e977375",
    "abscess": "538c8e1e4ff394530c8d98380f584b1338cf576412e52194272368a42cd794ca",
    "l3": "5a3b529454f10f192247c5c559d17fb350effbab65419d0c3a14419cc8bcdbe9",
}


def test_the_record_block_of_the_phantom_cases_is_unchanged(phantom_suite) -> None:  # type: ignore[no-untyped-def]
    got = {}
    for key in PHANTOM_BLOCKS:
        bundle = json.loads((phantom_suite.case_dir(key) / "ehr.json").read_text())
        got[key] = hashlib.sha256(EHRContext.from_bundle(bundle).text().encode()).hexdigest()
    assert got == PHANTOM_BLOCKS
