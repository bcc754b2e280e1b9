"""The gateway's run is the run log's GatewayRun: one record per run (trigger, stage, route,
status, held with its reason, write-backs pending and done, the SR per model, what the run
evaluated, the SR's evidence), in the run folder's run.sqlite or, with
``NEUROSANDBOX_DATABASE_URL``, in the install's PostgreSQL run log keyed by run id.

- a study sent by storescu through the in-process gateway with a PostgreSQL run log: its
  GatewayRun is a row of ``gateway_runs`` (queried), listing asks the database, the review
  queue lists the run, and the pipeline's stage changes were small updates (counted);
- a data folder written by the code before GatewayRun (tests/data/gateway_legacy) is read,
  and its record moved into the log with the facts the folder kept elsewhere;
- the gateway refuses a PostgreSQL run log of an older schema, naming the command to run;
- the SR's evidence is written once per run (a trigger counts the statements that write its
  column): later changes of the record leave it as stored;
- runs made on SQLite before an install switched to PostgreSQL are listed beside the
  database's (newest first), read and changed in their own run.sqlite.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from gateway_inproc import finished_runs, rules_file, start_gateway
from gateway_process import send
from gateway_synth import make_study
from orthanc_fixture import OrthancServer
from pg_server import fresh_pg_database
from review_server import bearer

from evaluation.log import EvidenceRef, RunStore, SchemaOutOfDateError, WriteBack, upgrade
from gateway.api import create_app
from gateway.runs import GATEWAY_NOTE, RunStatus, StudyRunStore
from gateway.serve import build_gateway, check_run_log
from gateway.study_key import StudyKey

LEGACY = Path(__file__).parent / "data" / "gateway_legacy" / "data"
STUDY = "1.2.826.0.1.3680043.8.498.36001"
DONE = "0000018f00000000" + "a" * 16
RUNNING = "0000018f00000001" + "b" * 16
OLDEST = "0000018e00000000" + "c" * 16


def _pg(url: str) -> str:
    """A libpq URL for psycopg from the SQLAlchemy one."""
    return url.replace("postgresql+psycopg://", "postgresql://")


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often the run store's gateway writes are called in this process."""
    calls: Counter[str] = Counter()
    for name in ("put_gateway_run", "set_gateway_stage", "set_note"):
        original = getattr(RunStore, name)

        def wrapper(self: RunStore, *a: object, _o=original, _n=name, **k: object) -> object:
            calls[_n if _n != "set_note" else f"set_note:{a[0]}"] += 1
            return _o(self, *a, **k)

        monkeypatch.setattr(RunStore, name, wrapper)
    return calls


# every statement that writes gateway_runs.evidence_json, counted by the database itself
_PG_COUNT_EVIDENCE = (
    "CREATE TABLE evidence_writes (run_id text)",
    "CREATE FUNCTION count_evidence() RETURNS trigger LANGUAGE plpgsql AS "
    "$$ BEGIN INSERT INTO evidence_writes VALUES (NEW.run_id); RETURN NEW; END $$",
    "CREATE TRIGGER evidence_inserted AFTER INSERT ON gateway_runs FOR EACH ROW "
    "WHEN (NEW.evidence_json IS NOT NULL) EXECUTE FUNCTION count_evidence()",
    "CREATE TRIGGER evidence_updated AFTER UPDATE OF evidence_json ON gateway_runs "
    "FOR EACH ROW EXECUTE FUNCTION count_evidence()",
)
_SQLITE_COUNT_EVIDENCE = (
    "CREATE TABLE evidence_writes (run_id TEXT)",
    "CREATE TRIGGER evidence_inserted AFTER INSERT ON gateway_runs "
    "WHEN NEW.evidence_json IS NOT NULL BEGIN INSERT INTO evidence_writes VALUES (NEW.run_id); END",
    "CREATE TRIGGER evidence_updated AFTER UPDATE OF evidence_json ON gateway_runs "
    "BEGIN INSERT INTO evidence_writes VALUES (NEW.run_id); END",
)


@pytest.fixture
def pg_gateway(
    orthanc_server: OrthancServer, pg_url: str, tmp_path: Path, counted: Counter[str]
) -> Iterator[tuple[object, str, Path]]:
    url = fresh_pg_database(pg_url)
    upgrade(url)  # `neurosandbox db upgrade`
    with psycopg.connect(_pg(url), autocommit=True) as con:
        for sql in _PG_COUNT_EVIDENCE:
            con.execute(sql)
    data = tmp_path / "data"
    routing = rules_file(tmp_path / "rules.yaml", ["differential"], "pg")
    gw = start_gateway(orthanc_server, data, routing, 1.0, database_url=url)
    try:
        yield gw, url, data
    finally:
        gw.stop()


