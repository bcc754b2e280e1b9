"""``neurosandbox export-case``: a case leaves as a de-identified bundle another site can load.

Two cases, end to end through the command line: a phantom case with names planted in several
person-name attributes (one inside a sequence), in the record and in the note; and the real
BRAINIX study of the shared corpus under a hospital manifest. Each bundle is read back here
independently of the command's own checks: every DICOM file parsed (marks, no original UID,
no person name), every file's bytes searched for the planted names and identifiers, one file
per series validated with dciodvfy against its source, and the bundle loaded back as a case,
rendered and evaluated.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import time
import zipfile
from pathlib import Path
from typing import Any

import pydicom
import pytest
from conftest import corpus_path
from dciodvfy import dciodvfy_errors
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence
from typer.testing import CliRunner

from gateway.cli import app

SALT = "export-case-test-salt-0123456789abcdef-not-a-secret"
PHANTOM_INDEX = 2  # an MS case: seven MR series
BRAINIX = "brainix/BRAINIX/DICOM"

# Planted in the phantom: person-name attributes of every file (one inside a kept sequence,
# one inside a removed sequence), the record (a practitioner, a performer, a family contact)
# and the note. The phantom plants the patient's own identifiers and the referring physician
# (who signs the note) itself.
PLANTED_DICOM = {
    "OperatorsName": "Kowalczyk^Agnieszka",
    "PerformingPhysicianName": "Okonkwo^Chibueze",
    "NameOfPhysiciansReadingStudy": "Fitzgerald^Siobhan",
}
NESTED_KEPT = "Nakamura^Hiroshi"  # PersonName in ReferencedStudySequence (kept sequence)
NESTED_REMOVED = "Lindqvist^Henrik"  # in RequestAttributesSequence (removed whole)
NOTE_TAIL = (
    "\nDiscussed with Dr Okonkwo and Siobhan Fitzgerald (radiology), and with Ingrid "
    "Thorvaldsen; scanned by A. Kowalczyk. Next of kin: Oisin Brannigan."
)
NAMES = [
    "Kowalczyk",
    "Agnieszka",
    "Okonkwo",
    "Chibueze",
    "Fitzgerald",
    "Siobhan",
    "Nakamura",
    "Hiroshi",
    "Lindqvist",
    "Henrik",
    "Thorvaldsen",
    "Ingrid",
    "Brannigan",
    "Oisin",
]


def _run(*args: str, cache: Path) -> tuple[int, str]:
    env = {"NEUROSANDBOX_CACHE_DIR": str(cache), "NEUROSANDBOX_DEID_SALT": SALT}
    res = CliRunner().invoke(app, list(args), env=env)
    return res.exit_code, " ".join(res.output.split())


def _uids(ds: Dataset) -> set[str]:
    """Instance UIDs of a dataset (any depth, file meta too), not standard class UIDs."""
    found: set[str] = set()
    for elem in [*ds.iterall(), *ds.file_meta]:
        if elem.VR == "UI" and elem.value and "ClassUID" not in elem.keyword:
            values = elem.value if isinstance(elem.value, list) else [elem.value]
            found.update(v for v in map(str, values) if not v.startswith("1.2.840.10008."))
    return found


def _source_uids(folder: Path) -> set[str]:
    out: set[str] = set()
    for path in folder.rglob("*.dcm"):
        out |= _uids(pydicom.dcmread(path, stop_before_pixels=True))
    return out


def _all_bytes(path: Path) -> bytes:
    """A file's bytes, with the decoded attachments of a JSON record appended."""
    data = path.read_bytes()
    if path.suffix == ".json":
        blobs: list[bytes] = []
        stack: list[Any] = [json.loads(data)]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                if isinstance(node.get("data"), str):
                    blobs.append(base64.b64decode(node["data"]))
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
        data += b"\n".join(blobs)
    return data


def _forms(text: str) -> set[bytes]:
    """`text` lowercased as it could be stored: UTF-8, and Latin-1 when it fits."""
    forms = {text.lower().encode("utf-8")}
    with contextlib.suppress(UnicodeEncodeError):
        forms.add(text.lower().encode("latin-1"))
    return forms


def _hits(bundle: Path, needles: list[str]) -> list[str]:
    """Needles found in the bundle's bytes (any case; whole words, so that a three-letter name
    is not found inside an unrelated word or a run of base64)."""
    forms = {form: needle for needle in needles for form in _forms(needle)}
    alternatives = b"|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True))
    pattern = re.compile(rb"(?<![a-z0-9])(?:" + alternatives + rb")(?![a-z0-9])")
    found: set[str] = set()
    for path in sorted(p for p in bundle.rglob("*") if p.is_file()):
        for match in pattern.finditer(_all_bytes(path).lower()):
            found.add(f"{path.relative_to(bundle)}: {forms[match.group(0)]}")
    return sorted(found)


