"""A DICOM archive as a ``PacsClient``, over DIMSE (pynetdicom): C-FIND, C-GET or C-MOVE, C-STORE.

- Finding: Study Root C-FIND at STUDY level, one request per listed accession number or patient
  ID (only UID lists may be multi-valued), then one SERIES-level C-FIND per study listed (until
  the query's limit) when the archive did not return the modalities or counts (dcmqrscp does
  not). Every value the archive returns is bounded; what it returns is filtered again by the
  query. A find that reaches its bound asks the archive to stop (C-CANCEL) and reads the rest of
  its answers, so that the association stays in order for the next request.
- Statuses are named as the standard names them (``status_text``: ``0xA700 (Refused: Out of
  Resources)``, with the archive's ErrorComment); a C-MOVE destination the archive does not
  know (A801) is an error naming it; an archive that accepts none of the SOP classes asked for
  (read-only for our AE title) says so, and for C-STORE it is a refusal of each object.
- Pulling: C-GET (the archive sends the instances back on the same association: we offer the
  storage classes of neuro imaging and reports in SCP role), or C-MOVE to ``move_destination``:
  a receiver of ours (``receiving``) listens on ``receive_host:receive_port`` for the archive's
  association (only from the archive's AE title) while the move runs. Each instance is written as a Part 10
  file named by a hash of its bytes, never by a UID from the peer; then ``keep_the_study``.
- Storing: C-STORE of each object (the SR, the Encapsulated PDF).
- TLS: the PACS's ``tls:`` settings (``gateway.pacs.tls``), for the association and the receiver.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import (
    JPEG2000,
    UID,
    DeflatedExplicitVRLittleEndian,
    ExplicitVRBigEndian,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    JPEG2000Lossless,
    JPEGBaseline8Bit,
    JPEGExtended12Bit,
    JPEGLosslessSV1,
    JPEGLSLossless,
    JPEGLSNearLossless,
    RLELossless,
)
from pynetdicom import AE, build_context, build_role, evt
from pynetdicom.association import Association
from pynetdicom.sop_class import (  # type: ignore[attr-defined]
    BasicTextSRStorage,
    ComprehensiveSRStorage,
    CTImageStorage,
    EncapsulatedPDFStorage,
    EnhancedCTImageStorage,
    EnhancedMRColorImageStorage,
    EnhancedMRImageStorage,
    EnhancedSRStorage,
    GrayscaleSoftcopyPresentationStateStorage,
    LegacyConvertedEnhancedCTImageStorage,
    LegacyConvertedEnhancedMRImageStorage,
    MRImageStorage,
    MRSpectroscopyStorage,
    MultiFrameGrayscaleByteSecondaryCaptureImageStorage,
    MultiFrameGrayscaleWordSecondaryCaptureImageStorage,
    MultiFrameTrueColorSecondaryCaptureImageStorage,
    PositronEmissionTomographyImageStorage,
    RawDataStorage,
    SecondaryCaptureImageStorage,
    StudyRootQueryRetrieveInformationModelFind,
    StudyRootQueryRetrieveInformationModelGet,
    StudyRootQueryRetrieveInformationModelMove,
    XRayRadiationDoseSRStorage,
)
from pynetdicom.status import (
    GENERAL_STATUS,
    QR_FIND_SERVICE_CLASS_STATUS,
    QR_GET_SERVICE_CLASS_STATUS,
    QR_MOVE_SERVICE_CLASS_STATUS,
    STORAGE_SERVICE_CLASS_STATUS,
)

from dicom import atomic_write
from gateway.pacs.client import (
    MAX_MATCHES,
    PacsRequestError,
    Progress,
    RetrievedStudy,
    StoreResult,
    StudyMatch,
    StudyQuery,
    keep_the_study,
    pacs_count,
    pacs_date,
    pacs_text,
)
from gateway.pacs.config import DimsePacs
from gateway.pacs.tls import client_context, describe_tls_error, server_context

Comprehensive3DSRStorage = "1.2.840.10008.5.1.4.1.1.88.34"
# What C-GET offers to receive (SCP role): neuro imaging, its reports and captures. A study
# holding another class loses those instances, listed in ``failed`` by the archive's count.
GET_STORAGE = [
    MRImageStorage, EnhancedMRImageStorage, EnhancedMRColorImageStorage,
    LegacyConvertedEnhancedMRImageStorage, MRSpectroscopyStorage,
    CTImageStorage, EnhancedCTImageStorage, LegacyConvertedEnhancedCTImageStorage,
    PositronEmissionTomographyImageStorage,
    SecondaryCaptureImageStorage, MultiFrameGrayscaleByteSecondaryCaptureImageStorage,
    MultiFrameGrayscaleWordSecondaryCaptureImageStorage,
    MultiFrameTrueColorSecondaryCaptureImageStorage,
    BasicTextSRStorage, EnhancedSRStorage, ComprehensiveSRStorage, Comprehensive3DSRStorage,
    XRayRadiationDoseSRStorage, EncapsulatedPDFStorage,
    GrayscaleSoftcopyPresentationStateStorage, RawDataStorage,
]  # fmt: skip
TRANSFER_SYNTAXES: list[str | UID] = [
    ExplicitVRLittleEndian, ImplicitVRLittleEndian, DeflatedExplicitVRLittleEndian,
    ExplicitVRBigEndian, JPEGBaseline8Bit, JPEGExtended12Bit, JPEGLosslessSV1, JPEGLSLossless,
    JPEGLSNearLossless, JPEG2000Lossless, JPEG2000, RLELossless,
]  # fmt: skip
MAX_INSTANCE_BYTES = 2 * 1024**3
UNCOMPRESSED: list[str | UID] = TRANSFER_SYNTAXES[:4]
# the image classes, whose instances an archive may hold compressed
_IMAGES = {
    MRImageStorage, EnhancedMRImageStorage, EnhancedMRColorImageStorage,
    LegacyConvertedEnhancedMRImageStorage, CTImageStorage, EnhancedCTImageStorage,
    LegacyConvertedEnhancedCTImageStorage, PositronEmissionTomographyImageStorage,
    SecondaryCaptureImageStorage, MultiFrameGrayscaleByteSecondaryCaptureImageStorage,
    MultiFrameGrayscaleWordSecondaryCaptureImageStorage,
    MultiFrameTrueColorSecondaryCaptureImageStorage,
}  # fmt: skip


def get_contexts() -> list[tuple[str, list[str | UID]]]:
    """The presentation contexts a C-GET proposes for the archive to send back on: per class,
    one context of the uncompressed transfer syntaxes and, for an image class, one context per
    compressed syntax. The archive accepts one syntax per context and sends an instance only on
    a context of the syntax it can send it in: a single context of every syntax let an archive
    that prefers a compressed one (dcmqrscp +xs) accept that, then fail every uncompressed
    instance (and the reverse for one that cannot decompress). 117 contexts: with the C-GET's
    own, 118 of the 128 an association may have."""
    out: list[tuple[str, list[str | UID]]] = []
    for cls in GET_STORAGE:
        out.append((cls, UNCOMPRESSED))
        if cls in _IMAGES:
            out += [(cls, [ts]) for ts in TRANSFER_SYNTAXES[4:]]
    return out


MAX_COUNTED_INSTANCES = 100_000  # IMAGE-level answers read to count a study's instances
MAX_STUDY_BYTES = 64 * 1024**3  # received for one study (as DICOMweb's; a neuro study is a few GB)
MAX_STUDY_INSTANCES = 200_000  # instances received for one study
_FIND_KEYS = (
    "PatientID", "IssuerOfPatientID", "PatientName", "PatientBirthDate", "AccessionNumber",
    "StudyDate", "ModalitiesInStudy", "StudyDescription", "NumberOfStudyRelatedSeries",
    "NumberOfStudyRelatedInstances",
)  # fmt: skip
_PENDING = (0xFF00, 0xFF01)
MAX_DRAINED = 10_000  # answers read after a C-CANCEL before the association is aborted


def status_text(code: int, table: dict[int, tuple[str, str]], status: Dataset | None = None) -> str:
    """A DIMSE status as the standard names it (PS3.4 and PS3.7 Annex C), with the peer's
    ErrorComment (bounded: the peer's text is hostile): ``0xA700 (Refused: Out of Resources)``."""
    if code < 0:
        return "no answer (timeout or abort)"
    name = (table.get(code) or GENERAL_STATUS.get(code) or ("", ""))[1]
    if not name:
        name = {0xA7: "Refused: Out of Resources", 0xA9: "Error: Data Set Does Not Match SOP Class",
                0xC0: "Error: Cannot Understand"}.get(code >> 8, "")  # fmt: skip
        if not name and code >> 12 == 0xC:
            name = "Error: Cannot Understand"
    comment = pacs_text(status.get("ErrorComment")) if status is not None else ""
    text = f"status 0x{code & 0xFFFF:04X}" + (f" ({name})" if name else "")
    return text + (f": {comment[:200]}" if comment else "")


def _with_transfer_syntax(ds: Dataset) -> Dataset:
    """The dataset with a transfer syntax to send it in: one built in memory (an SR, a PDF)
    has no File Meta; it goes as Explicit VR Little Endian (a shallow copy, the caller's
    dataset unchanged)."""
    meta = getattr(ds, "file_meta", None)
    if meta is not None and "TransferSyntaxUID" in meta:
        return ds
    out = copy.copy(ds)
    out.file_meta = FileMetaDataset(meta) if meta is not None else FileMetaDataset()
    out.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    return out


class NoContextAcceptedError(PacsRequestError):
    """The archive took the association but none of the SOP classes asked for."""

    def __init__(self, message: str, classes: list[str]) -> None:
        super().__init__(message)
        self.classes = classes


def _of_patient(answers: list[Dataset], m: StudyMatch) -> list[Dataset]:
    """The SERIES or IMAGE answers that are of the study's patient. Below the study level the
    patient is not a matching key in the Study Root model: an archive (dcmqrscp) answers with
    the series of every patient who has a study of that UID. An answer naming another patient
    ID (or, both given, another issuer) is left out; one naming none is kept."""
    out = []
    for a in answers:
        pid, issuer = pacs_text(a.get("PatientID")), pacs_text(a.get("IssuerOfPatientID"))
        if pid and pid != m.patient_id:
            continue
        if issuer and m.issuer and issuer != m.issuer:
            continue
        out.append(a)
    return out


def _no_delay(assoc: Association) -> None:
    """TCP_NODELAY on the association's socket: a DIMSE message goes as a command PDU then a
    data PDU, and Nagle's algorithm held the second until the peer's delayed ACK (tens of ms a
    message: a C-FIND took 93 ms against dcmqrscp on loopback, 45 ms without the wait)."""
    with contextlib.suppress(AttributeError, OSError):  # no socket: the association is gone
        assoc.dul.socket.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # type: ignore[union-attr]


def _stop(assoc: Association) -> None:
    """Abort an association from inside its C-STORE handler. On C-GET's association the
    handler runs in our own thread, inside the C-GET's wait for the archive's next message:
    pynetdicom 3.0 would wait out the whole DIMSE timeout before seeing its own abort, so the
    wait is woken with what the DIMSE queue holds when nothing more will come (None, None)."""
    assoc.abort()  # from a handler: queued, the association then ends
    if assoc.is_requestor:
        assoc.dimse.msg_queue.put((None, None))


class _Writer:
    """The C-STORE handler of one pull (C-GET's association or the C-MOVE receiver): each
    instance as a Part 10 file named by the hash of its bytes, progress per instance, and the
    study bounded as a whole. Past ``MAX_STUDY_BYTES`` or ``MAX_STUDY_INSTANCES`` the archive's
    association is aborted and ``over`` says which bound; ``remove_written`` then takes back the
    files of this pull."""

    def __init__(
        self, dest: Path, progress: Progress | None, total: int | None, failed: list[str]
    ) -> None:
        self.dest, self.progress, self.total, self.failed = dest, progress, total, failed
        self.lock = threading.Lock()
        self.done = self.n_bytes = 0
        self.written: set[str] = set()
        self.over: str | None = None

    def __call__(self, event: Any) -> int:
        if self.over is not None:
            return 0xA700
        try:
            data = event.encoded_dataset(include_meta=True)
        except Exception as exc:  # a dataset pynetdicom cannot encode: refused, listed
            self.failed.append(f"an instance could not be written: {str(exc)[:120]}")
            return 0xC210
        if len(data) > MAX_INSTANCE_BYTES:
            self.failed.append(f"an instance over {MAX_INSTANCE_BYTES} bytes was refused")
            return 0xA700
        with self.lock:
            if self.n_bytes + len(data) > MAX_STUDY_BYTES:
                self.over = f"{MAX_STUDY_BYTES} bytes"
            elif self.done + 1 > MAX_STUDY_INSTANCES:
                self.over = f"{MAX_STUDY_INSTANCES} instances"
            if self.over is not None:
                _stop(event.assoc)
                return 0xA700
            self.n_bytes += len(data)
            name = hashlib.sha256(data).hexdigest()[:32] + ".dcm"
            self.written.add(name)
        try:  # whole or not at all (the cache's rule: dicom.atomic_write); a cache: no fsync
            with atomic_write(self.dest / name, fsync=False) as fh:
                fh.write(data)
        except OSError as exc:  # disk full, folder gone: the archive hears Out of Resources
            self.failed.append(f"an instance could not be written: {exc.strerror or exc}"[:200])
            return 0xA700
        with self.lock:
            self.done += 1
            if self.progress:
                self.progress(self.done, self.total)
        return 0x0000

    def remove_written(self) -> None:
        with self.lock:
            names = list(self.written)
        for name in names:
            (self.dest / name).unlink(missing_ok=True)
        for part in self.dest.glob(".*.part"):
            part.unlink(missing_ok=True)


class DimseClient:
    """Find, pull and store on a DICOM node by DIMSE."""

    def __init__(self, name: str, cfg: DimsePacs) -> None:
        self.name = name
        self.cfg = cfg
        self._tls = client_context(cfg.tls)

    def close(self) -> None:
        pass

    def _where(self) -> str:
        c = self.cfg
        return f"PACS {self.name!r} ({c.ae_title}@{c.host}:{c.port})"

    def _ae(self, title: str | None = None) -> AE:
        ae = AE(ae_title=title or self.cfg.calling_ae)
        t = self.cfg.timeout_s
        ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = t
        ae.connection_timeout = min(t, 30.0)
        ae.maximum_pdu_size = 0  # no limit: fewer PDUs for large instances
        return ae

    @contextmanager
    def _associate(self, ae: AE, ext_neg: list[Any] | None = None) -> Iterator[Association]:
        tls_args = (
            (self._tls, self.cfg.tls.server_name or self.cfg.host)
            if self._tls is not None and self.cfg.tls is not None
            else None
        )
        failure: list[BaseException] = []
        try:
            assoc = ae.associate(self.cfg.host, self.cfg.port, ae_title=self.cfg.ae_title,
                                 ext_neg=ext_neg, tls_args=tls_args)  # fmt: skip
        except (OSError, ValueError) as exc:
            failure.append(exc)
            assoc = None
        if (
            assoc is not None
            and not assoc.is_established
            and assoc.rejected_contexts
            and not assoc.accepted_contexts
        ):  # acknowledged, then aborted by pynetdicom: nothing we may ask
            names = sorted({UID(c.abstract_syntax or "").name for c in assoc.rejected_contexts})
            raise NoContextAcceptedError(
                f"{self._where()}: the archive accepted none of the SOP classes asked for "
                f"({', '.join(names[:8])}): is it read-only for our AE title, or does it "
                "not take them?",
                names,
            )
        if assoc is None or not assoc.is_established:
            why = describe_tls_error(failure[0]) if failure else None
            if why is None and assoc is not None and assoc.is_rejected:
                why = "the association was rejected (is our AE title known to the archive?)"
            if why is None and self._tls is not None:
                why = "no association over TLS (the certificate may not be trusted: tls.ca_file)"
            raise PacsRequestError(f"{self._where()}: {why or 'cannot associate (down?)'}")
        _no_delay(assoc)
        try:
            yield assoc
        finally:
            if assoc.is_established:
                assoc.release()

    # ----------------------------------------------------------------- finding

    def _requests(self, query: StudyQuery) -> list[Dataset]:
        base = Dataset()
        base.QueryRetrieveLevel = "STUDY"
        base.StudyInstanceUID = "\\".join(query.study_uids) if query.study_uids else ""
        for k in _FIND_KEYS:
            setattr(base, k, "")
        base.StudyDate = query.dicom_date_range()
        if len(query.modalities) == 1:
            base.ModalitiesInStudy = query.modalities[0]
        out = []
        for pattern in query.description_patterns() or [""]:
            d = copy.deepcopy(base)
            d.StudyDescription = pattern
            out.append(d)
        keyed = [("AccessionNumber", query.accession_numbers), ("PatientID", query.patient_ids)]
        if all(values for _, values in keyed):  # both lists: ask by the shorter, check the
            keyed = [min(keyed, key=lambda kv: len(kv[1]))]  # other here (query.matches)
        for key, values in keyed:
            if values:
                grown = []
                for ds in out:
                    for v in values:
                        d = copy.deepcopy(ds)  # update() would share the elements
                        setattr(d, key, v)
                        grown.append(d)
                out = grown
        return out

    def _find(
        self, assoc: Association, request: Dataset, model: str, bound: int
    ) -> tuple[list[Dataset], bool]:
        """The identifiers a C-FIND answers, at most ``bound`` (and whether there were more).
        At the bound the archive is asked to stop (C-CANCEL) and its remaining answers are read
        to the end, so that the association stays in order for the next request (answers left
        unread would be taken for the next request's); an archive that goes on past
        ``MAX_DRAINED`` more is aborted."""
        out: list[Dataset] = []
        responses = assoc.send_c_find(request, model)
        for status, ident in responses:
            code = int(getattr(status, "Status", -1)) if status else -1
            if code in _PENDING:
                if ident is not None:
                    out.append(ident)
                if len(out) >= bound:
                    self._cancel(assoc, responses, model)
                    return out, True
            elif code != 0x0000:
                raise PacsRequestError(
                    f"{self._where()}: C-FIND failed "
                    f"({status_text(code, QR_FIND_SERVICE_CLASS_STATUS, status or None)})"
                )
        return out, False

    def _cancel(self, assoc: Association, responses: Iterator[Any], model: str) -> None:
        context = next((c for c in assoc.accepted_contexts if c.abstract_syntax == model), None)
        if context is not None and context.context_id is not None:
            assoc.send_c_cancel(1, context.context_id)  # the C-FIND's message ID (1)
        for n, (status, _) in enumerate(responses):
            code = int(getattr(status, "Status", -1)) if status else -1
            if code not in _PENDING:
                return  # Cancel (FE00), or done before the cancel reached the archive
            if n >= MAX_DRAINED:
                assoc.abort()
                raise PacsRequestError(
                    f"{self._where()}: C-FIND: the archive went on answering after being "
                    f"asked to stop (C-CANCEL) at {n} answers more; the association was aborted"
                )

    def find_studies(self, query: StudyQuery) -> list[StudyMatch]:
        ae = self._ae()
        ae.add_requested_context(StudyRootQueryRetrieveInformationModelFind)
        found: dict[tuple[str, str, str], StudyMatch] = {}  # a study of a patient (and issuer)
        bound = MAX_MATCHES
        with self._associate(ae) as assoc:
            for request in self._requests(query):
                answers, more = self._find(
                    assoc, request, StudyRootQueryRetrieveInformationModelFind, bound - len(found)
                )
                for ident in answers:
                    m = self._match(ident)
                    if m is not None:
                        found.setdefault((m.study_uid, m.patient_id, m.issuer), m)
                if more or len(found) >= bound:
                    break  # at the bound: no more requests (a narrower query finds the rest)
            # in the order listed; the series of a study are asked for (when the archive did
            # not give its modalities and counts) only until the limit is reached
            done: list[StudyMatch] = []
            listed = sorted(found.values(), key=lambda m: (str(m.study_date or ""), m.study_uid))
            for m in listed:
                if not query.matches(
                    m
                ):  # on what the study answer says (modalities may be unknown)
                    continue
                if not m.modalities or m.n_series is None or m.n_instances is None:
                    m = self._series_of(assoc, m)
                if query.matches(m):
                    done.append(m)
                    if len(done) >= query.limit:
                        break
        return done

    def _match(self, ident: Dataset) -> StudyMatch | None:
        g = ident.get
        try:
            return StudyMatch(
                pacs=self.name,
                study_uid=pacs_text(g("StudyInstanceUID")),
                patient_id=pacs_text(g("PatientID")),
                issuer=pacs_text(g("IssuerOfPatientID")),
                patient_name=pacs_text(g("PatientName")),
                birth_date=pacs_text(g("PatientBirthDate"))[:8],
                accession=pacs_text(g("AccessionNumber")),
                study_date=pacs_date(g("StudyDate")),
                modalities=[m for m in pacs_text(g("ModalitiesInStudy")).split("\\") if m][:16],
                description=pacs_text(g("StudyDescription")),
                n_series=pacs_count(g("NumberOfStudyRelatedSeries")),
                n_instances=pacs_count(g("NumberOfStudyRelatedInstances")),
            )
        except ValueError:  # no valid StudyInstanceUID: not a study the sandbox can name
            return None

    def _series_of(self, assoc: Association, m: StudyMatch) -> StudyMatch:
        """Modalities and counts from the study's series (and, when the archive has no count
        per series, its instances)."""
        req = Dataset()
        req.QueryRetrieveLevel = "SERIES"
        req.StudyInstanceUID = m.study_uid
        req.PatientID = m.patient_id
        req.IssuerOfPatientID = ""
        req.SeriesInstanceUID = req.Modality = req.NumberOfSeriesRelatedInstances = ""
        series, _ = self._find(assoc, req, StudyRootQueryRetrieveInformationModelFind, 1000)
        series = _of_patient(series, m)
        mods = sorted({pacs_text(s.get("Modality")) for s in series} - {""})
        counts = [pacs_count(s.get("NumberOfSeriesRelatedInstances")) for s in series]
        n_inst: int | None = sum(c for c in counts if c is not None)
        if any(c is None for c in counts):
            n_inst = self._count_instances(assoc, m)
        return m.model_copy(update={
            "modalities": m.modalities or mods,
            "n_series": m.n_series if m.n_series is not None else len(series),
            "n_instances": m.n_instances if m.n_instances is not None else n_inst,
        })  # fmt: skip

    def _count_instances(self, assoc: Association, m: StudyMatch) -> int | None:
        req = Dataset()
        req.QueryRetrieveLevel = "IMAGE"
        req.StudyInstanceUID = m.study_uid
        req.PatientID = m.patient_id
        req.IssuerOfPatientID = ""
        req.SeriesInstanceUID = req.SOPInstanceUID = ""
        found, more = self._find(
            assoc, req, StudyRootQueryRetrieveInformationModelFind, MAX_COUNTED_INSTANCES
        )
        return None if more else len(_of_patient(found, m))

    # ----------------------------------------------------------------- pulling

    def _identifier(self, match: StudyMatch) -> Dataset:
        ds = Dataset()
        ds.QueryRetrieveLevel = "STUDY"
        ds.StudyInstanceUID = match.study_uid
        ds.PatientID = match.patient_id
        return ds

    def _writer(
        self, dest: Path, progress: Progress | None, total: int | None, failed: list[str]
    ) -> _Writer:
        return _Writer(dest, progress, total, failed)

    def retrieve(
        self, match: StudyMatch, dest: Path, progress: Progress | None = None
    ) -> RetrievedStudy:
        started = time.monotonic()
        dest.mkdir(parents=True, exist_ok=True)
        failed: list[str] = []
        on_store = self._writer(dest, progress, match.n_instances, failed)
        try:
            if self.cfg.retrieve == "c-move":
                self._move(match, on_store, failed)
            else:
                self._get(match, on_store, failed)
        except PacsRequestError:
            if on_store.over is None:
                raise
        if on_store.over is not None:  # the archive's failure after our abort is not the news
            on_store.remove_written()
            raise PacsRequestError(
                f"{self._where()}: the study sent is over {on_store.over}: the pull was stopped "
                "and nothing of it kept (is the archive answering for this study only?)"
            )
        out = keep_the_study(match, dest, started)
        out.failed = failed[:50]
        return out

    def _check_retrieve(
        self, what: str, responses: Iterator[Any], failed: list[str], destination: str = ""
    ) -> None:
        """The C-GET or C-MOVE answers read to the end: the instances the archive could not
        send are listed in ``failed``; a failure of the whole retrieve is a PacsRequestError
        saying what the standard calls it (PS3.4 C.4.2.1.5, C.4.3.1.5)."""
        table = QR_MOVE_SERVICE_CLASS_STATUS if what == "C-MOVE" else QR_GET_SERVICE_CLASS_STATUS
        last, final = -1, None
        for status, _ in responses:
            if not status:
                raise PacsRequestError(f"{self._where()}: {what}: no answer (timeout or abort)")
            last, final = int(getattr(status, "Status", -1)), status
            n_failed = pacs_count(status.get("NumberOfFailedSuboperations"))
            if last not in _PENDING and n_failed:
                failed.append(f"{what}: the archive could not send {n_failed} instance(s)")
        if last == 0xA801:
            raise PacsRequestError(
                f"{self._where()}: the archive does not know the C-MOVE destination "
                f"{destination!r}: add it to the archive's AE table with this machine's address "
                f"and receive_port {self.cfg.receive_port}, or use retrieve: c-get"
            )
        if last not in (0x0000, 0xB000):
            raise PacsRequestError(
                f"{self._where()}: {what} failed ({status_text(last, table, final)})"
            )

    def _get(self, match: StudyMatch, on_store: Callable[[Any], int], failed: list[str]) -> None:
        ae = self._ae()
        ae.add_requested_context(StudyRootQueryRetrieveInformationModelGet)
        roles = []
        for cls, syntaxes in get_contexts():
            ae.add_requested_context(cls, syntaxes)
        for cls in GET_STORAGE:
            roles.append(build_role(cls, scp_role=True))
        with self._associate(ae, ext_neg=roles) as assoc:
            assoc.bind(evt.EVT_C_STORE, on_store)
            responses = assoc.send_c_get(
                self._identifier(match), StudyRootQueryRetrieveInformationModelGet
            )
            self._check_retrieve("C-GET", responses, failed)

    @contextmanager
    def receiving(self, on_store: Callable[[Any], int]) -> Iterator[None]:
        """Our C-MOVE destination listening on ``receive_host:receive_port`` while in the
        block: it answers as ``move_destination`` and takes associations from the archive's AE
        title only (any other calling AE is rejected), for the storage classes of
        ``GET_STORAGE``; each instance goes to ``on_store``."""
        cfg = self.cfg
        if cfg.receive_port is None:
            raise PacsRequestError(
                f"{self._where()}: retrieve: c-move needs receive_port (where the archive "
                f"sends to; it must know {cfg.move_destination or cfg.calling_ae} at this port)"
            )
        receiver = self._ae(cfg.move_destination or cfg.calling_ae)
        receiver.require_calling_aet = [cfg.ae_title]
        receiver.supported_contexts = [build_context(c, TRANSFER_SYNTAXES) for c in GET_STORAGE]
        try:
            server = receiver.start_server(
                (cfg.receive_host, cfg.receive_port),
                block=False,
                ssl_context=server_context(cfg.tls) if cfg.tls else None,
                evt_handlers=[
                    (evt.EVT_C_STORE, on_store),
                    (evt.EVT_ESTABLISHED, lambda event: _no_delay(event.assoc)),
                ],
            )
        except OSError as exc:
            raise PacsRequestError(
                f"{self._where()}: cannot listen on {cfg.receive_host}:{cfg.receive_port} "
                f"for C-MOVE: {exc.strerror}"
            ) from None
        try:
            yield
        finally:
            if server is not None:
                server.shutdown()

    def _move(self, match: StudyMatch, on_store: Callable[[Any], int], failed: list[str]) -> None:
        dest_ae = self.cfg.move_destination or self.cfg.calling_ae
        with self.receiving(on_store):
            ae = self._ae()
            ae.add_requested_context(StudyRootQueryRetrieveInformationModelMove)
            with self._associate(ae) as assoc:
                responses = assoc.send_c_move(
                    self._identifier(match), dest_ae, StudyRootQueryRetrieveInformationModelMove
                )
                self._check_retrieve("C-MOVE", responses, failed, dest_ae)

    # ----------------------------------------------------------------- storing

    def store(self, objects: Sequence[Dataset]) -> list[StoreResult]:
        if not objects:
            return []
        ae = self._ae()
        objects = [_with_transfer_syntax(ds) for ds in objects]
        seen: set[tuple[str, str]] = set()
        for ds in objects:
            key = (str(ds.SOPClassUID), str(ds.file_meta.TransferSyntaxUID))
            if key not in seen and len(seen) < 120:
                seen.add(key)
                ae.add_requested_context(key[0], [key[1], ExplicitVRLittleEndian])
        out = []
        try:
            with self._associate(ae) as assoc:
                for ds in objects:
                    out.append(self._store_one(assoc, ds))
                    if not assoc.is_established:
                        break
        except NoContextAcceptedError:  # a refusal of each object, by its class: not "down"
            return [
                StoreResult(sop_instance_uid=str(ds.get("SOPInstanceUID", "")), stored=False,
                            detail=f"the archive accepted no presentation context for "
                            f"{UID(str(ds.SOPClassUID)).name} (read-only, or not a class it "
                            "stores)")
                for ds in objects
            ]  # fmt: skip
        while len(out) < len(objects):
            uid = str(objects[len(out)].get("SOPInstanceUID", ""))
            out.append(StoreResult(sop_instance_uid=uid, stored=False, detail="association lost"))
        return out

    def _store_one(self, assoc: Association, ds: Dataset) -> StoreResult:
        uid = str(ds.get("SOPInstanceUID", ""))
        try:
            status = assoc.send_c_store(ds)
        except ValueError as exc:  # no accepted context for this class
            return StoreResult(sop_instance_uid=uid, stored=False,
                               detail=f"not accepted: {str(exc)[:200]}")  # fmt: skip
        code = int(getattr(status, "Status", -1)) if status else -1
        ok = code == 0x0000 or (code & 0xF000) == 0xB000  # success or warning (PS3.4 B.2.3)
        detail = "" if ok else status_text(code, STORAGE_SERVICE_CLASS_STATUS, status or None)
        return StoreResult(sop_instance_uid=uid, stored=ok, detail=detail)
