"""pynetdicom's association acceptor, tuned for bulk C-STORE (the DICOM node's hot path).

Stock pynetdicom 3.0 spends ~3 ms of CPU per instance turning two small command sets (the
C-STORE-RQ in, the C-STORE-RSP out) into pydicom Datasets and back, and each instance crosses
two 1 ms polling loops (the association thread picks the request up, the reader thread the
response). At a few hundred instances per second that is most of the cost. This module keeps
pynetdicom's negotiation, state machine, PDU codec and Storage service class, and changes the
hot path only, through pynetdicom's extension point (``AE.make_server(request_handler=...)``):

- the C-STORE-RQ command set is read, and the C-STORE-RSP written, byte for byte (always
  implicit VR little endian, a handful of elements); anything unusual takes the stock path;
- a complete C-STORE request is served on the connection's reader (DUL) thread, which sends
  the response on its next loop (dcmtk's storescp is single-threaded in the same way);
- the reader waits in ``select()`` on the socket instead of sleeping 1 ms between polls,
  reads a PDU with ``recv_into`` instead of 4 kB ``recv`` calls, and ACKs at once (a sender
  with Nagle's algorithm on otherwise stalls ~20 ms per instance on delayed ACKs);
- each association copies the ~170 presentation contexts shallowly (``deepcopy`` took ~0.1 s
  per association) and binds no per-message logging handlers (they log UIDs at debug level).

It also bounds association negotiation. pynetdicom starts an association thread per TCP
connection, and every one counts against ``AE.maximum_associations`` until it ends, whether or
not the peer ever sends an A-ASSOCIATE-RQ. The ARTIM timer (``AE.acse_timeout``) is a deadline
from the connection to the A-ASSOCIATE-AC: a connection that sends nothing is closed by the
DUL's ARTIM timer, and one that sends part of a request (or trickles it) by the socket timeout,
which until the accept is whatever is left of that deadline. Once the association is accepted,
the socket timeout is ``AE.network_timeout``, the generous one for pauses between images.

The overrides follow pynetdicom 3.0's internals; with another version ``start_store_server``
falls back to the stock server (correct, slower) and logs why.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, cast

import pynetdicom
from pynetdicom import _config, evt
from pynetdicom._globals import MODE_ACCEPTOR
from pynetdicom._handlers import (
    standard_dimse_recv_handler,
    standard_dimse_sent_handler,
    standard_pdu_recv_handler,
    standard_pdu_sent_handler,
)
from pynetdicom.association import Association
from pynetdicom.dimse import DIMSEServiceProvider
from pynetdicom.dimse_messages import C_STORE_RQ, DIMSEMessage
from pynetdicom.dimse_primitives import C_CANCEL, C_STORE, N_EVENT_REPORT
from pynetdicom.dul import DULServiceProvider
from pynetdicom.pdu import A_ASSOCIATE_AC
from pynetdicom.pdu_primitives import P_DATA
from pynetdicom.transport import AssociationSocket, RequestHandler, ThreadedAssociationServer

log = logging.getLogger(__name__)

FAST_PATH_VERSIONS = ("3.0.",)  # pynetdicom versions whose internals these overrides follow
_QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux only
_RECV_CHUNK = 1 << 20  # first allocation for a PDU; more only once that much has arrived
IDLE_WAIT_S = 0.005  # reader: longest wait for the socket before looking at its queues again
_LOG_HANDLERS = {
    standard_dimse_recv_handler,
    standard_dimse_sent_handler,
    standard_pdu_recv_handler,
    standard_pdu_sent_handler,
}
_ELEMENT = struct.Struct("<HHI")
_US = struct.Struct("<HHIH")
# C-STORE-RQ command elements (group 0000) the fast reader knows; any other takes the stock path.
_RQ_KNOWN = {0x0000, 0x0002, 0x0100, 0x0110, 0x0700, 0x0800, 0x1000}


def fast_path_available() -> bool:
    return pynetdicom.__version__.startswith(FAST_PATH_VERSIONS)


# ----------------------------------------------------------------- command sets


def store_request(msg: DIMSEMessage) -> C_STORE | None:
    """The C-STORE primitive of a decoded C-STORE-RQ message, read from its raw command set.

    None when the command set holds anything the stock decoder should judge (unknown or
    repeated elements, odd lengths, Move Originator fields, no data set).
    """
    raw = msg.encoded_command_set.getvalue()
    fields: dict[int, bytes] = {}
    pos, end = 0, len(raw)
    while pos < end:
        if pos + 8 > end:
            return None
        group, elem, length = _ELEMENT.unpack_from(raw, pos)
        pos += 8
        if group != 0 or elem not in _RQ_KNOWN or elem in fields or pos + length > end:
            return None
        fields[elem] = raw[pos : pos + length]
        pos += length
    try:
        cmd, msg_id, priority, ds_type = (fields[e] for e in (0x0100, 0x0110, 0x0700, 0x0800))
        sop_class, sop_instance = fields[0x0002], fields[0x1000]
    except KeyError:
        return None
    if any(len(v) != 2 for v in (cmd, msg_id, priority, ds_type)):
        return None
    if int.from_bytes(cmd, "little") != 0x0001 or int.from_bytes(ds_type, "little") == 0x0101:
        return None
    req = C_STORE()
    try:
        req.MessageID = int.from_bytes(msg_id, "little")
        req.Priority = int.from_bytes(priority, "little")
        req.AffectedSOPClassUID = sop_class.rstrip(b"\0 ").decode("ascii")
        req.AffectedSOPInstanceUID = sop_instance.rstrip(b"\0 ").decode("ascii")
    except (ValueError, TypeError):  # the stock decoder decides (and aborts) on bad values
        return None
    req.DataSet = msg.data_set
    req._context_id = msg.context_id
    return req


def _ui(elem: int, uid: str) -> bytes:
    value = uid.encode("ascii")
    if len(value) % 2:
        value += b"\0"
    return _ELEMENT.pack(0, elem, len(value)) + value


def store_response_bytes(
    sop_class: str | None, message_id: int, status: int, sop: str | None
) -> bytes:
    """The C-STORE-RSP command set (implicit VR little endian), as pynetdicom encodes it."""
    body = b"".join(
        (
            _ui(0x0002, sop_class) if sop_class else b"",
            _US.pack(0, 0x0100, 2, 0x8001),  # CommandField: C-STORE-RSP
            _US.pack(0, 0x0120, 2, message_id),
            _US.pack(0, 0x0800, 2, 0x0101),  # CommandDataSetType: no data set
            _US.pack(0, 0x0900, 2, status),
            _ui(0x1000, sop) if sop else b"",
        )
    )
    return _ELEMENT.pack(0, 0x0000, 4) + struct.pack("<I", len(body)) + body


# ----------------------------------------------------------------- providers


class _StoreDIMSE(DIMSEServiceProvider):
    def receive_primitive(self, primitive: P_DATA) -> None:
        if self.message is None:
            self.message = DIMSEMessage()
        msg = self.message
        if not msg.decode_msg(primitive, self.assoc):
            return
        evt.trigger(self.assoc, evt.EVT_DIMSE_RECV, {"message": msg})
        context_id = cast(int, msg.context_id)
        req = store_request(msg) if type(msg) is C_STORE_RQ and not msg._data_set_file else None
        try:
            d_primitive = req if req is not None else msg.message_to_primitive()
        except Exception as exc:  # as stock pynetdicom: abort the association
            log.error("received an invalid DIMSE message (%s)", type(exc).__name__)
            self.dul.event_queue.put("Evt19")
            return
        self.message = None
        assoc = cast(_StoreAssociation, self.assoc)
        if req is not None and assoc.serving and self.msg_queue.empty():
            # Served here, on the reader thread: the response leaves on its next loop.
            assoc._serve_request(req, context_id)
        elif isinstance(d_primitive, C_CANCEL) and len(self.cancel_req) < 10:
            self.cancel_req[cast(int, d_primitive.MessageIDBeingRespondedTo)] = d_primitive
        elif isinstance(d_primitive, N_EVENT_REPORT) and d_primitive.is_valid_request:
            threading.Thread(
                target=self.assoc._serve_request, args=(d_primitive, context_id), daemon=True
            ).start()
        else:
            self.msg_queue.put((context_id, d_primitive))  # type: ignore[arg-type]

    def send_msg(self, primitive: Any, context_id: int) -> None:
        if (
            type(primitive) is C_STORE
            and primitive.MessageIDBeingRespondedTo is not None
            and primitive.Status is not None
            and primitive.ErrorComment is None
            and primitive.OffendingElement is None
            and not self.assoc.get_handlers(evt.EVT_DIMSE_SENT)
        ):
            cmd = store_response_bytes(
                primitive.AffectedSOPClassUID,
                primitive.MessageIDBeingRespondedTo,
                primitive.Status,
                primitive.AffectedSOPInstanceUID,
            )
            max_pdu = self.maximum_pdu_size
            if not max_pdu or len(cmd) + 6 <= max_pdu:
                pdata = P_DATA()
                pdata.presentation_data_value_list.append((context_id, b"\x03" + cmd))
                self.dul.send_pdu(pdata)
                return
        super().send_msg(primitive, context_id)


class _StoreDUL(DULServiceProvider):
    def __init__(self, assoc: Association) -> None:
        super().__init__(assoc)
        self._run_loop_delay = 0.0  # the idle wait is the select() below

    def _is_transport_event(self) -> bool:
        sock = self.socket.socket if self.socket is not None else None
        if (
            sock is not None
            and self.event_queue.empty()
            and self.state_machine.current_state != "Sta13"
        ):
            # Returns as soon as the peer sends; the queues are looked at after the timeout.
            # A socket closed meanwhile raises: the stock check below reports it.
            with contextlib.suppress(OSError, ValueError):
                select.select([sock], [], [], IDLE_WAIT_S)
        return bool(super()._is_transport_event())

    def _send(self, pdu: Any) -> None:
        if isinstance(pdu, A_ASSOCIATE_AC) and isinstance(self.socket, _StoreSocket):
            # Before the peer can answer the accept: its data is read with the network timeout.
            self.socket.negotiated(self.assoc.network_timeout)
        super()._send(pdu)


class _StoreSocket(AssociationSocket):
    def __init__(
        self, assoc: Association, client_socket: socket.socket, artim_s: float | None = None
    ) -> None:
        super().__init__(assoc, client_socket=client_socket)
        # Until the A-ASSOCIATE-AC is sent: the ARTIM deadline, from the connection.
        self.deadline = None if artim_s is None else time.monotonic() + artim_s
        self.negotiating = True
        self.timed_out = False  # a read during negotiation ran into the deadline
        client_socket.settimeout(artim_s)

    def negotiated(self, network_timeout: float | None) -> None:
        self.negotiating = False
        if self.socket is not None:
            self.socket.settimeout(network_timeout)

    @property
    def artim_expired(self) -> bool:
        """The ARTIM deadline passed before the association was accepted."""
        if not self.negotiating or self.deadline is None:
            return False
        return self.timed_out or time.monotonic() >= self.deadline

    def recv(self, nr_bytes: int) -> bytearray:
        """Read ``nr_bytes`` (fewer if the peer closes) with ``recv_into``.

        The length comes from the peer: the buffer grows as data arrives, never ahead of it.
        Before the association is accepted, the read ends at the ARTIM deadline too, with what
        has arrived: the DUL then sees a short PDU, as from a peer that closed, and closes.
        """
        sock = cast(Any, self.socket)
        if _QUICKACK is not None:
            # Many senders leave Nagle's algorithm on (Debian's dcmtk and Orthanc unless
            # TCP_NODELAY=1): the tail of each message then waits for our ACK, which Linux
            # delays by up to 40 ms once we answer promptly. Quick ACKs: 18 s -> 4 s here.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
        buf = bytearray(min(nr_bytes, _RECV_CHUNK))
        got = 0
        while got < nr_bytes:
            if got == len(buf):
                buf += bytearray(min(nr_bytes - got, len(buf)))  # doubles, up to nr_bytes
            with memoryview(buf) as view:
                n = self._recv_into(sock, view[got:])
            if not n:
                del buf[got:]
                break
            got += n
        return buf

    def _recv_into(self, sock: socket.socket, view: memoryview) -> int:
        if not self.negotiating or self.deadline is None:
            return sock.recv_into(view)
        left = self.deadline - time.monotonic()
        if left > 0:
            sock.settimeout(left)
            with contextlib.suppress(TimeoutError):
                return sock.recv_into(view)
        self.timed_out = True
        return 0


class _StoreAssociation(Association):
    def __init__(self, ae: Any, mode: str) -> None:
        super().__init__(ae, mode)
        self.dul = _StoreDUL(self)
        self.dimse = _StoreDIMSE(self)
        # The stock DUL took the AE's timeouts in Association.__init__; this one starts with
        # pynetdicom's placeholders (ARTIM 30 s, idle 60 s) until they are set again.
        self.acse_timeout = self.acse_timeout
        self.network_timeout = self.network_timeout
        # Set once negotiation is over (EVT_ACCEPTED/EVT_ESTABLISHED handlers have run) and
        # the association's own loop runs: from then on the reader may serve C-STOREs.
        self.serving = False
        self.on_artim: Callable[[], object] | None = None

    def run_reactor(self) -> None:
        try:
            super().run_reactor()
        finally:
            # Once per connection, when its thread (and slot) ends: was it closed because no
            # association was requested in time? (Not EVT_CONN_CLOSE: pynetdicom skips it when
            # its own ARTIM wait in this thread stops the reader first.)
            sock = self.dul.socket
            if (
                self.on_artim is not None
                and isinstance(sock, _StoreSocket)
                and sock.artim_expired
                and not self.is_rejected
            ):
                self.on_artim()

    def _run_reactor(self) -> None:
        self.serving = self.is_acceptor
        super()._run_reactor()

    def _bind_defaults(self) -> None:
        for event in evt._INTERVENTION_EVENTS:
            self.bind(event, evt.get_default_handler(event))


class _StoreRequestHandler(RequestHandler):
    def _create_association(self) -> Association:
        """As pynetdicom 3.0's, with the providers above and a shallow context copy."""
        assoc = _StoreAssociation(self.ae, MODE_ACCEPTOR)
        assoc._server = self.server
        assoc.on_artim = cast(_StoreServer, self.server).on_artim
        assoc.name = f"AcceptorThread@{datetime.now():%Y%m%d%H%M%S}"
        sock = cast(socket.socket, self.request)
        assoc.set_socket(_StoreSocket(assoc, sock, self.ae.acse_timeout))
        acceptor = assoc.acceptor
        acceptor.maximum_length = self.ae.maximum_pdu_size
        acceptor.ae_title = self.server.ae_title
        acceptor.address_info = self.local
        acceptor.implementation_class_uid = self.ae.implementation_class_uid
        acceptor.implementation_version_name = self.ae.implementation_version_name
        contexts = []
        for cx in self.server.contexts:  # UIDs are immutable: a new list per context suffices
            c = copy.copy(cx)
            c._transfer_syntax = list(cx._transfer_syntax)
            contexts.append(c)
        acceptor.supported_contexts = contexts
        assoc.requestor.address_info = self.remote
        for event, handlers in self.server._handlers.items():
            if event.is_intervention:
                if handlers:
                    assoc.bind(event, *handlers)
            elif isinstance(event, evt.NotificationEvent):
                for handler, args in cast(list[tuple[Any, Any]], handlers):
                    if handler not in _LOG_HANDLERS:
                        assoc.bind(event, handler, args)
        return assoc