def _check_bundle_dicom(bundle: Path, source_uids: set[str]) -> dict[str, list[Path]]:
    """Every DICOM file of the bundle, parsed again; returns the files per series folder."""
    files = sorted((bundle / "dicom").rglob("*.dcm"))
    assert files
    pseudonyms = set()
    series: dict[str, list[Path]] = {}
    for path in files:
        ds = pydicom.dcmread(path)
        series.setdefault(path.parent.name, []).append(path)
        assert ds.PatientIdentityRemoved == "YES"
        assert ds.DeidentificationMethod
        assert "113100" in {i.CodeValue for i in ds.DeidentificationMethodCodeSequence}
        assert ds.PatientName == ds.PatientID
        pseudonyms.add(str(ds.PatientID))
        assert not (_uids(ds) & source_uids), path
        for elem in ds.iterall():
            assert not elem.tag.is_private, (path, elem.tag)
            if elem.VR == "PN" and elem.value:
                assert str(elem.value) in (str(ds.PatientID), "ANONYMIZED"), (path, elem)
    assert len(pseudonyms) == 1 and next(iter(pseudonyms)).startswith("NS-")
    return series


def _dciodvfy_no_new_errors(series: dict[str, list[Path]], source: Path) -> int:
    """dciodvfy on the first file of each series: no error its source file does not have."""
    by_position: dict[tuple[int, int], Path] = {}
    for path in source.rglob("*.dcm"):
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        by_position[(int(ds.SeriesNumber), int(ds.InstanceNumber))] = path
    checked = 0
    for files in series.values():
        out = pydicom.dcmread(files[0], stop_before_pixels=True)
        src = by_position[(int(out.SeriesNumber), int(out.InstanceNumber))]
        new = set(dciodvfy_errors(files[0])) - set(dciodvfy_errors(src))
        assert not new, f"{files[0].parent.name}: dciodvfy errors the source lacks: {new}"
        checked += 1
    return checked


def _no_partial(parent: Path) -> None:
    assert not [p.name for p in parent.iterdir() if ".partial-" in p.name or p.suffix == ".part"]


# --------------------------------------------------------------------------- the phantom


def _plant(case_dir: Path) -> None:
    """Names in every file's person-name attributes, in the record and in the note."""
    for path in sorted((case_dir / "dicom").rglob("*.dcm")):
        ds = pydicom.dcmread(path)
        for keyword, value in PLANTED_DICOM.items():
            setattr(ds, keyword, value)
        ref = Dataset()
        ref.ReferencedSOPClassUID = "1.2.840.10008.3.1.2.3.1"
        ref.ReferencedSOPInstanceUID = ds.StudyInstanceUID
        ref.PersonName = NESTED_KEPT
        ds.ReferencedStudySequence = Sequence([ref])
        request = Dataset()
        request.RequestedProcedureID = "RQ-77120934"
        request.ScheduledPerformingPhysicianName = NESTED_REMOVED
        ds.RequestAttributesSequence = Sequence([request])
        ds.save_as(path)
    case = json.loads((case_dir / "case.json").read_text())
    case["note"] += NOTE_TAIL
    ehr = case["ehr"]
    ehr["entry"].append(
        {
            "fullUrl": "urn:uuid:11111111-2222-4333-8444-555555555555",
            "resource": {
                "resourceType": "Practitioner",
                "id": "11111111-2222-4333-8444-555555555555",
                "name": [{"family": "Thorvaldsen", "given": ["Ingrid"]}],
                "telecom": [{"system": "phone", "value": "+44 20 7946 0999"}],
            },
        }
    )
    for entry in ehr["entry"]:
        res = entry["resource"]
        if res["resourceType"] == "Patient":
            res["contact"] = [{"name": {"family": "Brannigan", "given": ["Oisin"]}}]
        if res["resourceType"] == "Observation" and "performer" not in res:
            res["performer"] = [
                {
                    "reference": "urn:uuid:11111111-2222-4333-8444-555555555555",
                    "display": "Dr Ingrid Thorvaldsen",
                }
            ]
    (case_dir / "case.json").write_text(json.dumps(case))
    (case_dir / "ehr.json").write_text(json.dumps(ehr))
    (case_dir / "note.txt").write_text(case["note"])


