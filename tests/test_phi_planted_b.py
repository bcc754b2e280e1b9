"""Issue 34 (PHI in free text): the second planted set, written by someone other than the gate's
author, through the PHI gate to an untrusted endpoint.

``tests/data/phi_planted_b.json`` is a FHIR R4 Bundle and a clinical note with 115 planted items
(EN/DE/FR/ES/IT/UK/US conventions, some disguised: zero-width, soft hyphen, look-alike letters,
full-width digits, decomposed accents, letter-spaced and line-broken text) and 46 clinical
strings that must survive; ``tests/data/phi_planted_b_check.py`` judges what is sent, knowing
nothing of the gate. The case is built from the bundle and the note as a dataset gives them; the
Bundle's DocumentReference (a referral letter, base64) is not shown to models by the sandbox, so
its text is added to the note as a second document (otherwise its five items would pass for
scrubbed without the gate seeing them). The prompts are the real task templates rendered by
``build_turns``, the gate is ``PHIGate.prepare`` for a remote endpoint, and what is judged is what
a model reads: the text outside the data containers, each container's text (unescaped) and each
image label.

The set is a measurement: the gate's rules are general classes, never its strings. The test
holds the gate at the recall it reached and prints every miss (``-s`` to see them); run the
checker by hand with ``python tests/data/phi_planted_b_check.py --sent sent.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from evaluation.case import Case, Diagnosis, GroundTruth, Provenance, TaskFamily, Turn
from evaluation.ehr import EHRContext
from evaluation.modelio import ImagePart, Message, TextPart
from evaluation.phi import PHIGate, PHIPolicy
from evaluation.prompts import data_blocks, default_prompts, outside_data
from evaluation.tasks import TaskItem, build_turns

sys.path.insert(0, str(Path(__file__).parent / "data"))
import phi_planted_b_check as checker

REMOTE = "https://api.example.org/v1"
# What the gate reached on this set (misses: LEAKED + PARTIAL of 115), and where it started.
MAX_MISSES = 0
BEFORE = "before the rules of this set's commit: 87 scrubbed, 23 LEAKED, 5 PARTIAL of 115"


def _case(bundle: dict[str, Any], note: str) -> Case:
    letter = EHRContext.from_bundle(bundle).note
    return Case(
        case_id="planted-b",
        images=[],
        ehr=bundle,
        note=note + ("\n\n" + letter if letter else ""),
        ground_truth=GroundTruth(final_diagnosis=Diagnosis(name="acute ischaemic stroke")),
        provenance=Provenance(source="test"),
        turns=[Turn(question="What now?")],
    )


def _messages(case: Case) -> list[Message]:
    out: list[Message] = []
    for family in (TaskFamily.DIFFERENTIAL, TaskFamily.MULTITURN):
        turns = build_turns(
            case, TaskItem(case_id=case.case_id, family=family), default_prompts(), bytes
        )
        out += [turns.system, *turns.turns]
    return out


def _read(messages: list[Message]) -> list[str]:
    """What a model reads: outside the containers, each container's text, each image label."""
    texts: list[str] = []
    for m in messages:
        for p in m.content:
            if isinstance(p, TextPart):
                texts += [outside_data(p.text), *(b.text for b in data_blocks(p.text))]
            elif isinstance(p, ImagePart):
                texts.append(p.label)
    return texts


def _gated(bundle: dict[str, Any], note: str) -> list[str]:
    case = _case(bundle, note)
    out, result = PHIGate(PHIPolicy()).prepare(_messages(case), case, REMOTE)
    assert result.remote and result.deidentified
    return _read(out)


def _ungated(bundle: dict[str, Any], note: str) -> list[str]:
    return _read(_messages(_case(bundle, note)))


@pytest.fixture(scope="module")
def planted() -> dict[str, Any]:
    data = checker.load()
    assert checker.verify(data) == []  # the set itself is sound
    assert len(data["planted"]) == 115 and len(data["keep"]) == 46
    return data


def test_every_planted_item_reaches_the_prompt_when_nothing_is_gated(
    planted: dict[str, Any],
) -> None:
    """The measurement is not vacuous: each item is in what a model reads without the gate."""
    report = checker.check(_ungated, planted)
    missing = [f"{r.id} {r.text!r}" for r in report.items if r.status != "LEAKED"]
    assert not missing


def test_planted_set_b_through_the_gate(planted: dict[str, Any]) -> None:
    report = checker.check(_gated, planted)
    where = {p["id"]: p["where"] for p in planted["planted"]}
    print(f"\nplanted set B ({BEFORE}):\n" + report.to_text())
    for r in report.items:
        if r.status != "scrubbed":
            print(f"  {r.id} at {where[r.id]}")
    misses = [r for r in report.items if r.status != "scrubbed"]
    assert len(misses) <= MAX_MISSES, "\n".join(f"{r.id} {r.kind} {r.text!r}" for r in misses)
    # what a clinician needs survives: scores, drugs and doses, eponyms, anatomy, durations
    assert report.lost == []