class _StoreServer(ThreadedAssociationServer):
    # socketserver's listen backlog is 5: a burst of connections (modalities sending at once,
    # or a flood of idle ones) had its SYNs dropped and retried 1 s, 3 s... later.
    request_queue_size = 128
    on_artim: Callable[[], object] | None = None


def start_store_server(
    ae: pynetdicom.AE,
    address: tuple[str, int],
    handlers: list[Any],
    on_artim: Callable[[], object] | None = None,
) -> ThreadedAssociationServer:
    """Start a non-blocking storage server on ``address`` (as ``ae.start_server`` does).

    ``on_artim`` is called (on the connection's thread) for each connection closed because it
    had not completed an A-ASSOCIATE-RQ within the ARTIM timeout; never with the stock server.
    """
    if not fast_path_available():
        log.warning(
            "pynetdicom %s: the C-STORE fast path follows 3.0 only; using the stock server",
            pynetdicom.__version__,
        )
        return cast(
            ThreadedAssociationServer, ae.start_server(address, block=False, evt_handlers=handlers)
        )
    if _config.STORE_RECV_CHUNKED_DATASET:
        log.info("STORE_RECV_CHUNKED_DATASET is on: C-STORE requests take the stock path")
    server = cast(
        _StoreServer,
        ae.make_server(
            address,
            evt_handlers=handlers,
            server_class=_StoreServer,
            request_handler=_StoreRequestHandler,
        ),
    )
    server.on_artim = on_artim
    thread = threading.Thread(
        target=server.serve_forever, name=f"AcceptorServer@{address[1]}", daemon=True
    )
    thread.start()
    ae._servers.append(server)  # as start_server does: server.shutdown() removes it
    return server
