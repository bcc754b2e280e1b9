"""Erasure, the paths tests/test_purge.py does not take: ``--study UID --pacs`` through the
in-process gateway with registered cases (NEUROSANDBOX_CASES) and a patient whose studies carry
an IssuerOfPatientID; the issuer rule (one issuer found: matched; two: refused naming them; a
study keyed without its issuer, as Orthanc's change feed keys it, found by its files); a gateway
on a PostgreSQL run log (nothing of the patient left in any table).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import psycopg
import pydicom
import pytest
from gateway_inproc import finished_runs, rules_file, start_gateway
from gateway_process import send
from gateway_synth import SynthStudy, make_study
from orthanc_fixture import OrthancServer
from pg_server import fresh_pg_database
from test_purge import _leftovers, _sandbox_series
from typer.testing import CliRunner

from evaluation.log import upgrade
from gateway.cli import app
from gateway.orthanc import OrthancClient
from gateway.purge import Places, PurgeError, Purger, PurgeTarget
from gateway.runs import RunRecord, RunStatus, StudyRunStore
from gateway.study_key import StudyKey

pytestmark = pytest.mark.integration
QUIET = 1.0
C_ID, C_NAME, C_ISSUER = "NSBX-STUDYGO-5T1R", "Brackenbury^Perpetua", "HOSP-NORTH-77"
D_ID, D_NAME = "NSBX-STAYS-2H6W", "Keeper^Dora"


def _with_issuer(s: SynthStudy, issuer: str) -> None:
    for f in s.files:
        ds = pydicom.dcmread(f)
        ds.IssuerOfPatientID = issuer
        ds.save_as(f)


def _needles(s: SynthStudy, *extra: str) -> list[str]:
    sops = [os.path.basename(p) for p in s.files if os.path.basename(p).startswith("1.")]
    return [s.study_uid, *s.series_uids.values(), *sops, *extra]


def _register(root: Path, case_id: str, patient_id: str, study_uid: str, note: str) -> Path:
    folder = root / case_id
    folder.mkdir(parents=True)
    case = {
        "case_id": case_id,
        "patient_id": patient_id,
        "note": note,
        "provenance": {"source": "folder", "study_uids": [study_uid]},
    }
    (folder / "case.json").write_text(json.dumps(case))
    return folder


def _client(orthanc_server: OrthancServer) -> OrthancClient:
    ep = orthanc_server.endpoints
    return OrthancClient.from_settings(
        orthanc_server.settings.model_copy(
            update={
                "orthanc_url": ep.orthanc_url,
                "orthanc_password_file": Path(ep.password_file or ""),
            }
        )
    )


def _env(orthanc_server: OrthancServer, data: Path, **extra: str) -> dict[str, str]:
    ep = orthanc_server.endpoints
    return {
        "NEUROSANDBOX_DATA_DIR": str(data),
        "NEUROSANDBOX_ORTHANC_URL": ep.orthanc_url,
        "NEUROSANDBOX_ORTHANC_PASSWORD_FILE": str(ep.password_file),
        **extra,
    }


def test_study_and_issuer_purges_through_the_gateway(
    orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    """``--study UID --pacs``: nothing of that study in the data folder or the registered
    cases (its case folder gone), its SR/PDF gone from Orthanc and its images kept, the other
    study whole. Then ``--patient`` without ``--issuer`` finds a study that carries one, lists
    the issuer it matched, and removes that patient's registered case."""
    c = make_study(tmp_path / "c", classes=("FLAIR",), n_slices=3, patient_id=C_ID,
                   patient_name=C_NAME)  # fmt: skip
    _with_issuer(c, C_ISSUER)
    c2 = make_study(tmp_path / "c2", classes=("FLAIR",), n_slices=3, patient_id=C_ID,
                    patient_name=C_NAME)  # fmt: skip
    _with_issuer(c2, C_ISSUER)
    d = make_study(tmp_path / "d", classes=("FLAIR",), n_slices=3, patient_id=D_ID,
                   patient_name=D_NAME)  # fmt: skip
    data, cases = tmp_path / "data", tmp_path / "cases"
    gw = start_gateway(orthanc_server, data, rules_file(tmp_path / "r.yaml", ["differential"]),
                       QUIET)  # fmt: skip
    try:
        for s in (c, c2, d):
            send(gw.scp.port, s.files)
        runs = {r.study_uid: r for r in finished_runs(gw, 3)}
    finally:
        gw.stop()
    assert all(r.status is RunStatus.DONE for r in runs.values()), runs
    case_c = _register(cases, "case-c", C_ID, c.study_uid, "Perpetua's first scan")
    _register(cases, "case-c2", C_ID, c2.study_uid, "Perpetua's second scan")
    case_d = _register(cases, "case-d", D_ID, d.study_uid, "Dora's scan")
    env = _env(orthanc_server, data, NEUROSANDBOX_CASES=str(cases))
    orthanc = _client(orthanc_server)
    try:
        hospital = orthanc.find_study_of(c.study_uid, C_ID)
        n_images = len(orthanc.study_instances(hospital)) - 2
        assert _sandbox_series(orthanc_server, orthanc, c) == 2
        assert _leftovers(data, _needles(c))

        r = CliRunner().invoke(app, ["purge", "--study", c.study_uid, "--pacs", "--json"], env=env)
        assert r.exit_code == 0, r.output
        out = json.loads(r.stdout)
        assert out["run_ids"] == [runs[c.study_uid].run_id]
        assert out["counts"]["registered_cases"] == 1 and out["counts"]["pacs_objects"] == 2
        assert _leftovers(data, _needles(c)) == {}
        assert _leftovers(cases, [c.study_uid]) == {} and not case_c.exists()
        assert _sandbox_series(orthanc_server, orthanc, c) == 0
        assert len(orthanc.study_instances(hospital)) == n_images == len(c.files)
        # the other studies of the same patient and the other patient: untouched
        assert _sandbox_series(orthanc_server, orthanc, c2) == 2
        assert _sandbox_series(orthanc_server, orthanc, d) == 2
        assert _leftovers(data, [c2.study_uid]) and case_d.is_dir()
        assert {x.study_uid for x in StudyRunStore(data).list()} == {c2.study_uid, d.study_uid}

        # the patient without --issuer: their study carries one, found and named
        r = CliRunner().invoke(app, ["purge", "--patient", C_ID, "--json"], env=env)
        assert r.exit_code == 0, r.output
        out = json.loads(r.stdout)
        assert C_ISSUER in out["issuers"] and out["counts"]["runs"] == 1
        assert out["counts"]["spool_studies"] == 1 and out["counts"]["registered_cases"] == 1
        assert _leftovers(data, [C_ID, "Brackenbury", *_needles(c2)]) == {}
        assert _leftovers(cases, [C_ID, "Perpetua"]) == {}
        assert [x.study_uid for x in StudyRunStore(data).list()] == [d.study_uid]
        assert _leftovers(data, [D_ID]) and case_d.is_dir()
    finally:
        orthanc.close()


