"""The DICOM node's hot path against pynetdicom's and pydicom's own codecs (no peers needed)."""

from __future__ import annotations

import errno
import gzip
import io
import os
import socket
import threading
from pathlib import Path

import pydicom
import pytest
from conftest import corpus_path
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence
from pydicom.uid import ExplicitVRLittleEndian, ImplicitVRLittleEndian, generate_uid
from pynetdicom.dimse_messages import C_STORE_RQ, C_STORE_RSP, DIMSEMessage
from pynetdicom.dimse_primitives import C_STORE

from gateway.part10 import read_uids, scan_uids
from gateway.scp_transport import fast_path_available, store_request, store_response_bytes
from gateway.spool import SyncBatch, Syncer, write_instance

MR = "1.2.840.10008.5.1.4.1.1.4"

# --------------------------------------------------------------------------- command sets


def _stock_rsp(sop_class: str | None, msg_id: int, status: int, sop: str | None) -> bytes:
    rsp = C_STORE()
    rsp.MessageIDBeingRespondedTo = msg_id
    rsp.AffectedSOPClassUID = sop_class
    rsp.AffectedSOPInstanceUID = sop
    rsp.Status = status
    msg = C_STORE_RSP()
    msg.primitive_to_message(rsp)
    (pdata,) = list(msg.encode_msg(1, 16382))
    ((_cx, pdv),) = pdata.presentation_data_value_list
    assert pdv[0] == 0x03  # last command fragment
    return bytes(pdv[1:])


@pytest.mark.parametrize(
    ("sop_class", "msg_id", "status", "sop"),
    [
        (MR, 1, 0x0000, "1.2.3.4"),  # even-length UIDs
        (MR + "1", 65535, 0xA700, "1.2.3.45"),  # odd lengths are NUL-padded
        (
            "1.2.840.10008.5.1.4.1.1.2",
            7,
            0xC000,
            "1.2.826.0.1.3680043.8.498.59026990456331612222356652437946249709",
        ),
        (None, 3, 0xA900, None),  # no UIDs: elements omitted, as pynetdicom does
    ],
)
def test_the_c_store_response_is_byte_for_byte_pynetdicoms(
    sop_class: str | None, msg_id: int, status: int, sop: str | None
) -> None:
    assert store_response_bytes(sop_class, msg_id, status, sop) == _stock_rsp(
        sop_class, msg_id, status, sop
    )


def _received(req: C_STORE) -> DIMSEMessage:
    """A C-STORE-RQ as the reader has it: encoded by pynetdicom, then decoded from P-DATA."""
    out = C_STORE_RQ()
    out.primitive_to_message(req)
    msg = DIMSEMessage()
    done = False
    for pdata in out.encode_msg(1, 4096):
        done = msg.decode_msg(pdata)
    assert done
    return msg


def _request(**extra: object) -> C_STORE:
    req = C_STORE()
    req.MessageID = 42
    req.AffectedSOPClassUID = MR
    req.AffectedSOPInstanceUID = generate_uid()
    req.Priority = 1
    req.DataSet = io.BytesIO(b"\x08\x00\x16\x00UI\x02\x001\x00" * 500)
    for k, v in extra.items():
        setattr(req, k, v)
    return req


def test_the_c_store_request_reads_as_pynetdicoms() -> None:
    req = _request()
    fast = store_request(_received(req))
    stock = _received(req).message_to_primitive()
    assert fast is not None and isinstance(stock, C_STORE)
    for name in ("MessageID", "AffectedSOPClassUID", "AffectedSOPInstanceUID", "Priority"):
        assert getattr(fast, name) == getattr(stock, name) == getattr(req, name), name
    assert fast.DataSet is not None and stock.DataSet is not None and req.DataSet is not None
    assert fast.DataSet.getvalue() == stock.DataSet.getvalue() == req.DataSet.getvalue()
    assert fast._context_id == stock._context_id == 1


