"""The gateway on the queue (gateway/study_queue.py): with a PostgreSQL run log and its queue's
tables, a study sent to the gateway by storescu is handed to a ``neurosandbox worker`` rather
than evaluated in the gateway's process; the worker (another "host": its own DATA_DIR, the
shared folder mounted at the same path) finds the study in the real Orthanc by its UID and
patient, evaluates it with the gateway's route and writes back the UNVERIFIED SR and the
checklist PDF; ``runs show`` and the gateway's review queue list the run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from gateway_inproc import (
    PDF_CLASS,
    SR_CLASS,
    instance_of,
    queue_gateway,
    rows,
    rules_file,
    start_worker,
    stop_worker,
    study_classes,
    until,
)
from gateway_process import send
from gateway_synth import make_study
from orthanc_fixture import OrthancServer
from pg_server import fresh_pg_database
from review_server import bearer
from typer.testing import CliRunner

from dicom import NotShownReason
from evaluation.log import open_store
from evaluation.log import upgrade as upgrade_run_log
from gateway.api import create_app
from gateway.cli import app
from gateway.orthanc import OrthancClient
from gateway.pacs_local import free_port
from gateway.routing import Route
from gateway.runs import RunStatus, SkipKind
from gateway.settings import Settings
from gateway.study_key import StudyKey, orthanc_id

pytestmark = pytest.mark.integration


def test_a_study_sent_to_a_gateway_with_a_database_url_is_evaluated_by_a_worker(
    orthanc_server: OrthancServer, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    routing = rules_file(tmp_path / "rules.yaml", ["differential"], "queued")
    # `neurosandbox db upgrade` (the run log's schema and the queue's tables), the gateway on it
    q = queue_gateway(orthanc_server, pg_url, tmp_path, routing)
    gw, here, url, shared, env = q.gw, q.here, q.url, q.shared, q.env
    worker_log = tmp_path / "worker.log"
    worker: subprocess.Popen[bytes] | None = None
    try:
        study = make_study(
            tmp_path / "study", classes=("FLAIR",), n_slices=4, patient_id="NSBX-Q-1"
        )
        key = StudyKey(study_uid=study.study_uid, patient_id="NSBX-Q-1")
        send(gw.scp.port, study.files)
        until("the run is queued", lambda: [r.stage for r in gw.ctx.runs.list(
            study_uid=study.study_uid)] == ["queued for a worker"], [worker_log])  # fmt: skip
        [run] = gw.ctx.runs.list(study_uid=study.study_uid)
        assert run.status is RunStatus.QUEUED
        # a later series while the study's job still waits: merged into it, as the gateway
        # merges a study's runs
        late = make_study(tmp_path / "late", classes=("T2",), n_slices=4, patient_id="NSBX-Q-1",
                          study_uid=study.study_uid, first_series_number=2)  # fmt: skip
        send(gw.scp.port, late.files)
        until("the later run is merged", lambda: any(
            r.final for r in gw.ctx.runs.list(study_uid=study.study_uid) if r.run_id != run.run_id
        ), [worker_log])  # fmt: skip
        merged = next(r for r in gw.ctx.runs.list(study_uid=study.study_uid) if r != run)
        assert merged.status is RunStatus.SKIPPED and merged.skip is SkipKind.MERGED, merged
        assert gw.ctx.runs.get(run.run_id).status is RunStatus.QUEUED
        # a worker (another host: its own DATA_DIR) takes the job
        worker = start_worker(q, tmp_path, worker_log)
        until("the worker finished the run", lambda: gw.ctx.runs.get(run.run_id).final,
              [worker_log], timeout_s=40)  # fmt: skip
        done = gw.ctx.runs.get(run.run_id)
        assert done.status is RunStatus.DONE, (done, worker_log.read_text()[-3000:])
        assert here.calls == 0
        jobs = rows(url, "SELECT task, lock, queueing_lock, args, job_id FROM job_outbox "
                         "ORDER BY id")  # fmt: skip
        assert [j[4] is None for j in jobs] == [False, True], jobs  # queued; merged
        task, lock, qlock, args, job_id = jobs[0]
        assert (task, lock, qlock) == ("study_run", f"study:{key.name}", f"study:{key.name}")
        assert jobs[1][1:3] == (lock, qlock)
        assert f'evaluate-study", "{run.run_id}' in str(args)
        assert "NSBX-Q-1" not in str(jobs)  # no patient identifier in the queue
        assert f"job {job_id} (outbox" in worker_log.read_text()  # the worker ran it
        assert done.n_instances == 8  # both series: what the PACS held when the job started
        # the SR per model and the checklist PDF, UNVERIFIED, in the patient's study
        assert done.route is not None and set(done.sr_sop_uids) == set(done.route.models)
        assert done.pdf_sop_uid
        classes = study_classes(orthanc_server, key)
        assert classes.count(SR_CLASS) == len(done.route.models) and PDF_CLASS in classes
        sr = instance_of(orthanc_server, next(iter(done.sr_sop_uids.values())))
        assert sr.VerificationFlag == "UNVERIFIED" and sr.PatientID == "NSBX-Q-1"
        # the run's folder (images, SR copies) in the shared folder, its rows in PostgreSQL
        folder = shared / "runs" / run.run_id
        assert (folder / "run.db.json").is_file() and list((folder / "images").glob("*.png"))
        assert not (tmp_path / "gateway-data" / "runs" / run.run_id).exists()
        counted = rows(url, f"SELECT count(*) FROM samples WHERE run_id = '{run.run_id}'")
        assert counted[0][0] == len(done.route.models)
        # `runs show` of the shared folder's run (any host with the folder and the URL)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        shown = CliRunner().invoke(app, ["runs", "show", str(folder)])
        assert shown.exit_code == 0, shown.output
        assert done.route.models[0] in shown.output and "complete" in shown.output
        # the gateway's review queue lists it, read from the run log
        with TestClient(create_app(gw.ctx), base_url="http://testserver") as client:
            client.headers.update(bearer(gw.ctx, "Dr Queue", "Queue^Quinn"))
            page = client.get("/review")
            assert page.status_code == 200 and f'data-run="{run.run_id}"' in page.text
        # an evaluation asked for over the API is queued too, forced (nothing new in the study)
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
        asked = gw.pipeline.request(
            orthanc_id(key.patient_id, key.study_uid), Route.model_validate(done.route.model_dump())
        )
        until("the API's run is queued",
               lambda: gw.ctx.runs.get(asked).stage == "queued for a worker", [worker_log])  # fmt: skip
        [(argv,)] = rows(url, "SELECT args FROM job_outbox ORDER BY id DESC LIMIT 1")
        assert f'"evaluate-study", "{asked}", "--force"' in str(argv)
        assert here.calls == 0
    finally:
        stop_worker(worker)
        gw.stop()


class _Deadline:
    """An evaluation still going when the worker's deadline sends the command SIGTERM."""

    name = "deadline"

    def evaluate(self, *args: object, **kwargs: object) -> object:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the signal's handler raises in here
        raise AssertionError("SIGTERM did not stop the evaluation")


