"""NeuroVLM-Bench end to end (issue 18): rows shaped exactly like the benchmark's
image_mapping.csv (its own subclass spellings, file paths with spaces, commas and parentheses,
empty fields) through the loader, the parser and the scorer; every tumour and stroke subtype is
scored, "undetermined" is the benchmark's abstention, not a format failure."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from engine_helpers import brain_png

from evaluation.case import Case, TaskFamily
from evaluation.datasets.neurovlm import load_neurovlm
from evaluation.parsing import parse_answer
from evaluation.scores import FieldDetails, ParseStatus
from evaluation.scoring import ScoredSample, make_scored_sample, summarise

# (class, subclass as the benchmark spells it, the model's spelling, modality, sequence, plane)
ROWS = [
    ("tumor", "glioma", "glioma", "MRI", "T1C+", "axial"),
    ("tumor", "meningioma", "meningioma", "MRI", "T1C+", "sagittal"),
    ("tumor", "neurocitoma", "neurocytoma", "MRI", "T1", ""),
    ("tumor", "papiloma", "papilloma", "MRI", "T2", "axial"),
    ("tumor", "meduloblastoma", "medulloblastoma", "MRI", "", "sagittal"),
    ("tumor", "pituitary tumor", "pituitary_tumor", "MRI", "T1C+", ""),
    ("tumor", "schwannoma", "schwannoma", "MRI", "T1C+", "axial"),
    ("tumor", "carcinoma", "carcinoma", "MRI", "FLAIR", "axial"),
    ("tumor", "tuberculoma", "tuberculoma", "MRI", "T1C+", "axial"),
    ("tumor", "germinoma", "germinoma", "MRI", "T1C+", "axial"),
    ("tumor", "granuloma", "granuloma", "MRI", "T1C+", "axial"),
    ("stroke", "ischemic", "ischemic", "CT", "", "axial"),
    ("stroke", "hemorrhagic", "hemorrhagic", "CT", "", ""),
    ("multiple sclerosis", "", None, "MRI", "FLAIR", "axial"),
    ("normal", "", None, "MRI", "T2", "axial"),
    ("other abnormalities", "", None, "CT", "", ""),
]
SUBTYPED = sum(1 for r in ROWS if r[1])


def _mapping(root: Path) -> Path:
    folder = root / "Brain Tumor (figshare), set 1"
    folder.mkdir(parents=True)
    with (root / "image_mapping.csv").open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["dataset", "file_path", "class", "original_class", "subclass", "modality",
                    "modality_subtype", "plane"])  # fmt: skip
        for n, (cls, sub, _, mod, seq, plane) in enumerate(ROWS):
            rel = f"{folder.name}/img ({n}), {sub or cls}.png"
            (root / rel).write_bytes(brain_png(seed=n))
            w.writerow(["figshare" if cls == "tumor" else "stroke", rel, cls, sub or cls, sub, mod,
                        seq, plane])  # fmt: skip
    return root / "image_mapping.csv"


def classified(case: Case, text: str) -> ScoredSample:
    """A classification reply parsed and scored as a run would (model "m")."""
    parsed = parse_answer(text, TaskFamily.CLASSIFICATION)
    return make_scored_sample(
        case, TaskFamily.CLASSIFICATION, "m", parsed.status, parsed.answer, text, bertscore=False
    )


def _reply(cls: str, sub: str | None, mod: str, seq: str, plane: str) -> str:
    return json.dumps(
        {
            "modality": mod,
            "specialized_sequence": seq or None,
            "plane": plane or "axial",
            "diagnosis_name": cls,
            "diagnosis_detailed": sub,
            "icd10_code": None,
            "severity_score": 0.5,
            "diagnosis_confidence": 0.8,
            "severity_confidence": 0.5,
        }
    )


@pytest.fixture
def cases(tmp_path: Path) -> list:  # type: ignore[type-arg]
    _, loaded, warnings = load_neurovlm(_mapping(tmp_path / "nvb"), None, tmp_path / "cache")
    assert not warnings and len(loaded) == len(ROWS)
    return loaded


def test_every_subtype_in_the_benchmarks_spelling_is_scored(cases: list) -> None:  # type: ignore[type-arg]
    scored_subtypes = 0
    for case, (cls, sub, said, mod, seq, plane) in zip(cases, ROWS, strict=True):
        s = classified(case, _reply(cls, said, mod, seq, plane))
        assert s.status is ParseStatus.OK, s.scores
        assert s.value("classification_correct") == 1.0, (case.case_id, s.scores)
        sub_score = s.score("classification_subtype")
        if sub:
            assert sub_score is not None and sub_score.value == 1.0, (sub, sub_score)
            scored_subtypes += 1
        else:
            assert sub_score is not None and sub_score.value is None  # no subtype to score
        assert s.value("safety_flags") == 0.0, s.score("safety_flags")
    assert scored_subtypes == SUBTYPED == 13


@pytest.mark.parametrize(
    ("table", "said"),
    [
        ("Pituitary Tumour", "pituitary_tumor"),
        ("Haemorrhagic", "hemorrhagic"),
        ("schwanoma", "schwannoma"),  # a one-letter slip in the label table
        ("meningeoma", "Meningioma"),
        ("Neurocitoma", "central neurocytoma"),
    ],
)
def test_other_spellings_of_a_subtype_are_scored(tmp_path: Path, table: str, said: str) -> None:
    """Spellings beyond the benchmark's own, on either side, read as the subtype."""
    cls = "stroke" if "haem" in table.lower() else "tumor"
    root = tmp_path / "nvb"
    root.mkdir()
    (root / "a (1).png").write_bytes(brain_png(seed=1))
    (root / "image_mapping.csv").write_text(
        "dataset,file_path,class,original_class,subclass,modality,modality_subtype,plane\n"
        f'x,"a (1).png",{cls},{cls},{table},MRI,,\n'
    )
    _, [case], warnings = load_neurovlm(root / "image_mapping.csv", None, tmp_path / "cache")
    assert not warnings
    s = classified(case, _reply(cls, said, "MRI", "", ""))
    assert s.value("classification_subtype") == 1.0, s.score("classification_subtype")


def test_a_wrong_subtype_is_scored_wrong(cases: list) -> None:  # type: ignore[type-arg]
    case = cases[2]  # neurocitoma
    s = classified(case, _reply("tumor", "papilloma", "MRI", "T1", ""))
    assert s.value("classification_subtype") == 0.0


@pytest.mark.parametrize(
    "field_value",
    ["undetermined", "Undetermined", "UNDETERMINED ", "indeterminate", "cannot be determined"],
)
def test_undetermined_is_the_benchmarks_abstention(cases: list, field_value: str) -> None:  # type: ignore[type-arg]
    data = json.loads(_reply("tumor", "glioma", "MRI", "T1C+", "axial"))
    data["diagnosis_name"] = field_value
    data["diagnosis_detailed"] = field_value
    data["plane"] = field_value
    text = json.dumps(data)
    parsed = parse_answer(text, TaskFamily.CLASSIFICATION)
    assert parsed.status is ParseStatus.OK, parsed.error
    assert parsed.answer.diagnosis_name is None and parsed.answer.plane is None  # type: ignore[union-attr]
    s = classified(cases[0], text)
    main = s.score("classification_correct")
    field = main.details_as(FieldDetails) if main is not None else None
    assert main is not None and main.value == 0.0 and field is not None and field.abstained
    summary = summarise([s], n_boot=20)
    assert summary.neurovlm["m"].abstention_rate == 1.0
