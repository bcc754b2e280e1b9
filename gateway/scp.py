"""The DICOM node: a pynetdicom storage SCP that spools studies and says when one is complete.

Each instance is written as received (the encoded bytes, no decode; only the UIDs and the
PatientID with its issuer that name its folder are read) to a temporary file, then renamed,
into a staging folder of its association, under a name of its own (the same instance twice in
one association is two staged files). A normally released association commits its files into
``spool/studies/<StudyInstanceUID>_<patient hash>/<SeriesInstanceUID>/`` once they are on disk
(see ``gateway.spool`` for the fsync policies): a study is its UID *and* its patient
(``gateway.study_key``), so two patients under one StudyInstanceUID are two spool studies, as
they are two studies in Orthanc. Committing is idempotent: an instance already in the spool
with the same bytes is dropped; one with other bytes (a re-send under the same UIDs) is kept
or replaced as the PACS does (``pacs_overwrites``, Orthanc's ``OverwriteInstances``), so that
what is evaluated is what the PACS holds; a replacement is a revision the pipeline warns about.
Any failure while committing puts the study in the queue as failed, with its reason
(``on_failed``). An aborted association (A-ABORT, dropped connection) never reaches the study:
its files go to ``spool/quarantine/`` and are logged; so do those of an association a crash
interrupted, found at the next start, and what they added to Orthanc is deleted (the
forwarder's journal in the staging folder). With a forwarder
(``gateway.forward``), each instance is also stored in Orthanc as it arrives, and what an
aborted association added there is deleted again. A write that fails
(disk full, file size limit, I/O error) answers 0xA700 (Out of Resources), so the sender knows
the instance was not kept. The transport is pynetdicom's, with the C-STORE hot path of
``gateway.scp_transport``.

Every TCP connection holds an association slot (``max_associations``) until it ends. One that
has not completed its A-ASSOCIATE-RQ within the ARTIM timeout (``artim_timeout_s``, a few
seconds) is closed, so idle or half-open connections cannot keep a sender out for long; an
accepted association keeps the network timeout (60 s) for pauses between images. Every refused
association is counted in ``dicom_associations_refused_total`` with its reason (see
``gateway.metrics``).

A study is complete once no association is sending to it and ``quiet_s`` seconds have passed
since its last instance; later arrivals make it complete again (a new report version).
"""

from __future__ import annotations

import filecmp
import hashlib
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

import pydicom
from pydantic import BaseModel
from pynetdicom import AE, ALL_TRANSFER_SYNTAXES, AllStoragePresentationContexts, evt
from pynetdicom.sop_class import Verification  # type: ignore[attr-defined]

from dicom import InvalidUIDError, check_uid
from gateway.forward import Forwarder
from gateway.metrics import METRICS
from gateway.part10 import file_meta_bytes, keys_of, read_file_meta, read_uids
from gateway.scp_transport import PeerLimits, start_store_server
from gateway.spool import (
    FSYNC_POLICIES,
    FsyncPolicy,
    SyncBatch,
    Syncer,
    fsync_dirs,
    quarantine,
    read_received_info,
    write_instance,
    write_received_info,
)
from gateway.study_key import StudyKey

log = logging.getLogger(__name__)

STATUS_SUCCESS = 0x0000
STATUS_OUT_OF_RESOURCES = 0xA700
STATUS_CANNOT_UNDERSTAND = 0xC000
STATUS_DATASET_MISMATCH = 0xA900
META_HEAD_BYTES = 1 << 16  # a STOW-RS file's head read for its File Meta (a few hundred bytes)
STOW_SENDER = "STOW-RS"  # the "calling AE" of studies received by STOW-RS
CLOSE_GRACE_S = 3.0  # after a connection closes, how long to wait for the release event
ARTIM_TIMEOUT_S = 5.0  # from connection to accepted association; then the network timeout
NETWORK_TIMEOUT_S = 60.0  # an accepted association may be silent this long (between images)
# A-ASSOCIATE-RJ (source, diagnostic) -> the refusal counter's reason label
_REJECT_REASONS = {(0x01, 0x03): "calling_aet", (0x01, 0x07): "called_aet"}


