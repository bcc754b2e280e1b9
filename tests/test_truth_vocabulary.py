"""The truth in the team's own words: every controlled field of a manifest's ground truth
(region, lobe, hemisphere, sequence, signal, enhancement, diagnosis group) is read through the
vocabulary the answers are read through, or refused by `cases check` with the allowed values and
a did-you-mean; docs/cases.md lists the values from the code."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from evaluation.answers import Finding
from evaluation.case import Case, Provenance, TaskFamily

ROOT = Path(__file__).resolve().parents[1]


def _entry(lesion: dict[str, Any] | None = None, **truth: Any) -> dict[str, Any]:
    gt: dict[str, Any] = {"final_diagnosis": {"name": "acute ischaemic stroke"}, **truth}
    if lesion is not None:
        gt["lesions"] = [{"id": "l1", "type": "acute infarct", **lesion}]
    return {"case_id": "c1", "study": "s", "ground_truth": gt}


def _truth(entry: dict[str, Any]) -> Any:
    from evaluation.datasets.manifest import parse_manifest

    parsed = parse_manifest({"name": "t", "cases": [entry]})
    assert not parsed.problems, parsed.problems
    (case,) = parsed.cases
    assert case is not None and case.ground_truth is not None
    return case.ground_truth


def _problems(entry: dict[str, Any]) -> list[str]:
    from evaluation.datasets.manifest import parse_manifest

    return [str(p) for p in parse_manifest({"name": "t", "cases": [entry]}).problems]


STROKE = {"hemisphere": "left", "region": "frontal", "signal": {"DWI": "hyperintense"}}


def test_frontal_lobe_in_the_truth_scores_as_frontal() -> None:
    """The issue's example: `region: frontal lobe` against "left frontal lobe, DWI hyperintense,
    30 mm" scored 0.00/0.00 (hallucinated + missed); it is the frontal region."""
    from evaluation.scoring.lesions import match_lesions

    gt = _truth(_entry({**STROKE, "region": "frontal lobe", "size_mm": 30}))
    case = Case(
        case_id="c1", ground_truth=gt, tasks=[TaskFamily.LESION], provenance=Provenance(source="t")
    )
    res = match_lesions(case, [Finding(description="left frontal lobe, DWI hyperintense, 30 mm")])
    assert res is not None
    assert (res.precision, res.recall) == (1.0, 1.0)


@pytest.mark.parametrize(
    ("field", "written", "read"),
    [
        ("region", "frontal lobe", "frontal"),
        ("region", "Parietal Lobe", "parietal"),
        ("region", "left thalamus", "thalamus"),
        ("region", "pons", "brainstem"),
        ("region", "extra axial", "extra-axial"),
        ("region", "periventricular white matter", "periventricular white matter"),
        ("lobe", "temporal lobe", "temporal"),
        ("hemisphere", "L", "left"),
        ("hemisphere", "left hemisphere", "left"),
        ("hemisphere", "Right", "right"),
        ("hemisphere", "both", "bilateral"),
        ("enhancement", "ring-enhancing", "ring"),
        ("enhancement", "non-enhancing", "none"),
    ],
)
def test_lesion_fields_are_read_through_the_answer_vocabulary(
    field: str, written: str, read: str
) -> None:
    gt = _truth(_entry({**STROKE, field: written}))
    assert str(getattr(gt.lesions[0], field)) == read


@pytest.mark.parametrize(
    ("signal", "read"),
    [
        ({"T2-FLAIR": "hyperintense"}, {"FLAIR": "hyperintense"}),
        ({"DWI": "hyperintense on DWI"}, {"DWI": "hyperintense"}),
        ({"diffusion": "restricted"}, {"DWI": "hyperintense"}),
        ({"ADC map": "restricted diffusion"}, {"ADC": "hypointense"}),
        ({"T1 post-contrast": "bright"}, {"T1C": "hyperintense"}),
        ({"non-contrast CT": "high density"}, {"CT": "hyperdense"}),
        ({"CT": "hypodense"}, {"CT": "hypodense"}),
        ({"SWI": "blooming"}, {"SWI": "hypointense"}),
        ({"TRACE": "isointense"}, {"TRACE": "isointense"}),  # a canonical class stays as written
    ],
)
def test_signal_sequences_and_values_are_read_through_the_vocabulary(
    signal: dict[str, str], read: dict[str, str]
) -> None:
    gt = _truth(_entry({**STROKE, "signal": signal}))
    assert {k: str(v) for k, v in gt.lesions[0].signal.items()} == read


