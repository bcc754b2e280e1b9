"""Synonym families clinicians write (issue 18): "bleed", CVA variants and the Oxford stroke
classes, eponyms (bare and possessive), a bleed into a lesion, a site after the term; each family
is read by a rule or a lexicon entry, and each has a test here that failed before."""

from __future__ import annotations

import pytest

from evaluation.case import Diagnosis, DiseaseGroup
from evaluation.scoring.lexicon import default_lexicon, match_diagnosis

L = default_lexicon()


def _reads(text: str, concept: str) -> None:
    found = L.lookup(text)
    assert found.concept_id == concept, (text, found)


@pytest.mark.parametrize(
    ("text", "concept"),
    [
        ("left basal ganglia bleed", "deep_ich"),
        ("hypertensive bleed", "deep_ich"),
        ("intraparenchymal bleeding", "ich"),
        ("subdural bleed", "sdh"),
        ("epidural bleed", "edh"),
        ("pontine bleed", "brainstem_haemorrhage"),
        ("lobar bleed", "lobar_ich"),
        ("acute intracranial bleeding", "haemorrhagic_stroke"),
        ("a bleed", "haemorrhagic_stroke"),
        ("bleeding stroke", "haemorrhagic_stroke"),
        ("Bleeds", "haemorrhagic_stroke"),
    ],
)
def test_bleed_is_haemorrhage(text: str, concept: str) -> None:
    _reads(text, concept)


@pytest.mark.parametrize(
    ("text", "concept"),
    [
        ("bleed in the left thalamus", "deep_ich"),
        ("haemorrhage in the pons", "brainstem_haemorrhage"),
        ("infarct in the cerebellum", "cerebellar_infarct"),
        ("haemorrhage involving the right cerebellum", "cerebellar_haemorrhage"),
        ("stroke in the brainstem", "brainstem_infarct"),  # the nearest subtype with the word
        ("infarct of the left thalamus", "acute_ischaemic_stroke"),  # no thalamic infarct: parent
    ],
)
def test_a_site_after_the_term_selects_the_subtype(text: str, concept: str) -> None:
    _reads(text, concept)


@pytest.mark.parametrize(
    ("text", "concept"),
    [
        ("bleed into a tumour", "haemorrhagic_tumour"),
        ("haemorrhage into a tumor", "haemorrhagic_tumour"),
        ("bleeding within a metastasis", "haemorrhagic_metastasis"),
        ("intratumoral haemorrhage", "haemorrhagic_tumour"),
        ("haemorrhagic metastases", "haemorrhagic_metastasis"),
        ("haemorrhage into an infarct", "haemorrhagic_infarct"),
        ("haemorrhagic transformation of the infarct", "haemorrhagic_infarct"),
        ("pituitary apoplexy", "pituitary_apoplexy"),
    ],
)
def test_a_bleed_into_a_lesion_is_that_lesion(text: str, concept: str) -> None:
    _reads(text, concept)


def test_bleed_into_a_tumour_is_a_tumour_not_a_stroke() -> None:
    truth = Diagnosis(name="haemorrhagic melanoma metastasis", icd10="C79.3",
                      group=DiseaseGroup.TUMOUR)  # fmt: skip
    m = match_diagnosis("bleed into a metastasis", truth)
    assert m.correct, m
    wrong = match_diagnosis("bleed into a tumour", Diagnosis(name="intracerebral haemorrhage"))
    assert not wrong.correct and wrong.answer_concept == "haemorrhagic_tumour", wrong


@pytest.mark.parametrize(
    ("text", "concept"),
    [
        ("cerebral vascular accident", "stroke"),
        ("cerebrovascular event", "stroke"),
        ("CVE", "stroke"),
        ("haemorrhagic cerebrovascular accident", "haemorrhagic_stroke"),
        ("embolic CVA", "cardioembolic_stroke"),
        ("thromboembolic stroke", "acute_ischaemic_stroke"),
        ("LACI", "lacunar_infarct"),
        ("LACS", "lacunar_infarct"),
        ("TACI", "anterior_circulation_infarct"),
        ("partial anterior circulation infarct", "anterior_circulation_infarct"),
        ("POCI", "posterior_circulation_infarct"),
        ("posterior circulation stroke", "posterior_circulation_infarct"),
    ],
)
def test_cva_and_oxford_classes(text: str, concept: str) -> None:
    _reads(text, concept)


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("TACI", "left MCA territory infarct"),
        ("POCI", "right PCA territory infarct"),
        ("posterior circulation stroke", "cerebellar infarct"),
        ("ischaemic CVA", "acute ischaemic stroke"),
    ],
)
def test_oxford_class_is_the_right_ischaemic_stroke(answer: str, truth: str) -> None:
    m = match_diagnosis(answer, Diagnosis(name=truth))
    assert m.correct, m


@pytest.mark.parametrize(
    ("text", "concept"),
    [
        ("Devic's", "nmosd"),
        ("Marchiafava-Bignami", "marchiafava_bignami"),
        ("Wernicke's", "wernicke"),
        ("Creutzfeldt–Jakob", "cjd"),  # en dash
        ("Lhermitte-Duclos disease", "lhermitte_duclos"),
        ("Rasmussen's encephalitis", "rasmussen_encephalitis"),
        ("Alzheimer's", "alzheimers"),
        ("von Hippel-Lindau", "vhl"),  # a particle before the name
        ("Schilder's", "schilder"),
    ],
)
def test_eponyms_bare_or_possessive(text: str, concept: str) -> None:
    _reads(text, concept)


def test_negated_bleed_is_not_a_diagnosis() -> None:
    found = L.lookup("no bleed; acute ischaemic stroke")
    assert found.concept_id == "acute_ischaemic_stroke", found
    assert "haemorrhagic_stroke" in found.negated
