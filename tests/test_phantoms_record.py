"""The record of each phantom case: what its FHIR R4 Bundle carries, and the L2 cases it decides.

At L2 a ring-enhancing lesion comes without diffusion images, so the images cannot tell an
abscess from a glioblastoma; the record must (fever, raised CRP and white cells, or none).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
from phantom_fixture import PhantomSuite

from evaluation.case import Case, DiseaseGroup, Enhancement

TEMPERATURE, CRP, WBC = "8310-5", "1988-5", "6690-2"  # LOINC
SCALES = {"stroke": "NIH Stroke Scale total score", "ms": "EDSS", "ich": "Glasgow coma score total"}


def _of(bundle: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e["resource"] for e in bundle["entry"] if e["resource"]["resourceType"] == kind]


def _observation(bundle: dict[str, Any], loinc: str | None = None, text: str | None = None):  # type: ignore[no-untyped-def]
    """The one Observation with this LOINC code or code text, or None."""
    hits = [
        o
        for o in _of(bundle, "Observation")
        if (loinc and any(c["code"] == loinc for c in o["code"].get("coding", [])))
        or (text and o["code"]["text"] == text)
    ]
    assert len(hits) <= 1
    return hits[0] if hits else None


def _value(obs: dict[str, Any]) -> float:
    return float(obs["valueQuantity"]["value"])


def _flag(obs: dict[str, Any]) -> str | None:
    coding = obs.get("interpretation", [{}])[0].get("coding", [{}])
    return coding[0].get("code")


def inflamed(bundle: dict[str, Any]) -> bool | None:
    """True: fever with CRP and white cells raised and flagged; False: all three normal."""
    t, crp, wbc = (_observation(bundle, code) for code in (TEMPERATURE, CRP, WBC))
    assert t and crp and wbc, "temperature, CRP and white cells must be in the record"
    high = (_value(t) >= 38.0, _value(crp) > 10, _value(wbc) > 11)
    if all(high):
        assert _flag(crp) == "H" and _flag(wbc) == "H" and _flag(t) == "H"
        return True
    if not any(high):
        assert _value(t) < 37.5 and _value(crp) <= 5 and _flag(crp) == "N" and _flag(wbc) == "N"
        return False
    return None  # mixed: neither picture


def check_record(bundle: dict[str, Any], group: str, difficulty: str) -> None:
    """What every record carries, whatever the case."""
    where = (group, difficulty)
    assert bundle["resourceType"] == "Bundle" and bundle["type"] == "collection"
    (patient,) = _of(bundle, "Patient")
    (encounter,) = _of(bundle, "Encounter")
    assert encounter["reasonCode"][0]["text"], where
    assert encounter["subject"]["reference"] == f"urn:uuid:{patient['id']}"
    assert _of(bundle, "Condition") and all(c["code"]["text"] for c in _of(bundle, "Condition"))
    meds = _of(bundle, "MedicationStatement")
    assert meds and all(m["medicationCodeableConcept"]["text"] for m in meds), where
    assert len(_of(bundle, "DocumentReference")) == 1
    labs = [_observation(bundle, code) for code in (CRP, WBC)]
    if difficulty == "L3":
        assert labs == [None, None], where  # held back for the last turn
    else:
        assert all(o and o["category"][0]["coding"][0]["code"] == "laboratory" for o in labs)
    family = "stroke" if group.startswith("stroke-") else group
    for name, scale in SCALES.items():
        obs = _observation(bundle, text=scale)
        assert (obs is not None) == (family == name), (where, scale)
        if obs is not None:
            assert obs["category"][0]["coding"][0]["code"] == "survey"
    if difficulty != "L3" and family in ("abscess", "gbm"):
        assert inflamed(bundle) is (family == "abscess"), where


def test_every_record_carries_conditions_medications_reason_labs_and_scales() -> None:
    """Over many seeds and every scheduled case (records only, no images)."""
    from evaluation.datasets.phantoms import case_specs
    from evaluation.datasets.phantoms.clinical import scenario
    from evaluation.datasets.phantoms.ehr import build_bundle, note_text
    from evaluation.datasets.phantoms.identity import make_identity
    from evaluation.datasets.phantoms.masses import PRIMARIES

    when = dt.datetime(2024, 3, 2, 10, 15)
    empty_lists = 0
    for seed in range(10):
        for spec in case_specs(30):
            rng = np.random.default_rng([seed, spec.index])
            facts: dict[str, object] = {
                "side": ("left", "right")[seed % 2],
                "territory": spec.group.rsplit("-", 1)[-1].upper(),
                "onset_hours": 2.5 + seed,
                "primary": PRIMARIES[seed % len(PRIMARIES)],
            }
            c = scenario(spec.group, spec.difficulty, facts, rng, 60, "M")
            idn = make_identity(rng, 60, "M", when.date())
            bundle, _ = build_bundle(idn, c, when, note_text(idn, c, when, rng), seed, "ph-x")
            check_record(bundle, spec.group, spec.difficulty)
            if not c.medications:
                empty_lists += 1
                (med,) = _of(bundle, "MedicationStatement")
                assert med["medicationCodeableConcept"]["coding"][0]["code"] == (
                    "no-known-medications"
                )
    assert empty_lists > 0  # the explicit "none" statement was exercised


def test_generated_records_carry_what_the_case_needs(
    phantom_suite: PhantomSuite, phantom_more: PhantomSuite
) -> None:
    for suite in (phantom_suite, phantom_more):
        for key in suite.cases:
            case = Case.model_validate_json(
                (suite.case_dir(key) / "case.json").read_text(encoding="utf-8")
            )
            made = case.provenance.phantom
            assert case.ehr is not None and made is not None
            check_record(case.ehr, made.group, made.difficulty)


def test_the_record_decides_abscess_against_glioblastoma_at_l2(
    phantom_suite: PhantomSuite, phantom_more: PhantomSuite
) -> None:
    cases = {
        key: Case.model_validate_json(
            (suite.case_dir(key) / "case.json").read_text(encoding="utf-8")
        )
        for suite, keys in (
            (phantom_suite, ("gbm", "abscess")),
            (phantom_more, ("gbm-l2", "abscess-l2")),
        )
        for key in keys
    }
    for key, case in cases.items():
        gt = case.ground_truth
        assert gt is not None and case.ehr is not None and case.note
        abscess = key.startswith("abscess")
        assert (gt.final_diagnosis.group is DiseaseGroup.INFECTION) == abscess
        assert gt.lesions[0].enhancement is Enhancement.RING  # the same picture on T1C
        assert inflamed(case.ehr) is abscess, key
        crp = _value(_observation(case.ehr, CRP))
        assert f"CRP {crp:g}" in case.note  # the note quotes the same value
        if key.endswith("l2"):
            assert gt.difficulty.value == "L2"
            # No diffusion images: restricted diffusion cannot tell them apart here.
            classes = {s.series_class for s in case.provenance.phantom.series}
            assert {"T1C", "T1"} <= classes and not classes & {"DWI", "ADC"}, key
    rationale = cases["abscess-l2"].ground_truth.rationale  # type: ignore[union-attr]
    assert "Fever" in rationale and "CRP" in rationale
    assert "without fever" in cases["gbm-l2"].ground_truth.rationale  # type: ignore[union-attr]
