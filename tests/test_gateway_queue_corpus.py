"""The gateway on the queue with a real vendor study (issue 40): the corpus's BRAINIX study
(Philips; T1 SE, T2 TSE, FLAIR and a tumour mask stored as an MR image, 88 instances) sent by
dcmtk's storescu to a gateway whose run log is on PostgreSQL with the queue's tables is queued,
not evaluated in the gateway; a `neurosandbox worker` process takes its job and writes back what
a hospital looks for: an UNVERIFIED SR per routed model and the checklist PDF in that patient's
study, every instance sent evaluated, the series classified as the corpus's labels say, and no
patient identifier in the queue. Skips without the corpus (fails with
NEUROSANDBOX_REQUIRE_CORPUS=1), like the other corpus tests."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pydicom
import pytest
from gateway_inproc import (
    PDF_CLASS,
    SR_CLASS,
    instance_of,
    pacs_client,
    queue_gateway,
    rows,
    rules_file,
    start_worker,
    stop_worker,
    study_classes,
    until,
)
from gateway_process import send
from orthanc_fixture import OrthancServer

from dicom import NotShownReason
from evaluation.log import open_store
from gateway.runs import RunStatus
from gateway.study_key import StudyKey

pytestmark = [pytest.mark.integration, pytest.mark.corpus]
BRAINIX = "brainix/BRAINIX/DICOM"  # the study's folder in the corpus; labels.json keys below it
MODELS = ["reference/image-rules", "reference/text-prior"]


def _labelled_series(corpus: Path) -> dict[str, tuple[str, list[Path]]]:
    """SeriesInstanceUID -> (the class labels.json expects, the series' files), for every
    series folder of the study."""
    labels = json.loads((corpus / "labels.json").read_text())["series"]
    out: dict[str, tuple[str, list[Path]]] = {}
    for folder, expected in labels.items():
        if folder.startswith(BRAINIX + "/"):
            files = sorted((corpus / folder).glob("*.dcm"))
            uid = pydicom.dcmread(files[0], stop_before_pixels=True).SeriesInstanceUID
            out[str(uid)] = (expected["class"], files)
    return out


def test_a_real_corpus_study_sent_to_a_queue_gateway_is_evaluated_by_a_worker(
    orthanc_server: OrthancServer, pg_url: str, corpus: Path, tmp_path: Path
) -> None:
    series = _labelled_series(corpus)
    assert len(series) == 4, series  # T1, T2, FLAIR, the mask
    files = [f for _, fs in series.values() for f in fs]
    first = pydicom.dcmread(files[0], stop_before_pixels=True)
    key = StudyKey(study_uid=str(first.StudyInstanceUID), patient_id=str(first.PatientID))
    identifiers = {str(first.PatientID), str(first.PatientName), str(first.PatientBirthDate)}
    # the session's PACS may hold the study from another corpus test (with its SRs): the
    # hospital's PACS here holds only what this test sends
    pacs = pacs_client(orthanc_server)
    for old in pacs.studies_by_uid(key.study_uid):
        pacs.api.delete(f"{pacs.url}/studies/{old.orthanc_id}").raise_for_status()
    routing = rules_file(tmp_path / "rules.yaml", ["differential"], "corpus-queued", MODELS)
    q = queue_gateway(orthanc_server, pg_url, tmp_path, routing)
    gw = q.gw
    worker_log = tmp_path / "worker.log"
    worker: subprocess.Popen[bytes] | None = None
    try:
        send(gw.scp.port, files)  # all four series: explicit VR little endian, as stored
        until("the run is queued", lambda: [r.stage for r in gw.ctx.runs.list(
            study_uid=key.study_uid)] == ["queued for a worker"], [worker_log])  # fmt: skip
        [run] = gw.ctx.runs.list(study_uid=key.study_uid)
        assert run.status is RunStatus.QUEUED and run.study_key == key.name
        worker = start_worker(q, tmp_path, worker_log)
        until("the worker finished the run", lambda: gw.ctx.runs.get(run.run_id).final,
              [worker_log], timeout_s=60)  # fmt: skip
        done = gw.ctx.runs.get(run.run_id)
        assert done.status is RunStatus.DONE, (done, worker_log.read_text()[-3000:])
        assert q.here.calls == 0  # not evaluated in the gateway's process
        # the job: the worker ran it; no patient identifier in the queue's rows
        jobs = rows(q.url, "SELECT task, lock, args, job_id FROM job_outbox ORDER BY id")
        [(task, lock, args, job_id)] = jobs
        assert task == "study_run" and lock == f"study:{key.name}"
        assert f'evaluate-study", "{run.run_id}' in str(args)
        assert f"job {job_id} (outbox" in worker_log.read_text()
        queued = rows(q.url, "SELECT queueing_lock, lock, args FROM procrastinate_jobs")
        assert queued and not [i for i in identifiers if i in str(jobs) + str(queued)]
        # the run's record is of the study as the PACS held it: every instance sent, the mask
        # series the rule does not route included (not fetched, never shown)
        assert done.n_instances == len(files) == 88
        # an SR per routed model and the checklist PDF, UNVERIFIED, in that patient's study
        assert done.route is not None and sorted(done.route.models) == sorted(MODELS)
        assert set(done.sr_sop_uids) == set(MODELS) and done.pdf_sop_uid
        classes = study_classes(orthanc_server, key)  # found by its UID and its PatientID
        assert classes.count(SR_CLASS) == len(MODELS) and classes.count(PDF_CLASS) == 1
        assert len(classes) == len(files) + len(MODELS) + 1, classes
        for uid in [*done.sr_sop_uids.values(), done.pdf_sop_uid]:
            ds = instance_of(orthanc_server, uid)
            assert (ds.PatientID, ds.StudyInstanceUID) == (key.patient_id, key.study_uid)
            assert ds.PatientName == first.PatientName
            if ds.SOPClassUID == SR_CLASS:
                assert ds.VerificationFlag == "UNVERIFIED"
        # the series the worker identified, shown or not: each as the corpus's labels say, and
        # the mask listed as not shown (what the checklist tells the reviewer)
        store = open_store(q.shared / "runs" / run.run_id, database_url=q.url, read_only=True)
        [case] = store.cases().values()
        found = {i.series_uid: i.series_class for i in case.images if i.series_uid}
        not_shown = case.provenance.series_not_shown
        assert not_shown is not None and not_shown.n_series == 4 and not_shown.n_shown == 3
        assert [s.reason for s in not_shown.series] == [NotShownReason.DERIVED], not_shown
        found.update({s.series_uid: s.series_class for s in not_shown.series})
        assert found == {uid: label for uid, (label, _) in series.items()}, found
        identity = case.provenance.identity
        assert identity is not None and identity.n_series == 4 and identity.modalities == ["MR"]
    finally:
        stop_worker(worker)
        gw.stop()