def uid_key(uid: str) -> str:
    """A short, non-reversible handle for logs: UIDs can identify a patient's study."""
    return hashlib.sha256(uid.encode()).hexdigest()[:12]


class ReceivedStudy(BaseModel):
    """A study the node considers complete (for now): one StudyInstanceUID of one patient."""

    study_uid: str
    key: StudyKey  # the UID with its patient: what the study is found by
    folder: str
    calling_aets: list[str]
    n_instances: int
    n_new: int  # instances committed since the previous completion
    # offered again after a restart, nothing received since: evaluate only if never evaluated
    recovered: bool = False
    first_received: float
    last_received: float
    # SOP UIDs re-sent with other bytes since the last completion and taken (the PACS
    # overwrites): the pipeline makes a new version and says so
    revised: list[str] = []
    # how many re-sends with other bytes were refused since the last completion (the PACS
    # keeps the original, and so does the spool)
    refused_resends: int = 0


class StoreOutcome(BaseModel):
    """What became of one instance sent by STOW-RS: its C-STORE status (0 is stored)."""

    sop_class: str = ""  # empty when the part was unreadable
    sop_instance: str = ""
    status: int
    reason: str = ""  # for a failure: what was wrong, for the sender


class FailedStudy(BaseModel):
    """A study whose received instances could not be committed: queued as failed."""

    study_uid: str
    key: StudyKey
    calling_aets: list[str]
    n_instances: int
    error: str


@dataclass
class _Staged:
    path: Path
    key: StudyKey
    series: str
    sop: str


@dataclass
class _Assoc:
    id: str
    calling_aet: str
    staging: Path
    studies: dict[StudyKey, int] = field(default_factory=dict)  # study -> instances staged
    files: list[_Staged] = field(default_factory=list)
    dirs: set[Path] = field(default_factory=set)
    done: bool = False
    closed_at: float | None = None
    batch: SyncBatch = field(default_factory=SyncBatch)  # background fsyncs of its files
    writes: count[int] = field(default_factory=count)  # names temporary files uniquely
    last_received: float = 0.0  # wall clock of its last instance
    last_instance: float = 0.0  # monotonic clock of its last instance (the quiet time's start)


@dataclass
class _Study:
    key: StudyKey
    calling_aets: set[str] = field(default_factory=set)
    first: float = field(default_factory=time.time)
    last_activity: float = field(default_factory=time.monotonic)
    last_received: float = field(default_factory=time.time)
    n_new: int = 0
    recovered: bool = False  # re-offered after a restart, nothing received since
    revised: set[str] = field(default_factory=set)
    refused_resends: int = 0


COMMITTED_SUFFIX = ".committed"  # a committed association's staging folder, being removed


def remove_committed_staging(staging: Path) -> None:
    """Remove a committed association's staging folder. It is renamed first: the forwarder
    appends its journal line (``.forwarded``) from another thread, by the folder's old path, and
    a line landing while ``rmtree`` empties the folder re-created the file and left the folder
    (and the study's key and UIDs) behind, quarantined at the next start. After the rename the
    line finds no folder and is dropped (its file is no longer staged: never undone)."""
    done = staging.with_name(staging.name + COMMITTED_SUFFIX)
    try:
        os.replace(staging, done)
    except OSError:  # gone already, or not renamable: remove it where it is
        done = staging
    shutil.rmtree(done, ignore_errors=True)


