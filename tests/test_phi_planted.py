"""Issue 34 (PHI in free text): the planted set A through the PHI gate to an untrusted endpoint.

Each of the 47 items of ``tests/data/phi_planted_a.json`` is planted where the issue found one
arriving: the clinical note, the encounter reason, a condition's text, an observation's value, a
medication's text, a multi-turn reveal. The case's record is a FHIR Bundle, the prompts are the
real task templates rendered by ``build_turns``, and the gate is ``PHIGate.prepare`` for a
remote endpoint. None of the 47 strings may arrive, in its written form nor normalised (NFKC,
invisible characters removed, look-alike letters read as Latin), and what a clinician needs
(anatomy, scores, drug names, durations, ages under 90, sequence names, eponyms) must survive.
"""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path
from typing import Any

import pytest

from evaluation.case import Case, Diagnosis, GroundTruth, Provenance, TaskFamily, Turn
from evaluation.modelio import ImagePart, Message, TextPart
from evaluation.phi import PHIGate, PHIPolicy, scrub_text
from evaluation.prompts import default_prompts
from evaluation.tasks import TaskItem, build_turns

PLANTED = json.loads(
    (Path(__file__).parent / "data" / "phi_planted_a.json").read_text(encoding="utf-8")
)
REMOTE = "https://api.example.org/v1"
# The test's own reading of a disguised string (independent of the gate's): compatibility
# forms, no format characters, the Cyrillic and Greek letters that look Latin read as Latin.
_LOOK_ALIKE = str.maketrans("аеорсухіјԁԛѕԝАВЕКМНОРСТХІЈЅοαιΑΒΕΗΙΚΜΝΟΡΤΧΖ", "aeopcyxijdqswABEKMHOPCTXIJSoaiABEHIKMNOPTXZ")  # fmt: skip


def _plain(text: str) -> str:
    text = unicodedata.normalize("NFKC", text)
    text = "".join(c for c in text if unicodedata.category(c) != "Cf")
    return text.translate(_LOOK_ALIKE).casefold()


def _bundle(items: list[dict[str, Any]]) -> dict[str, Any]:
    def texts(where: str) -> list[str]:
        return list(dict.fromkeys(i["context"] for i in items if i["where"] == where))

    res: list[dict[str, Any]] = [
        PLANTED["patient"],
        {
            "resourceType": "Encounter",
            "id": "e1",
            "class": {"code": "EMER"},
            "period": {"start": PLANTED["encounter_start"]},
            "reasonCode": [{"text": t} for t in texts("encounter_reason")],
        },
    ]
    res += [
        {"resourceType": "Condition", "clinicalStatus": {"coding": [{"code": "active"}]}, "code": {"text": t}}
        for t in texts("condition")
    ]  # fmt: skip
    res += [
        {"resourceType": "Observation", "status": "final", "code": {"text": "Nursing note"}, "valueString": t}
        for t in texts("observation")
    ]  # fmt: skip
    res += [
        {"resourceType": "MedicationStatement", "status": "active", "medicationCodeableConcept": {"text": t}}
        for t in texts("medication")
    ]  # fmt: skip
    return {"resourceType": "Bundle", "type": "collection", "entry": [{"resource": r} for r in res]}


def _case(items: list[dict[str, Any]]) -> Case:
    note_lines = [i["context"] for i in items if i["where"] == "note"] + PLANTED["keep_lines"]
    reveals = [i["context"] for i in items if i["where"] == "reveal"]
    return Case(
        case_id="planted-a",
        images=[],
        ehr=_bundle(items),
        note="\n".join(dict.fromkeys(note_lines)),
        ground_truth=GroundTruth(final_diagnosis=Diagnosis(name="acute ischaemic stroke")),
        provenance=Provenance(source="test"),
        turns=[Turn(reveal_text=" ".join(reveals), question="What now?")],
    )


def _messages(case: Case) -> list[Message]:
    prompts = default_prompts()
    out: list[Message] = []
    for family in (TaskFamily.DIFFERENTIAL, TaskFamily.MULTITURN):
        turns = build_turns(case, TaskItem(case_id=case.case_id, family=family), prompts, bytes)
        out += [turns.system, *turns.turns]
    return out


