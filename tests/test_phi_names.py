"""Issue 22 (PHI): no person's name reaches an untrusted model endpoint.

The PHI gate scrubs every person the record names, in any role, not only the patient: every
PN attribute of the study the case came from (referring, performing, reading physicians,
operators, physicians of record, requesting physician, nested sequences included), every person
of the FHIR record (practitioners, encounter participants, the note's author, family contacts,
related persons), in every written form, and the note's signature lines whoever signs them.

The end-to-end test plants a distinct name for each role in a phantom case, runs every task
family and the rubric grader through litellm against a real OpenAI-compatible server on loopback
that is not trusted, and looks for every planted name part in every request body it received.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
from pathlib import Path
from typing import Any

import pydicom
import pytest
from engine_helpers import server_spec
from grader_helpers import asked_nonce, fixed_verdict
from openai_server import OpenAIServer, Script
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence

from evaluation.case import Case, Provenance, StudyIdentity, TaskFamily
from evaluation.datasets import DatasetSpec
from evaluation.ehr import EHRContext, identifying_terms
from evaluation.engine import start_run
from evaluation.log.store import RunStore
from evaluation.modelio import GenerateConfig, Message, TextPart
from evaluation.phi import PHIGate, PHIPolicy, scrub_text
from evaluation.runconfig import RunConfig
from evaluation.scoring.rubric import DIMENSIONS

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# --------------------------------------------------------------------------- the planted people

# DICOM person-name attributes, per modality (CT and MR series of the L3 phantom); the values
# are PN (Family^Given^Middle^Prefix^Suffix).
DICOM_PEOPLE: dict[str, dict[str, Any]] = {
    "CT": {
        "PerformingPhysicianName": "Brightwater^Ottilie",
        "OperatorsName": "Pennywhistle^Dafydd",
        "PhysiciansOfRecord": "Ravensworth^Imelda",
        "RequestingPhysician": "Castellanos^Evaristo",
    },
    "MR": {
        "PerformingPhysicianName": "Kesteven^Humphrey",
        "NameOfPhysiciansReadingStudy": "Haverford^Cornelius^J",
        "OperatorsName": ["Marchetti^Serafina", "Lowenthal^Bramwell"],
        "PhysiciansOfRecord": "Ravensworth^Imelda",
    },
}
NESTED = "Fairweather^Lucinda"  # RequestAttributesSequence > ScheduledPerformingPhysicianName

# Persons of the FHIR record (none of them is the patient).
EHR_PEOPLE = {
    "practitioner": ("Okonkwo-Hartigan", "Theodora"),
    "contact": ("Whitcombe", "Gwendolyn"),  # Patient.contact (wife)
    "related": ("Ødegård", "Sigrún"),  # RelatedPerson, next of kin (text only)
    "participant": ("Vasquez-Ellery", "Perpetua"),  # Encounter.participant display
    "author": ("Thornbury", "Sebastian"),  # DocumentReference.author display
    "authenticator": ("Crowhurst", "Thaddeus"),  # DocumentReference.authenticator display
}
# Persons only the note names, on its signature lines.
SIGNERS = {
    "electronic": ("Zabrowski", "Wilhelmina"),
    "dictated": ("Quillfeather", "Barnaby"),
    "dash": ("Kingsnorth", "Leopold"),
}
# How the note mentions them: every form people write, none a form the gate was told about.
NOTE_LINES = [
    "Referred by Dr Alvarez after a request from Castellanos^Evaristo (on the order).",
    "CT performed by O. Brightwater, operator PENNYWHISTLE D; MRI by Humphrey Kesteven.",
    "MRI read by HAVERFORD C J; radiographers Marchetti S and Bramwell Lowenthal.",
    "Under the care of Ravensworth, Imelda; scheduled by L. Fairweather.",
    "Discussed with Theodora Okonkwo-Hartigan and Dr Vasquez-Ellery; Okonkwo agrees.",
    "Wife Gwendolyn Whitcombe present; next of kin Sigrun Odegard (sister) aware.",
    "Note by Thornbury S., checked by CROWHURST, Thaddeus.",
]
SIGNATURE_LINES = [
    "Electronically signed by: Wilhelmina Zabrowski, MD 26/03/2024 14:02",
    "Dictated by Barnaby Quillfeather",
    "— Leopold Kingsnorth (neurology)",
]
CLINICAL_WORDS = ("ibuprofen", "papilloedema", "osteoarthritis", "cranial nerves intact")
REVEAL = " Radiographer Marchetti notes patient movement."


def _parts(*names: str) -> set[str]:
    """Name parts a body must not hold: surnames and given names of 3 letters or more."""
    out = set()
    for name in names:
        for group in name.split("="):
            for comp in group.split("^")[:3]:
                for piece in [comp, *re.split(r"[\s-]+", comp)]:
                    if len(piece) >= 3:
                        out.add(piece)
    return out


def _plant_dicom(case_dir: Path) -> str:
    """Every role's name into every file of the study; returns the referring physician's PN."""
    referring = ""
    for path in sorted((case_dir / "dicom").rglob("*.dcm")):
        ds = pydicom.dcmread(path)
        referring = str(ds.ReferringPhysicianName)
        for keyword, value in DICOM_PEOPLE[ds.Modality if ds.Modality == "CT" else "MR"].items():
            setattr(ds, keyword, value)
        item = Dataset()
        item.RequestedProcedureID = "RP1"
        item.ScheduledPerformingPhysicianName = NESTED
        ds.RequestAttributesSequence = Sequence([item])
        ds.save_as(path)
    return referring


def _plant_record(case_dir: Path) -> None:
    """The persons of EHR_PEOPLE into ehr.json, the mentions and signatures into the note (and
    the note's DocumentReference), a name into a multi-turn reveal."""
    note = (case_dir / "note.txt").read_text(encoding="utf-8").rstrip("\n").split("\n")
    plan = next(i for i, line in enumerate(note) if line.startswith("Plan:"))
    note = [*note[:plan], *NOTE_LINES, *note[plan:], *SIGNATURE_LINES]
    text = "\n".join(note) + "\n"
    (case_dir / "note.txt").write_text(text, encoding="utf-8")
    bundle = json.loads((case_dir / "ehr.json").read_text())
    res = [e["resource"] for e in bundle["entry"]]
    patient = next(r for r in res if r["resourceType"] == "Patient")
    fam, giv = EHR_PEOPLE["contact"]
    patient["contact"] = [
        {"relationship": [{"text": "wife"}], "name": {"family": fam, "given": [giv]}}
    ]
    fam, giv = EHR_PEOPLE["practitioner"]
    extra = [
        {
            "resourceType": "Practitioner",
            "id": "pr1",
            "name": [{"family": fam, "given": [giv], "prefix": ["Dr"]}],
        },
        {
            "resourceType": "RelatedPerson",
            "id": "rp1",
            "relationship": [{"text": "next of kin"}],
            "name": [{"text": " ".join(reversed(EHR_PEOPLE["related"]))}],
        },
    ]
    encounter = next(r for r in res if r["resourceType"] == "Encounter")
    fam, giv = EHR_PEOPLE["participant"]
    encounter["participant"] = [
        {"individual": {"reference": "Practitioner/pr2", "display": f"Dr {giv} {fam}"}}
    ]
    doc = next(r for r in res if r["resourceType"] == "DocumentReference")
    fam, giv = EHR_PEOPLE["author"]
    doc["author"] = [{"display": f"{giv} {fam} (neurology)"}]
    fam, giv = EHR_PEOPLE["authenticator"]
    doc["authenticator"] = {"reference": "Practitioner/pr3", "display": f"{fam}, {giv}"}
    doc["content"][0]["attachment"]["data"] = base64.b64encode(text.encode()).decode()
    bundle["entry"] += [{"fullUrl": f"urn:uuid:{r['id']}", "resource": r} for r in extra]
    (case_dir / "ehr.json").write_text(json.dumps(bundle))
    case = json.loads((case_dir / "case.json").read_text())
    case["turns"][1]["reveal_text"] += REVEAL
    case.pop("ehr", None)  # read from ehr.json
    case["note"] = ""  # read from note.txt
    (case_dir / "case.json").write_text(json.dumps(case))


@pytest.fixture(scope="module")
def named_case(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[str]]:
    """A suite folder with one L3 phantom (CT then MRI, every task family) whose record names a
    person in every role; and the name parts none of them may leave in."""
    from evaluation.datasets.phantoms import case_spec, generate_suite

    root = tmp_path_factory.mktemp("phi-names")
    generate_suite(root, 21, 11, only=[21])
    case_dir = root / case_spec(21).case_id
    referring = _plant_dicom(case_dir)
    _plant_record(case_dir)
    case = json.loads((case_dir / "case.json").read_text())
    patient = next(
        p["value"] for p in case["ground_truth"]["phi"] if p["where"] == "dicom:PatientName"
    )
    dicom_names = [referring, patient, NESTED]
    for roles in DICOM_PEOPLE.values():
        for value in roles.values():
            dicom_names += value if isinstance(value, list) else [value]
    people = [f"{f}^{g}" for f, g in [*EHR_PEOPLE.values(), *SIGNERS.values()]]
    parts = _parts(*dicom_names, *people) | {"Odegard", "Sigrun"}  # the note's ASCII spelling
    return root, parts


def _texts(body: dict[str, Any]) -> str:
    """Every string of a request body except image data (base64 holds any short word)."""
    out: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
        elif isinstance(v, str) and not v.startswith("data:image"):
            out.append(v)

    walk(body)
    return "\n".join(out)


# --------------------------------------------------------------------------- end to end


def test_no_person_named_by_the_record_reaches_an_untrusted_endpoint_in_any_family_or_grader(
    named_case: tuple[Path, set[str]], tmp_path: Path
) -> None:
    suite, parts = named_case
    grader_reply = fixed_verdict({d: 3 for d in DIMENSIONS} | {"comments": "ok"})
    with OpenAIServer(Script(responder=grader_reply)) as server:
        config = RunConfig(
            dataset=DatasetSpec(path=str(suite)),
            models=[server_spec(server.url)],
            graders=[server_spec(server.url, name="grader")],
            tasks=list(TaskFamily),
            generate=GenerateConfig(temperature=0.0, max_tokens=500, timeout_s=20),
            bertscore=False,
            cache_dir=str(tmp_path / "cache"),
            phi=PHIPolicy(trusted=[]),  # nothing trusted: loopback is remote too
        )
        stats = asyncio.run(start_run(config, tmp_path / "run"))
        bodies = list(server.stats.bodies)
    assert stats.errors == 0
    store = RunStore(tmp_path / "run")
    try:
        families = {r.family for r in store.samples()}
        audit = list(store.audit())
    finally:
        store.close()
    assert families == {f.value for f in TaskFamily}  # every task family was asked
    assert len(audit) == len(bodies) and all(a.remote and a.deidentified for a in audit)
    texts = [_texts(b) for b in bodies]
    graded = [t for b, t in zip(bodies, texts, strict=True) if asked_nonce(json.dumps(b))]
    assert len(graded) >= 4  # the rubric grader's requests (answers and the canary)
    hits = {n: sorted({p for p in parts if p.lower() in t.lower()}) for n, t in enumerate(texts)}
    assert {n: h for n, h in hits.items() if h} == {}, "person names sent to an untrusted endpoint"
    # The clinical content is still there: the note went out, scrubbed, not dropped.
    with_note = [t for t in texts if "Clinical note:" in t]
    assert len(with_note) >= 4
    for word in CLINICAL_WORDS:
        assert all(word in t.lower() for t in with_note), word
    assert all("(neurology)" in t for t in with_note)  # a signature's department stays
    assert any("notes patient movement" in t for t in texts)  # the multi-turn reveal


# --------------------------------------------------------------------------- the rule, unit


def _case(**kw: Any) -> Case:
    return Case(case_id="c1", provenance=Provenance(source="folder", **kw))


def _persons(**names: str) -> StudyIdentity:
    """A study identity naming persons by role (DICOM keyword -> PN value)."""
    from evaluation.case import StudyPerson  # the typed record this issue adds

    return StudyIdentity(persons=[StudyPerson(role=k, name=v) for k, v in names.items()])


def _scrub(text: str, case: Case) -> str:
    gate = PHIGate(PHIPolicy(trusted=[]))
    out, _ = gate.prepare(
        [Message(role="user", content=[TextPart(text=text)])], case, "http://127.0.0.1:1/v1"
    )
    part = out[0].content[0]
    assert isinstance(part, TextPart)
    return part.text


@pytest.mark.parametrize(
    "written",
    [
        "Marta Alvarez",
        "M. Alvarez",
        "M Alvarez",
        "Alvarez, Marta",
        "ALVAREZ^MARTA",
        "Alvarez^Marta^^Dr",
        "Dr Alvarez",
        "alvarez m",
        "Alvarez M.",
        "Marta",
        "M.Alvarez",
    ],
)
def test_a_study_persons_name_is_scrubbed_in_every_written_form(written: str) -> None:
    case = _case(identity=_persons(ReferringPhysicianName="Alvarez^Marta^^Dr"))
    out = _scrub(f"Seen in clinic; plan discussed with {written} today, MRI brain requested.", case)
    assert "alvarez" not in out.lower() and "marta" not in out.lower(), out
    assert "MRI brain requested" in out and "Seen in clinic" in out


def test_pn_component_groups_and_accents_are_scrubbed_in_every_spelling() -> None:
    case = _case(
        identity=_persons(
            OperatorsName="Yamada^Tarou=山田^太郎=やまだ^たろう",
            PerformingPhysicianName="Østergård^Søren",
            NameOfPhysiciansReadingStudy="Li^Wei",
        )
    )
    out = _scrub(
        "Scanned by Tarou Yamada (山田太郎); Søren Østergård and Soren Ostergard; read by Wei Li.",
        case,
    )
    for part in (
        "Yamada",
        "Tarou",
        "山田太郎",
        "Søren",
        "Østergård",
        "Soren",
        "Ostergard",
        "Wei Li",
    ):
        assert part.lower() not in out.lower(), (part, out)


def test_every_person_of_the_fhir_record_gives_terms_not_only_the_patient() -> None:
    bundle = {
        "resourceType": "Bundle",
        "entry": [
            {
                "resource": {
                    "resourceType": "Patient",
                    "name": [{"family": "Quixote", "given": ["Alonso"]}],
                    "contact": [
                        {
                            "name": {"family": "Panza", "given": ["Teresa"]},
                            "telecom": [{"system": "phone", "value": "+44 20 7946 0111"}],
                        }
                    ],
                    "generalPractitioner": [{"display": "Dr Pedro Recio"}],
                }
            },
            {"resource": {"resourceType": "Practitioner", "name": [{"text": "Sansón Carrasco"}]}},
            {
                "resource": {
                    "resourceType": "RelatedPerson",
                    "name": [{"family": "Lorenzo", "given": ["Aldonza"]}],
                }
            },
            {
                "resource": {
                    "resourceType": "Encounter",
                    "participant": [
                        {
                            "individual": {
                                "reference": "Practitioner/x",
                                "display": "Nicolás Barbero, MD",
                            }
                        }
                    ],
                    "serviceProvider": {"reference": "Organization/o", "display": "Neurology"},
                }
            },
            {
                "resource": {
                    "resourceType": "DocumentReference",
                    "author": [{"reference": "urn:uuid:1", "display": "Ginés de Pasamonte"}],
                }
            },
        ],
    }
    terms = {t.lower() for t in identifying_terms(EHRContext.from_bundle(bundle))}
    for name in ("Quixote", "Panza", "Teresa", "Recio", "Pedro", "Sansón", "Carrasco", "Lorenzo",
                 "Aldonza", "Nicolás", "Barbero", "Ginés", "Pasamonte", "Sanson"):  # fmt: skip
        assert name.lower() in terms, name
    # role, department and title words are not names: the note keeps them
    assert not {"neurology", "dr", "md", "de"} & terms
    text, _ = scrub_text(
        "Neurology review: Teresa Panza phoned; Dr Recio's letter.",
        identifying_terms(EHRContext.from_bundle(bundle)),
    )
    assert "Neurology review" in text and "Panza" not in text and "Recio" not in text


@pytest.mark.parametrize(
    ("line", "name"),
    [
        ("Electronically signed by: Zed Quennell, MD on 02/03/2024", "Quennell"),
        ("Signed: Zed Quennell", "Quennell"),
        ("Signed by Zed Quennell (consultant)", "Quennell"),
        ("Dictated by Zed Quennell, not read", "Quennell"),
        ("Dictated but not signed by Dr Zed Quennell", "Quennell"),
        ("— Z. Quennell (neurology)", "Quennell"),
        ("-- Zed Quennell, ST5 Neurology", "Quennell"),
        ("Z. Quennell (ED registrar)", "Quennell"),
        ("Zed Quennell (neurology)", "Quennell"),
        ("Reported by Zed Quennell, consultant neuroradiologist", "Quennell"),
        ("Verified by: QUENNELL, Zed", "Quennell"),
        ("cc: Dr Zed Quennell, GP", "Quennell"),
        ("Seen with registrar Zed Quennell on the ward round", "Quennell"),
        ("Discussed with Prof. Zed Quennell (stroke)", "Quennell"),
        ("Kind regards,\n\nZed Quennell\nConsultant Neurologist", "Quennell"),
        ("Zoë Quennell-Ибрагимова (neurology)", "Ибрагимова"),
        ("Dr Zed Abelard Quennell reviewed the films", "Quennell"),
    ],
)
def test_signature_lines_are_scrubbed_whoever_signs(line: str, name: str) -> None:
    note = f"PC: headache for two weeks.\nO/E: no papilloedema.\n{line}\n"
    out, counts = scrub_text(note, [])
    assert name.lower() not in out.lower(), out
    assert "Zed" not in out and "Zoë" not in out, out
    assert "PC: headache for two weeks." in out and "O/E: no papilloedema." in out
    assert counts


@pytest.mark.parametrize(
    "line",
    [
        "Plan: imaging as per protocol; review with results.",
        "MRI Brain (with contrast)",
        "CT Head (non-contrast)",
        "Seen by neurology; NIHSS 4.",
        "Treated with Aspirin and Clopidogrel.",
        "Multiple Sclerosis (relapsing-remitting)",
        "Consultant Neurologist",
        "Glasgow Coma Scale 15",
        "Image 2: FLAIR axial; axial montage, 12 slices, I 40 mm to S 60 mm",
        "Patient: 35 years, male",  # the record block's first line is not a name
        "FH: mother Parkinson's disease; father: Huntington's chorea.",  # eponyms, not names
        "Sister: Charcot-Marie-Tooth disease",
        "Brother Guillain-Barré syndrome at 30",
        "Transferred to: Ophthalmology",
        "Signed consent obtained; verified patient identity.",
        "MRI brain performed by GE Signa 3T.",
    ],
)
def test_clinical_lines_that_look_like_signatures_are_kept(line: str) -> None:
    out, _ = scrub_text(f"PC: headache.\n{line}\n", [])
    assert line in out, out


def test_every_pn_attribute_of_a_header_names_a_person_nested_multivalued_and_private() -> None:
    from dicom import person_names  # the DICOM rule this issue adds

    ds = Dataset()
    ds.PatientName = "Doe^Jane"
    ds.ReferringPhysicianName = "Alvarez^Marta^^Dr"
    ds.OperatorsName = ["Pennywhistle^Dafydd", "Marchetti^Serafina"]
    ds.StudyDescription = "MRI Brain"  # LO: not a person
    inner = Dataset()
    inner.PersonName = "Crowhurst^Thaddeus"
    item = Dataset()
    item.ScheduledPerformingPhysicianName = "Fairweather^Lucinda"
    item.ContentSequence = Sequence([inner])
    ds.RequestAttributesSequence = Sequence([item])
    ds.add_new(0x00091010, "LO", "ACME 1.0")  # a private creator, then its private PN
    ds.add_new(0x00091110, "PN", "Quillfeather^Barnaby")
    ds.add_new(0x00091111, "PN", "")
    got = {(p.keyword, p.name) for p in person_names(ds)}
    assert got == {
        ("PatientName", "Doe^Jane"),
        ("ReferringPhysicianName", "Alvarez^Marta^^Dr"),
        ("OperatorsName", "Pennywhistle^Dafydd"),
        ("OperatorsName", "Marchetti^Serafina"),
        ("ScheduledPerformingPhysicianName", "Fairweather^Lucinda"),
        ("PersonName", "Crowhurst^Thaddeus"),
        ("(0009,1110)", "Quillfeather^Barnaby"),
    }
