"""The phantom generator's provenance is a typed record (issue 36), read back from the
case.json files earlier versions wrote, byte for byte, with nothing they hold lost."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from evaluation.case import (
    Case,
    PhantomFacts,
    PhantomLesionFacts,
    PhantomSeries,
    Provenance,
)

# A case.json's provenance exactly as generator version 4 wrote it (ph-003-stroke-mca, seed 0;
# two of its seven series), with keys no version of ours wrote, at each level.
OLD_PROVENANCE = {
    "answers_by_question": {},
    "burned_in_series": [],
    "dataset": None,
    "generator": "neurosandbox-phantoms 4",
    "identity": None,
    "neurovlm": None,
    "phantom": {
        "case_index": 3,
        "difficulty": "L1",
        "facts": {
            "branch": "M2 superior division",
            "onset_hours": 12.1,
            "side": "right",
            "territory": "MCA",
            "collateral_grade": 2,
        },
        "field_strength_t": 3.0,
        "group": "stroke-mca",
        "lesion_facts": [
            {"branch": "M2 superior division", "onset_hours": 12.1, "territory": "MCA"},
            {"active": False, "black_hole": True, "placement": "periventricular", "shape": "ovoid"},
        ],
        "series": [
            {
                "description": "Head 5.0 non-contrast",
                "modality": "CT",
                "role": "ct",
                "series_class": "CT",
                "series_uid": "2.25.141382057986148938679299451789604265457",
            },
            {
                "description": "ep2d_diff_b0_1000_tra",
                "modality": "MR",
                "role": "dwi",
                "series_class": "DWI",
                "series_uid": "2.25.35219065615602466396829658806957148620",
                "b_values": [0, 1000],
            },
        ],
    },
    "seed": 0,
    "series_not_shown": None,
    "patient": None,
    "source": "phantom",
    "study_uids": ["2.25.7785183793282500046462279670562549912"],
}


def test_an_old_case_json_reads_back_typed() -> None:
    case = Case.model_validate(
        {"case_id": "ph-003-stroke-mca", "provenance": json.loads(json.dumps(OLD_PROVENANCE))}
    )
    made = case.provenance.phantom
    assert made is not None
    assert made.facts.territory == "MCA" and made.facts.onset_hours == 12.1
    assert made.facts.side == "right" and made.facts.site is None
    assert made.lesion_facts[1].black_hole is True and made.lesion_facts[1].active is False
    dwi = made.series[1]
    assert isinstance(dwi, PhantomSeries) and dwi.series_class == "DWI" and dwi.modality == "MR"
    # what this version does not know is kept, and written back where it was
    assert made.facts.extra == {"collateral_grade": 2}
    assert made.lesion_facts[1].extra == {"shape": "ovoid"}
    assert dwi.extra == {"b_values": [0, 1000]}
    again = json.loads(case.model_dump_json())["provenance"]
    assert json.dumps(again, sort_keys=True) == json.dumps(OLD_PROVENANCE, sort_keys=True)


def test_a_mistyped_fact_is_caught() -> None:
    """The old ``facts["teritory"]`` read raised KeyError at best, ``.get`` gave None."""
    facts = Provenance.model_validate(OLD_PROVENANCE).phantom.facts  # type: ignore[union-attr]
    with pytest.raises(AttributeError):
        _ = facts.teritory  # type: ignore[attr-defined]
    with pytest.raises(ValidationError):  # a value of the wrong type
        PhantomFacts(onset_hours="soon")  # type: ignore[arg-type]


def test_the_generator_declares_every_fact_it_draws() -> None:
    from evaluation.datasets.phantoms.case import drawn

    got = drawn(PhantomLesionFacts, {"radius_mm": 20.4, "intratumoural_haemorrhage": True})
    assert got.radius_mm == 20.4 and got.intratumoural_haemorrhage is True
    with pytest.raises(ValueError, match="collateral_grade"):
        drawn(PhantomFacts, {"territory": "MCA", "collateral_grade": 2})