def test_a_queued_run_is_evaluated_only_on_its_own_patients_study_and_never_twice(
    orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    """The worker's side alone (`runs evaluate-study` is StudyPipeline.run_queued): a run whose
    UID is in the PACS only under another patient fails saying so (never evaluated by the UID
    alone); a run an earlier attempt started (its worker lost) is resumed, or marked
    interrupted once its write-back had begun (never evaluated again); a finished run is left as it is; a run the worker's deadline stops
    (SIGTERM to its command) fails saying so."""
    from gateway.cli.worker import stopped_by_sigterm, worker_pipeline
    from gateway.pipeline import RETRIED_RUN
    from gateway.runs import RunRecord

    pipeline = worker_pipeline(_worker_settings(orthanc_server, tmp_path))
    try:
        other = make_study(tmp_path / "b", classes=("FLAIR",), n_slices=2, patient_id="NSBX-Q-B")
        pipeline.orthanc.upload_many(other.files)  # the UID's study in the PACS: patient B's
        runs = pipeline.runs

        def queued(patient: str, pacs_patient: str, status: RunStatus) -> str:
            run_id = runs.new_id()
            runs.create(RunRecord(
                run_id=run_id, trigger="dicom", study_uid=other.study_uid, status=status,
                study_key=StudyKey(study_uid=other.study_uid, patient_id=patient).name,
                orthanc_study_id=orthanc_id(pacs_patient, other.study_uid)))  # fmt: skip
            return run_id

        # patient A's run, pointed at B's study under the same UID (or at A's, not in the PACS)
        for pacs_patient, why in (("NSBX-Q-B", "another patient's"), ("NSBX-Q-A", "no longer")):
            rec = pipeline.run_queued(queued("NSBX-Q-A", pacs_patient, RunStatus.QUEUED))
            assert rec.status is RunStatus.FAILED and why in (rec.error or ""), rec
            assert not rec.sr_sop_uids
        # B's run that a lost worker had started, before its write-back: resumed, and done
        # (tests/test_study_run_resume.py: its stored answers are reused)
        rec = pipeline.run_queued(queued("NSBX-Q-B", "NSBX-Q-B", RunStatus.RUNNING))
        assert rec.status is RunStatus.DONE and rec.version == 1 and rec.sr_sop_uids, rec
        # one whose write-back had begun (version 2, its objects kept): interrupted, never
        # evaluated again; the study's next version is 3, superseding what it kept
        run_id = queued("NSBX-Q-B", "NSBX-Q-B", RunStatus.RUNNING)
        runs.update(run_id, version=2)
        rec = pipeline.run_queued(run_id)
        assert rec.status is RunStatus.INTERRUPTED and rec.error == RETRIED_RUN
        assert rec.evaluated_digest is None and not rec.sr_sop_uids
        key_b = StudyKey(study_uid=other.study_uid, patient_id="NSBX-Q-B")
        assert runs.last_evaluation(key_b).version == 2
        # a finished run (its job retried after it ended): left as it is
        again = pipeline.run_queued(rec.run_id)
        assert again.status is RunStatus.INTERRUPTED and again.finished_at == rec.finished_at
        # a run finished DONE by an attempt that died before pointing the study at it: the
        # retried job points it (the study's next version is 6, not 3)
        done_id = queued("NSBX-Q-B", "NSBX-Q-B", RunStatus.RUNNING)
        runs.update(done_id, version=5)
        runs.finish(done_id, RunStatus.DONE)
        assert pipeline.run_queued(done_id).status is RunStatus.DONE
        assert runs.last_evaluation(key_b).version == 5
        # the PACS does not answer when the job starts: the run fails saying so (the job is
        # not retried for a command that exited: never left queued or running)
        up = pipeline.orthanc
        pipeline.orthanc = OrthancClient(f"http://127.0.0.1:{free_port()}", "x", "y",
                                         timeout_s=2, retries=0)  # fmt: skip
        try:
            for status in (RunStatus.QUEUED, RunStatus.RUNNING):
                down = pipeline.run_queued(queued("NSBX-Q-B", "NSBX-Q-B", status))
                assert down.status is RunStatus.FAILED, down
                assert "the PACS did not answer" in (down.error or ""), down
        finally:
            pipeline.orthanc = up
        # the worker stops the command at the run deadline (SIGTERM): the run fails saying so
        pipeline.evaluator = _Deadline()  # type: ignore[assignment]
        before = signal.getsignal(signal.SIGTERM)
        with stopped_by_sigterm(7.0):
            rec = pipeline.run_queued(queued("NSBX-Q-B", "NSBX-Q-B", RunStatus.QUEUED))
        assert rec.status is RunStatus.FAILED and "7 s run deadline" in (rec.error or ""), rec
        assert rec.stage == "failed" and not rec.sr_sop_uids
        assert signal.getsignal(signal.SIGTERM) == before  # the handler put back
    finally:
        if pipeline.printer is not None:
            pipeline.printer.close()


def test_a_queued_run_records_the_series_its_rule_does_not_fetch(
    orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    """A run on a study in the PACS fetches only the series its rule routes; its record is of
    the study as the PACS holds it all the same (as a study received by the gateway's node):
    every instance counted, every other series listed as not shown with why, the study's
    series counted. Before, a queued run of a FLAIR + T2 study routed to FLAIR recorded 4
    instances, one series and 'every series shown'."""
    from gateway.cli.worker import worker_pipeline
    from gateway.runs import RunRecord, route_record

    pipeline = worker_pipeline(_worker_settings(orthanc_server, tmp_path))
    try:
        study = make_study(tmp_path / "s", classes=("FLAIR", "T2"), n_slices=4,
                           patient_id="NSBX-Q-NF")  # fmt: skip
        pipeline.orthanc.upload_many(study.files)
        route = Route(rule="flair-only", models=["reference/image-rules"],
                      tasks=["differential"], series_classes=["FLAIR"])  # fmt: skip
        run_id = pipeline.runs.new_id()
        pipeline.runs.create(RunRecord(
            run_id=run_id, trigger="dicom", study_uid=study.study_uid, route=route_record(route),
            study_key=StudyKey(study_uid=study.study_uid, patient_id="NSBX-Q-NF").name,
            orthanc_study_id=orthanc_id("NSBX-Q-NF", study.study_uid)))  # fmt: skip
        rec = pipeline.run_queued(run_id)
        assert rec.status is RunStatus.DONE, rec
        assert rec.n_instances == 8  # both series, though only the FLAIR was fetched
        assert {p.parent.name for p in (pipeline.runs.run_dir(run_id) / "study").rglob("*.dcm")
                } == {study.series_uids["FLAIR"]}  # fmt: skip
        [case] = open_store(pipeline.runs.run_dir(run_id)).cases().values()
        assert {i.series_uid for i in case.images} == {study.series_uids["FLAIR"]}
        ns = case.provenance.series_not_shown
        assert ns is not None and (ns.n_series, ns.n_shown) == (2, 1), ns
        [t2] = ns.series
        assert (t2.series_uid, t2.series_class) == (study.series_uids["T2"], "T2")
        assert t2.reason is NotShownReason.NOT_ROUTED and t2.n_files == 4, t2
        assert case.provenance.identity is not None and case.provenance.identity.n_series == 2
    finally:
        if pipeline.printer is not None:
            pipeline.printer.close()


def test_a_merged_run_the_gateway_left_queued_is_finished_by_the_studys_job(
    pg_url: str, tmp_path: Path
) -> None:
    """A hand-over that could not see its drain's outcome (another process's drain held the
    outbox row) leaves a merged run queued: the study's job finishes it as merged, and only
    runs of its study whose rows were merged."""
    import sqlalchemy as sa

    from gateway.jobs import enqueue, study_job
    from gateway.runs import RunRecord, StudyRunStore
    from gateway.study_queue import finish_merged, study_argv

    url = fresh_pg_database(pg_url)
    upgrade_run_log(url)
    runs = StudyRunStore(tmp_path / "shared", database_url=url)
    key, other = (StudyKey(study_uid=f"1.2.3.{n}", patient_id="P").name for n in (1, 2))
    ids = {}
    for name, study_key, merged in (("merged", key, True), ("waiting", key, False),
                                    ("other", other, True)):  # fmt: skip
        run_id = ids[name] = runs.new_id()
        runs.create(RunRecord(run_id=run_id, trigger="dicom", study_key=study_key))
        with sa.create_engine(url, poolclass=sa.pool.NullPool).begin() as conn:
            oid = enqueue(conn, study_job(study_key, study_argv(run_id)))
            conn.execute(sa.text("UPDATE job_outbox SET drained_at = 'now', job_id = :j "
                                 "WHERE id = :o"), {"j": None if merged else 7, "o": oid})  # fmt: skip
    assert finish_merged(runs, url, key) == [ids["merged"]]
    rec = runs.get(ids["merged"])
    assert rec.status is RunStatus.SKIPPED and rec.skip is SkipKind.MERGED
    assert runs.get(ids["waiting"]).status is RunStatus.QUEUED  # its own job
    assert runs.get(ids["other"]).status is RunStatus.QUEUED  # another study's
    assert finish_merged(runs, url, key) == []  # once


def test_a_run_an_earlier_attempt_still_holds_is_left_to_it(
    orthanc_server: OrthancServer, pg_url: str, tmp_path: Path
) -> None:
    """A job retried while its first worker is only stalled (alive, past the stall timeout):
    the retry leaves the run to that attempt (which holds it: gateway.jobs.run_held), never
    evaluating and writing it back a second time; once that attempt is gone, it resumes."""
    from gateway.cli.worker import worker_pipeline
    from gateway.jobs import run_held
    from gateway.runs import RunRecord

    url = fresh_pg_database(pg_url)
    upgrade_run_log(url)
    settings = _worker_settings(orthanc_server, tmp_path).model_copy(update={"database_url": url})
    pipeline = worker_pipeline(settings)
    try:
        study = make_study(tmp_path / "s", classes=("FLAIR",), n_slices=2, patient_id="NSBX-Q-F")
        pipeline.orthanc.upload_many(study.files)
        run_id = pipeline.runs.new_id()
        pipeline.runs.create(RunRecord(
            run_id=run_id, trigger="dicom", study_uid=study.study_uid, status=RunStatus.RUNNING,
            study_key=StudyKey(study_uid=study.study_uid, patient_id="NSBX-Q-F").name,
            orthanc_study_id=orthanc_id("NSBX-Q-F", study.study_uid)))  # fmt: skip
        with run_held(url, run_id) as first:  # the first attempt, stalled but alive
            assert first
            rec = pipeline.run_queued(run_id)
            assert rec.status is RunStatus.RUNNING and not rec.sr_sop_uids, rec
        rec = pipeline.run_queued(run_id)  # that attempt is gone: resumed and done
        assert rec.status is RunStatus.DONE and rec.sr_sop_uids, rec
    finally:
        if pipeline.printer is not None:
            pipeline.printer.close()


def _worker_settings(server: OrthancServer, tmp_path: Path) -> Settings:
    """A worker host's settings: its own DATA_DIR, the shared folder, the gateway's Orthanc."""
    ep = server.endpoints
    return server.settings.model_copy(update={
        "data_dir": tmp_path / "worker", "shared_dir": tmp_path / "shared",
        "orthanc_url": ep.orthanc_url, "orthanc_password_file": Path(ep.password_file or "")})  # fmt: skip