def test_unusual_requests_are_left_to_pynetdicom() -> None:
    moved = _request(MoveOriginatorApplicationEntityTitle="PACS", MoveOriginatorMessageID=9)
    assert store_request(_received(moved)) is None  # the stock decoder handles these
    stock = _received(moved).message_to_primitive()
    assert isinstance(stock, C_STORE) and stock.MoveOriginatorApplicationEntityTitle == "PACS"
    # A command set with an element the fast reader does not know, or a repeated one.
    msg = _received(_request())
    raw = msg.encoded_command_set.getvalue()
    msg.encoded_command_set = io.BytesIO(raw + b"\x00\x00\x02\x09\x02\x00\x00\x00ab")
    assert store_request(msg) is None
    msg.encoded_command_set = io.BytesIO(raw + raw[-12:])
    assert store_request(msg) is None
    msg.encoded_command_set = io.BytesIO(raw[:-3])  # truncated
    assert store_request(msg) is None


def test_the_fast_path_follows_the_installed_pynetdicom() -> None:
    # If this fails, pynetdicom moved past 3.0: check gateway/scp_transport.py against its
    # internals, then extend FAST_PATH_VERSIONS (the node falls back to the stock server).
    assert fast_path_available()


# --------------------------------------------------------------------------- UIDs


def _encode(ds: Dataset, implicit: bool) -> bytes:
    out = io.BytesIO()
    ds.save_as(out, enforce_file_format=False, implicit_vr=implicit, little_endian=True)
    return out.getvalue()


def _dataset(undefined: bool) -> Dataset:
    inner = Dataset()
    inner.ReferencedSOPClassUID = MR
    inner.ReferencedSOPInstanceUID = generate_uid()
    deeper = Dataset()
    deeper.CodeValue = "T-A0100"
    inner.ConceptNameCodeSequence = Sequence([deeper])
    ds = Dataset()
    ds.SOPClassUID = MR
    ds.SOPInstanceUID = generate_uid()
    ds.ReferencedImageSequence = Sequence([inner, inner])
    ds.add_new(0x00190010, "LO", "SIEMENS MR HEADER")
    ds.add_new(0x0019100C, "IS", "1000")
    ds.StudyInstanceUID = "1.2.826.0.1.3680043.8.498.12345"  # odd: NUL-padded on the wire
    ds.SeriesInstanceUID = generate_uid()
    ds.InstanceNumber = 3
    ds.add_new(0x7FE00010, "OB", b"\0" * 64)
    if undefined:
        ds["ReferencedImageSequence"].is_undefined_length = True
        inner["ConceptNameCodeSequence"].is_undefined_length = True
        for item in (inner, deeper):
            item.is_undefined_length_sequence_item = True
    return ds


@pytest.mark.parametrize("implicit", [True, False])
@pytest.mark.parametrize("undefined", [True, False])
def test_the_uid_walk_reads_what_pydicom_reads(implicit: bool, undefined: bool) -> None:
    ds = _dataset(undefined)
    raw = _encode(ds, implicit)
    assert (b"\xff\xff\xff\xff" in raw) == undefined
    want = (ds.StudyInstanceUID, ds.SeriesInstanceUID, str(ds.get("PatientID", "")), "")
    assert scan_uids(memoryview(raw), implicit) == want
    ts = ImplicitVRLittleEndian if implicit else ExplicitVRLittleEndian
    assert read_uids(io.BytesIO(raw), ts) == want


def test_the_uid_walk_hands_odd_data_to_pydicom_and_reports_missing_uids() -> None:
    ds = _dataset(undefined=True)
    raw = _encode(ds, implicit=False)
    assert scan_uids(memoryview(raw[:40]), False) is None  # cut inside an element
    del ds.SeriesInstanceUID
    with pytest.raises(KeyError):
        scan_uids(memoryview(_encode(ds, implicit=False)), False)
    with pytest.raises(KeyError):  # the pydicom path agrees
        read_uids(io.BytesIO(_encode(ds, implicit=True)), ImplicitVRLittleEndian)
    # A sequence encoded as UN with undefined length: the walk declines, pydicom reads it.
    un = bytearray(_encode(_dataset(undefined=True), implicit=False))
    at = un.index(b"\x08\x00\x40\x11SQ")  # ReferencedImageSequence
    un[at + 4 : at + 6] = b"UN"
    assert scan_uids(memoryview(bytes(un)), False) is None