class StorageSCP:
    """A C-STORE SCP with a spool; call ``start()``/``stop()``."""

    def __init__(
        self,
        spool: Path,
        ae_title: str = "NEUROSANDBOX",
        host: str = "127.0.0.1",
        port: int = 11112,
        quiet_s: float = 30.0,
        on_complete: Callable[[ReceivedStudy], object] | None = None,
        max_associations: int = 32,
        allowed_calling_aets: list[str] | None = None,
        fsync: FsyncPolicy = "association",
        artim_timeout_s: float = ARTIM_TIMEOUT_S,
        forwarder: Forwarder | None = None,
        peer_limits: PeerLimits | None = None,  # connections per peer address, reserved slots
        on_failed: Callable[[FailedStudy], object] | None = None,
        pacs_overwrites: bool = False,
    ) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync policy must be one of {FSYNC_POLICIES}, not {fsync!r}")
        self.spool = spool
        self.ae_title = ae_title
        self.host, self.port = host, port
        self.quiet_s = quiet_s
        self.on_complete = on_complete
        self.on_failed = on_failed
        # what the PACS does with a re-sent instance of other bytes (Orthanc's
        # OverwriteInstances): the spool does the same, so it holds what the PACS holds
        self.pacs_overwrites = pacs_overwrites
        # stores each instance in Orthanc as it arrives (gateway.forward)
        self.forwarder = forwarder
        self.fsync = fsync
        self.peer_limits = peer_limits
        self.allowed = {a.strip() for a in allowed_calling_aets or [] if a.strip()}
        self.incoming = spool / "incoming"
        self.studies_dir = spool / "studies"
        self.quarantine = spool / "quarantine"
        self.receiving = spool / "receiving"  # STOW-RS bodies while they arrive
        self._lock = threading.Lock()
        self._assocs: dict[int, _Assoc] = {}
        self._studies: dict[StudyKey, _Study] = {}
        self._stop = threading.Event()
        self._committing = 0
        self._server: Any = None
        self._ticker: threading.Thread | None = None
        self._syncer = Syncer()
        self.ae = AE(ae_title=ae_title)
        self.ae.maximum_associations = max_associations
        self.ae.maximum_pdu_size = 0  # no limit: let the sender pick large PDUs
        self.ae.require_called_aet = True
        # An empty list accepts any calling AE; otherwise others get A-ASSOCIATE-RJ (0x03).
        self.ae.require_calling_aet = sorted(self.allowed)
        self.ae.acse_timeout = artim_timeout_s  # pynetdicom's ARTIM timer (scp_transport)
        self.ae.network_timeout = NETWORK_TIMEOUT_S
        self.ae.dimse_timeout = 120
        for cx in AllStoragePresentationContexts:
            if cx.abstract_syntax is not None:
                self.ae.add_supported_context(cx.abstract_syntax, ALL_TRANSFER_SYNTAXES)
        self.ae.add_supported_context(Verification)

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        for d in (self.incoming, self.studies_dir, self.quarantine):
            d.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.receiving, ignore_errors=True)  # bodies a stop or crash cut short
        self._recover()
        self._syncer.start()
        handlers: list[Any] = [
            (evt.EVT_C_STORE, self._on_store),
            (evt.EVT_C_ECHO, lambda _e: STATUS_SUCCESS),
            (evt.EVT_REQUESTED, self._on_requested),
            (evt.EVT_ACCEPTED, self._on_accepted),
            (evt.EVT_REJECTED, self._on_rejected),
            (evt.EVT_RELEASED, self._on_released),
            (evt.EVT_ABORTED, self._on_aborted),
            (evt.EVT_CONN_CLOSE, self._on_closed),
        ]
        self._server = start_store_server(
            self.ae,
            (self.host, self.port),
            handlers,
            on_artim=self._on_artim,
            peer_limits=self.peer_limits,
        )
        self.port = self._server.server_address[1]
        self._stop.clear()
        self._ticker = threading.Thread(target=self._tick, name="scp-quiet", daemon=True)
        self._ticker.start()
        log.info("DICOM node %s listening on %s:%d", self.ae_title, self.host, self.port)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop listening; let released associations finish committing their files first."""
        deadline = time.monotonic() + timeout_s
        while self._committing and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server = None
        if self._ticker is not None:
            self._ticker.join(timeout=5)
        self._syncer.stop()

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Wait until no association is open and every released one is committed."""
        deadline = time.monotonic() + timeout_s
        while self._assocs or self._committing:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def _recover(self) -> None:
        """After a crash: staged files of unreleased associations go to quarantine, and what
        they added to Orthanc is deleted (the forwarder's journal); spooled studies are offered
        again after the quiet time, marked ``recovered`` (the pipeline evaluates only what it
        has never evaluated). A study folder of an earlier version (named by its UID alone)
        is renamed by its key."""
        for d in self.incoming.iterdir():
            if d.name.endswith(COMMITTED_SUFFIX):  # committed; its removal was cut short
                shutil.rmtree(d, ignore_errors=True)
                continue
            if self.forwarder is not None:
                self.forwarder.undo_journal(d)
            self._quarantine(d, "left over from a previous run (interrupted association)")
        for d in sorted(self.studies_dir.iterdir()):
            if not d.is_dir():
                continue
            info = read_received_info(d)
            key = _key_of_folder(d, info)
            if key is None:
                log.warning("spool folder %s: no readable instance, left alone", d.name)
                continue
            if d.name != key.name:
                target = self.studies_dir / key.name
                if target.exists():
                    log.warning("spool folder %s: %s exists, left alone", d.name, key.name)
                    continue
                os.replace(d, target)
            st = _Study(key=key, calling_aets=set(info.get("calling_aets", [])))
            st.n_new, st.recovered = 1, True
            self._studies[key] = st

    # ----------------------------------------------------------------- association events

    def _on_requested(self, event: Any) -> None:
        METRICS.inc("dicom_associations_requested_total")

    def _on_rejected(self, event: Any) -> None:
        rj = event.assoc.acceptor.primitive  # the A-ASSOCIATE-RJ pynetdicom sent
        source, diagnostic = rj.result_source, rj.diagnostic
        reason = _REJECT_REASONS.get((source, diagnostic), "rejected")
        if source == 0x03:  # DUL presentation related: local limit exceeded (every slot taken)
            reason = "limit"
        log.warning("association refused (%s)", reason)
        METRICS.inc("dicom_associations_refused_total", reason=reason)

    def _on_artim(self) -> None:
        # A connection that requested no association in time (idle, or half a request): it
        # held a slot like one, so its closing counts as a refusal.
        log.info("connection closed: no A-ASSOCIATE-RQ within the ARTIM timeout")
        METRICS.inc("dicom_associations_refused_total", reason="artim")

    def _on_accepted(self, event: Any) -> None:
        aet = event.assoc.requestor.ae_title.strip()
        a = _Assoc(id=uuid.uuid4().hex, calling_aet=aet, staging=self.incoming / uuid.uuid4().hex)
        with self._lock:
            self._assocs[id(event.assoc)] = a
        METRICS.inc("dicom_associations_total")

    def _on_store(self, event: Any) -> int:
        a = self._assocs.get(id(event.assoc))
        if a is None or a.done:
            return STATUS_OUT_OF_RESOURCES
        if a.batch.error is not None:  # an earlier file of this association did not reach disk
            METRICS.inc("dicom_store_failures_total")
            return STATUS_OUT_OF_RESOURCES
        req = event.request
        ts = str(event.context.transfer_syntax)
        try:
            sop = check_uid(str(req.AffectedSOPInstanceUID))
            sop_class = check_uid(str(req.AffectedSOPClassUID))
            uids = read_uids(req.DataSet, ts)
            if uids is None:  # deflated: decode the whole dataset
                uids = keys_of(event.dataset)
            study, series = check_uid(uids.study_uid), check_uid(uids.series_uid)
            key = StudyKey(study_uid=study, patient_id=uids.patient_id, issuer=uids.issuer)
        except (AttributeError, InvalidUIDError, KeyError) as exc:
            log.warning("C-STORE refused: missing or invalid UIDs (%s)", type(exc).__name__)
            METRICS.inc("dicom_instances_refused_total")
            return STATUS_DATASET_MISMATCH
        except Exception as exc:
            log.warning("C-STORE refused: undecodable dataset (%s)", type(exc).__name__)
            METRICS.inc("dicom_instances_refused_total")
            return STATUS_CANNOT_UNDERSTAND
        # A view of the received bytes: no copy; released before pynetdicom closes them.
        with req.DataSet.getbuffer() as body:
            return self._stage(a, key, series, sop, sop_class, ts, body)

    def _stage(
        self,
        a: _Assoc,
        key: StudyKey,
        series: str,
        sop: str,
        sop_class: str,
        ts: str,
        body: bytes | memoryview,
    ) -> int:
        """Write one instance (its dataset bytes as received) into the association's staging
        folder; the status to answer. The one path of C-STORE and STOW-RS."""
        folder = a.staging / key.name / series
        dest = folder / f"{next(a.writes)}.dcm"  # a name of its own: duplicates are two files
        try:
            if folder not in a.dirs:
                folder.mkdir(parents=True, exist_ok=True)
                a.dirs.add(folder)
            meta = file_meta_bytes(sop_class, sop, ts, a.calling_aet)
            tmp = folder / f".{next(a.writes)}.part"
            write_instance(dest, tmp, (meta, body), self.fsync, self._syncer, a.batch)
            size = len(body)
            if self.forwarder is not None:
                try:
                    # one copy; its journal lets a restart undo what a crash left behind
                    self.forwarder.submit(a.id, key.name, sop, meta + body, (a.staging, dest))
                except Exception:  # forwarding is best effort: the pipeline uploads it
                    log.exception("forwarding a received instance failed")
        except OSError as exc:
            # Disk full, file too large, read-only: the sender must keep (and resend) it.
            log.error(
                "C-STORE write failed (%s): answered 0xA700", exc.strerror or type(exc).__name__
            )
            METRICS.inc("dicom_store_failures_total")
            return STATUS_OUT_OF_RESOURCES
        a.last_received, a.last_instance = time.time(), time.monotonic()
        with self._lock:
            a.files.append(_Staged(dest, key, series, sop))
            a.studies[key] = a.studies.get(key, 0) + 1
            st = self._studies.get(key)
            if st is None:
                st = self._studies[key] = _Study(key=key)
            st.last_activity = time.monotonic()
        METRICS.inc("dicom_instances_received_total")
        METRICS.inc("dicom_bytes_received_total", size)
        return STATUS_SUCCESS

    def receiving_folder(self) -> Path:
        """A new, empty folder for the parts of one STOW-RS request while its body arrives
        (``spool/receiving/``: fragments until the body is whole, never read as instances,
        removed at each start)."""
        folder = self.receiving / uuid.uuid4().hex
        folder.mkdir(parents=True)
        return folder

    def receive_files(
        self, files: Sequence[Path], sender: str = STOW_SENDER, study_uid: str | None = None
    ) -> list[StoreOutcome]:
        """STOW-RS: the Part 10 files of one request, taken as one association. Each goes
        through the C-STORE path (``_stage``: identity from its UIDs and patient, per-file
        status), then the staged files are committed together, as on A-RELEASE, and the
        study waits for its quiet time like any other. ``study_uid``: the request's target
        study; an instance of another is refused (0xA900, named by its UIDs). An instance
        that cannot be staged is refused alone; a failed commit fails every instance of the
        request (nothing of it is in the spool)."""
        a = _Assoc(
            id=uuid.uuid4().hex, calling_aet=sender, staging=self.incoming / uuid.uuid4().hex
        )
        handle = object()
        with self._lock:
            self._assocs[id(handle)] = a  # the study is busy while the request is staged
        outcomes: list[StoreOutcome] = []
        try:
            for path in files:  # one instance in memory at a time, as a C-STORE holds one
                outcomes.append(self._stage_file(a, path, study_uid))
        except BaseException:
            with self._lock:
                self._assocs.pop(id(handle), None)
                a.done = True
            self._discard(a, "STOW-RS request interrupted")
            raise
        with self._lock:
            self._assocs.pop(id(handle), None)
            a.done = True
            self._committing += 1
        try:
            committed = self._commit(a)
        finally:
            with self._lock:
                self._committing -= 1
        if not committed:
            why = "the instances could not be committed to the spool"
            outcomes = [
                o
                if o.status != STATUS_SUCCESS
                else o.model_copy(update={"status": STATUS_OUT_OF_RESOURCES, "reason": why})
                for o in outcomes
            ]
        return outcomes

    def _stage_file(self, a: _Assoc, path: Path, study_uid: str | None) -> StoreOutcome:
        """Stage one Part 10 file of a STOW-RS request: its File Meta Information read element
        by element (``part10.read_file_meta``: its group length may be missing or wrong, as
        some writers leave it), the dataset's bytes after it staged as a C-STORE'd
        instance's."""
        if a.batch.error is not None:
            METRICS.inc("dicom_store_failures_total")
            return StoreOutcome(status=STATUS_OUT_OF_RESOURCES, reason="an earlier file failed")
        sop = sop_class = ""
        try:
            # One copy of the instance in memory, as C-STORE holds one: the File Meta from the
            # file's head, then the dataset's bytes alone, its UIDs read in place
            with open(path, "rb") as fh:
                meta = read_file_meta(fh.read(META_HEAD_BYTES))  # else ValueError
                fh.seek(meta.dataset_offset)
                body = fh.read()
            sop = check_uid(meta.sop_instance)
            sop_class = check_uid(meta.sop_class)
            ts = check_uid(meta.transfer_syntax)
            uids = read_uids(body, ts)
            if uids is None:  # deflated: decode the whole dataset
                uids = keys_of(pydicom.dcmread(path, stop_before_pixels=True))
            study, series = check_uid(uids.study_uid), check_uid(uids.series_uid)
            key = StudyKey(study_uid=study, patient_id=uids.patient_id, issuer=uids.issuer)
        except (AttributeError, InvalidUIDError, KeyError) as exc:
            log.warning(
                "STOW-RS instance refused: missing or invalid UIDs (%s)", type(exc).__name__
            )
            METRICS.inc("dicom_instances_refused_total")
            return StoreOutcome(
                sop_class=sop_class,
                sop_instance=sop,
                status=STATUS_DATASET_MISMATCH,
                reason="missing or invalid UIDs (study, series, SOP instance or class)",
            )
        except Exception as exc:
            log.warning("STOW-RS instance refused: not a DICOM file (%s)", type(exc).__name__)
            METRICS.inc("dicom_instances_refused_total")
            return StoreOutcome(
                sop_class=sop_class,
                sop_instance=sop,
                status=STATUS_CANNOT_UNDERSTAND,
                reason="not a readable DICOM Part 10 file (preamble, DICM, file meta)",
            )
        if study_uid is not None and study != study_uid:
            METRICS.inc("dicom_instances_refused_total")
            return StoreOutcome(
                sop_class=sop_class,
                sop_instance=sop,
                status=STATUS_DATASET_MISMATCH,
                reason="an instance of another study than the one in the request's URL",
            )
        status = self._stage(a, key, series, sop, sop_class, ts, body)
        reason = "" if status == STATUS_SUCCESS else "not written to the spool (disk)"
        return StoreOutcome(sop_class=sop_class, sop_instance=sop, status=status, reason=reason)

    def _on_released(self, event: Any) -> None:
        with self._lock:
            a = self._assocs.pop(id(event.assoc), None)
            if a is None or a.done:
                return
            a.done = True
            self._committing += 1
        try:
            self._commit(a)
        finally:
            with self._lock:
                self._committing -= 1

    def _on_aborted(self, event: Any) -> None:
        with self._lock:
            a = self._assocs.pop(id(event.assoc), None)
        if a is not None and not a.done:
            a.done = True
            self._discard(a, "association aborted")

    def _on_closed(self, event: Any) -> None:
        # The peer may close right after A-RELEASE-RP, before the association thread reports
        # the release: decide later (the ticker), not here.
        with self._lock:
            a = self._assocs.get(id(event.assoc))
            if a is not None and not a.done:
                a.closed_at = time.monotonic()

    def _reap(self) -> None:
        """Associations whose connection closed without release or abort are aborts too."""
        now = time.monotonic()
        with self._lock:
            stale = [
                (k, a)
                for k, a in self._assocs.items()
                if a.closed_at is not None and now - a.closed_at > CLOSE_GRACE_S and not a.done
            ]
            for k, a in stale:
                del self._assocs[k]
                a.done = True
        for _k, a in stale:
            self._discard(a, "connection closed without release")

    # ----------------------------------------------------------------- spool

    def _commit(self, a: _Assoc) -> bool:
        """Commit the staged files of a released association; False: nothing committed."""
        # The files enter the study only once on disk: an evaluation never reads data that a
        # power loss could still undo.
        a.batch.wait()
        if a.batch.error is not None:
            self._discard(a, f"files not on disk ({a.batch.error.strerror})")
            return False
        try:
            revised, refused = self._place(a)
        except Exception as exc:  # nothing of it is evaluated; the queue says why
            log.exception("committing an association's instances failed")
            self._commit_failed(a, f"{type(exc).__name__}: {exc}")
            return False
        if self.forwarder is not None:
            self.forwarder.commit(a.id)
        # (a journal line written after this names a file no longer staged: never undone)
        remove_committed_staging(a.staging)
        with self._lock:
            for key, n in a.studies.items():
                st = self._studies.setdefault(key, _Study(key=key))
                st.calling_aets.add(a.calling_aet)
                st.n_new += n
                st.revised |= revised.get(key, set())
                st.refused_resends += refused.get(key, 0)
                st.recovered = False  # new instances: a real arrival
                # the quiet time runs from the last instance, not from this commit (which may
                # have waited seconds for the association's fsyncs)
                st.last_activity = max(st.last_activity, a.last_instance)
                st.last_received = max(st.last_received, a.last_received)
                self._write_info(st)
        if a.files:
            log.info(
                "association released: %d instance(s) committed to %d study(ies)",
                len(a.files),
                len(a.studies),
            )
        return True

    def _place(self, a: _Assoc) -> tuple[dict[StudyKey, set[str]], dict[StudyKey, int]]:
        """Move the staged files into their study folders, idempotently: an instance already
        there with the same bytes is dropped; one with other bytes is kept or replaced as the
        PACS does. Returns the SOP UIDs replaced and the re-sends refused, by study."""
        made: set[Path] = set()
        revised: dict[StudyKey, set[str]] = {}
        refused: dict[StudyKey, int] = {}
        placed: set[Path] = set()  # taken in this commit (a duplicate in one association)
        for f in a.files:
            folder = self.studies_dir / f.key.name / f.series
            if folder not in made:
                if not folder.parent.exists():
                    made.add(self.studies_dir)  # a new study folder: its entry too
                folder.mkdir(parents=True, exist_ok=True)
                made |= {folder, folder.parent}
            dest = folder / f"{f.sop}.dcm"
            if not f.path.exists():
                raise FileNotFoundError(f"staged instance {f.path.name} of {f.sop} is gone")
            if dest.exists():
                if filecmp.cmp(f.path, dest, shallow=False):
                    f.path.unlink()  # the same bytes again: nothing changes
                    continue
                if not self.pacs_overwrites:
                    refused[f.key] = refused.get(f.key, 0) + 1
                    METRICS.inc("dicom_resends_refused_total")
                    log.warning(
                        "instance %s re-sent with other bytes: kept the original, as the PACS "
                        "does (OverwriteInstances false)",
                        uid_key(f.sop),
                    )
                    f.path.unlink()
                    continue
                if dest not in placed:  # a revision of what an earlier association sent
                    revised.setdefault(f.key, set()).add(f.sop)
            os.replace(f.path, dest)
            placed.add(dest)
        if self.fsync != "off":
            fsync_dirs(sorted(made, key=lambda p: -len(p.parts)))  # children before parents
        return revised, refused

    def _commit_failed(self, a: _Assoc, why: str) -> None:
        """A commit that raised: its files are quarantined, its studies queued as failed.
        What it forwarded stays in Orthanc: the sender was answered Success for each."""
        if self.forwarder is not None:
            self.forwarder.commit(a.id)
        self._discard(a, f"commit failed ({why})", count_abort=False)
        if self.on_failed is None:
            return
        for key, n in a.studies.items():
            try:
                self.on_failed(
                    FailedStudy(
                        study_uid=key.study_uid,
                        key=key,
                        calling_aets=[a.calling_aet],
                        n_instances=n,
                        error=f"received instances could not be committed: {why}"[:500],
                    )
                )
            except Exception:
                log.exception("study-failed handler failed")

    def _discard(self, a: _Assoc, why: str, count_abort: bool = True) -> None:
        if count_abort:
            METRICS.inc("dicom_associations_aborted_total")
        if self.forwarder is not None:  # what its instances added to Orthanc goes too
            self.forwarder.discard(a.id)
        if not a.files:
            shutil.rmtree(a.staging, ignore_errors=True)
            return
        self._quarantine(a.staging, why, len(a.files))
        with self._lock:
            for key in a.studies:
                st = self._studies.get(key)
                if st is not None and st.n_new == 0 and not (self.studies_dir / key.name).exists():
                    del self._studies[key]

    def _quarantine(self, folder: Path, why: str, n: int | None = None) -> None:
        count = quarantine(folder, self.quarantine, why, n)
        METRICS.inc("dicom_instances_quarantined_total", count)

    def _write_info(self, st: _Study) -> None:
        info = {
            "study_uid": st.key.study_uid,
            "patient_id": st.key.patient_id,
            "issuer": st.key.issuer,
            "calling_aets": sorted(st.calling_aets),
            "first_received": st.first,
            "last_received": st.last_received,
        }
        write_received_info(self.studies_dir / st.key.name, info)

    # ----------------------------------------------------------------- completion

    def _busy(self, key: StudyKey) -> bool:
        return any(key in a.studies and not a.done for a in self._assocs.values())

    def _tick(self) -> None:
        """Emit each study once its quiet time has passed; wake when the next one is due
        (at most 0.25 s apart, at least 10 ms)."""
        wait = 0.25
        while not self._stop.wait(wait):
            self._reap()
            ready: list[_Study] = []
            wait = 0.25
            with self._lock:
                now = time.monotonic()
                for st in list(self._studies.values()):
                    if st.n_new <= 0:
                        continue
                    due = st.last_activity + self.quiet_s - now
                    if due <= 0 and not self._busy(st.key):
                        ready.append(
                            _Study(
                                **st.__dict__
                                | {"calling_aets": set(st.calling_aets), "revised": set(st.revised)}
                            )
                        )
                        st.n_new, st.recovered = 0, False
                        st.revised, st.refused_resends = set(), 0
                    elif due > 0:
                        wait = min(wait, due)
            wait = max(0.01, wait)
            for st in ready:
                self._emit(st)

    def _emit(self, st: _Study) -> None:
        folder = self.studies_dir / st.key.name
        n = sum(1 for _ in folder.rglob("*.dcm"))
        if n == 0:
            return
        study = ReceivedStudy(
            study_uid=st.key.study_uid,
            key=st.key,
            folder=str(folder),
            calling_aets=sorted(st.calling_aets),
            n_instances=n,
            n_new=st.n_new,
            recovered=st.recovered,
            first_received=st.first,
            last_received=st.last_received,
            revised=sorted(st.revised),
            refused_resends=st.refused_resends,
        )
        METRICS.inc("studies_completed_total")
        log.info("study %s complete: %d instance(s), %d new", uid_key(st.key.name), n, st.n_new)
        if self.on_complete is not None:
            try:
                self.on_complete(study)
            except Exception:
                log.exception("study-complete handler failed")


def _key_of_folder(folder: Path, info: dict[str, Any]) -> StudyKey | None:
    """The key of a spool study folder: from its ``.received.json``, else (a folder of an
    earlier version) from the header of one of its instances."""
    study = info.get("study_uid")
    if isinstance(study, str) and StudyKey.parse_name(folder.name):
        key = StudyKey(
            study_uid=study,
            patient_id=str(info.get("patient_id", "")),
            issuer=str(info.get("issuer", "")),
        )
        if key.name == folder.name:
            return key
    for path in folder.rglob("*.dcm"):
        try:
            ds = pydicom.dcmread(path, stop_before_pixels=True, specific_tags=_KEY_TAGS)
            return StudyKey(
                study_uid=check_uid(str(ds.StudyInstanceUID)),
                patient_id=str(ds.get("PatientID", "") or "").strip()[:64],
                issuer=str(ds.get("IssuerOfPatientID", "") or "").strip()[:64],
            )
        except Exception:  # another file may be readable
            continue
    return None


_KEY_TAGS = ["StudyInstanceUID", "PatientID", "IssuerOfPatientID"]