def _spool_study(data: Path, uid: str, patient_id: str, issuer: str) -> Path:
    key = StudyKey(study_uid=uid, patient_id=patient_id, issuer=issuer)
    folder = data / "spool" / "studies" / key.name
    folder.mkdir(parents=True)
    info = {"study_uid": uid, "patient_id": patient_id, "issuer": issuer}
    (folder / ".received.json").write_text(json.dumps(info))
    return folder


def test_two_issuers_are_refused_by_name_and_one_issuer_is_purged(tmp_path: Path) -> None:
    """One PatientID held under two issuers is two patients: without --issuer the purge is
    refused naming both, nothing removed; with one, only that issuer's study goes."""
    north = _spool_study(tmp_path, "1.2.3.1", "P-1", "NORTH")
    south = _spool_study(tmp_path, "1.2.3.2", "P-1", "SOUTH")
    purger = Purger(Places(data_dir=tmp_path))
    with pytest.raises(PurgeError, match=r"2 issuers \(NORTH, SOUTH\).*--issuer"):
        purger.purge(PurgeTarget.of(patient_id="P-1"))
    assert north.is_dir() and south.is_dir()
    r = CliRunner().invoke(app, ["purge", "--patient", "P-1"],
                           env={"NEUROSANDBOX_DATA_DIR": str(tmp_path)})  # fmt: skip
    assert r.exit_code == 2 and "NORTH, SOUTH" in r.output
    rep = purger.purge(PurgeTarget.of(patient_id="P-1", issuer="SOUTH"))
    assert rep.counts.spool_studies == 1 and rep.issuers == ["SOUTH"]
    assert north.is_dir() and not south.exists()


