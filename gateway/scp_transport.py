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

Connections are shared out before an association thread starts (``PeerLimits``, in the
server's ``verify_request``): one peer address holds at most ``per_peer`` connections, peers
not known as senders together at most ``maximum_associations - reserved``, all together
``maximum_associations``. A new connection over a bound makes room by closing the connection
within that bound that has sent nothing (else the one that has waited longest without
completing its association request: a sender's request is on its way at once); an
accepted association is never closed for room, and when none waits the new connection is
closed at once. Known senders are the configured hosts and every address an allowed calling
AE associated from, so 40 idle connections reopened as fast as they are closed, from one
address or several unknown ones, cannot keep a modality out.

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
from dataclasses import dataclass, field
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
        self.ended = False  # the connection ended during negotiation
        self.spoke = False  # bytes of a request came
        client_socket.settimeout(artim_s)

    def negotiated(self, network_timeout: float | None) -> None:
        self.negotiating = False
        server = getattr(self.assoc, "_server", None)
        if self.socket is not None and isinstance(server, _StoreServer) and server.connections:
            # a sender once its calling AE passed an allow list (with none, any AE passes)
            server.connections.accepted(self.socket, sender=bool(self.assoc.ae.require_calling_aet))
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
        if got and self.negotiating and not self.spoke:
            self.spoke = True
            server = getattr(self.assoc, "_server", None)
            if isinstance(server, _StoreServer) and server.connections is not None:
                server.connections.spoke(sock)
        if got < nr_bytes and self.negotiating and not self.ended:
            # Closed (by the peer, for room, or at the deadline) before any association: the
            # association thread waits for a request until ARTIM; wake it now (None: "no
            # request"), or its thread, counted as a slot by pynetdicom, outlives the socket.
            self.ended = True
            self.assoc.dul.to_user_queue.put(None)  # type: ignore[arg-type]
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


@dataclass(frozen=True)
class PeerLimits:
    """How the DICOM node's connections are shared among peer addresses.

    ``per_peer``: connections one address may hold; ``reserved``: of the node's
    ``maximum_associations``, the slots only known senders may use: ``known_hosts`` (IP
    addresses) and, when the node has an allow list of calling AEs, every address an allowed
    AE associated from since the start."""

    per_peer: int = 16  # a PACS router may send a dozen studies at once from one address
    reserved: int = 8
    known_hosts: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.per_peer < 1 or self.reserved < 0:
            raise ValueError(
                f"per_peer must be >= 1 and reserved >= 0, not {self.per_peer}/{self.reserved}"
            )


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    peer: str
    opened: float = field(default_factory=time.monotonic)
    accepted: bool = False  # the A-ASSOCIATE-AC was sent: never closed for room
    spoke: bool = False  # bytes of a request were read from it

    def silent(self) -> bool:
        """Nothing of a request came yet (read or waiting in the socket)."""
        if self.spoke:
            return False
        try:  # (a recv on a socket with a timeout would wait for it: select first)
            if not select.select([self.sock], [], [], 0)[0]:
                return True
            return not self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)  # b"": closed
        except (OSError, ValueError):
            return True


class _Connections:
    """The node's live connections by peer address; admits or refuses a new one (any thread)."""

    MAX_LEARNED = 1024  # addresses remembered as senders, most recent kept

    def __init__(self, limits: PeerLimits, total: int) -> None:
        self.limits, self.total = limits, total
        self.unknown_share = max(1, total - limits.reserved)
        self.learned: dict[str, None] = {}  # addresses an association was accepted from
        self.conns: dict[socket.socket, _Conn] = {}
        self.lock = threading.Lock()
        self.closed_for_room = 0
        self.refused = 0

    def known(self, peer: str) -> bool:
        return peer in self.limits.known_hosts or peer in self.learned

    def admit(self, sock: socket.socket, peer: str) -> bool:
        with self.lock:
            live = [c for c in self.conns.values() if c.sock.fileno() != -1]
            self.conns = {c.sock: c for c in live}
            unknown = [c for c in live if not self.known(c.peer)]
            bounds = [
                ([c for c in live if c.peer == peer], self.limits.per_peer),
                (unknown, None if self.known(peer) else self.unknown_share),
                (unknown + [c for c in live if self.known(c.peer)], self.total),
            ]
            for group, bound in bounds:
                if bound is not None and len(group) >= bound and not self._make_room(group):
                    self.refused += 1
                    return False
            self.conns[sock] = _Conn(sock, peer)
            return True

    def _make_room(self, group: list[_Conn]) -> bool:
        """Close the connection of ``group`` (unknown peers first) that has waited longest."""
        waiting = [c for c in group if not c.accepted and c.sock in self.conns]
        if not waiting:
            return False
        # silent ones first (a sender's request is on its way at once), unknown peers first
        oldest = min(waiting, key=lambda c: (not c.silent(), self.known(c.peer), c.opened))
        del self.conns[oldest.sock]
        with contextlib.suppress(OSError):  # its reader sees the end at once and closes
            oldest.sock.shutdown(socket.SHUT_RDWR)
        self.closed_for_room += 1
        return True

    def spoke(self, sock: socket.socket) -> None:
        with self.lock:
            conn = self.conns.get(sock)
            if conn is not None:
                conn.spoke = True

    def accepted(self, sock: socket.socket, sender: bool) -> None:
        with self.lock:
            conn = self.conns.get(sock)
            if conn is None:
                return
            conn.accepted = True
            if not sender:
                return
            self.learned.pop(conn.peer, None)
            self.learned[conn.peer] = None
            if len(self.learned) > self.MAX_LEARNED:
                del self.learned[next(iter(self.learned))]


class _StoreServer(ThreadedAssociationServer):
    # socketserver's listen backlog is 5: a burst of connections (modalities sending at once,
    # or a flood of idle ones) had its SYNs dropped and retried 1 s, 3 s... later.
    request_queue_size = 128
    on_artim: Callable[[], object] | None = None
    connections: _Connections | None = None

    def verify_request(self, request: Any, client_address: Any) -> bool:
        """Share the slots out before an association thread starts (``PeerLimits``)."""
        if self.connections is None or not isinstance(client_address, tuple):
            return True
        return self.connections.admit(cast(socket.socket, request), str(client_address[0]))


def start_store_server(
    ae: pynetdicom.AE,
    address: tuple[str, int],
    handlers: list[Any],
    on_artim: Callable[[], object] | None = None,
    peer_limits: PeerLimits | None = None,
) -> ThreadedAssociationServer:
    """Start a non-blocking storage server on ``address`` (as ``ae.start_server`` does).

    ``on_artim`` is called (on the connection's thread) for each connection closed because it
    had not completed an A-ASSOCIATE-RQ within the ARTIM timeout; never with the stock server.
    ``peer_limits`` (default ``PeerLimits()``) shares ``ae.maximum_associations`` slots among
    peer addresses; pynetdicom's own count (of threads, closing ones included) is then only a
    backstop, set above it.
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
    total = ae.maximum_associations
    limits = peer_limits or PeerLimits()
    server.connections = _Connections(limits, total)
    ae.maximum_associations = total + limits.per_peer  # threads of closed connections ending
    thread = threading.Thread(
        target=server.serve_forever, name=f"AcceptorServer@{address[1]}", daemon=True
    )
    thread.start()
    ae._servers.append(server)  # as start_server does: server.shutdown() removes it
    return server
