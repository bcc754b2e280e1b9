"""The DICOM node: a pynetdicom storage SCP that spools studies and says when one is complete.

Each instance is written as received (the encoded bytes, no decode; only the two UIDs that name
its folder are read) to a temporary file, then renamed, into a staging folder of its
association. A normally released association commits its files into
``spool/studies/<StudyInstanceUID>/<SeriesInstanceUID>/`` once they are on disk (see
``gateway.spool`` for the fsync policies); an aborted one (A-ABORT, dropped connection) never
reaches the study: its files go to ``spool/quarantine/`` and are logged. With a forwarder
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

import hashlib
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pynetdicom import AE, ALL_TRANSFER_SYNTAXES, AllStoragePresentationContexts, evt
from pynetdicom.sop_class import Verification  # type: ignore[attr-defined]

from gateway.cache import InvalidUIDError, check_uid
from gateway.forward import Forwarder
from gateway.metrics import METRICS
from gateway.part10 import file_meta_bytes, read_uids
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

log = logging.getLogger(__name__)

STATUS_SUCCESS = 0x0000
STATUS_OUT_OF_RESOURCES = 0xA700
STATUS_CANNOT_UNDERSTAND = 0xC000
STATUS_DATASET_MISMATCH = 0xA900
CLOSE_GRACE_S = 3.0  # after a connection closes, how long to wait for the release event
ARTIM_TIMEOUT_S = 5.0  # from connection to accepted association; then the network timeout
NETWORK_TIMEOUT_S = 60.0  # an accepted association may be silent this long (between images)
# A-ASSOCIATE-RJ (source, diagnostic) -> the refusal counter's reason label
_REJECT_REASONS = {(0x01, 0x03): "calling_aet", (0x01, 0x07): "called_aet"}


def uid_key(uid: str) -> str:
    """A short, non-reversible handle for logs: UIDs can identify a patient's study."""
    return hashlib.sha256(uid.encode()).hexdigest()[:12]


class ReceivedStudy(BaseModel):
    """A study the node considers complete (for now)."""

    study_uid: str
    folder: str
    calling_aets: list[str]
    n_instances: int
    n_new: int  # instances committed since the previous completion
    # offered again after a restart, nothing received since: evaluate only if never evaluated
    recovered: bool = False
    first_received: float
    last_received: float


@dataclass
class _Assoc:
    id: str
    calling_aet: str
    staging: Path
    studies: dict[str, int] = field(default_factory=dict)  # study UID -> instances staged
    files: list[tuple[Path, str, str, str]] = field(default_factory=list)  # path, st, se, sop
    dirs: set[Path] = field(default_factory=set)
    done: bool = False
    closed_at: float | None = None
    batch: SyncBatch = field(default_factory=SyncBatch)  # background fsyncs of its files
    writes: count[int] = field(default_factory=count)  # names temporary files uniquely
    last_received: float = 0.0  # wall clock of its last instance
    last_instance: float = 0.0  # monotonic clock of its last instance (the quiet time's start)