def test_a_stored_study_is_one_gatewayrun_row_in_postgresql_and_in_the_review_queue(
    pg_gateway: tuple[object, str, Path], tmp_path: Path, counted: Counter[str]
) -> None:
    gw, url, data = pg_gateway
    study = make_study(tmp_path / "study", classes=("FLAIR",), n_slices=4, patient_id="NSBX-PG-1")
    send(gw.scp.port, study.files)  # type: ignore[attr-defined]
    [run] = finished_runs(gw, 1, study.study_uid)  # type: ignore[arg-type]
    assert run.status is RunStatus.DONE, run
    with psycopg.connect(_pg(url)) as con:
        rows = con.execute(
            "SELECT run_id, status, stage, progress, study_uid, record_json, evidence_json "
            "FROM gateway_runs"
        ).fetchall()
    assert [r[:5] for r in rows] == [(run.run_id, "done", "done", 1.0, study.study_uid)]
    record = json.loads(rows[0][5])
    # the SR per model, the write-backs done (none pending), what was evaluated, the route
    assert set(record["sr_sop_uids"]) == set(run.route.models) and record["pdf_sop_uid"]
    assert record["writebacks_pending"] == []
    done = {w["sop_instance_uid"] for w in record["writebacks_done"]}
    assert done == {*record["sr_sop_uids"].values(), record["pdf_sop_uid"]}
    assert record["evaluated_digest"] and record["route"]["rule"] == "pg"
    evidence = json.loads(rows[0][6])
    assert len(evidence) == 4 and evidence[0]["header"]  # the series' first header, 3 refs
    # the run folder holds no record of its own: the marker naming the run in the log
    folder = data / "runs" / run.run_id
    marker = json.loads((folder / "run.db.json").read_text())
    assert marker["run_id"] == run.run_id
    # and the engine's rows of the run (its samples) are in the same database, not a run.sqlite
    assert not (folder / "run.sqlite").exists()
    with psycopg.connect(_pg(url)) as con:
        (n,) = con.execute(
            "SELECT count(*) FROM samples WHERE run_id = %s", (run.run_id,)
        ).fetchone()
    assert n > 0
    # the SR's evidence was written once (with the write-backs pending), never rewritten
    with psycopg.connect(_pg(url)) as con:
        written = con.execute("SELECT run_id FROM evidence_writes").fetchall()
    assert written == [(run.run_id,)], written
    # listing asks the database, not the folders
    assert gw.ctx.runs.ids() == [run.run_id]  # type: ignore[attr-defined]
    # the study's state keeps what spans runs, and points at its evaluation
    runs: StudyRunStore = gw.ctx.runs  # type: ignore[attr-defined]
    key = StudyKey(study_uid=study.study_uid, patient_id="NSBX-PG-1")
    assert run.study_key == key.name
    state_text = runs._state_path(key.name).read_text()
    assert "evaluated_digest" not in state_text and run.run_id in state_text
    last = runs.last_evaluation(key)
    assert last.run_id == run.run_id and last.version == 1
    # stage changes were small updates; the whole record was written a few times only
    assert counted["set_gateway_stage"] >= 6, counted
    assert counted["put_gateway_run"] <= 6, counted
    assert counted[f"set_note:{GATEWAY_NOTE}"] == 0, counted
    # the review queue lists it
    with TestClient(create_app(gw.ctx), base_url="http://testserver") as client:  # type: ignore[attr-defined]
        client.headers.update(bearer(gw.ctx, "Dr Pg", "Pg^Paula"))  # type: ignore[attr-defined]
        page = client.get("/review")
        assert page.status_code == 200
        assert f'data-run="{run.run_id}"' in page.text
        api = client.get(f"/runs/{run.run_id}")
        assert api.status_code == 200 and api.json()["status"] == "done"
        # the API says the run's status and write-backs, never the SR's evidence (the series'
        # first headers, with the patient's name), local paths or the uploaded instances
        for body in (api.text, client.get("/runs").text):
            assert "Test^Synthetic" not in body and "Synthetic" not in body
            for field in ("evidence", "sr_paths", "uploaded", "evaluated_digest"):
                assert f'"{field}"' not in body, field
        assert set(api.json()["sr_sop_uids"]) == set(run.route.models)