def _text(messages: list[Message]) -> str:
    return "\n".join(
        p.text if isinstance(p, TextPart) else p.label
        for m in messages
        for p in m.content
        if isinstance(p, TextPart | ImagePart)
    )


def _found(needle: str, text: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(needle)}(?!\w)", text) is not None


def _arrived(item: dict[str, Any], sent: str) -> bool:
    """The item as written, or as read once normalised, as a word of the sent text ("Bonn" is not
    in "Bonnet"), in any case."""
    phi = item["phi"]
    return _found(phi.casefold(), sent.casefold()) or _found(_plain(phi), _plain(sent))


@pytest.fixture(scope="module")
def gated() -> tuple[str, str, dict[str, int]]:
    case = _case(PLANTED["items"])
    messages = _messages(case)
    out, result = PHIGate(PHIPolicy()).prepare(messages, case, REMOTE)
    assert result.remote and result.deidentified
    return _text(messages), _text(out), result.redactions


def test_every_planted_item_is_in_the_prompt_before_the_gate(
    gated: tuple[str, str, dict[str, int]],
) -> None:
    """The set is not vacuous: each item reaches the rendered prompt when nothing is gated."""
    before, _, _ = gated
    assert len(PLANTED["items"]) == 47
    missing = [i["phi"] for i in PLANTED["items"] if not _arrived(i, before)]
    assert not missing


def test_none_of_the_47_planted_items_reaches_an_untrusted_endpoint(
    gated: tuple[str, str, dict[str, int]],
) -> None:
    _, sent, _ = gated
    leaked = [
        f"{i['kind']}@{i['where']}: {i['phi']!r}" for i in PLANTED["items"] if _arrived(i, sent)
    ]
    recall = (47 - len(leaked)) / 47
    print(f"planted set A recall: {47 - len(leaked)}/47 = {recall:.3f}")
    assert not leaked, "\n".join(leaked)


def test_what_a_clinician_needs_survives_the_gate(gated: tuple[str, str, dict[str, int]]) -> None:
    before, sent, _ = gated
    lost = [k for k in PLANTED["keep"] if k in before and k not in sent]
    print(f"planted set A over-redaction: {len(lost)}/{len(PLANTED['keep'])} kept terms lost")
    assert all(k in before for k in PLANTED["keep"])
    assert not lost


def test_the_audit_counts_each_kind_that_was_redacted(
    gated: tuple[str, str, dict[str, int]],
) -> None:
    """The audit says what was redacted, by kind, and its counts add up to the redactions made."""
    before, sent, counts = gated
    kinds = {i["kind"] for i in PLANTED["items"]}
    assert {"date", "address", "person_name"} <= set(counts), counts
    assert kinds == {"date", "address", "person", "patient_name"}
    markers = sent.count("[REDACTED]") - before.count("[REDACTED]")
    uncounted = {"age_over_89", "invisible_characters", "look_alike_characters"}
    assert sum(v for k, v in counts.items() if k not in uncounted) == markers, counts
    assert all(v > 0 for v in counts.values())


def test_disguised_text_is_read_as_written_and_counted() -> None:
    """Zero-width and soft-hyphen splits, full-width and Cyrillic look-alike letters: the name is
    found, the text sent is the normalised one, and the audit counts what was read differently."""
    terms = ["Vandersloot", "Henrietta"]
    text = "Henri\u200betta Vander\u00adsloot; V\u0430ndersloot; \uff28\uff45\uff4e\uff52\uff49\uff45\uff54\uff54\uff41"
    out, counts = scrub_text(text, terms)
    assert out == "[REDACTED] [REDACTED]; [REDACTED]; [REDACTED]"
    assert counts["invisible_characters"] == 2 and counts["look_alike_characters"] == 10
    assert counts["identifier"] == 4


def test_a_prompt_without_a_record_is_sent_unchanged() -> None:
    """The templates, questions and schemas are not the record: the gate leaves them alone."""
    case = Case(
        case_id="empty",
        images=[],
        ground_truth=GroundTruth(final_diagnosis=Diagnosis(name="normal")),
        provenance=Provenance(source="test"),
        turns=[Turn(question="What now?")],
    )
    messages = _messages(case)
    out, result = PHIGate(PHIPolicy()).prepare(messages, case, REMOTE)
    assert _text(out) == _text(messages), result.redactions
