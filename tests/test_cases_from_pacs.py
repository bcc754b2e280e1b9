"""`neurosandbox cases from-pacs`: a cohort found on a PACS, pulled once, joined with the team's
diagnoses, written as a manifest that `cases check` passes (gateway/pacs/cohort.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pydicom
import pytest
import yaml

from evaluation.coverage import SkippedCase
from evaluation.datasets.manifest import parse_case
from evaluation.datasets.suite import check_manifest, load_manifest
from evaluation.errors import DatasetError
from gateway.orthanc import OrthancClient
from gateway.pacs import LOCAL, StudyMatch, StudyQuery
from gateway.pacs.cohort import (
    RETRIEVED,
    Cohort,
    CohortError,
    CohortStudy,
    PacsFetcher,
    found_cohort,
    read_diagnoses,
    read_values,
    retrieve_cohort,
    write_manifest,
)
from gateway.pacs.orthanc_rest import OrthancRestClient
from gateway.settings import Settings
from gateway.study_key import orthanc_id
from tests.dcmqrscp_fixture import AE_TITLE, Dcmqrscp
from tests.gateway_synth import make_study
from tests.orthanc_fixture import OrthancServer

CLI = [str(Path(sys.executable).with_name("neurosandbox"))]


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env={**os.environ, **env}, cwd=cwd, text=True,
                          capture_output=True, timeout=120)  # fmt: skip


def _studies(root: Path, tag: str) -> dict[str, object]:
    """Three studies of two patients, accession numbers A1-tag, A2-tag, B1-tag."""
    made = {}
    for acc, pid in ((f"A1{tag}", f"PA{tag}"), (f"A2{tag}", f"PA{tag}"), (f"B1{tag}", f"PB{tag}")):
        s = make_study(root / acc, classes=("FLAIR",), n_slices=2, patient_id=pid)
        for f in s.files:
            ds = pydicom.dcmread(f)
            ds.AccessionNumber, ds.StudyDescription = acc, "MRI HEAD"
            ds.save_as(f)
        made[acc] = s
    return made


@pytest.fixture(scope="module")
def on_orthanc(orthanc_server: OrthancServer, tmp_path_factory: pytest.TempPathFactory):
    tag = uuid.uuid4().hex[:6].upper()
    root = tmp_path_factory.mktemp("cohort")
    made = _studies(root, tag)
    ep = orthanc_server.endpoints
    orthanc = OrthancClient(ep.orthanc_url, ep.username, orthanc_server.password, timeout_s=60)
    for s in made.values():
        for f in s.files:  # type: ignore[attr-defined]
            orthanc.upload(f)
    orthanc.close()
    return tag, made


def test_a_cohort_is_listed_pulled_once_joined_and_checked(
    on_orthanc, orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    tag, _ = on_orthanc
    csv = tmp_path / "dx.csv"
    csv.write_text(
        "accession_number,patient_id,diagnosis,icd10,synonyms\n"
        f"A1{tag},PA{tag},Multiple sclerosis,G35,MS;disseminated sclerosis\n"
        f"A2{tag},SOMEONE-ELSE,Glioblastoma,C71.9,\n"  # the archive's study is PA's: not joined
        f"ZZ{tag},PA{tag},Migraine,,\n"  # no such study
    )
    args = ["cases", "from-pacs", "--pacs", "local", "--accession", f"A1{tag}", "--accession",
            f"A2{tag}", "--accession", f"B1{tag}", "--diagnoses", str(csv), "--out", "m.yaml",
            "--name", "pilot", "--json"]  # fmt: skip
    run = _run(args, orthanc_server.env, tmp_path)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert len(out["studies"]) == 3 and all(s["retrieved"]["n_files"] == 2 for s in out["studies"])
    kinds = sorted((i["kind"], i.get("accession") or "") for i in out["issues"])
    assert kinds == [
        ("patient_disagrees", f"A2{tag}"),
        ("row_matches_no_study", f"ZZ{tag}"),
        ("study_without_row", f"A2{tag}"),
        ("study_without_row", f"B1{tag}"),
    ]
    manifest = yaml.safe_load((tmp_path / "m.yaml").read_text())
    truths = [c.get("ground_truth") for c in manifest["cases"]]
    assert [t["final_diagnosis"]["name"] for t in truths if t] == ["Multiple sclerosis"]
    text = (tmp_path / "m.yaml").read_text()
    assert f"PA{tag}" not in yaml.safe_dump(manifest)  # pseudonyms only in the fields
    assert f"accession A1{tag}" in text  # the team's reference, as a comment
    check = _run(["cases", "check", "m.yaml"], orthanc_server.env, tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    # a second run pulls nothing, and will not overwrite the manifest without --force
    again = _run([*args[:-5], "--out", "m2.yaml", "--by-uid", "--json"], orthanc_server.env,
                 tmp_path)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert all(s["retrieved"]["cached"] for s in json.loads(again.stdout)["studies"])
    refused = _run([*args[:-5], "--out", "m.yaml"], orthanc_server.env, tmp_path)
    assert refused.returncode == 2 and "--force" in refused.stderr
    # the by-UID form: each study named on the PACS by its UID and the archive's patient
    by_uid = yaml.safe_load((tmp_path / "m2.yaml").read_text())["cases"]
    assert sorted(c["study"]["patient_id"] for c in by_uid) == [f"PA{tag}", f"PA{tag}", f"PB{tag}"]
    assert {c["study"]["pacs"] for c in by_uid} == {"local"}
    # `eval` gives the loader the PACS fetcher (the studies are in the cache: nothing pulled)
    dry = _run(["eval", "--suite", "m2.yaml", "--out", "r", "--model", "reference/image-rules",
                "--dry-run", "--json"], orthanc_server.env, tmp_path)  # fmt: skip
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]
    estimate = json.loads(dry.stdout)
    assert (estimate["cases"], estimate["cases_skipped"]) == (3, 0)  # none skipped: fetched
    report = check_manifest(tmp_path / "m2.yaml", known_pacs={"local"})  # as `cases check`
    assert report.ok and report.cases == 3, report.problems
    assert sum("on the PACS 'local', not fetched" in n for n in report.notes) == 3


def test_a_manifest_names_a_study_on_a_pacs_by_uid_and_patient(
    on_orthanc, orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    """Fetched on first use into the cache by the gateway's fetcher, once, and only for the
    patient the case names; without a fetcher, or on a PACS not configured, the case says why."""
    tag, made = on_orthanc
    uid = {acc: str(pydicom.dcmread(s.files[0]).StudyInstanceUID) for acc, s in made.items()}
    cases = [
        {"case_id": "a1", "study": {"pacs": "local", "study_uid": uid[f"A1{tag}"],
                                    "patient_id": f"PA{tag}"}},
        {"case_id": "b1-wrong-patient", "study": {"pacs": "local", "study_uid": uid[f"B1{tag}"],
                                                  "patient_id": f"PA{tag}"}},
    ]  # fmt: skip
    manifest = tmp_path / "m.yaml"
    manifest.write_text(yaml.safe_dump({"name": "by-uid", "cases": cases}))
    fetcher = PacsFetcher(orthanc_server.settings, tmp_path / "studies")
    _, loaded, notes = load_manifest(manifest, tmp_path / "render", fetch_study=fetcher)
    assert [c.case_id for c in loaded] == ["a1"]
    case = loaded[0]
    assert case.provenance.source == "pacs" and case.provenance.study_uids == [uid[f"A1{tag}"]]
    folder = Path(case.study_path or "")
    assert folder.parent == tmp_path / "studies" / "pacs" / "local" and case.images
    files = [p for p in folder.rglob("*.dcm")]
    assert len(files) == 2 and all(pydicom.dcmread(f).PatientID == f"PA{tag}" for f in files)
    skipped = [n for n in notes if isinstance(n, SkippedCase)]
    assert [s.case_id for s in skipped] == ["b1-wrong-patient"]
    assert "no such study for the manifest's patient_id" in skipped[0].reason
    # once: the second load finds the study in the cache, whatever the PACS says now
    stamp = (folder / RETRIEVED).stat().st_mtime_ns
    assert fetcher(parse_case(cases[0]).study, tmp_path / "render") == folder
    assert (folder / RETRIEVED).stat().st_mtime_ns == stamp
    # no fetcher (a command that cannot reach a PACS): the case is skipped, saying why
    with pytest.raises(DatasetError, match="cannot fetch from a PACS"):
        load_manifest(manifest, tmp_path / "render")
    # a PACS the PACS file does not configure: `cases check` names the field
    report = check_manifest(manifest, known_pacs={"local"})
    assert report.ok
    report = check_manifest(manifest, known_pacs={"archive"})
    assert [p.path for p in report.problems] == ["cases[0].study.pacs", "cases[1].study.pacs"]
    assert "no PACS named 'local'" in report.problems[0].message


def test_a_cohort_from_a_dimse_archive(dcmqrscp: Dcmqrscp, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:6].upper()
    made = _studies(tmp_path / "src", tag)
    dcmqrscp.store(*[tmp_path / "src" / acc for acc in made])
    pacs = tmp_path / "pacs.yaml"
    pacs.write_text(yaml.safe_dump({"pacs": {"archive": {
        "kind": "dimse", "ae_title": AE_TITLE, "host": "127.0.0.1", "port": dcmqrscp.port,
        "retrieve": "c-get"}}}))  # fmt: skip
    env = {"NEUROSANDBOX_PACS_FILE": str(pacs), "NEUROSANDBOX_DATA_DIR": str(tmp_path / "var")}
    run = _run(["cases", "from-pacs", "--pacs", "archive", "--patient-id", f"PA{tag}",
                "--description", "mri*", "--out", "m.yaml", "--by-uid"], env, tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 studies on archive" in run.stdout and "wrote m.yaml" in run.stdout
    assert _run(["cases", "check", "m.yaml"], env, tmp_path).returncode == 0
    # the by-UID cases load from the archive itself (C-GET), into a cache of their own
    settings = Settings(data_dir=tmp_path / "var", pacs_file=pacs)
    fetcher = PacsFetcher(settings, tmp_path / "fresh")
    _, loaded, _ = load_manifest(tmp_path / "m.yaml", tmp_path / "render", fetch_study=fetcher)
    assert len(loaded) == 2 and all(c.images for c in loaded)
    assert all(Path(c.study_path or "").is_relative_to(tmp_path / "fresh") for c in loaded)


def test_usage_errors_say_what_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "pacs.yaml"
    bad.write_text("pacs: {web: {kind: dicomweb, url: 'https://x', password_env: OPENAI_API_KEY}}")
    env = {"NEUROSANDBOX_PACS_FILE": str(bad), "NEUROSANDBOX_DATA_DIR": str(tmp_path / "var")}
    run = _run(["cases", "from-pacs", "--pacs", "web", "--patient-id", "X"], env, tmp_path)
    assert run.returncode == 2 and "pacs.web.dicomweb.password_env" in run.stderr
    empty = _run(["cases", "from-pacs", "--pacs", "local"], env, tmp_path)
    assert empty.returncode == 2 and "whole archive" in empty.stderr
    date = _run(["cases", "from-pacs", "--pacs", "local", "--date-from", "03/2024"], env, tmp_path)
    assert date.returncode == 2 and "YYYY-MM-DD" in date.stderr


# --------------------------------------------------------------------------- hostile inputs


def test_a_study_failing_midway_is_listed_and_not_cached_as_whole(
    orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    """An instance the PACS cannot send in the middle of a pull: the study is not pulled (a
    partial study is never cached as whole nor written as a case), the next study goes on, and
    the next run pulls it again."""
    tag = uuid.uuid4().hex[:6].upper()
    made = _studies(tmp_path / "src", tag)
    ep = orthanc_server.endpoints
    orthanc = OrthancClient(ep.orthanc_url, ep.username, orthanc_server.password, timeout_s=60)
    for s in made.values():
        for f in s.files:  # type: ignore[attr-defined]
            orthanc.upload(f)
    client = OrthancRestClient(LOCAL, orthanc)
    matches = client.find_studies(StudyQuery(accession_numbers=[f"A1{tag}", f"B1{tag}"]))
    studies = [CohortStudy(match=m, case_id=m.accession) for m in matches]
    doomed = studies[0].match
    sid = orthanc_id(doomed.patient_id, doomed.study_uid)
    deleted: list[str] = []

    def on_study(s: CohortStudy, done: int, total: int | None) -> None:
        if s.match is doomed and done == 1:  # the second instance vanishes mid-pull
            gone = orthanc.study_instances(sid)[1]["ID"]  # the order the pull follows
            orthanc.delete_instance(gone)
            deleted.append(gone)

    try:
        retrieve_cohort(client, studies, tmp_path / "cache", on_study)
        assert deleted, "the pull never reached its second instance"
        assert "1 of 2 instances could not be pulled" in studies[0].error
        assert studies[1].error == "" and studies[1].retrieved.n_files == 2  # type: ignore[union-attr]
        assert not (studies[0].folder / RETRIEVED).exists()  # type: ignore[operator]
        with pytest.raises(CohortError, match="no study was retrieved"):
            write_manifest(
                tmp_path / "m.yaml", Cohort(pacs=LOCAL, studies=studies[:1]), None, False
            )
        for f in made[doomed.accession].files:  # type: ignore[attr-defined]
            orthanc.upload(f)  # the archive holds the whole study again
        again = [CohortStudy(match=m, case_id=m.accession) for m in matches]
        retrieve_cohort(client, again, tmp_path / "cache")
        assert [s.error for s in again] == ["", ""]
        assert [s.retrieved.cached for s in again] == [False, True]  # type: ignore[union-attr]
        assert again[0].retrieved.n_files == 2  # type: ignore[union-attr]
    finally:
        client.close()


def test_query_value_files_read_one_column_or_say_why_not(tmp_path: Path) -> None:
    f = tmp_path / "acc.txt"
    f.write_text("# the pilot\nA1\n\n  A2  \n")
    assert read_values(f, "accession_number") == ["A1", "A2"]
    f.write_text("Accession Number\nA1\nA2\n")  # a one-column CSV: its header is not a value
    assert read_values(f, "accession_number") == ["A1", "A2"]
    f.write_text("patient_id;accession_number\nP1;A1\nP2;A2\n")  # a spreadsheet's ; export
    assert read_values(f, "accession_number") == ["A1", "A2"]
    f.write_text("mrn,acc\nP1,A1\n")  # a CSV without the column: no value is guessed
    with pytest.raises(CohortError, match=r"no accession_number column \(found: mrn, acc\)"):
        read_values(f, "accession_number")
    f.write_bytes(b"\xff\xfeA\x001\x00")
    with pytest.raises(CohortError, match="not UTF-8"):
        read_values(f, "accession_number")
    f.write_text("A1\n" * 3_000_000)
    with pytest.raises(CohortError, match="over"):
        read_values(f, "accession_number")


def test_a_hostile_diagnoses_csv_is_refused_or_its_rows_listed(tmp_path: Path) -> None:
    f = tmp_path / "dx.csv"
    f.write_text("study_uid,patient_id,diagnosis\n1.2.3,P1," + "x" * 200_000 + "\n")
    with pytest.raises(CohortError, match="line 2"):  # not csv's own error, uncaught
        read_diagnoses(f)
    f.write_text("study_uid,patient_id,Diagnosis,diagnosis\n1.2.3,P1,MS,Glioma\n")
    with pytest.raises(CohortError, match="'diagnosis' twice"):
        read_diagnoses(f)
    f.write_text("study_uid,patient_id,diagnosis,icd_10\n1.2.3,P1,MS,G35\n")  # the code would go
    with pytest.raises(CohortError, match="did you mean 'icd10'"):
        read_diagnoses(f)
    f.write_text("study_uid,patient_id,diagnosis,comment\n1.2.3,P1,MS\x00\x1b[2J,ok\n"
                 "1.2.4,P2,Glioma,other columns are the team's\n")  # fmt: skip
    rows, issues = read_diagnoses(f)
    assert [r.line for r in rows] == [3]
    assert [(i.kind, i.line) for i in issues] == [("bad_row", 2)]
    assert "control character" in issues[0].detail


def test_a_study_listed_twice_is_one_case_and_a_full_list_says_there_may_be_more() -> None:
    a = StudyMatch(pacs="x", study_uid="1.2.3", patient_id="P1", accession="A1")
    other_patient = StudyMatch(pacs="x", study_uid="1.2.3", patient_id="P2")
    cohort = found_cohort("x", [a, a.model_copy(), other_patient], "pilot ../2024 étude", 3)
    assert [s.match.patient_id for s in cohort.studies] == ["P1", "P2"]
    ids = [s.case_id for s in cohort.studies]
    assert len(set(ids)) == 2 and all(i.startswith("pilot-2024-tude-") for i in ids), ids
    assert cohort.limit_reached
    assert not found_cohort("x", [a], "case", 500).limit_reached