def test_a_study_keyed_without_its_issuer_is_found_by_its_files(tmp_path: Path) -> None:
    """A study from Orthanc's change feed is keyed by PatientID alone (as Orthanc keys it):
    ``--patient X --issuer H`` finds its run by the DICOM files in the run folder, and its
    study state with it; a run of X under another issuer stays."""
    runs = StudyRunStore(tmp_path)
    made: dict[str, RunRecord] = {}
    for uid, issuer in (("1.2.9.1", "H"), ("1.2.9.2", "K")):
        key = StudyKey(study_uid=uid, patient_id="X-7")  # the change feed's key: no issuer
        rec = runs.create(RunRecord(run_id=runs.new_id(), trigger="orthanc", study_uid=uid,
                                    study_key=key.name))  # fmt: skip
        runs.finish(rec.run_id, RunStatus.DONE)
        ds = pydicom.Dataset()
        ds.PatientID, ds.IssuerOfPatientID, ds.StudyInstanceUID = "X-7", issuer, uid
        ds.SOPClassUID, ds.SOPInstanceUID = "1.2.840.10008.5.1.4.1.1.88.22", uid + ".5"
        ds.file_meta = pydicom.dataset.FileMetaDataset()
        ds.file_meta.TransferSyntaxUID = pydicom.uid.ExplicitVRLittleEndian
        (runs.run_dir(rec.run_id) / "study").mkdir(parents=True, exist_ok=True)
        ds.save_as(runs.run_dir(rec.run_id) / "study" / "1.dcm", enforce_file_format=True)
        from gateway.runs import StudyState

        runs.save_study_state(StudyState(study_uid=uid, key=key.name, last_run_id=rec.run_id))
        made[issuer] = rec
    rep = Purger(Places(data_dir=tmp_path)).purge(PurgeTarget.of(patient_id="X-7", issuer="H"))
    assert rep.run_ids == [made["H"].run_id] and rep.counts.study_states == 1
    assert [r.run_id for r in runs.list()] == [made["K"].run_id]


def _tables_holding(url: str, needles: list[str]) -> dict[str, list[str]]:
    """Every table of the database whose rows, as text, hold a needle."""
    found: dict[str, list[str]] = {}
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        names = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]  # fmt: skip
        for name in names:
            rows = conn.execute(f'SELECT t::text FROM "{name}" t').fetchall()
            blob = "\n".join(r[0] for r in rows).lower()
            hits = [n for n in needles if n.lower() in blob]
            if hits:
                found[name] = hits
    return found


def test_purge_on_a_postgresql_run_log_leaves_nothing_in_the_database(
    orthanc_server: OrthancServer, pg_url: str, tmp_path: Path
) -> None:
    """A gateway whose run log is PostgreSQL: after ``purge --patient``, no table holds the
    patient's ID, name or UIDs and no file of the data folder does; the other run reads."""
    url = fresh_pg_database(pg_url)
    upgrade(url)
    p = make_study(tmp_path / "p", classes=("FLAIR",), n_slices=3, patient_id="NSBX-PG-GONE-3",
                   patient_name="Fairweather^Ignatius")  # fmt: skip
    q = make_study(tmp_path / "q", classes=("FLAIR",), n_slices=3, patient_id="NSBX-PG-KEEP-8")
    data = tmp_path / "data"
    gw = start_gateway(orthanc_server, data, rules_file(tmp_path / "r.yaml", ["differential"]),
                       QUIET, database_url=url)  # fmt: skip
    try:
        send(gw.scp.port, p.files)
        send(gw.scp.port, q.files)
        runs = {r.study_uid: r for r in finished_runs(gw, 2)}
    finally:
        gw.stop()
    needles = ["NSBX-PG-GONE-3", "Fairweather", *_needles(p)]
    assert _tables_holding(url, needles), "the run log holds nothing of the patient"
    env = _env(orthanc_server, data, NEUROSANDBOX_DATABASE_URL=url)
    r = CliRunner().invoke(app, ["purge", "--patient", "NSBX-PG-GONE-3", "--json"], env=env)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["run_ids"] == [runs[p.study_uid].run_id] and out["counts"]["run_log_rows"] > 5
    assert _tables_holding(url, needles) == {}
    assert _leftovers(data, needles) == {}
    kept = StudyRunStore(data, database_url=url)
    assert [x.run_id for x in kept.list()] == [runs[q.study_uid].run_id]
    assert _tables_holding(url, ["NSBX-PG-KEEP-8", q.study_uid])
    with kept.open(runs[q.study_uid].run_id) as store:
        assert store.samples() and store.gateway_run() is not None