@dataclass
class _Study:
    uid: str
    calling_aets: set[str] = field(default_factory=set)
    first: float = field(default_factory=time.time)
    last_activity: float = field(default_factory=time.monotonic)
    last_received: float = field(default_factory=time.time)
    n_new: int = 0
    recovered: bool = False  # re-offered after a restart, nothing received since


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
    ) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync policy must be one of {FSYNC_POLICIES}, not {fsync!r}")
        self.spool = spool
        self.ae_title = ae_title
        self.host, self.port = host, port
        self.quiet_s = quiet_s
        self.on_complete = on_complete
        # stores each instance in Orthanc as it arrives (gateway.forward)
        self.forwarder = forwarder
        self.fsync = fsync
        self.peer_limits = peer_limits
        self.allowed = {a.strip() for a in allowed_calling_aets or [] if a.strip()}
        self.incoming = spool / "incoming"
        self.studies_dir = spool / "studies"
        self.quarantine = spool / "quarantine"
        self._lock = threading.Lock()
        self._assocs: dict[int, _Assoc] = {}
        self._studies: dict[str, _Study] = {}
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
        """After a crash: staged files of unreleased associations go to quarantine; spooled
        studies are offered again after the quiet time, marked ``recovered`` (the pipeline
        evaluates only what it has never evaluated)."""
        for d in self.incoming.iterdir():
            self._quarantine(d, "left over from a previous run")
        for d in self.studies_dir.iterdir():
            if d.is_dir():
                info = read_received_info(d)
                st = _Study(uid=d.name, calling_aets=set(info.get("calling_aets", [])))
                st.n_new, st.recovered = 1, True
                self._studies[d.name] = st

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
                ds = event.dataset
                uids = (str(ds.StudyInstanceUID), str(ds.SeriesInstanceUID))
            study, series = check_uid(uids[0]), check_uid(uids[1])
        except (AttributeError, InvalidUIDError, KeyError) as exc:
            log.warning("C-STORE refused: missing or invalid UIDs (%s)", type(exc).__name__)
            METRICS.inc("dicom_instances_refused_total")
            return STATUS_DATASET_MISMATCH
        except Exception as exc:
            log.warning("C-STORE refused: undecodable dataset (%s)", type(exc).__name__)
            METRICS.inc("dicom_instances_refused_total")
            return STATUS_CANNOT_UNDERSTAND
        folder = a.staging / study / series
        dest = folder / f"{sop}.dcm"
        try:
            if folder not in a.dirs:
                folder.mkdir(parents=True, exist_ok=True)
                a.dirs.add(folder)
            # A view of the received bytes: no copy; released before pynetdicom closes them.
            with req.DataSet.getbuffer() as body:
                meta = file_meta_bytes(sop_class, sop, ts, a.calling_aet)
                tmp = folder / f".{next(a.writes)}.part"
                write_instance(dest, tmp, (meta, body), self.fsync, self._syncer, a.batch)
                size = len(body)
                if self.forwarder is not None:
                    try:
                        self.forwarder.submit(a.id, study, sop, meta + body)  # one copy
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
            a.files.append((dest, study, series, sop))
            a.studies[study] = a.studies.get(study, 0) + 1
            st = self._studies.get(study)
            if st is None:
                st = self._studies[study] = _Study(uid=study)
            st.last_activity = time.monotonic()
        METRICS.inc("dicom_instances_received_total")
        METRICS.inc("dicom_bytes_received_total", size)
        return STATUS_SUCCESS

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

    def _commit(self, a: _Assoc) -> None:
        # The files enter the study only once on disk: an evaluation never reads data that a
        # power loss could still undo.
        a.batch.wait()
        if a.batch.error is not None:
            self._discard(a, f"files not on disk ({a.batch.error.strerror})")
            return
        made: set[Path] = set()
        for src, study, series, sop in a.files:
            folder = self.studies_dir / study / series
            if folder not in made:
                if not folder.parent.exists():
                    made.add(self.studies_dir)  # a new study folder: its entry too
                folder.mkdir(parents=True, exist_ok=True)
                made |= {folder, folder.parent}
            os.replace(src, folder / f"{sop}.dcm")
        if self.fsync != "off":
            fsync_dirs(sorted(made, key=lambda p: -len(p.parts)))  # children before parents
        shutil.rmtree(a.staging, ignore_errors=True)
        if self.forwarder is not None:
            self.forwarder.commit(a.id)
        with self._lock:
            for study, n in a.studies.items():
                st = self._studies.setdefault(study, _Study(uid=study))
                st.calling_aets.add(a.calling_aet)
                st.n_new += n
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

    def _discard(self, a: _Assoc, why: str) -> None:
        METRICS.inc("dicom_associations_aborted_total")
        if self.forwarder is not None:  # what its instances added to Orthanc goes too
            self.forwarder.discard(a.id)
        if not a.files:
            shutil.rmtree(a.staging, ignore_errors=True)
            return
        self._quarantine(a.staging, why, len(a.files))
        with self._lock:
            for study in a.studies:
                st = self._studies.get(study)
                if st is not None and st.n_new == 0 and not (self.studies_dir / study).exists():
                    del self._studies[study]

    def _quarantine(self, folder: Path, why: str, n: int | None = None) -> None:
        count = quarantine(folder, self.quarantine, why, n)
        METRICS.inc("dicom_instances_quarantined_total", count)

    def _write_info(self, st: _Study) -> None:
        info = {
            "calling_aets": sorted(st.calling_aets),
            "first_received": st.first,
            "last_received": st.last_received,
        }
        write_received_info(self.studies_dir / st.uid, info)

    # ----------------------------------------------------------------- completion

    def _busy(self, study: str) -> bool:
        return any(study in a.studies and not a.done for a in self._assocs.values())

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
                    if due <= 0 and not self._busy(st.uid):
                        ready.append(_Study(**st.__dict__ | {"calling_aets": set(st.calling_aets)}))
                        st.n_new, st.recovered = 0, False
                    elif due > 0:
                        wait = min(wait, due)
            wait = max(0.01, wait)
            for st in ready:
                self._emit(st)

    def _emit(self, st: _Study) -> None:
        folder = self.studies_dir / st.uid
        n = sum(1 for _ in folder.rglob("*.dcm"))
        if n == 0:
            return
        study = ReceivedStudy(
            study_uid=st.uid,
            folder=str(folder),
            calling_aets=sorted(st.calling_aets),
            n_instances=n,
            n_new=st.n_new,
            recovered=st.recovered,
            first_received=st.first,
            last_received=st.last_received,
        )
        METRICS.inc("studies_completed_total")
        log.info("study %s complete: %d instance(s), %d new", uid_key(st.uid), n, st.n_new)
        if self.on_complete is not None:
            try:
                self.on_complete(study)
            except Exception:
                log.exception("study-complete handler failed")
