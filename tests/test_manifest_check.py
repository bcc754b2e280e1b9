"""A hospital case manifest: `neurosandbox cases check` names every bad field with its path, the
loader (and so `eval`) names them too without a traceback, and the published schema, the docs
example and the loader are one rule."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from evaluation.case import TaskFamily
from evaluation.errors import DatasetError

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
ALLOWED_TASKS = ", ".join(t.value for t in TaskFamily)


def check(*args: str) -> tuple[int, str]:
    from gateway.cli import app

    result = CliRunner().invoke(app, ["cases", "check", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, " ".join(result.output.split())  # rich may wrap: compare as one line


def write(folder: Path, data: object, name: str = "manifest.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real DICOM study (the MS phantom: seven MR series)."""
    from evaluation.datasets.phantoms import generate_suite

    root = tmp_path_factory.mktemp("manifest-study")
    generate_suite(root, 2, 11, only=[2])
    (case,) = [p for p in root.iterdir() if p.is_dir()]
    return case / "dicom"


def _with_study(folder: Path, study: Path, rel: str) -> None:
    shutil.copytree(study, folder / rel)


# --------------------------------------------------------------------------- cases check


def test_every_bad_field_is_named_with_its_path(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "x.dcm").write_bytes(b"")
    manifest = write(
        tmp_path,
        {
            "nmae": "pilot",
            "cases": [
                {"case_id": "a", "note": "no study given"},
                {"case_id": "b", "study": "s", "tasks": ["differential", "diagnosis"]},
                {
                    "case_id": "c",
                    "study": "s",
                    "notes": "a typo of note",
                    "ground_truth": {"final_diagnosis": {"name": "MS"}, "difficulty": "L9"},
                },
                {"case_id": "d", "study": "s", "ground_truth": {"final_diagnoses": "MS"}},
                {"case_id": "e", "study": 42, "ehr": ["not", "a", "bundle"]},
            ],
        },
    )
    code, out = check(str(manifest))
    assert code == 1, out
    assert "Traceback" not in out
    assert "cases[0].study: field required" in out
    assert f"cases[1].tasks[1]: 'diagnosis' is not one of {ALLOWED_TASKS}" in out
    assert "cases[1].tasks[0]" not in out  # the good task is not blamed
    assert "cases[2].notes: unknown field (did you mean 'note'?" in out
    assert "cases[2].ground_truth.difficulty: 'L9' is not one of L1, L2, L3" in out
    assert "cases[3].ground_truth.final_diagnoses: unknown field" in out
    assert "cases[3].ground_truth.final_diagnosis: field required" in out
    assert "cases[4].study:" in out and "cases[4].ehr:" in out
    assert "nmae: unknown field (did you mean 'name'?" in out
    assert "0 of 5 cases ok" in out


def test_json_report_lists_each_problem_with_its_path(tmp_path: Path) -> None:
    manifest = write(tmp_path, {"cases": [{"study": "missing", "tasks": ["diagnosis"]}]})
    from gateway.cli import app

    result = CliRunner().invoke(app, ["cases", "check", str(manifest), "--json"])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    paths = {p["path"] for p in report["problems"]}
    assert paths == {"cases[0].tasks[0]", "cases[0].study"}, report
    assert report["cases"] == 1 and report["cases_ok"] == 0


def test_missing_or_escaping_study_and_files_are_named(tmp_path: Path, study: Path) -> None:
    folder = tmp_path / "site"
    folder.mkdir()
    _with_study(folder, study, "studies/good")
    (folder / "studies" / "empty").mkdir()
    manifest = write(
        folder,
        {
            "cases": [
                {"case_id": "ok", "study": "studies/good"},
                {"case_id": "gone", "study": "studies/nope"},
                {"case_id": "gone2", "study": {"path": "studies/also-nope.zip"}},
                {"case_id": "out", "study": "../elsewhere"},
                {"case_id": "empty", "study": "studies/empty"},
                {"case_id": "files", "study": "studies/good", "ehr": "records/r.json"},
                {"case_id": "note", "study": "studies/good", "note": "notes/n.txt"},
            ]
        },
    )
    code, out = check(str(manifest))
    assert code == 1, out
    assert "cases[1].study: 'studies/nope' not found" in out
    assert "cases[2].study.path: 'studies/also-nope.zip' not found" in out
    assert "cases[3].study:" in out and "outside" in out
    assert "cases[4].study: 'studies/empty' holds no file" in out
    assert "cases[5].ehr: 'records/r.json' not found" in out
    assert "cases[6].note: 'notes/n.txt' not found" in out
    assert "error cases[0]" not in out
    assert "1 of 7 cases ok" in out


