"""Diagnosis phrasing (issue 18): "non-" is a prefix, not a negation; negation is scoped to its
clause; a subtype qualifier on a parent term selects the subtype."""

from __future__ import annotations

import pytest

from evaluation.case import Diagnosis
from evaluation.scoring.lexicon import default_lexicon, match_diagnosis

L = default_lexicon()


@pytest.mark.parametrize(
    ("text", "concept"),
    [
        ("non-traumatic subdural haematoma", "sdh"),
        ("non-enhancing low-grade glioma", "low_grade_glioma"),
        ("acute non-haemorrhagic infarct", "acute_ischaemic_stroke"),
        ("non haemorrhagic ischaemic stroke", "acute_ischaemic_stroke"),
        ("Non‑enhancing low grade glioma", "low_grade_glioma"),  # non-breaking hyphen
    ],
)
def test_non_prefixed_modifiers_do_not_negate(text: str, concept: str) -> None:
    found = L.lookup(text)
    assert found.concept_id == concept, (text, found)


@pytest.mark.parametrize(
    ("text", "concept"),
    [
        ("no haemorrhage; ischaemic stroke", "acute_ischaemic_stroke"),
        ("haemorrhage excluded, acute ischaemic stroke", "acute_ischaemic_stroke"),
        ("without mass effect. glioblastoma", "glioblastoma"),
        ("not a tumour but a brain abscess", "brain_abscess"),
    ],
)
def test_negation_stops_at_its_clause(text: str, concept: str) -> None:
    found = L.lookup(text)
    assert found.concept_id == concept, (text, found)


@pytest.mark.parametrize(
    "text",
    [
        "no glioblastoma",
        "glioblastoma ruled out",
        "negative for glioblastoma",
        "without evidence of glioblastoma",
    ],
)
def test_real_negation_still_negates(text: str) -> None:
    found = L.lookup(text)
    assert found.concept_id is None and "glioblastoma" in found.negated, (text, found)


@pytest.mark.parametrize(
    ("text", "concept"),
    [
        ("ischemic CVA", "acute_ischaemic_stroke"),
        ("ischaemic CVA", "acute_ischaemic_stroke"),
        ("haemorrhagic cerebrovascular accident", "haemorrhagic_stroke"),
        ("lacunar stroke", "lacunar_infarct"),
        ("lacunar CVA", "lacunar_infarct"),
    ],
)
def test_a_subtype_qualifier_selects_the_subtype(text: str, concept: str) -> None:
    found = L.lookup(text)
    assert found.concept_id == concept, (text, found)


def test_ischaemic_cva_gets_full_credit_against_acute_ischaemic_stroke() -> None:
    truth = Diagnosis(name="Acute ischaemic stroke, left MCA territory", icd10="I63.5")
    m = match_diagnosis("ischemic CVA", truth)
    assert m.correct and m.credit == 1.0, m


def test_acute_is_not_a_subtype_qualifier() -> None:
    assert L.lookup("acute CVA").concept_id == "stroke"