@pytest.mark.parametrize(
    ("group", "read"),
    [
        ("ischemic stroke", "ischaemic_stroke"),
        ("Ischaemic stroke", "ischaemic_stroke"),
        ("tumor", "tumour"),
        ("haemorrhagic-stroke", "haemorrhagic_stroke"),
        ("multiple sclerosis", "demyelinating"),  # a lexicon name: its concept's group
    ],
)
def test_diagnosis_groups_are_read_through_the_vocabulary(group: str, read: str) -> None:
    entry = _entry(None)
    entry["ground_truth"]["final_diagnosis"]["group"] = group
    entry["ground_truth"]["differential"] = [{"name": "glioma", "group": group}]
    gt = _truth(entry)
    assert gt.final_diagnosis.group.value == read
    assert gt.differential[0].group.value == read


@pytest.mark.parametrize(
    ("lesion", "path", "expect"),
    [
        ({"region": "frontl lobe"}, "lesions[0].region", "did you mean 'frontal'"),
        ({"region": "Frontallappen"}, "lesions[0].region", "allowed: frontal, parietal"),
        ({"region": "frontoparietal"}, "lesions[0].region", "frontal, parietal"),
        ({"lobe": "tempral"}, "lesions[0].lobe", "did you mean 'temporal'"),
        ({"hemisphere": "links"}, "lesions[0].hemisphere", "allowed: left, right, bilateral"),
        ({"signal": {"FLIAR": "bright"}}, "lesions[0].signal", "did you mean 'FLAIR'"),
        ({"signal": {"DWI": "glowing"}}, "lesions[0].signal", "allowed: hyperintense"),
        ({"enhancement": "enhancing"}, "lesions[0].enhancement", "ring"),
    ],
)
def test_words_the_vocabulary_does_not_map_are_refused(
    lesion: dict[str, Any], path: str, expect: str
) -> None:
    problems = _problems(_entry({**STROKE, **lesion}))
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"cases[0].ground_truth.{path}: "), problems
    assert expect in problems[0], problems


def test_a_misspelt_group_is_refused_with_did_you_mean() -> None:
    entry = _entry(None)
    entry["ground_truth"]["final_diagnosis"]["group"] = "demyelinatng"
    (problem,) = _problems(entry)
    assert problem.startswith("cases[0].ground_truth.final_diagnosis.group: ")
    assert "did you mean 'demyelinating'" in problem and "ischaemic_stroke" in problem


def test_cases_check_refuses_a_misspelt_region_and_passes_the_teams_words(
    tmp_path: Path,
) -> None:
    from gateway_synth import make_study

    from gateway.cli import app

    make_study(tmp_path / "s", classes=("FLAIR",), n_slices=3)  # the check indexes the study
    entry = _entry({**STROKE, "region": "frontal lobe", "hemisphere": "left hemisphere"})
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "cases": [entry]}))
    ok = CliRunner().invoke(app, ["cases", "check", str(path)])
    assert ok.exit_code == 0, ok.output
    entry["ground_truth"]["lesions"][0]["region"] = "frontl lobe"
    path.write_text(yaml.safe_dump({"name": "t", "cases": [entry]}))
    bad = CliRunner().invoke(app, ["cases", "check", str(path)])
    out = " ".join(bad.output.split())
    assert bad.exit_code == 1
    assert "cases[0].ground_truth.lesions[0].region" in out and "did you mean 'frontal'" in out


def test_docs_list_the_allowed_values_from_the_code() -> None:
    from evaluation.scoring.vocabulary import vocabulary_markdown

    text = (ROOT / "docs" / "cases.md").read_text()
    found = re.search(r"<!-- vocabulary:start -->\n(.*?)<!-- vocabulary:end -->", text, re.S)
    assert found, "docs/cases.md has no generated vocabulary block"
    assert found.group(1) == vocabulary_markdown(), (
        "regenerate the block: python -c 'from evaluation.scoring.vocabulary import "
        'vocabulary_markdown; print(vocabulary_markdown(), end="")\''
    )