def test_duplicate_case_ids_are_named(tmp_path: Path, study: Path) -> None:
    _with_study(tmp_path, study, "s")
    manifest = write(
        tmp_path, {"cases": [{"id": "x", "study": "s"}, {"case_id": "x", "study": "s"}]}
    )
    code, out = check(str(manifest))
    assert code == 1 and "cases[1].case_id: 'x' is also the id of cases[0]" in out, out


def test_not_a_manifest_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    for text in ("- just\n- a list\n", "cases: [\n", "name: x\n"):
        path = tmp_path / "m.yaml"
        path.write_text(text)
        code, out = check(str(path))
        assert code == 1 and "error" in out and "Traceback" not in out, (text, out)
    code, out = check(str(tmp_path / "absent.yaml"))
    assert code == 1 and "absent.yaml" in out and "not found" in out, out


def test_cases_check_help_documents_every_option() -> None:
    import typer

    from gateway.cli import app

    command = typer.main.get_command(app).commands["cases"].commands["check"]  # type: ignore[attr-defined]
    for param in command.params:
        assert (getattr(param, "help", None) or "").strip(), f"{param.name} has no help"
    out = CliRunner().invoke(app, ["cases", "check", "--help"]).output
    assert "--json" in out and "manifest" in out and "exit code" in out.lower()


# --------------------------------------------------------------------------- the loader


def test_loader_names_the_bad_fields_of_a_skipped_case(tmp_path: Path, study: Path) -> None:
    from evaluation.datasets.suite import load_manifest

    _with_study(tmp_path, study, "s")
    manifest = write(
        tmp_path,
        {
            "cases": [
                {"case_id": "good", "study": "s", "tasks": ["lesion"]},
                {"case_id": "bad", "study": "s", "tasks": ["diagnosis"], "notes": "typo"},
            ]
        },
    )
    _, cases, warnings = load_manifest(manifest, tmp_path / "cache")
    assert [c.case_id for c in cases] == ["good"]
    (skipped,) = [str(w) for w in warnings if "skipped" in str(w)]
    assert f"cases[1].tasks[0]: 'diagnosis' is not one of {ALLOWED_TASKS}" in skipped
    assert "cases[1].notes: unknown field" in skipped and "bad" in skipped


def test_loader_error_when_no_case_loads_names_each_field(tmp_path: Path) -> None:
    from evaluation.datasets.suite import load_manifest

    manifest = write(
        tmp_path,
        {"cases": [{"study": "s", "tasks": ["diagnosis"]}, {"study": "s", "ground_truth": {}}]},
    )
    with pytest.raises(DatasetError) as err:  # never a ValueError from deep inside
        load_manifest(manifest, tmp_path / "cache")
    assert f"cases[0].tasks[0]: 'diagnosis' is not one of {ALLOWED_TASKS}" in str(err.value)
    assert "cases[1].ground_truth.final_diagnosis: field required" in str(err.value)


def test_eval_with_a_bad_task_prints_the_field_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    manifest = write(tmp_path, {"cases": [{"case_id": "h1", "study": "s", "tasks": ["diagnosis"]}]})
    env = {**os.environ, "NEUROSANDBOX_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-c", "from gateway.cli import main; main()", "eval", "--suite",
         str(manifest), "--model", "reference/text-prior", "--out", str(tmp_path / "run")],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0 and "Traceback" not in out, out
    assert f"cases[0].tasks[0]: 'diagnosis' is not one of {ALLOWED_TASKS}" in out


# --------------------------------------------------------------------------- docs and schema


def _lay_out_example(folder: Path, study: Path) -> Path:
    """The docs example with what its header says it expects next to it."""
    example = folder / "manifest.yaml"
    shutil.copy(DOCS / "manifest.example.yaml", example)
    for line in example.read_text().splitlines():
        hit = re.match(r"#\s+(\S+)\s{2,}", line)
        if not hit or "/" not in hit.group(1):
            continue
        rel = hit.group(1)
        if rel.endswith("/"):
            _with_study(folder, study, rel.rstrip("/"))
        elif rel.endswith(".json"):
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            bundle = {"resourceType": "Bundle", "type": "collection", "entry": []}
            (folder / rel).write_text(json.dumps(bundle))
        else:
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_text("Headaches for six weeks.\n")
    return example


