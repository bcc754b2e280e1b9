"""Results by subgroup (evaluation.scoring.subgroups): each figure by vendor, scanner model, field
strength, age band and sex, read from the headers the run recorded and the patient record, with n
and a CI clustered by patient; a subgroup under the minimum size flagged, never dropped; hostile
header values read by stated rules; the real corpus' headers give the right vendor and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from scoring_cases import answer, stroke_case

from evaluation.case import Case, StudyIdentity, StudyScanner, TaskFamily
from evaluation.scores import ParseStatus
from evaluation.scoring import (
    ScoredSample,
    case_attributes,
    make_scored_sample,
    subgroup_results,
    subgroup_table,
    summarise,
)
from evaluation.scoring.stats import bootstrap_mean
from evaluation.scoring.subgroups import (
    NOT_READABLE,
    NOT_RECORDED,
    age_of_header,
    field_strength_label,
    field_strength_tesla,
    vendor_name,
)

D = TaskFamily.DIFFERENTIAL
RIGHT = answer("acute ischaemic stroke", differential=["acute ischaemic stroke"])
WRONG = answer("multiple sclerosis", differential=["multiple sclerosis"])


def _bundle(birth: str, gender: str) -> dict[str, Any]:
    return {
        "resourceType": "Bundle",
        "type": "collection",
        "timestamp": "2026-03-01T10:00:00Z",
        "entry": [{"resource": {"resourceType": "Patient", "birthDate": birth, "gender": gender}}],
    }


def _case(n: int, manufacturer: str, field: float | None, **ident: Any) -> Case:
    c = stroke_case()
    scanner = StudyScanner(
        manufacturer=manufacturer, model_name="Model X", field_strength=field, n_series=3
    )
    c = c.model_copy(update={"case_id": f"c{n}", "patient_id": f"p{n}"}, deep=True)
    c.provenance.identity = StudyIdentity(scanners=[scanner], **ident)
    return c


def _sample(case: Case, outcome: object, model: str = "m", index: int = 0) -> ScoredSample:
    status = outcome if isinstance(outcome, ParseStatus) else ParseStatus.OK
    parsed = None if isinstance(outcome, ParseStatus) else RIGHT if outcome else WRONG
    return make_scored_sample(
        case, D, model, status, parsed, "", sample_index=index, bertscore=False
    )


def _run() -> tuple[list[Case], list[ScoredSample]]:
    """12 Siemens patients (three spellings; 9 right, 3 wrong), 3 GE patients at 15000 gauss
    (2 right, 1 format failure); ages from the record for the Siemens ones, PatientAge for GE."""
    spellings = ["SIEMENS", "Siemens Healthineers", "Siemens HealthCare GmbH"]
    cases, samples = [], []
    for i in range(12):
        c = _case(i, spellings[i % 3], 3.0)
        c.ehr = _bundle("1950-06-01" if i < 6 else "1990-06-01", "female" if i % 2 else "male")
        cases.append(c)
        samples.append(_sample(c, i < 9))
    for i, outcome in enumerate([True, True, ParseStatus.FORMAT_FAILURE]):
        c = _case(20 + i, "GE MEDICAL SYSTEMS", 15000.0, age="045Y", sex="F")
        cases.append(c)
        samples.append(_sample(c, outcome))
    return cases, samples


def _row(rows: list[Any], attribute: str, value: str, metric: str = "accuracy") -> Any:
    found = [r for r in rows if (r.attribute, r.value, r.metric) == (attribute, value, metric)]
    assert len(found) == 1, (attribute, value, metric, [(r.attribute, r.value) for r in rows])
    return found[0]


def test_the_subgroup_table_of_a_small_run_matches_a_hand_computation() -> None:
    cases, samples = _run()
    rows = subgroup_results(cases, samples, n_boot=400)
    siemens = _row(rows, "vendor", "Siemens")  # three spellings, one vendor
    assert (siemens.n, siemens.n_patients, siemens.n_cases) == (12, 12, 12)
    assert siemens.estimate == pytest.approx(9 / 12)
    assert not siemens.too_small
    same = bootstrap_mean([1.0] * 9 + [0.0] * 3, [f"p{i}" for i in range(12)], n_boot=400)
    assert (siemens.ci_low, siemens.ci_high) == (same.low, same.high)
    assert siemens.ci_low < siemens.estimate < siemens.ci_high

    ge = _row(rows, "vendor", "GE")
    assert (ge.n, ge.n_patients, ge.unscored) == (2, 2, 1)  # the format failure is unscored
    assert ge.estimate == pytest.approx(1.0)
    assert ge.too_small and ge.too_small_text == "too small (n=2)"
    strict = _row(rows, "vendor", "GE", "strict_accuracy")  # ... and wrong in strict accuracy
    assert (strict.n, strict.estimate) == (3, pytest.approx(2 / 3))
    assert strict.ci_low is not None and strict.ci_high is not None

    assert _row(rows, "field_strength", "3 T").n == 12
    assert _row(rows, "field_strength", "1.5 T").n == 2  # 15000 gauss
    assert _row(rows, "age_band", "60-79").estimate == pytest.approx(1.0)  # born 1950, 6 right
    assert _row(rows, "age_band", "18-39").estimate == pytest.approx(3 / 6)
    assert _row(rows, "age_band", "40-59").n_cases == 3  # PatientAge 045Y: the header's
    assert _row(rows, "sex", "female").n_cases == 6 + 3
    assert _row(rows, "scanner_model", "GE Model X").n == 2


def test_a_subgroup_holding_every_answer_gives_the_leaderboard_figure() -> None:
    _, samples = _run()
    rows = subgroup_results([], samples, n_boot=300)  # no case known: all "not recorded"
    everyone = _row(rows, "vendor", NOT_RECORDED)
    board = summarise(samples, n_boot=300).leaderboard[0].accuracy
    assert (everyone.estimate, everyone.ci_low, everyone.ci_high, everyone.n) == (
        board.value,
        board.low,
        board.high,
        board.n,
    )


def test_where_age_and_sex_came_from_is_counted() -> None:
    cases, samples = _run()
    table = subgroup_table(cases, samples, n_boot=100)
    assert table.sources["age_band"] == {"record": 12, "DICOM PatientAge": 3}
    assert table.sources["sex"] == {"record": 12, "DICOM PatientSex": 3}
    assert table.sources["vendor"] == {"DICOM headers": 15}
    assert table.min_patients == 10


def test_too_small_subgroups_stay_in_the_table() -> None:
    cases, samples = _run()
    rows = subgroup_results(cases, samples, min_patients=13, n_boot=100)
    assert _row(rows, "vendor", "Siemens").too_small  # 12 < 13: flagged, still there
    assert _row(rows, "vendor", "Siemens").estimate == pytest.approx(0.75)


@pytest.mark.parametrize(
    ("written", "vendor"),
    [
        ("SIEMENS", "Siemens"),
        ("Siemens Healthineers", "Siemens"),
        ("Siemens HealthCare GmbH", "Siemens"),
        ("GE MEDICAL SYSTEMS", "GE"),
        ("GE Healthcare", "GE"),
        ("Philips Medical Systems", "Philips"),
        ("Philips Healthcare", "Philips"),
        ("UIH", "United Imaging"),
        ("TOSHIBA", "Canon (Toshiba)"),
        ("Canon Medical Systems Corporation", "Canon"),
        ("GENERIC IMAGING", "GENERIC IMAGING"),  # "GE" inside a word is not GE
        ("Acme Medical Systems, Inc.", "Acme"),
        ("  ", NOT_RECORDED),
        ("Evil\x00<script>alert(1)</script>" + "x" * 500, None),
    ],
)
def test_vendor_spellings(written: str, vendor: str | None) -> None:
    got = vendor_name(written)
    if vendor is None:  # hostile: bounded, no control characters (escaping is the page's)
        assert len(got) <= 40 and "\x00" not in got
    else:
        assert got == vendor


@pytest.mark.parametrize(
    ("written", "label"),
    [
        (1.5, "1.5 T"),
        (3, "3 T"),
        ("3.0", "3 T"),
        (2.89362, "3 T"),  # a Trio's
        (15000, "1.5 T"),  # gauss
        (30000, "3 T"),
        (640, "0.064 T"),  # gauss, an ultra-low-field scanner
        (0.55, "0.55 T"),
        (4.0, "4 T"),
        (50, NOT_READABLE),
        (0, NOT_READABLE),
        (-3, NOT_READABLE),
        (float("nan"), NOT_READABLE),
        (float("inf"), NOT_READABLE),
        (10**9, NOT_READABLE),
        ("abc", NOT_READABLE),
    ],
)
def test_field_strength_rule(written: object, label: str) -> None:
    assert field_strength_label(field_strength_tesla(written)) == label


def test_patient_age_header_rule() -> None:
    assert age_of_header("045Y") == 45
    assert age_of_header("018M") == 1
    assert age_of_header("000Y") is None  # anonymised, not a newborn
    assert age_of_header("***") is None
    assert age_of_header("45") is None


def test_an_unreadable_record_and_headers_leave_not_recorded() -> None:
    c = stroke_case().model_copy(update={"case_id": "x"}, deep=True)
    c.ehr = {"resourceType": "Bundle", "entry": [{"resource": {"resourceType": "Patient",
             "gender": ["x"] * 5, "birthDate": "not a date"}}]}  # fmt: skip
    c.provenance.identity = StudyIdentity(sex="", age="***", birth_date="", scanners=[])
    a = case_attributes(c)
    assert (a.vendor, a.field_strength, a.age_band) == (NOT_RECORDED,) * 3
    assert a.sex in (NOT_RECORDED, NOT_READABLE)


@pytest.mark.parametrize(
    ("folder", "vendor", "field", "model"),
    [
        ("siemens_xa30/In", "Siemens", "3 T", "Siemens MAGNETOM Prisma Fit"),
        ("ge_pioneer", "GE", "3 T", "GE SIGNA Pioneer"),
        ("brainix", "Philips", "1.5 T", "Philips Achieva"),
        ("uih_umr770", "United Imaging", "3 T", "United Imaging uMR 770"),
    ],
)
def test_real_corpus_headers_give_vendor_and_field_strength(
    corpus: Path, folder: str, vendor: str, field: str, model: str
) -> None:
    from dicom import index_path, study_identity_and_persons
    from evaluation.case import Provenance

    found, _ = study_identity_and_persons(index_path(corpus / folder))
    assert found is not None
    c = Case(
        case_id=folder,
        provenance=Provenance(
            source="folder", identity=StudyIdentity.model_validate(found.model_dump())
        ),
    )
    a = case_attributes(c)
    assert (a.vendor, a.field_strength, a.scanner_model) == (vendor, field, model)
    assert a.scanner_source == "DICOM headers"
    if folder == "siemens_xa30/In":
        assert (a.age_band, a.age_source, a.sex) == ("18-39", "DICOM PatientAge", "female")
    if folder == "ge_pioneer":  # PatientAge 000Y: anonymised, not a newborn
        assert a.age_band == NOT_RECORDED


def test_the_dataset_hash_leaves_out_what_the_subgroups_read() -> None:
    """A dataset keeps the hash it had before scanners, PatientAge and the record's age and sex
    were recorded: runs of it a month apart still compare (runs compare needs one hash)."""
    import hashlib
    import json

    from evaluation.case import RecordPatient
    from evaluation.datasets import dataset_hash

    c = _case(1, "SIEMENS", 3.0, age="045Y", sex="F")
    body = c.model_dump(mode="json", exclude={"images": {"__all__": {"path"}}})
    del body["provenance"]["identity"]["age"], body["provenance"]["identity"]["scanners"]
    del body["provenance"]["patient"]
    before = hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    ).hexdigest()
    assert dataset_hash([c]) == before
    c.provenance.patient = RecordPatient(age=50, sex="female")
    assert dataset_hash([c]) == before
    c.provenance.identity.sex = "M"  # what was hashed before still is
    assert dataset_hash([c]) != before


def test_a_run_snapshot_keeps_the_records_age_and_sex_and_nothing_else_of_it() -> None:
    from evaluation.scoring_bridge import scoring_snapshot

    c = _case(1, "SIEMENS", 3.0, age="020Y", sex="M")
    c.ehr = _bundle("1930-01-01", "female")  # 96 at the timestamp
    snap = scoring_snapshot(c)
    assert snap.ehr is None
    assert snap.provenance.patient is not None
    assert (snap.provenance.patient.age, snap.provenance.patient.sex) == (90, "female")
    a = case_attributes(snap)  # the record wins over the headers, from the snapshot too
    assert (a.age_band, a.age_source, a.sex, a.sex_source) == (
        "80 and over",
        "record",
        "female",
        "record",
    )