@pytest.fixture(scope="module")
def phantom(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, list[str]]:
    """One planted phantom case: (suite folder, case id, every identifier planted)."""
    from evaluation.datasets.phantoms import case_spec, generate_suite

    root = tmp_path_factory.mktemp("export-phantom")
    generate_suite(root, PHANTOM_INDEX, 11, only=[PHANTOM_INDEX])
    case_id = case_spec(PHANTOM_INDEX).case_id
    _plant(root / case_id)
    case = json.loads((root / case_id / "case.json").read_text())
    phi = case["ground_truth"]["phi"]
    values = {p["value"] for p in phi}
    people = ("dicom:PatientName", "dicom:ReferringPhysicianName", "ehr:Patient.name")
    names = [p["value"] for p in phi if p["where"] in people]
    words = {w for v in names for w in re.split(r"[\s^]+", v) if len(w) >= 3 and w.isalpha()}
    words -= {"Dr"}
    return root, case_id, sorted(values | words | set(NAMES))


def test_phantom_case_exports_verified_loads_renders_and_evaluates(
    phantom: tuple[Path, str, list[str]], tmp_path: Path
) -> None:
    suite, case_id, planted = phantom
    bundle = tmp_path / "bundle"
    cache = tmp_path / "cache"
    t0 = time.perf_counter()
    code, out = _run(
        "export-case", "--suite", str(suite), "--case", case_id, "--out", str(bundle), cache=cache
    )
    assert code == 0, out
    assert time.perf_counter() - t0 < 30
    assert "none found" in out and "the manifest loads" in out, out
    _no_partial(tmp_path)
    assert sorted(p.name for p in bundle.iterdir()) == [
        "deidentification.json",
        "dicom",
        "ehr.json",
        "manifest.yaml",
        "note.txt",
    ]

    # Every DICOM file parsed again; no planted name, identifier or original UID anywhere.
    source = suite / case_id / "dicom"
    series = _check_bundle_dicom(bundle, _source_uids(source))
    assert len(series) == 7 and sum(len(f) for f in series.values()) == 326
    assert _hits(bundle, planted) == []
    assert _dciodvfy_no_new_errors(series, source) == 7

    # What the command says it did, in the bundle (keywords and counts, never values).
    report = json.loads((bundle / "deidentification.json").read_text())
    assert report["check"]["problems"] == [] and report["check"]["manifest_loads"]
    assert {"OperatorsName", "PerformingPhysicianName", "NameOfPhysiciansReadingStudy"} <= set(
        report["dicom"]["removed"]
    )
    assert "ReferringPhysicianName" in report["dicom"]["emptied"]
    assert "RequestAttributesSequence" in report["dicom"]["removed"]
    assert report["record_removed"]["Practitioner"] == 1
    assert report["record_removed"]["ground_truth.phi"] > 10
    assert report["dicom"]["method_codes"] == ["113100", "113105", "113107"]

    # The record keeps what a prompt shows: the same age, sex and findings, shifted dates.
    from evaluation.ehr import EHRContext

    original = json.loads((suite / case_id / "ehr.json").read_text())
    shared_ehr = json.loads((bundle / "ehr.json").read_text())
    assert EHRContext.from_bundle(shared_ehr).text() == EHRContext.from_bundle(original).text()
    assert shared_ehr["timestamp"][:10] != original["timestamp"][:10]
    note = (bundle / "note.txt").read_text()
    assert "[REDACTED]" in note and "relative afferent pupillary defect" in note

    # The other site loads the bundle as a case: images render, the ground truth is there.
    from evaluation.datasets import DatasetSpec, load_dataset

    dataset = load_dataset(DatasetSpec(path=str(bundle / "manifest.yaml")), tmp_path / "site-b")
    (case,) = dataset.cases
    assert case.case_id == case_id and case.patient_id and case.patient_id.startswith("NS-")
    assert case.ground_truth is not None and case.ground_truth.phi == []
    assert case.ground_truth.final_diagnosis.name == "Multiple sclerosis"
    assert {i.series_class for i in case.images} >= {"FLAIR", "T2", "T1C", "DWI", "ADC"}
    for image in case.images:
        assert Path(image.path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # ... and `neurosandbox eval` runs on it (a reference model reads the images).
    code, out = _run(
        "eval",
        "--suite",
        str(bundle / "manifest.yaml"),
        "--model",
        "reference/image-rules",
        "--tasks",
        "differential",
        "--no-bertscore",
        "--out",
        str(tmp_path / "run"),
        cache=tmp_path / "site-b",
    )
    assert code == 0, out
    assert "1/1" in out, out


def test_export_refuses_an_existing_target_and_an_unknown_case(
    phantom: tuple[Path, str, list[str]], tmp_path: Path
) -> None:
    suite, case_id, _ = phantom
    taken = tmp_path / "taken"
    taken.mkdir()
    code, out = _run(
        "export-case", "--suite", str(suite), "--case", case_id, "--out", str(taken),
        cache=tmp_path / "cache",
    )  # fmt: skip
    assert code == 2 and "exists" in out
    code, out = _run(
        "export-case", "--suite", str(suite), "--case", "nope", "--out", str(tmp_path / "b"),
        cache=tmp_path / "cache",
    )  # fmt: skip
    assert code == 2 and "no case 'nope'" in out and case_id in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_every_option_has_help() -> None:
    import typer.main

    export = typer.main.get_command(app).commands["export-case"]  # type: ignore[attr-defined]
    options = [p for p in export.params if p.param_type_name == "option" and p.name != "help"]
    assert len(options) == 9
    for option in options:
        assert option.help and len(option.help) > 10, option.name
    res = CliRunner().invoke(app, ["export-case", "--help"])
    assert res.exit_code == 0 and "--allow-burned-in" in res.output


# --------------------------------------------------------------------------- a real study


def _brainix_manifest(folder: Path, corpus: Path) -> Path:
    """A hospital manifest for BRAINIX whose note repeats the study's own identifiers."""
    ds = pydicom.dcmread(corpus / BRAINIX / "T1" / "IM-0001-0001.dcm", stop_before_pixels=True)
    note = (
        f"Referred by Dr {ds.ReferringPhysicianName} for headache. Seen at {ds.InstitutionName}; "
        f"request {ds.RequestAttributesSequence[0].RequestedProcedureID}, study {ds.StudyID}. "
        "New left-sided weakness."
    )
    entry = {
        "case_id": "brainix",  # the patient's name: the command must refuse it as the case id
        "patient_id": str(ds.PatientID),
        "study": str(corpus / BRAINIX),
        "note": note,
        "ground_truth": {
            "final_diagnosis": {"name": "Glioblastoma", "icd10": "C71.9", "group": "tumour"},
            "rationale": "Infiltrative mass, oedema on FLAIR (tumour mask series given).",
        },
        "tasks": ["differential"],
    }
    path = folder / "hospital.yaml"
    path.write_text(json.dumps({"name": "hospital", "cases": [entry]}))
    return path


def test_real_study_exports_as_a_zip_bundle(tmp_path: Path) -> None:
    corpus = corpus_path()
    labels = json.loads((corpus / "labels.json").read_text())["series"]
    expected = sorted(v["class"] for k, v in labels.items() if k.startswith(BRAINIX + "/"))
    manifest = _brainix_manifest(tmp_path, corpus)
    source = corpus / BRAINIX
    first = pydicom.dcmread(source / "T1" / "IM-0001-0001.dcm", stop_before_pixels=True)
    identifiers = [
        str(first.PatientName),
        str(first.PatientID),
        str(first.ReferringPhysicianName),
        str(first.InstitutionName),
        str(first.StudyID),
        str(first.RequestAttributesSequence[0].RequestedProcedureID),
        str(first.PatientBirthDate),
    ]
    out = tmp_path / "out"
    out.mkdir()

    # The case id is the patient's name: verification finds it, nothing is written.
    code, text = _run(
        "export-case", "--suite", str(manifest), "--case", "brainix", "--out",
        str(out / "b.zip"), cache=tmp_path / "cache",
    )  # fmt: skip
    assert code == 1, text
    assert "PatientName value is in it" in text and "nothing was written" in text
    assert list(out.iterdir()) == []

    t0 = time.perf_counter()
    code, text = _run(
        "export-case", "--suite", str(manifest), "--case", "brainix", "--new-id", "site-a-001",
        "--out", str(out / "b.zip"), cache=tmp_path / "cache",
    )  # fmt: skip
    assert code == 0, text
    assert time.perf_counter() - t0 < 20
    assert [p.name for p in out.iterdir()] == ["b.zip"]
    with zipfile.ZipFile(out / "b.zip") as zf:
        zf.extractall(tmp_path / "unzipped")
    bundle = tmp_path / "unzipped" / "b"
    series = _check_bundle_dicom(bundle, _source_uids(source))
    assert sum(len(f) for f in series.values()) == 88
    assert _hits(bundle, identifiers) == []
    assert _dciodvfy_no_new_errors(series, source) == 4
    note = (bundle / "note.txt").read_text()
    assert note.count("[REDACTED]") == 4 and "left-sided weakness" in note

    # Classified as the corpus labels say: descriptions survive de-identification cleaned.
    from dicom import index_path

    classes = sorted(s.series_class.value for s in index_path(bundle / "dicom").series)
    assert classes == expected == ["FLAIR", "MASK", "T1", "T2"]
    from evaluation.datasets import DatasetSpec, load_dataset

    (case,) = load_dataset(DatasetSpec(path=str(bundle / "manifest.yaml")), tmp_path / "b").cases
    assert case.case_id == "site-a-001" and len(case.images) >= 3
    assert case.ground_truth is not None and case.ground_truth.final_diagnosis.icd10 == "C71.9"