def test_docs_example_checks_and_loads(tmp_path: Path, study: Path) -> None:
    from evaluation.datasets.suite import load_manifest

    example = _lay_out_example(tmp_path, study)
    n = len(yaml.safe_load(example.read_text())["cases"])
    code, out = check(str(example))
    assert code == 0 and f"{n} cases ok" in out, out
    name, cases, warnings = load_manifest(example, tmp_path / "cache")
    assert name == yaml.safe_load(example.read_text())["name"]
    assert len(cases) == n and not [w for w in warnings if "skipped" in str(w)], warnings
    second = cases[1]
    assert second.note.startswith("Headaches") and second.ehr is not None and second.turns
    assert all(c.images for c in cases)


def test_committed_schema_is_the_generated_one_and_the_docs_validate() -> None:
    from evaluation.datasets.manifest import manifest_schema, parse_manifest
    from gateway.cli import app

    committed = json.loads((DOCS / "manifest.schema.json").read_text())
    assert committed == manifest_schema(), (
        "regenerate: neurosandbox cases schema > docs/manifest.schema.json"
    )
    printed = CliRunner().invoke(app, ["cases", "schema"]).stdout
    assert json.loads(printed) == committed
    jsonschema.Draft202012Validator.check_schema(committed)
    validator = jsonschema.Draft202012Validator(committed)
    documents = [yaml.safe_load((DOCS / "manifest.example.yaml").read_text())]
    # the commented Orthanc case of the example, and every YAML block of docs/cases.md
    commented = [
        line.removeprefix("  # ") for line in (DOCS / "manifest.example.yaml").read_text().splitlines()
        if line.startswith("  # ") and ("- case_id" in line or line.startswith("  #   "))
    ]  # fmt: skip
    documents.append({"cases": yaml.safe_load("\n".join(commented))})
    for block in re.findall(r"```yaml\n(.*?)```", (DOCS / "cases.md").read_text(), re.S):
        documents.append(yaml.safe_load(block))
    assert len(documents) >= 3
    for doc in documents:
        assert not list(validator.iter_errors(doc)), doc
        assert not parse_manifest(doc).problems, doc
    # docs/cases.md names every task family (from the enum, not a second list)
    text = (DOCS / "cases.md").read_text()
    assert all(f"`{t.value}`" in text for t in TaskFamily)


BAD_CASES = [
    {"study": "s", "tasks": ["diagnosis"]},
    {"study": "s", "notes": "typo"},
    {"note": "no study"},
    {"study": {"orthanc": "http://pacs:8042"}},  # no study_uid anywhere
    {"study": {"orthanc": {"url": "http://pacs:8042", "study_uid": "1.2"}, "typo": 1}},
    {"study": {"path": "s", "extra": 1}},
    {"study": "s", "ground_truth": {"final_diagnosis": {"name": "x", "icd": "G35"}}},
    {"study": "s", "ground_truth": {"final_diagnosis": {"name": "x"}, "modality": "PET"}},
    {"study": "s", "turns": [{"reveal_text": "no question"}]},
    {"study": "s", "questions": [{"number": "one", "text": "q"}]},
    {"study": "s", "ehr": 5},
    {"study": "s", "case_id": True},
    {"study": "s", "note": 3},
    # a manifest from elsewhere may not name any secret of this machine for the server it names
    {
        "study": {
            "orthanc": "http://evil:8042",
            "study_uid": "1.2",
            "password_env": "OPENAI_API_KEY",
        }
    },
    {"study": {"orthanc": {"url": "http://evil:8042", "username_env": "HOME"}, "study_uid": "1.2"}},
]
GOOD_CASES = [
    {
        "study": {"orthanc": {"url": "http://pacs:8042", "study_uid": "1.2"}, "study_uid": None}
    },  # null: not given
    {"study": "s"},
    {"study": {"path": "s"}, "case_id": 7, "patient_id": 12.5},
    {"study": {"orthanc": "http://pacs:8042", "study_uid": "1.2", "password_env": "PACS_PW"}},
    {"study": {"orthanc": {"url": "http://pacs:8042", "study_uid": "1.2", "timeout_s": 30}}},
    {"study": "s", "ehr": "r.json", "note": "n.txt", "tasks": [t.value for t in TaskFamily]},
    {"study": "s", "questions": [{"number": 1, "text": "q", "family": "lesion"}]},
]


@pytest.mark.parametrize("entry", BAD_CASES + GOOD_CASES)
def test_schema_and_loader_are_one_rule(entry: dict[str, object]) -> None:
    from evaluation.datasets.manifest import manifest_schema, parse_manifest

    doc = {"name": "x", "cases": [entry]}
    schema_errors = list(jsonschema.Draft202012Validator(manifest_schema()).iter_errors(doc))
    problems = parse_manifest(doc).problems
    assert bool(schema_errors) == bool(problems) == (entry in BAD_CASES), (schema_errors, problems)
    assert all(p.path.startswith("cases[0]") for p in problems)
