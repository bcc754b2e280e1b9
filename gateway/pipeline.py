"""What happens to a complete study: store, route, evaluate, report, write back (SR + PDF).

The evaluation itself sits behind the narrow ``Evaluator`` protocol: a study folder, its one
index and a ``Route`` in, an ``EvaluationResult`` (the run as its store records it,
``RunData``, and the study's facts) out. ``gateway.study_run.DefaultEvaluator``, the
built-in one, runs the evaluation engine in the run folder, whose run store is the run's one
record (the gateway's status notes included, ``gateway.runs``); the service runs it through
``ProcessEvaluator`` (a worker process per evaluation, started ahead while idle, stopped at
the run deadline: the run fails with the reason and the next study goes on). The pipeline
writes the run's report bundle (``gateway.runs.report``; Chromium prints its checklist while
the upload settles and the SRs are built): the checklist PDF goes back to PACS with one
UNVERIFIED SR per model (``gateway.writeback``), and the bundle goes to the review pages
(``<reports dir>/<run id>``).

A study is its StudyInstanceUID and its patient (``gateway.study_key``). Before anything is
evaluated the pipeline checks the identity (``_check_identity``): the indexed instances name
one patient, the patient of the study's key; no other patient's study shares the UID (in the
spool or in Orthanc); a registered case of this UID is this patient's. A study that fails the
check is *held*: not evaluated, nothing written back, and listed in the review queue with the
reason and every identity involved.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import pydicom

from dicom import (
    IndexResult,
    MixedPatientsError,
    PatientKey,
    SeriesInfo,
    check_uid,
    index_path,
    one_patient,
)
from evaluation import Case as EvalCase
from evaluation.datasets import case_registry
from evaluation.log import WriteBack
from evaluation.reports import Printer
from gateway.audit import AuditLog
from gateway.cache import InstanceCache
from gateway.case_studies import CaseGatherer, CaseStudies
from gateway.forward import Forwarder
from gateway.metrics import METRICS
from gateway.orthanc import OrthancClient, SeriesSummary, StackClass
from gateway.pacs import LOCAL, PacsClient
from gateway.routing import Route, Router, StudyFacts
from gateway.runs import RunRecord, RunStatus, SkipKind, StudyRunStore, StudyState
from gateway.runs.report import publish, write_checklist
from gateway.runs.results import EvaluationResult
from gateway.runs.store import route_record
from gateway.scp import FailedStudy, ReceivedStudy, uid_key
from gateway.spool import read_received_info
from gateway.sr import series_uid_for
from gateway.study_key import StudyKey
from gateway.study_key import orthanc_id as resource_id
from gateway.study_queue import StudyQueue
from gateway.workers import EvaluationAbandonedError, EvaluationWorkerError
from gateway.writeback import (
    KEPT_DIR,
    Delivery,
    build_unverified,
    checklist_pdf,
    deliver,
    evidence,
    evidence_refs,
    keep,
)
from gateway.writeback import warm as warm_writeback

log = logging.getLogger(__name__)


@runtime_checkable
class Evaluator(Protocol):
    """Evaluate one study (a folder of DICOM files) as the route says; write into ``work_dir``."""

    name: str

    def evaluate(
        self, study_dir: Path, route: Route, work_dir: Path, index: IndexResult
    ) -> EvaluationResult: ...


def failure_text(exc: Exception) -> str:
    """What a failed run records: the reason an abandoned evaluation was stopped, else the
    exception (for one raised in the worker, its class there)."""
    if isinstance(exc, EvaluationAbandonedError):
        return str(exc)
    kind = exc.kind if isinstance(exc, EvaluationWorkerError) else type(exc).__name__
    return f"{kind}: {exc}"


def _revise(sops: Iterable[str], state: StudyState) -> None:
    """Count one more revision of each of ``sops`` (re-stored under the same UIDs)."""
    for sop in sops:
        state.revisions[sop] = state.revisions.get(sop, 0) + 1


def sop_digest(sop_uids: Iterable[str]) -> str:
    """What a study's instances are: their SOP UIDs, each with what identifies its content
    where it can change under the same UID (``<sop>#<revision>``, ``<sop>#<file uuid>``)."""
    return hashlib.sha256("\n".join(sorted(set(sop_uids))).encode()).hexdigest()


class EstimateUnavailable(Exception):
    """The pipeline's evaluator has no estimate (a custom ``Evaluator``)."""


# a queued run's job retried after its worker died or stalled during the write-back: what it
# kept is stored by the gateway's retry loop, nothing is built or stored a second time (one
# stopped before its write-back is resumed: its stored answers reused, StudyPipeline.run_queued)
RETRIED_RUN = (
    "the worker evaluating this run stopped during its write-back (killed, or silent past the "
    "queue's stall timeout) and its job was retried: the SRs and PDF it had kept are stored "
    "by the gateway's write-back retry, and the run is not evaluated a second time; the "
    "study's next evaluation is the next version"
)


class QueuedStudyError(Exception):
    """A queued run's study is not in the PACS as the run names it (the reason says why)."""


class StudyHeldError(Exception):
    """The study is not evaluated: its identity does not hold (the reason says why)."""

    def __init__(self, message: str, identities: list[str]) -> None:
        super().__init__(message)
        self.identities = identities


def evaluation_digest(instances: str, route: Route) -> str:
    """What an evaluation is of: the instances (``sop_digest``) and the rule, models and tasks.
    The same again is skipped; a new instance or a changed rule evaluates the study again. A
    rule without the robustness audit digests as before the option existed (no re-evaluation
    of every study on upgrade)."""
    body = route.model_dump_json(exclude=None if route.robustness else {"robustness"})
    return hashlib.sha256(f"{instances}\n{body}".encode()).hexdigest()


@dataclass
class _HeldStable:
    """A study being written back into the followed Orthanc: its run, and whether a
    StableStudy came since the last object stored (set and cleared under
    ``_HELD_LOCK``)."""

    run_id: str
    seen: bool = False


_HELD_LOCK = threading.Lock()  # what a stored object and a StableStudy do to a hold


def _deliver(
    dest: PacsClient, items: list[tuple[WriteBack, pydicom.Dataset]], held: _HeldStable | None
) -> Delivery:
    """``deliver`` the objects; one stored in the followed Orthanc supersedes a StableStudy
    held for the study until then (Orthanc calls the study stable again after it)."""
    got = deliver(dest, items, time.time)
    if got.done and held is not None:
        with _HELD_LOCK:
            held.seen = False
    return got


@dataclass
class Job:
    run_id: str
    trigger: str  # dicom | orthanc | api
    study_uid: str | None = None
    key: StudyKey | None = None  # the UID with its patient (known once the study is)
    folder: Path | None = None  # spool folder (dicom)
    orthanc_id: str | None = None
    calling_aets: list[str] = field(default_factory=list)
    route: Route | None = None  # forced (api)
    force: bool = False
    recovered: bool = False  # re-offered after a restart: only if never evaluated
    revised: list[str] = field(default_factory=list)  # SOP UIDs re-sent with other bytes
    # a registered case of several studies: the others (their keys and spool folders), and
    # the named studies that did not arrive in time (gateway.case_studies)
    others: list[tuple[StudyKey, Path]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    case_id: str | None = None
    case_other_patients: list[str] = field(default_factory=list)  # held when any
    t0: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)  # the study's instances (dicom)
    uploads: list[tuple[Path, Future[str]]] = field(default_factory=list)  # before write-back
    stored: set[str] = field(default_factory=set)  # SOP UIDs this run knows are in Orthanc
    settled: bool = False  # every instance of the study known to be in Orthanc


class StudyPipeline:
    """One worker thread runs jobs in order; jobs for a study already queued are merged."""

    def __init__(
        self,
        orthanc: OrthancClient,
        evaluator: Evaluator,
        router: Router,
        runs: StudyRunStore,
        audit: AuditLog,
        cache: InstanceCache,
        upload_threads: int = 4,
        forwarder: Forwarder | None = None,
        printer: Printer | None = None,
        cases: Path | None = None,
    ) -> None:
        self.orthanc, self.evaluator, self.router = orthanc, evaluator, router
        self.forwarder = forwarder  # stores received instances in Orthanc as they arrive
        self.printer = printer  # a Chromium kept running for the checklists (closed on stop)
        self.runs, self.audit, self.cache = runs, audit, cache
        self.upload_threads = upload_threads
        self.cases = cases  # the registered cases (NEUROSANDBOX_CASES): matched on UID and patient
        self.spool_studies: Path | None = None  # the DICOM node's study folders (siblings)
        # cases of several studies: gathered before they are evaluated, once, together
        self.gatherer: CaseGatherer | None = None
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._pending: dict[str, str] = {}  # study key -> queued run id
        self._held: dict[str, _HeldStable] = {}  # Orthanc study ID -> its write-back's hold
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._warmed = False  # the write-back's tables loaded ahead (``_prepare``)
        # where SR and PDF go: a configured PACS (NEUROSANDBOX_PACS_FILE's writeback:); None:
        # the Orthanc above. An object not stored is kept under kept_dir until it is.
        self.writeback: PacsClient | None = None
        self.kept_dir: Path = runs.runs_dir.parent / KEPT_DIR
        # the queue (PostgreSQL run log, gateway.study_queue): set, a study's evaluation is
        # handed to a `neurosandbox worker` where it would start here; None: evaluated here
        self.queue: StudyQueue | None = None

    def destination(self) -> PacsClient:
        """The PACS results are written back to."""
        if self.writeback is not None:
            return self.writeback
        from gateway.pacs.orthanc_rest import OrthancRestClient

        return OrthancRestClient(LOCAL, self.orthanc)

    @property
    def reports_dir(self) -> Path:
        """Where the run's report bundle is published (the review pages read it there)."""
        return self.runs.reports_dir

    # ----------------------------------------------------------------- submission

    def start(self) -> None:
        interrupted = self.runs.mark_interrupted()
        if interrupted:
            log.warning(
                "%d run(s) interrupted by the previous stop marked as such", len(interrupted)
            )
        self._thread = threading.Thread(target=self._work, name="pipeline", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop the worker thread. An evaluator that can (``cancel``: a worker process) stops
        the running evaluation now, which fails saying so; runs still queued fail saying the
        gateway stopped. Otherwise the running job may finish within ``timeout_s``."""
        self._stopping = True
        if self.gatherer is not None:
            self.gatherer.close()
        self._queue.put(None)
        cancel = getattr(self.evaluator, "cancel", None)
        if callable(cancel):
            cancel()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
        if self.printer is not None:
            self.printer.close()

    def _submit(self, job: Job, key: str) -> str:
        with self._lock:
            if key in self._pending and not job.force:
                return self._pending[key]
            self._pending[key] = job.run_id
        self.runs.create(
            RunRecord(
                run_id=job.run_id,
                trigger=job.trigger,
                study_uid=job.study_uid,
                study_key=job.key.name if job.key else None,
                orthanc_study_id=job.orthanc_id,
                route=route_record(job.route),
            )
        )
        METRICS.set("runs_in_progress", float(self._queue.qsize() + 1))
        self._queue.put(job)
        if self._queue.unfinished_tasks > 1 and self.queue is None:  # behind a running study
            prepare_soon = getattr(self.evaluator, "prepare_soon", None)
            if callable(prepare_soon):  # its worker imports while the one ahead runs
                prepare_soon()
        return job.run_id

    def on_received(self, study: ReceivedStudy) -> str | None:
        """From the DICOM node: a study is complete (again). A study offered again after a
        restart with nothing new since its evaluation gets no run at all (None)."""
        folder = Path(study.folder)
        if self.gatherer is not None and self.gatherer.offer(study):
            return None  # one of a case's studies: evaluated with the others (on_case)
        if study.recovered and not study.revised:
            state = self.runs.study_state(study.key)
            last = self.runs.last_evaluation(study.key)
            instances = self._instances_digest(sorted(folder.rglob("*.dcm")), state.revisions)
            if instances in (last.evaluated_instances, last.evaluated_digest):
                log.info("study %s: evaluated before the restart", uid_key(study.key.name))
                return None
        if study.refused_resends:
            log.warning(
                "study %s: %d re-sent instance(s) with other bytes not taken (the PACS keeps the "
                "original)",
                uid_key(study.key.name),
                study.refused_resends,
            )
        job = Job(
            run_id=self.runs.new_id(),
            trigger="dicom",
            study_uid=study.study_uid,
            key=study.key,
            folder=folder,
            calling_aets=study.calling_aets,
            recovered=study.recovered,
            revised=list(study.revised),
        )
        return self._submit(job, f"uid:{study.key.name}")

    def on_case(self, cs: CaseStudies) -> str | None:
        """From the gatherer: every study of a case that arrived, evaluated once together
        (the primary's run: its key, its SR, its versions). After a restart with nothing new
        since their evaluation: no run (None)."""
        p = cs.primary
        studies = [p, *cs.others]
        if all(s.recovered and not s.revised for s in studies):
            state = self.runs.study_state(p.key)
            last = self.runs.last_evaluation(p.key)
            files = sorted(f for s in studies for f in Path(s.folder).rglob("*.dcm"))
            instances = self._instances_digest(files, state.revisions)
            if instances in (last.evaluated_instances, last.evaluated_digest):
                return None
        job = Job(
            run_id=self.runs.new_id(),
            trigger="dicom",
            study_uid=p.study_uid,
            key=p.key,
            folder=Path(p.folder),
            calling_aets=sorted({a for s in studies for a in s.calling_aets}),
            recovered=all(s.recovered for s in studies),
            revised=sorted({r for s in studies for r in s.revised}),
            others=[(s.key, Path(s.folder)) for s in cs.others],
            missing=list(cs.missing),
            case_id=cs.case_id,
            case_other_patients=list(cs.other_patients),
        )
        run_id = self._submit(job, f"case:{cs.case_id}:{p.key.patient_hash}")
        if cs.missing:
            log.warning(
                "case %s evaluated without %d of its studies (not arrived within %.0f s)",
                uid_key(cs.case_id),
                len(cs.missing),
                cs.wait_s,
            )
        return run_id

    def on_failed(self, study: FailedStudy) -> str:
        """From the DICOM node: received instances could not be committed. The study is in
        the queue as failed, with the reason."""
        run_id = self.runs.new_id()
        self.runs.create(
            RunRecord(
                run_id=run_id,
                trigger="dicom",
                study_uid=study.study_uid,
                study_key=study.key.name,
                n_instances=study.n_instances,
            )
        )
        METRICS.inc("evaluations_failed_total")
        self.runs.finish(run_id, RunStatus.FAILED, error=study.error)
        self.audit.write("system", "evaluation", f"run:{run_id}", "failed")
        return run_id

    @staticmethod
    def _instances_digest(files: list[Path], revisions: dict[str, int]) -> str:
        return sop_digest(
            f"{p.stem}#{revisions[p.stem]}" if p.stem in revisions else p.stem for p in files
        )

    def on_stable(self, orthanc_id: str) -> str:
        """From Orthanc's /changes: a study became stable. During the write-back into it the
        event is held by the run writing back, whose id is returned (``_holding_stable``)."""
        with self._lock, _HELD_LOCK:
            held = self._held.get(orthanc_id)
            if held is not None:
                held.seen = True
                return held.run_id
        job = Job(run_id=self.runs.new_id(), trigger="orthanc", orthanc_id=orthanc_id)
        return self._submit(job, f"orthanc:{orthanc_id}")

    def request(self, orthanc_id: str, route: Route, actor: str | None = None) -> str:
        """From the API: evaluate this study now with these models and tasks."""
        job = Job(
            run_id=self.runs.new_id(), trigger="api", orthanc_id=orthanc_id, route=route, force=True
        )
        run_id = self._submit(job, f"api:{job.run_id}")
        if actor:
            self.runs.update(run_id, requested_by=actor)
        return run_id

    def wait_idle(self, timeout_s: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._queue.unfinished_tasks == 0:
                return True
            time.sleep(0.05)
        return False

    # ----------------------------------------------------------------- worker

    def waiting(self) -> bool:
        """Whether a study waits in the queue behind the one being evaluated."""
        return not self._queue.empty()

    def _prepare(self) -> None:
        """While idle, start ahead what the next study needs: the evaluator's spare worker
        process, the checklists' Chromium. A failure here only costs that study its start."""
        if self._stopping or self.queue is not None:  # the workers evaluate
            return
        if self.printer is not None:
            self.printer.warm()
        if not self._warmed:  # once: what the first write-back would load on first use
            self._warmed = True
            try:
                warm_writeback()
            except Exception:
                log.exception("could not load the write-back's tables ahead")
        prepare = getattr(self.evaluator, "prepare", None)
        if not callable(prepare):
            return
        try:
            prepare()
        except Exception:
            log.exception("could not start a spare evaluation worker")

    def _work(self) -> None:
        while True:
            if self._queue.empty():
                self._prepare()
            job = self._queue.get()
            try:
                if job is None:
                    return
                with self._lock:
                    for k, v in list(self._pending.items()):
                        if v == job.run_id:
                            del self._pending[k]
                if self._stopping:
                    self.runs.finish(
                        job.run_id, RunStatus.FAILED, error="the gateway stopped before this run"
                    )
                    continue
                self._run(job)
            finally:
                self._queue.task_done()
                METRICS.set("runs_in_progress", float(self._queue.qsize()))

    def _run(self, job: Job) -> None:
        t0 = job.t0 = time.monotonic()
        self.runs.update(job.run_id, status=RunStatus.RUNNING, stage="starting", progress=0.02)
        try:
            if job.folder is not None:  # received here (a worker's run reads the PACS)
                self._run_received(job)
            else:
                self._run_orthanc(job)
        except StudyHeldError as exc:
            METRICS.inc("evaluations_held_total")
            log.warning("run %s held: %s", job.run_id, exc)
            self.runs.finish(
                job.run_id, RunStatus.HELD, error=str(exc)[:2000], identities=exc.identities[:20]
            )
            self.audit.write("system", "evaluation", f"run:{job.run_id}", "held")
            return
        except Exception as exc:
            METRICS.inc("evaluations_failed_total")
            if isinstance(exc, EvaluationAbandonedError | EvaluationWorkerError):
                log.warning("run %s failed: %s", job.run_id, failure_text(exc))
            else:
                log.exception("run %s failed", job.run_id)
            self.runs.finish(job.run_id, RunStatus.FAILED, error=failure_text(exc))
            self.audit.write("system", "evaluation", f"run:{job.run_id}", "failed")
            return
        log.info("run %s finished in %.1f s", job.run_id, time.monotonic() - t0)

    def _stage(self, job: Job, stage: str, progress: float) -> None:
        job.timings[stage] = round(time.monotonic() - job.t0, 3)
        self.runs.update(job.run_id, stage=stage, progress=progress, timings_s=dict(job.timings))

    def _run_received(self, job: Job) -> None:
        assert job.folder is not None and job.study_uid is not None and job.key is not None
        folder = job.folder
        if job.others:  # a case of several studies: one view of all their files, linked
            folder = self._case_view(job)
        job.files = sorted(folder.rglob("*.dcm"))
        if job.revised:  # re-sent with other bytes, taken as the PACS took them
            self.runs.update_study_state(job.key, functools.partial(_revise, job.revised))
        state = self.runs.study_state(job.key)
        # The forwarder stored (or is storing) most instances in Orthanc as they arrived;
        # the others are uploaded from the spool now, overlapping the evaluation, and the
        # write-back waits for both.
        self._stage(job, "storing in Orthanc", 0.1)
        forwarded: set[str] = set()
        for k in self._keys(job):
            forwarded |= self.forwarder.accepted(k.name) if self.forwarder else set()
        todo = [p for p in job.files if p.stem not in state.uploaded and p.stem not in forwarded]
        with ThreadPoolExecutor(self.upload_threads) as pool:
            job.uploads = [(p, pool.submit(self.orthanc.upload, p)) for p in todo]
            try:
                self.runs.update(job.run_id, n_instances=len(job.files))
                self._stage(job, "indexing", 0.2)
                # The study's one index: every header read once, the first of each series
                # kept for the identity, the PHI gate's names and the SR's evidence.
                index = index_path(folder, workers=1, keep_headers=True)
                facts = StudyFacts.from_index(index, job.calling_aets)
                digest = self._instances_digest(job.files, state.revisions)
                self._evaluate(job, folder, index, facts, digest)
            finally:
                try:
                    self._finish_uploads(job)
                finally:
                    self.runs.update_study_state(
                        job.key,
                        lambda s: setattr(s, "uploaded", sorted({*s.uploaded, *job.stored})),
                    )

    def _finish_uploads(self, job: Job) -> None:
        """Wait for the study's upload to Orthanc (forwarded on arrival, or from the spool);
        upload from the spool what the forwarder could not store; raise the first failure.
        Once settled, again is nothing (the write-back settles it, the run's end makes sure)."""
        if job.settled:
            return
        pairs, job.uploads = job.uploads, []
        for p, f in pairs:
            if f.exception() is None:
                job.stored.add(p.stem)
        for _p, f in pairs:
            f.result()
        if job.key is not None and job.trigger == "dicom":
            if self.forwarder is not None:
                for k in self._keys(job):
                    job.stored |= self.forwarder.settle(k.name)
            done = job.stored | set(self.runs.study_state(job.key).uploaded)
            for p in job.files:
                if p.stem not in done:  # declined or failed on arrival
                    self.orthanc.upload(p)
                    job.stored.add(p.stem)
            self.runs.update(
                job.run_id,
                orthanc_study_id=self.orthanc.find_study_of(job.key.study_uid, job.key.patient_id),
            )
        job.settled = True

    @staticmethod
    def _keys(job: Job) -> list[StudyKey]:
        return [k for k in (job.key, *(k for k, _ in job.others)) if k is not None]

    def _case_view(self, job: Job) -> Path:
        """The run's view of a case's studies: each study's spool files hard-linked (copied
        across devices) under ``study/<study key>/``; the spool stays as it is."""
        assert job.folder is not None and job.key is not None
        view = self.runs.run_dir(job.run_id) / "study"
        for key, src in [(job.key, job.folder), *job.others]:
            for p in src.rglob("*.dcm"):
                dest = view / key.name / p.relative_to(src)
                dest.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(p, dest)
                except FileExistsError:
                    pass
                except OSError:
                    shutil.copyfile(p, dest)
        return view

    def _run_orthanc(self, job: Job) -> None:
        assert job.orthanc_id is not None
        study = self.orthanc.study(job.orthanc_id)
        job.study_uid = study.study_uid
        # Orthanc keys a study by PatientID and UID: the study's key is the same pair (a
        # queued run's key, its issuer with it, was checked against the study: run_queued)
        if job.key is None:
            job.key = StudyKey(study_uid=check_uid(study.study_uid), patient_id=study.patient_id)
        self.runs.update(job.run_id, study_uid=study.study_uid, study_key=job.key.name)
        ours = {series_uid_for(study.study_uid, k) for k in ("sr", "pdf")}
        series = [s for s in self.orthanc.list_series(job.orthanc_id) if s.series_uid not in ours]
        sops = {s.orthanc_id: self.orthanc.series_instances(s.orthanc_id) for s in series}
        # An instance whose stored file changed since it was last seen was re-stored
        # (overwritten) under the same UIDs: a revision, as the node counts one it takes.
        seen = {k.sop_uid: k.content_id for ks in sops.values() for k in ks}

        def see(state: StudyState) -> tuple[list[str], StudyState]:
            revised = [s for s, f in seen.items() if state.files.get(s, f) != f]
            _revise(revised, state)
            state.files.update(seen)
            return revised, state  # read for this change alone: nobody else holds it

        job.revised, state = self.runs.update_study_state(job.key, see)
        digest = sop_digest(
            f"{sop}#{state.revisions[sop]}" if sop in state.revisions else sop for sop in seen
        )
        aets = set()
        for items in sops.values():
            if items:
                aet = self.orthanc.instance_metadata(items[0].instance_id).get("RemoteAET", "")
                if aet:
                    aets.add(aet)
        facts = StudyFacts(
            calling_aets=sorted(aets),
            modalities=sorted({s.modality for s in series if s.modality}),
            series_classes=sorted({c.series_class for s in series for c in s.stacks}),
        )
        route = job.route or self.router.route(facts)
        if route is None:
            return self._skip(job, SkipKind.NOT_ROUTED, facts)
        last = self.runs.last_evaluation(job.key)
        if not job.force and last.evaluated_digest == evaluation_digest(digest, route):
            return self._skip(job, SkipKind.UNCHANGED)
        self._stage(job, "fetching series", 0.2)
        folder = self.runs.run_dir(job.run_id) / "study"
        shutil.rmtree(folder, ignore_errors=True)  # a resumed run's earlier fetch: not again
        _files, not_fetched = self._fetch_routed(series, sops, route, folder)
        # the run records the study as the PACS holds it (as a received study's run does),
        # not only the series fetched
        self.runs.update(job.run_id, n_instances=sum(map(len, sops.values())))
        job.route = route
        self._stage(job, "indexing", 0.3)
        index = index_path(folder, workers=1, keep_headers=True)
        index.not_fetched = [
            st for s in not_fetched for st in _unfetched_stacks(study.study_uid, s)
        ]
        self._evaluate(job, folder, index, facts, digest)

    def _fetch_routed(
        self, series: list[Any], sops: dict[str, Any], route: Route, folder: Path
    ) -> tuple[list[Path], list[Any]]:
        """The instances of the series ``route`` evaluates, fetched into the cache and linked
        into ``folder`` (a folder per SeriesInstanceUID, files by SOPInstanceUID); and the
        series not fetched."""
        files: list[Path] = []
        not_fetched = []
        for s in series:
            if s.series_class in route.series_classes or any(
                c.series_class in route.series_classes for c in s.stacks
            ):
                for key in sops[s.orthanc_id]:
                    self.orthanc.fetch_instance(key, self.cache)
                target = folder / check_uid(s.series_uid)
                files += self.cache.link_into(sops[s.orthanc_id], target)
            else:
                not_fetched.append(s)
        return files, not_fetched

    def estimate(self, orthanc_id: str, route: Route) -> Any:
        """What evaluating the study with ``route`` would send and cost
        (``evaluation.budget.RunEstimate``), sending nothing and recording no run: the routed
        series fetched, indexed and rendered as a run would, in a folder removed after.
        Raises ``EstimateUnavailable`` when the evaluator cannot estimate."""
        import tempfile

        from evaluation.budget import history_of_runs

        inner = getattr(self.evaluator, "inner", self.evaluator)  # a worker pool's evaluator
        estimate = getattr(inner, "estimate", None)
        if estimate is None:
            raise EstimateUnavailable(f"the evaluator {self.evaluator.name} cannot estimate")
        study = self.orthanc.study(orthanc_id)
        ours = {series_uid_for(study.study_uid, k) for k in ("sr", "pdf")}
        series = [s for s in self.orthanc.list_series(orthanc_id) if s.series_uid not in ours]
        sops = {s.orthanc_id: self.orthanc.series_instances(s.orthanc_id) for s in series}
        earlier = [self.runs.run_dir(r.run_id) for r in self.runs.list(limit=20)]
        self.runs.root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="estimate-", dir=self.runs.root) as tmp:
            folder = Path(tmp) / "study"
            folder.mkdir()
            self._fetch_routed(series, sops, route, folder)
            index = index_path(folder, workers=1, keep_headers=True)
            return estimate(
                folder, route, Path(tmp) / "work", index,
                history_of_runs(earlier, self.runs.database_url),
            )  # fmt: skip

    def _skip(self, job: Job, kind: SkipKind, facts: StudyFacts | None = None) -> None:
        METRICS.inc("evaluations_skipped_total")
        log.info("run %s skipped: %s", job.run_id, kind.value)
        why = kind.value
        if facts is not None:  # what the rules were matched against
            why += (f" (calling AE {', '.join(facts.calling_aets) or 'unknown'}; modality "
                    f"{', '.join(facts.modalities) or 'none'}; series "
                    f"{', '.join(facts.series_classes) or 'none'})")  # fmt: skip
        self.runs.finish(job.run_id, RunStatus.SKIPPED, error=why, skip=kind)

    def _evaluate(
        self, job: Job, folder: Path, index: IndexResult, facts: StudyFacts, digest: str
    ) -> None:
        assert job.study_uid is not None and job.key is not None
        route = job.route or self.router.route(facts)
        if route is None:
            return self._skip(job, SkipKind.NOT_ROUTED, facts)
        patient = self._check_identity(self._keys(job), index)
        if job.case_other_patients:
            who = patient.describe()
            raise StudyHeldError(
                f"the studies of case {job.case_id} name more than one patient ({who}; "
                f"{'; '.join(job.case_other_patients[:5])}): the case is held",
                [who, *job.case_other_patients[:10]],
            )
        instances, digest = digest, evaluation_digest(digest, route)
        last = self.runs.last_evaluation(job.key)
        if not job.force and last.evaluated_digest == digest:
            return self._skip(job, SkipKind.UNCHANGED)
        # (a run from before the rule entered the digest holds the instances' digest alone)
        known = (last.evaluated_instances, last.evaluated_digest)
        if not job.force and job.recovered and instances in known:
            # a restart re-offers the spool: evaluated before, whatever the rule was then
            return self._skip(job, SkipKind.RESTARTED)
        self.runs.update(job.run_id, route=route)
        if self.queue is not None:
            if not job.others:
                return self._hand_over(job)
            log.info("run %s: a case of several studies is evaluated in the gateway, not "
                     "queued (a worker reads one study from the PACS)", job.run_id)  # fmt: skip
        self._stage(job, "evaluating", 0.4)
        work = self.runs.run_dir(job.run_id)
        if self.printer is not None:  # Chromium starts while the study is evaluated
            self.printer.warm()
        result = self.evaluator.evaluate(folder, route, work, index)
        for uid in job.missing:
            result.warnings.append(
                f"case {job.case_id}: study {uid} did not arrive within the wait for the "
                "case's studies: evaluated without it"
            )
        if job.revised:
            result.warnings.append(
                f"{len(job.revised)} instance(s) were re-sent with other content under the same "
                f"UIDs since version {last.version} and taken as the PACS took them: this "
                "version is evaluated on what the PACS now holds"
            )
        run = result.run  # the run as its store records it: the report bundle's RunData
        errors = functools.cache(lambda: self.runs.sample_errors(job.run_id))  # if a model failed

        def no_answer(model: str) -> str:
            why = {
                f"{x.scored.family}: {errors().get((model, x.scored.family)) or x.scored.status}"
                for x in run.samples
                if x.scored.model == model
            }
            return "; ".join(sorted(why)) or "no answer"

        version = last.version + 1
        dest = self.destination()
        self._stage(job, "writing the checklist", 0.6)
        # Chromium prints the checklist (on its warm page) while the upload settles and the
        # SRs are built and stored: the SRs never wait for the print, the PDF follows them.
        with (
            self._holding_stable(job) as held,
            ThreadPoolExecutor(1, thread_name_prefix="checklist") as printing,
        ):
            printed = printing.submit(write_checklist, run, work / "report", self.printer)
            self._stage(job, "waiting for the upload to Orthanc", 0.7)
            self._finish_uploads(job)
            headers = evidence(index, _one_study(index, result.evaluated_series_uids, job.key))
            previous = [pydicom.dcmread(p) for p in last.sr_paths if Path(p).exists()]
            back = build_unverified(
                run, route.models, headers, version, result.evaluator, previous, no_answer
            )
            self._stage(job, "writing back the SRs", 0.75)
            # in the run's record, before anything is stored: what is written back (each
            # object's file kept: one not stored is never lost), and the evidence a re-issue
            # attaches its VERIFIED SR to
            items = [(self._kept(job, dest, m, sr), sr) for m, sr in back.srs.items()]
            # local copies, the kept files' bytes (an SR is encoded once here): the next
            # version names them predecessors
            sr_paths: list[str] = []
            for wb, _ in items:
                path = work / f"sr-{len(sr_paths) + 1}.dcm"
                shutil.copyfile(wb.kept or "", path)
                sr_paths.append(str(path))
            self.runs.update(
                job.run_id,
                version=version,
                evidence=evidence_refs(headers),
                writebacks_pending=[w for w, _ in items],
                sr_paths=sr_paths or last.sr_paths,
            )
            delivered = _deliver(dest, items, held)
            self._stage(job, "writing back the PDF", 0.8)
            checklist = printed.result()
            warnings = [*result.warnings, *checklist.warnings, *back.warnings]
            pdf = checklist_pdf(headers, checklist.pdf, version)
            if pdf is None:
                warnings.append("no checklist PDF written back to PACS: it could not be printed")
            else:  # after the SRs, in the record's order too (the retry keeps it)
                item = (self._kept(job, dest, "", pdf), pdf)
                self.runs.update(job.run_id, writebacks_pending=[*delivered.pending, item[0]],
                                 writebacks_done=delivered.done)  # fmt: skip
                got = _deliver(dest, [item], held)
                delivered.done += got.done
                delivered.pending += got.pending
        done = delivered.done
        if delivered.pending:
            first = delivered.pending[0]
            warnings.append(
                f"{len(delivered.pending)} object(s) not yet stored in PACS {dest.name!r} "
                f"({first.last_error}): kept, tried again from {first.next_at}"
            )
            self.audit.write("system", "writeback", f"run:{job.run_id}", "pending")
        sr_uids = {m: str(sr.SOPInstanceUID) for m, sr in back.srs.items()}
        pdf_uid = str(pdf.SOPInstanceUID) if pdf is not None else None
        METRICS.inc("reports_stored_total", len(done))
        info = {
            "run_id": job.run_id,
            "trigger": job.trigger,
            "version": version,
            "unverified_sr": sr_uids,
            "checklist_pdf": pdf_uid,
        }
        publish(checklist, self.reports_dir, job.run_id, info)  # an export of the record
        METRICS.inc("evaluations_total")
        job.timings["done"] = round(time.monotonic() - job.t0, 3)
        self.runs.finish(
            job.run_id,
            RunStatus.DONE,
            sr_sop_uids=sr_uids,
            pdf_sop_uid=pdf_uid,
            writebacks_pending=delivered.pending,
            writebacks_done=done,
            evaluated_digest=digest,
            evaluated_instances=instances,
            warnings=warnings,
            timings_s=dict(job.timings),
        )
        # the study's pointer to its newest evaluation, once that run's record says so
        self.runs.update_study_state(job.key, lambda s: setattr(s, "last_run_id", job.run_id))
        self.audit.write("system", "evaluation", f"run:{job.run_id}", "done")
        log.info("study %s: report version %d stored", uid_key(job.key.name), version)

    def _kept(self, job: Job, dest: PacsClient, model: str, ds: pydicom.Dataset) -> WriteBack:
        """An SR (of ``model``) or the PDF (``model`` empty) to write back, its file kept."""
        return WriteBack(kind="sr" if model else "pdf", sop_instance_uid=str(ds.SOPInstanceUID),
                         model=model or None, destination=dest.name,
                         kept=str(keep(self.kept_dir, job.run_id, ds)))  # fmt: skip

    @contextlib.contextmanager
    def _holding_stable(self, job: Job) -> Iterator[_HeldStable | None]:
        """While the run writes its SRs and PDF back into the followed Orthanc (the PDF after
        the SRs, once printed), a StableStudy of the study is held (``on_stable``): the next
        object stored makes Orthanc call the study stable again, so an event before it is
        superseded (our SR alone, or a series that arrived meanwhile, then seen by the next
        event). An event after the last store is submitted when the write-back ends: one
        StableStudy after the write-back, however long the print took, and none lost."""
        if self.writeback is not None or job.key is None:  # results go to another PACS
            yield None
            return
        sid = resource_id(job.key.patient_id, job.key.study_uid)
        held = _HeldStable(job.run_id)
        with self._lock:
            self._held[sid] = held
        try:
            yield held
        finally:
            with self._lock:
                self._held.pop(sid, None)
            if held.seen:
                log.info("run %s: a StableStudy of its study after its write-back", job.run_id)
                self.on_stable(sid)

    # ----------------------------------------------------------------- the queue

    def _hand_over(self, job: Job) -> None:
        """Where the evaluation would start here: the study settled in the PACS (the worker
        reads it from there), then the run's queued state and its job committed together."""
        assert self.queue is not None and job.key is not None
        self._stage(job, "waiting for the upload to Orthanc", 0.3)
        self._finish_uploads(job)
        self.queue.hand_over(self.runs, job.run_id, job.key, force=job.force)

    def run_queued(self, run_id: str, *, force: bool = False) -> RunRecord:
        """Evaluate a run the gateway queued (``neurosandbox runs evaluate-study``, on any
        worker host): its study is found in the PACS by its UID and its patient together,
        then fetched, evaluated with the route the gateway recorded and written back as the
        gateway's own runs are. A run already finished (a retried job) is left as it is, and
        so is one an earlier attempt still holds (alive, its job retried: ``jobs.run_held``).
        Returns the run's record at the end."""
        if self.runs.database_url is None:
            return self._run_queued(run_id, force)
        from gateway.jobs import run_held

        with run_held(self.runs.database_url, run_id) as mine:
            if not mine:
                log.warning("run %s: an earlier attempt of it is still running (its worker "
                            "stalled and its job was retried): left to it", run_id)  # fmt: skip
                return self.runs.get(run_id)
            return self._run_queued(run_id, force)

    def _run_queued(self, run_id: str, force: bool) -> RunRecord:
        rec = self.runs.get(run_id)
        if rec.final:
            log.info("run %s is %s already: nothing to do", run_id, rec.status.value)
            if rec.status is RunStatus.DONE and rec.study_key and rec.version is not None:
                # an attempt that died after finishing it may not have pointed the study at it
                self.runs.make_last_run(rec.study_key, run_id, rec.version)
            return rec
        if rec.status is RunStatus.RUNNING:  # an attempt started it, and its worker was lost
            if rec.version is not None or rec.writebacks_pending or rec.writebacks_done:
                # its write-back had begun: what it kept is stored by the retry loop; its
                # version is the study's last, so that the next evaluation supersedes it
                self.runs.finish(run_id, RunStatus.INTERRUPTED, error=RETRIED_RUN)
                if rec.study_key and rec.version is not None:
                    self.runs.make_last_run(rec.study_key, run_id, rec.version)
                return self.runs.get(run_id)
            # stopped while evaluating: resumed, its stored answers reused (the evaluator
            # continues the run's store), on the study as the PACS holds it now
            log.info("run %s: resumed (the job's earlier attempt stopped)", run_id)
        job = Job(run_id=run_id, trigger=rec.trigger, force=force, t0=time.monotonic())
        job.route = Route.model_validate(rec.route.model_dump()) if rec.route else None
        try:
            job.key, job.orthanc_id = self._queued_study(rec)
        except Exception as exc:  # not the queued study, or the PACS did not answer: the run
            # ends saying so, never left queued or running (a command that exited is not retried)
            why = (str(exc) if isinstance(exc, QueuedStudyError)
                   else f"the PACS did not answer: {failure_text(exc)}")  # fmt: skip
            log.warning("run %s: %s", run_id, why)
            self.runs.finish(run_id, RunStatus.FAILED, error=why[:2000])
            return self.runs.get(run_id)
        job.study_uid = job.key.study_uid
        self._run(job)
        return self.runs.get(run_id)

    def _queued_study(self, rec: RunRecord) -> tuple[StudyKey, str]:
        """The queued run's study in the PACS: the PACS's study the record names, taken only
        when its StudyInstanceUID and its patient are the run's study key (never the UID
        alone). ``QueuedStudyError`` says why not."""
        from gateway.orthanc import OrthancError

        parsed = StudyKey.parse_name(rec.study_key or "")
        if parsed is None or rec.orthanc_study_id is None or parsed[0] != rec.study_uid:
            raise QueuedStudyError(f"run {rec.run_id} names no study in the PACS")
        try:
            study = self.orthanc.study(rec.orthanc_study_id)
        except OrthancError as exc:
            if exc.status == 404:
                raise QueuedStudyError(
                    "the PACS no longer holds the study (deleted after it was queued)"
                ) from None
            raise
        if (
            study.study_uid != rec.study_uid
            or resource_id(study.patient_id, study.study_uid) != rec.orthanc_study_id
        ):
            raise QueuedStudyError("the PACS's study is not the queued study (UID or patient)")
        key = StudyKey(study_uid=study.study_uid, patient_id=study.patient_id)
        if key.name != rec.study_key:  # a patient ID with its issuer (the study's shared tags)
            tags = self.orthanc.get_json(f"/studies/{study.orthanc_id}/shared-tags",
                                         {"simplify": ""})  # fmt: skip
            issuer = str(tags.get("IssuerOfPatientID", "") or "").strip()[:64]
            key = StudyKey(study_uid=study.study_uid, patient_id=study.patient_id, issuer=issuer)
        if key.name != rec.study_key:
            raise QueuedStudyError(
                "the PACS's study under this UID is another patient's than the queued run's"
            )
        return key, study.orthanc_id

    # ----------------------------------------------------------------- identity

    def _check_identity(self, keys: list[StudyKey], index: IndexResult) -> PatientKey:
        """The one patient of the studies (a case's may be several); ``StudyHeldError``
        unless their index names one patient, the patient of each key, each alone under its
        UID, and the registered case of each UID (if any) is this patient's."""
        try:
            patient = one_patient(index)
        except MixedPatientsError as exc:
            raise StudyHeldError(str(exc), exc.identities) from None
        cases = case_registry(self.cases)[0] if self.cases is not None else {}
        for key in keys:
            self._check_key(key, patient, cases.get(key.study_uid))
        return patient

    def _check_key(self, key: StudyKey, patient: PatientKey, case: EvalCase | None) -> None:
        if patient.patient_id != key.patient_id:
            raise StudyHeldError(
                f"the instances name {patient.describe()}, the study is filed under "
                f"PatientID {key.patient_id or '(none)'}: not evaluated",
                [patient.describe(), f"ID {key.patient_id or '(none)'}"],
            )
        others = self._sharing_uid(key)
        if others:
            raise StudyHeldError(
                f"StudyInstanceUID {key.study_uid} is shared by {len(others) + 1} patients "
                f"({patient.describe()}; {'; '.join(others[:5])}): each part is held until the "
                "sender fixes the UIDs",
                [patient.describe(), *others],
            )
        if case is not None and not case.is_of_patient(patient.patient_id):
            raise StudyHeldError(
                f"StudyInstanceUID {key.study_uid} is registered as case {case.case_id} of "
                f"patient {case.patient_id}, but arrived for {patient.describe()}: not "
                "evaluated as that case",
                [patient.describe(), f"case {case.case_id}: ID {case.patient_id}"],
            )

    def _sharing_uid(self, key: StudyKey) -> list[str]:
        """The other patients whose study has this UID: in the spool, and in Orthanc."""
        found: dict[str, str] = {}
        spool = self.spool_studies
        if spool is not None:
            for d in spool.glob(f"{key.study_uid}_*"):
                if d.name != key.name and StudyKey.parse_name(d.name):
                    info = read_received_info(d)
                    pid = str(info.get("patient_id", "")) if info else ""
                    found[pid] = f"ID {pid or '(none)'} (received)"
        for s in self.orthanc.studies_by_uid(key.study_uid):
            if s.patient_id != key.patient_id:
                who = f"ID {s.patient_id or '(none)'}"
                found[s.patient_id] = f"{who}, {s.patient_name}" if s.patient_name else who
        found.pop(key.patient_id, None)
        return [found[k] for k in sorted(found)]


def _one_study(index: IndexResult, series_uids: list[str], key: StudyKey) -> list[str]:
    """The evaluated series the SR cites: those of its own study (a case's other studies are
    named in the checklist); another study's when its own had none evaluated."""
    study_of = {s.series_uid: s.study_uid for s in index.series}
    mine = [u for u in series_uids if study_of.get(u) == key.study_uid]
    if mine or not series_uids:
        return mine
    first = study_of.get(series_uids[0])
    return [u for u in series_uids if study_of.get(u) == first]


def _unfetched_stacks(study_uid: str, s: SeriesSummary) -> list[SeriesInfo]:
    """The stacks of a series left in the PACS, as its headers there classified them (the
    index's ``not_fetched``: a case's record lists them as not shown)."""
    stacks = s.stacks or [StackClass(series_class=s.series_class, n_files=s.n_instances)]
    out = []
    for k, st in enumerate(stacks):
        out.append(SeriesInfo.model_validate({
            "path": f"pacs:series/{s.orthanc_id}", "study_uid": study_uid,
            "series_uid": s.series_uid, "series_number": s.series_number,
            "description": s.description, "modality": s.modality, "stack": k,
            "class": st.series_class, "reason": st.reason, "detail": st.detail,
            "plane": st.plane, "n_files": st.n_files,
        }))  # fmt: skip
    return out