def test_a_stage_change_is_one_small_update_not_a_rewrite(
    tmp_path: Path, counted: Counter[str]
) -> None:
    runs = StudyRunStore(tmp_path / "data")
    from gateway.runs import RunRecord

    run_id = runs.new_id()
    runs.create(RunRecord(run_id=run_id, trigger="dicom", study_uid="1.2.3", warnings=["w" * 5000]))
    db = runs.store_path(run_id)
    before = sa.create_engine(f"sqlite:///{db}").connect()
    try:
        record = before.exec_driver_sql("SELECT record_json FROM gateway_runs").scalar()
        for n in range(20):
            runs.update(run_id, stage=f"stage {n}", progress=n / 20, timings_s={"s": n})
        runs.update(run_id, status=RunStatus.RUNNING, stage="running", progress=0.99)
        after = before.exec_driver_sql("SELECT record_json, stage FROM gateway_runs").one()
    finally:
        before.close()
    assert counted["set_gateway_stage"] == 21 and counted["put_gateway_run"] == 1, counted
    assert after[0] == record and after[1] == "running"  # the record's JSON never rewritten
    rec = runs.get(run_id)
    assert rec.status is RunStatus.RUNNING and rec.started_at and rec.timings_s == {"s": 19}


def test_a_data_folder_of_the_code_before_gatewayrun_is_read_and_moved_into_the_log(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    shutil.copytree(LEGACY, data)
    runs = StudyRunStore(data)
    assert runs.ids() == [RUNNING, DONE]
    rec = runs.get(DONE)
    assert rec.status is RunStatus.DONE and rec.version == 1 and rec.route is not None
    # the SR per model from the old bundle's config["gateway"], the evidence from evidence.json
    assert rec.sr_sop_uids == {"reference/image-rules": f"{STUDY}.9.1"}
    assert [e.sop_instance_uid for e in rec.evidence] == [f"{STUDY}.1.{n}" for n in (1, 2, 3)]
    headers = runs.evidence(DONE)
    assert str(headers[0].PatientID) == "NSBX-LEGACY-1" and "PatientID" not in headers[1]
    # what the run evaluated, from the study's old state; the state keeps the study's facts
    key = StudyKey(study_uid=STUDY, patient_id="NSBX-LEGACY-1")
    last = runs.last_evaluation(key)
    assert (last.run_id, last.version, last.evaluated_digest) == (DONE, 1, "d" * 64)
    assert last.evaluated_instances == "e" * 64 and len(last.sr_paths) == 1
    state = runs.study_state(key)
    assert state.legacy is None and state.revisions and state.files and len(state.uploaded) == 3
    # moved: the store now holds the record as a row, the note says so
    with RunStore(runs.run_dir(DONE)) as store:
        row = store.gateway_run()
        assert row is not None and row.sr_sop_uids == rec.sr_sop_uids and row.evidence
        assert store.note(GATEWAY_NOTE) != rec.model_dump_json()
    # a run a killed gateway left running is interrupted at the next start
    assert runs.mark_interrupted() == [RUNNING]
    assert runs.get(RUNNING).status is RunStatus.INTERRUPTED
    # the run of before the run store (run.json) is listed and read, and takes changes
    assert [r.run_id for r in runs.list()] == [RUNNING, DONE, OLDEST]
    assert runs.get(OLDEST).status is RunStatus.SKIPPED
    runs.update(OLDEST, warnings=["read again"])
    assert runs.get(OLDEST).warnings == ["read again"]


def test_the_gateway_refuses_a_postgresql_run_log_of_an_older_schema(
    orthanc_server: OrthancServer, pg_url: str, tmp_path: Path
) -> None:
    url = fresh_pg_database(pg_url)  # empty: never migrated
    settings = orthanc_server.settings.model_copy(
        update={"data_dir": tmp_path / "data", "database_url": url}
    )
    with pytest.raises(SchemaOutOfDateError, match="neurosandbox db upgrade"):
        build_gateway(settings)
    upgrade(url)
    with psycopg.connect(_pg(url), autocommit=True) as con:
        con.execute("UPDATE alembic_version SET version_num = '0002_run_keys'")
    with pytest.raises(SchemaOutOfDateError, match=r"0002_run_keys.*neurosandbox db upgrade"):
        check_run_log(settings)
    assert not (tmp_path / "data" / "runs").exists()  # refused before anything was made


def _evidence(n: int) -> list[EvidenceRef]:
    return [
        EvidenceRef(series_uid="1.2.3.4", sop_instance_uid=f"1.2.3.4.{i}", sop_class_uid="1.2.840",
                    header='{"00100010": {"vr": "PN"}}' * 200 if i == 1 else None)
        for i in range(1, n + 1)
    ]  # fmt: skip


def test_the_srs_evidence_is_written_once_and_later_changes_leave_it(tmp_path: Path) -> None:
    runs = StudyRunStore(tmp_path / "data")
    from gateway.runs import RunRecord

    run_id = runs.new_id()
    runs.create(RunRecord(run_id=run_id, trigger="dicom", study_uid="1.2.3"))
    engine = sa.create_engine(f"sqlite:///{runs.store_path(run_id)}")
    with engine.begin() as con:
        for sql in _SQLITE_COUNT_EVIDENCE:
            con.exec_driver_sql(sql)
    pending = [WriteBack(kind="sr", sop_instance_uid="1.2.3.9.1", model="m")]
    # the pipeline's order: the evidence with the write-backs pending, then the write-back done
    runs.update(run_id, version=1, evidence=_evidence(3), writebacks_pending=pending)
    runs.update(run_id, stage="writing back", progress=0.8)
    done = [pending[0].model_copy(update={"at": "2026-01-01T00:00:00+00:00"})]
    runs.finish(run_id, RunStatus.DONE, sr_sop_uids={"m": "1.2.3.9.1"}, writebacks_pending=[],
                writebacks_done=done, warnings=["w"], timings_s={"done": 1.0})  # fmt: skip
    runs.update(run_id, requested_by="token-1")
    with engine.connect() as con:
        written = con.exec_driver_sql("SELECT run_id FROM evidence_writes").fetchall()
    engine.dispose()
    assert written == [(run_id,)], written
    rec = runs.get(run_id)  # everything else changed, the evidence as first stored
    assert rec.status is RunStatus.DONE and rec.writebacks_done == done and rec.warnings == ["w"]
    assert rec.requested_by == "token-1" and rec.version == 1 and rec.progress == 1.0
    assert rec.evidence == _evidence(3)
    # a change of the evidence itself rewrites it
    runs.update(run_id, evidence=_evidence(2))
    assert runs.get(run_id).evidence == _evidence(2)


def test_runs_made_on_sqlite_before_the_switch_to_postgresql_are_listed_read_and_changed(
    pg_url: str, tmp_path: Path
) -> None:
    from gateway.runs import RunRecord

    data = tmp_path / "data"
    shutil.copytree(LEGACY, data)
    before = StudyRunStore(data)  # the install on SQLite: its runs' records moved into the log
    assert before.get(DONE).status is RunStatus.DONE and before.ids() == [RUNNING, DONE]
    url = fresh_pg_database(pg_url)
    upgrade(url)
    runs = StudyRunStore(data, database_url=url)  # the same install, now on PostgreSQL
    new = runs.new_id()
    runs.create(RunRecord(run_id=new, trigger="dicom", study_uid=STUDY, status=RunStatus.DONE))
    assert (runs.run_dir(new) / "run.db.json").is_file()
    # listed beside the database's runs, newest first; by study too; a limit keeps the newest
    assert runs.ids() == [new, RUNNING, DONE]
    assert runs.ids(after=DONE) == [new, RUNNING]
    assert [r.run_id for r in runs.list()] == [new, RUNNING, DONE]
    assert [r.run_id for r in runs.list(limit=2)] == [new, RUNNING]
    assert [r.run_id for r in runs.list(study_uid=STUDY)] == [new, RUNNING, DONE]
    # read where it is (the evidence of its old bundle included), and changed there
    rec = runs.get(DONE)
    assert rec.version == 1 and rec.evidence[0].sop_instance_uid == f"{STUDY}.1.1"
    assert runs.has_store(DONE) and runs.store_path(DONE).name == "run.sqlite"
    runs.update(DONE, warnings=["changed after the switch"])
    assert runs.get(DONE).warnings == ["changed after the switch"]
    with RunStore(runs.run_dir(DONE)) as store:  # in its own file
        row = store.gateway_run()
        assert row is not None and row.warnings == ["changed after the switch"]
    with psycopg.connect(_pg(url)) as con:
        ids = [r[0] for r in con.execute("SELECT run_id FROM gateway_runs").fetchall()]
    assert ids == [new]  # nothing of the old runs was written into the database
    assert not (runs.run_dir(DONE) / "run.db.json").exists()
    # a run killed mid-way before the switch is interrupted at the next start, in its file
    assert runs.mark_interrupted() == [RUNNING]
    assert runs.get(RUNNING).status is RunStatus.INTERRUPTED