@pytest.mark.corpus
def test_the_uid_walk_agrees_with_pydicom_on_the_corpus() -> None:
    files = sorted(p for p in corpus_path().rglob("*") if p.suffix in (".dcm", ".gz"))
    files = [p for p in files if p.suffix == ".dcm"] + [p for p in files if p.suffix == ".gz"][::40]
    walked = compared = 0
    for path in files:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        try:
            ds = pydicom.dcmread(io.BytesIO(data), stop_before_pixels=True)
            ts = str(ds.file_meta.TransferSyntaxUID)
            expected = (
                str(ds.StudyInstanceUID),
                str(ds.SeriesInstanceUID),
                str(ds.get("PatientID", "") or "").strip(" \0")[:64],
                str(ds.get("IssuerOfPatientID", "") or "").strip(" \0")[:64],
            )
        except Exception:
            continue  # hostile or incomplete: the SCP refuses those by status
        if data[128:132] != b"DICM" or ts == "1.2.840.10008.1.2.2":
            continue
        body = data[132 + 12 + int.from_bytes(data[140:144], "little") :]
        compared += 1
        try:
            got = scan_uids(memoryview(body), ts == ImplicitVRLittleEndian)
        except KeyError:
            got = None
        if got is not None:
            walked += 1
            assert got == expected, path
    assert compared > 100 and walked > 0.9 * compared, (walked, compared)


# --------------------------------------------------------------------------- spool writes


def test_a_failed_write_leaves_no_file(tmp_path: Path) -> None:
    dest, tmp = tmp_path / "x.dcm", tmp_path / ".0.part"

    def parts() -> object:
        yield b"half"
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError):
        write_instance(dest, tmp, parts(), "instance")  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
    write_instance(dest, tmp, [b"DICM", memoryview(b"body")], "off")
    assert dest.read_bytes() == b"DICMbody" and not tmp.exists()


def test_the_syncer_reports_a_failed_fsync_and_closes_every_file(tmp_path: Path) -> None:
    syncer = Syncer()
    syncer.start()
    try:
        ok, bad = SyncBatch(), SyncBatch()
        good_fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
        read_end, write_end = os.pipe()  # fsync of a pipe fails (EINVAL): a real error
        syncer.submit(ok, good_fd)
        syncer.submit(bad, write_end)
        assert ok.wait(10) and bad.wait(10)
        assert ok.error is None
        assert bad.error is not None and bad.error.errno == errno.EINVAL
        for fd in (good_fd, write_end):
            with pytest.raises(OSError):
                os.fstat(fd)  # closed by the syncer
        os.close(read_end)
    finally:
        syncer.stop()


# --------------------------------------------------------------------------- socket reads


def test_a_pdu_is_read_whole_and_a_hostile_length_allocates_in_step_with_the_data() -> None:
    from pynetdicom import AE
    from pynetdicom._globals import MODE_ACCEPTOR

    from gateway.scp_transport import _StoreAssociation, _StoreSocket

    assoc = _StoreAssociation(AE(), MODE_ACCEPTOR)
    ours, peer = socket.socketpair()
    try:
        sock = _StoreSocket(assoc, client_socket=ours)
        payload = os.urandom(3_000_000)  # more than the first allocation, sent in pieces
        sender = threading.Thread(target=peer.sendall, args=(payload,))
        sender.start()
        assert sock.recv(len(payload)) == payload
        sender.join()
        peer.sendall(b"0123456789")
        peer.close()  # then the peer goes away
        got = sock.recv(0xFFFFFFFF)  # a 4 GB PDU length from the wire
        assert got == b"0123456789"
    finally:
        ours.close()
        peer.close()
