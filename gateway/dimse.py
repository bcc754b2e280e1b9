"""C-FIND / C-GET / C-MOVE retrieval for a PACS that offers no REST API (pynetdicom SCU).

Received instances go into the same SOP-Instance-UID cache as REST fetches, byte for byte as
sent (no decode). C-GET needs SCP role selection for the storage classes, which shares the
128-context limit with the query model; C-MOVE needs our AE known to the PACS (Orthanc: in
DicomModalities) and a storage SCP listening while the move runs.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from pydicom.dataset import Dataset
from pynetdicom import AE, StoragePresentationContexts, build_role, evt
from pynetdicom.sop_class import (  # type: ignore[attr-defined]
    StudyRootQueryRetrieveInformationModelFind,
    StudyRootQueryRetrieveInformationModelGet,
    StudyRootQueryRetrieveInformationModelMove,
)

from gateway.cache import InstanceCache, InvalidUIDError, check_uid
from gateway.part10 import file_meta_bytes

log = logging.getLogger(__name__)
# Query/retrieve context + storage classes must fit in 128 presentation contexts.
_STORAGE = [str(cx.abstract_syntax) for cx in StoragePresentationContexts][:126]


class RetrieveError(RuntimeError):
    """The PACS refused the association or the retrieve failed (status says which)."""


class DimseRetriever:
    def __init__(
        self,
        local_aet: str,
        peer_host: str,
        peer_port: int,
        peer_aet: str,
        cache: InstanceCache,
        timeout_s: float = 120.0,
    ) -> None:
        self.local_aet, self.peer = local_aet, (peer_host, peer_port, peer_aet)
        self.cache = cache
        self.timeout_s = timeout_s

    def _ae(self) -> AE:
        ae = AE(ae_title=self.local_aet)
        ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = self.timeout_s
        return ae

    def _store(self, received: list[str]) -> Any:
        def handler(event: Any) -> int:
            try:
                sop = check_uid(str(event.request.AffectedSOPInstanceUID))
                sop_class = check_uid(str(event.request.AffectedSOPClassUID))
            except InvalidUIDError:
                return 0xA900
            ts = str(event.context.transfer_syntax)
            with event.request.DataSet.getbuffer() as body:
                data = file_meta_bytes(sop_class, sop, ts, self.peer[2]) + bytes(body)
            try:
                self.cache.put_bytes(sop, data)
            except OSError:
                return 0xA700
            received.append(sop)
            return 0x0000

        return handler

    def _associate(self, ae: AE, **kwargs: Any) -> Any:
        host, port, aet = self.peer
        assoc = ae.associate(host, port, ae_title=aet, **kwargs)
        if not assoc.is_established:
            raise RetrieveError(
                f"{aet}@{host}:{port} refused the association from {self.local_aet}"
            )
        return assoc

    def find_series(self, study_uid: str) -> list[Dataset]:
        """C-FIND at SERIES level: one identifier per series of the study."""
        ae = self._ae()
        ae.add_requested_context(StudyRootQueryRetrieveInformationModelFind)
        query = Dataset()
        query.QueryRetrieveLevel = "SERIES"
        query.StudyInstanceUID = check_uid(study_uid)
        query.SeriesInstanceUID = ""
        query.Modality = ""
        query.SeriesNumber = ""
        query.SeriesDescription = ""
        query.NumberOfSeriesRelatedInstances = ""
        assoc = self._associate(ae)
        out = []
        try:
            for status, ident in assoc.send_c_find(
                query, StudyRootQueryRetrieveInformationModelFind
            ):
                if "Status" not in status:  # an empty dataset: no answer, association gone
                    raise RetrieveError("C-FIND: no response from the PACS (association aborted)")
                if status.Status in (0xFF00, 0xFF01) and ident is not None:
                    out.append(ident)
                elif status.Status != 0x0000 and status.Status not in (0xFF00, 0xFF01):
                    raise RetrieveError(f"C-FIND failed with status 0x{status.Status:04X}")
        finally:
            assoc.release()
        return out

    def _query(self, study_uid: str, series_uid: str) -> Dataset:
        q = Dataset()
        q.QueryRetrieveLevel = "SERIES"
        q.StudyInstanceUID = check_uid(study_uid)
        q.SeriesInstanceUID = check_uid(series_uid)
        return q

    @staticmethod
    def _check(responses: Any, what: str) -> None:
        final = None
        for status, _ident in responses:
            if status is not None and "Status" in status:
                final = status
        if final is None:
            raise RetrieveError(f"{what}: no response from the PACS")
        code = int(final.Status)
        if code not in (0x0000, 0xB000):  # success, or some sub-operations failed
            raise RetrieveError(f"{what} failed with status 0x{code:04X}")
        if code == 0xB000:
            log.warning(
                "%s: %s sub-operation(s) failed", what, final.get("NumberOfFailedSuboperations")
            )

    def get_series(self, study_uid: str, series_uid: str) -> list[Path]:
        """C-GET one series into the cache (we act as storage SCP on the same association)."""
        ae = self._ae()
        ae.add_requested_context(StudyRootQueryRetrieveInformationModelGet)
        for uid in _STORAGE:
            ae.add_requested_context(uid)
        roles = [build_role(uid, scp_role=True) for uid in _STORAGE]
        received: list[str] = []
        assoc = self._associate(
            ae, ext_neg=roles, evt_handlers=[(evt.EVT_C_STORE, self._store(received))]
        )
        try:
            self._check(
                assoc.send_c_get(
                    self._query(study_uid, series_uid), StudyRootQueryRetrieveInformationModelGet
                ),
                "C-GET",
            )
        finally:
            assoc.release()
        return [self.cache.path(s) for s in received]

    def move_series(
        self, study_uid: str, series_uid: str, listen_host: str, listen_port: int
    ) -> list[Path]:
        """C-MOVE one series to ourselves: a storage SCP listens on ``listen_port`` meanwhile."""
        received: list[str] = []
        lock = threading.Lock()
        store = self._store(received)

        def locked(event: Any) -> int:
            with lock:
                return int(store(event))

        scp_ae = self._ae()
        for uid in _STORAGE:
            scp_ae.add_supported_context(uid)
        server: Any = scp_ae.start_server(
            (listen_host, listen_port), block=False, evt_handlers=[(evt.EVT_C_STORE, locked)]
        )
        try:
            ae = self._ae()
            ae.add_requested_context(StudyRootQueryRetrieveInformationModelMove)
            assoc = self._associate(ae)
            try:
                self._check(
                    assoc.send_c_move(
                        self._query(study_uid, series_uid),
                        self.local_aet,
                        StudyRootQueryRetrieveInformationModelMove,
                    ),
                    "C-MOVE",
                )
            finally:
                assoc.release()
        finally:
            server.shutdown()
        return [self.cache.path(s) for s in received]
