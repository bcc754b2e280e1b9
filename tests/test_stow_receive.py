"""STOW-RS into the gateway (POST /dicomweb/studies): a study sent by a real HTTP client (curl)
is evaluated like one sent by C-STORE; a malformed or oversize body is a clear 4xx and nothing
of it is stored; only admin and sender tokens may send, and a sender token reads nothing."""

from __future__ import annotations

import contextlib
import json
import resource
import shutil
import socket
import subprocess
import threading
import time
import tracemalloc
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pydicom
import pytest
import uvicorn
from gateway_inproc import finished_runs, rules_file, start_gateway
from orthanc_fixture import OrthancServer

from gateway.api import create_app
from gateway.auth import Role
from gateway.pacs.multipart import encode_related
from gateway.pacs_local import free_port
from gateway.runs import RunStatus
from gateway.scp import StorageSCP
from gateway.serve import Gateway, api_server_config
from tests.gateway_synth import make_study

pytestmark = pytest.mark.integration
CURL = shutil.which("curl")
QUIET_S = 1.0  # the gateway's quiet time in these tests
MAX_BODY = 400_000  # the test's STOW bound (the default is 2 GiB)
BODY_TIMEOUT_S = 3.0  # the test's STOW body deadline (the default is 600 s); 1 s cut off a whole body under CI load


class Stow:
    def __init__(self, gw: Gateway, base: str, tokens: dict[str, str]) -> None:
        self.gw, self.base, self.tokens = gw, base, tokens

    def post(self, body: Path, content_type: str, who: str = "sender", path: str = "/dicomweb/studies",
             chunked: bool = False) -> tuple[int, dict]:  # fmt: skip
        """curl, as a hospital's script would send it; (status, JSON answer)."""
        args = [str(CURL), "-s", "-o", "-", "-w", "\n%{http_code}", "-X", "POST",
                "-H", f"Content-Type: {content_type}", "-H", "Accept: application/dicom+json"]  # fmt: skip
        if who:
            args += ["-H", f"Authorization: Bearer {self.tokens[who]}"]
        if chunked:
            args += ["-H", "Transfer-Encoding: chunked"]
        args += ["--data-binary", f"@{body}", f"{self.base}{path}"]
        out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True).stdout
        text, _, code = out.rpartition("\n")
        return int(code), (json.loads(text) if text.strip().startswith("{") else {"raw": text})

    def spooled(self) -> list[str]:
        spool = self.gw.ctx.settings.data_dir / "spool"
        return sorted(p.name for p in (spool / "studies").iterdir() if p.is_dir()) + sorted(
            f"{d}/{p.name}" for d in ("incoming", "receiving") for p in (spool / d).glob("*")
        )


@pytest.fixture(scope="module")
def stow(orthanc_server: OrthancServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stow]:
    if CURL is None:
        pytest.skip("curl is not installed")
    data = tmp_path_factory.mktemp("stow-data")
    routing = rules_file(data.parent / "stow-rules.yaml", ["differential"])
    gw = start_gateway(orthanc_server, data, routing, QUIET_S, stow_max_body_bytes=MAX_BODY,
                       stow_body_timeout_s=BODY_TIMEOUT_S)  # fmt: skip
    port = free_port()
    server = uvicorn.Server(api_server_config(create_app(gw.ctx), gw.ctx.settings, port))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{base}/health", timeout=2)
            break
        except OSError:
            assert time.monotonic() < deadline, "the API did not start"
            time.sleep(0.1)
    tokens = {
        "sender": gw.ctx.tokens.create(Role.SENDER, "mri-1")[1],
        "admin": gw.ctx.tokens.create(Role.ADMIN, "stow-admin")[1],
        "reviewer": gw.ctx.tokens.create(Role.REVIEWER, "stow-reviewer", "Rev^Iewer")[1],
    }
    try:
        yield Stow(gw, base, tokens)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        gw.stop()


def _body(tmp: Path, parts: list[bytes | Path]) -> tuple[Path, str]:
    content_type, chunks = encode_related(parts)
    path = tmp / "body.bin"
    path.write_bytes(b"".join(chunks))
    return path, content_type


def test_a_study_sent_by_stow_is_evaluated_like_one_sent_by_c_store(
    stow: Stow, tmp_path: Path
) -> None:
    study = make_study(tmp_path / "s", classes=("FLAIR", "T2"), n_slices=3, patient_id="STOW-1")
    body, ct = _body(tmp_path, list(study.files))
    code, answer = stow.post(body, ct)
    assert code == 200, answer
    stored = answer["00081199"]["Value"]
    assert len(stored) == 6 and "00081198" not in answer
    assert {i["00081155"]["Value"][0] for i in stored} == {
        str(pydicom.dcmread(f).SOPInstanceUID) for f in study.files
    }
    # spooled by study and patient under the node's own File Meta, as C-STORE'd instances are
    (folder,) = [n for n in stow.spooled() if n.startswith(study.study_uid)]
    spooled = sorted((stow.gw.ctx.settings.data_dir / "spool" / "studies" / folder).rglob("*.dcm"))
    assert len(spooled) == 6
    meta = pydicom.dcmread(spooled[0], stop_before_pixels=True).file_meta
    assert meta.SourceApplicationEntityTitle == "STOW-RS"
    (run,) = finished_runs(stow.gw, 1, study.study_uid, timeout_s=120)
    assert run.status is RunStatus.DONE, run
    assert run.trigger == "dicom" and run.route is not None and run.route.tasks == ["differential"]
    assert not [
        n for n in stow.spooled() if n.startswith(("incoming/", "receiving/"))
    ]  # nothing left behind
    # the audit log: the route's line, and what came of the request, by the sender's token id
    sender_id = stow.tokens["sender"].split("_")[1]
    log = (stow.gw.ctx.settings.data_dir / "audit.jsonl").read_text().splitlines()
    mine = [json.loads(line) for line in log if f'"actor":"{sender_id}"' in line.replace(" ", "")]
    line = next(e for e in mine if e["action"] == "stow-rs store")
    assert line["outcome"] == "200" and line["detail"] == "6 stored, 0 refused"
    assert any(e["action"] == "POST /dicomweb/studies" and e["outcome"] == "200" for e in mine)


def test_a_bad_body_is_a_clear_4xx_and_nothing_is_stored(stow: Stow, tmp_path: Path) -> None:
    study = make_study(tmp_path / "s", classes=("FLAIR",), n_slices=2, patient_id="STOW-BAD")
    before = stow.spooled()
    body, ct = _body(tmp_path, list(study.files))
    cut = tmp_path / "cut.bin"
    cut.write_bytes(body.read_bytes()[:-40])  # the closing boundary never comes
    code, answer = stow.post(cut, ct)
    assert code == 400 and "before the closing boundary" in answer["detail"]
    code, answer = stow.post(body, "application/dicom")
    assert code == 415 and "multipart/related" in answer["detail"]
    big = [study.files[0]] * (MAX_BODY // study.files[0].stat().st_size + 2)
    body, ct = _body(tmp_path, list(big))
    for chunked in (False, True):  # by Content-Length, and by counting a chunked stream
        code, answer = stow.post(body, ct, chunked=chunked)
        assert code == 413 and str(MAX_BODY) in answer.get("detail", ""), (chunked, answer)
    assert stow.spooled() == before


def test_each_file_has_its_own_outcome(stow: Stow, tmp_path: Path) -> None:
    study = make_study(tmp_path / "s", classes=("T1",), n_slices=2, patient_id="STOW-MIX")
    other = make_study(tmp_path / "o", classes=("T1",), n_slices=1, patient_id="STOW-MIX")
    body, ct = _body(tmp_path, [*study.files, b"not a DICOM file at all", *other.files])
    code, answer = stow.post(body, ct, path=f"/dicomweb/studies/{study.study_uid}")
    assert code == 202, answer
    assert len(answer["00081199"]["Value"]) == 2
    reasons = sorted(i["00081197"]["Value"][0] for i in answer["00081198"]["Value"])
    assert reasons == [0xA900, 0xC000]  # another study than the URL's; not DICOM
    # PS3.18: a failed item names its instance (Type 1), so the sender knows which to resend;
    # only a part that is not DICOM at all has no UIDs to name
    (refused,) = [i for i in answer["00081198"]["Value"] if i["00081197"]["Value"] == [0xA900]]
    theirs = pydicom.dcmread(other.files[0])
    assert refused["00081155"]["Value"] == [str(theirs.SOPInstanceUID)]
    assert refused["00081150"]["Value"] == [str(theirs.SOPClassUID)]
    assert not [n for n in stow.spooled() if n.startswith(other.study_uid)]


def _without_group_length(src: Path, dest: Path, shift: int | None = None) -> Path:
    """A copy of a Part 10 file whose File Meta Information Group Length (0002,0000), a UL
    right after DICM, is left out (``shift`` None) or off by ``shift`` bytes: other writers
    omit it or get it wrong, and the group is still read element by element (as pydicom and
    dcmtk do)."""
    data = src.read_bytes()
    assert data[132:138] == b"\x02\x00\x00\x00UL"
    if shift is None:
        dest.write_bytes(data[:132] + data[144:])
    else:
        length = int.from_bytes(data[140:144], "little") + shift
        dest.write_bytes(data[:140] + length.to_bytes(4, "little") + data[144:])
    pydicom.dcmread(dest)  # still a file pydicom reads
    return dest


@pytest.mark.parametrize("shift", [None, 8, -8])
def test_a_file_meta_without_a_right_group_length_is_read_by_its_elements(
    stow: Stow, tmp_path: Path, shift: int | None
) -> None:
    study = make_study(tmp_path / "s", classes=("T1",), n_slices=1, patient_id="STOW-META")
    odd = _without_group_length(study.files[0], tmp_path / "odd.dcm", shift)
    body, ct = _body(tmp_path, [odd])
    code, answer = stow.post(body, ct)
    assert code == 200, answer
    (folder,) = [n for n in stow.spooled() if n.startswith(study.study_uid)]
    (spooled,) = (stow.gw.ctx.settings.data_dir / "spool" / "studies" / folder).rglob("*.dcm")
    assert pydicom.dcmread(spooled).SOPInstanceUID == pydicom.dcmread(odd).SOPInstanceUID


def test_only_admin_and_sender_tokens_send_and_a_sender_reads_nothing(
    stow: Stow, tmp_path: Path
) -> None:
    study = make_study(tmp_path / "s", classes=("T1",), n_slices=1, patient_id="STOW-AUTH")
    body, ct = _body(tmp_path, list(study.files))
    assert stow.post(body, ct, who="")[0] == 401
    assert stow.post(body, ct, who="reviewer")[0] == 403
    assert stow.post(body, ct, who="admin")[0] == 200
    req = urllib.request.Request(f"{stow.base}/studies",
                                 headers={"Authorization": f"Bearer {stow.tokens['sender']}"})  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=10)
    assert exc.value.code == 403  # a known token, not allowed here: it says what it may do
    assert b"sender token" in exc.value.read()
    for path in ("/runs", "/audit"):
        req = urllib.request.Request(f"{stow.base}{path}",
                                     headers={"Authorization": f"Bearer {stow.tokens['sender']}"})  # fmt: skip
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(req, timeout=10)
        assert exc.value.code == 403, path
    # the audit log: the sender's request, by its token id, and what came of it
    sender_id = stow.tokens["sender"].split("_")[1]
    events = [json.loads(line) for line in
              (stow.gw.ctx.settings.data_dir / "audit.jsonl").read_text().splitlines()]  # fmt: skip
    mine = {(e["action"], e["outcome"]) for e in events if e["actor"] == sender_id}
    assert {("POST /dicomweb/studies", "200"), ("GET /runs", "403")} <= mine, mine


def test_stow_has_its_own_body_deadline_and_every_other_route_keeps_the_api_bound(
    stow: Stow,
) -> None:
    port = int(stow.base.rsplit(":", 1)[1])
    ct = 'multipart/related; type="application/dicom"; boundary=x'
    with socket.create_connection(("127.0.0.1", port), timeout=BODY_TIMEOUT_S + 10) as s:
        s.sendall(
            f"POST /dicomweb/studies HTTP/1.1\r\nHost: x\r\nContent-Type: {ct}\r\n"
            f"Authorization: Bearer {stow.tokens['sender']}\r\nContent-Length: 100000\r\n\r\n"
            "--x\r\n\r\n".encode()
            + b"\0" * 1000
        )
        t0, reply = time.monotonic(), b""
        while chunk := s.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert time.monotonic() - t0 < BODY_TIMEOUT_S + 3
    assert not [n for n in stow.spooled() if n.startswith(("incoming/", "receiving/"))]
    # the API's 1 MiB bound still holds on the other routes (the headers alone say it: the
    # answer comes before the body, which is never sent)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(
            f"POST /studies/abc/evaluations HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {stow.tokens['admin']}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {(1 << 20) + 1}\r\n\r\n".encode()
        )
        reply = s.recv(65536)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]


def test_a_client_that_leaves_mid_body_stores_nothing_and_the_gateway_goes_on(
    stow: Stow, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    study = make_study(tmp_path / "s", classes=("T1",), n_slices=2, patient_id="STOW-LEFT")
    body, ct = _body(tmp_path, list(study.files))
    whole = body.read_bytes()
    port = int(stow.base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(
            f"POST /dicomweb/studies HTTP/1.1\r\nHost: x\r\nContent-Type: {ct}\r\n"
            f"Authorization: Bearer {stow.tokens['sender']}\r\n"
            f"Content-Length: {len(whole)}\r\n\r\n".encode()
            + whole[: len(whole) // 2]
        )
    time.sleep(0.5)
    assert not [
        n for n in stow.spooled() if n.startswith((study.study_uid, "incoming/", "receiving/"))
    ]
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")], [
        r.getMessage() for r in caplog.records
    ]
    code, answer = stow.post(body, ct)
    assert code == 200, answer


def test_a_body_refused_mid_stream_closes_the_connection(stow: Stow) -> None:
    """413 while a chunked body streams: the rest is never read, so the connection is closed
    at once (it was kept, the rest of the body read and dropped, for another request)."""
    port = int(stow.base.rsplit(":", 1)[1])
    ct = 'multipart/related; type="application/dicom"; boundary=x'
    chunk = b"--x\r\n\r\n" + b"\0" * MAX_BODY
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(
            f"POST /dicomweb/studies HTTP/1.1\r\nHost: x\r\nContent-Type: {ct}\r\n"
            f"Authorization: Bearer {stow.tokens['sender']}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n".encode()
            + b"%x\r\n" % len(chunk)
            + chunk
            + b"\r\n"
        )
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += s.recv(65536)
        assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
        assert b"connection: close" in reply.lower()
        with contextlib.suppress(OSError):  # the server may have closed already
            s.sendall(b"0\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        rest = b""
        with contextlib.suppress(OSError):
            while chunk := s.recv(65536):
                rest += chunk
    assert b"HTTP/1.1 200" not in rest  # no second request on that connection


def test_a_large_instance_is_held_once_while_it_is_staged(tmp_path: Path) -> None:
    """The node's STOW-RS path holds one copy of a part's bytes, as C-STORE holds one (it held
    three: the file read whole, the dataset copied for the UID scan, then the file meta)."""
    study = make_study(tmp_path / "s", classes=("T1",), n_slices=1, size=2048, patient_id="BIG")
    (src,) = study.files
    size = src.stat().st_size
    assert size > 8 << 20
    scp = StorageSCP(tmp_path / "spool", port=0, fsync="off")
    for d in (scp.incoming, scp.studies_dir, scp.quarantine):
        d.mkdir(parents=True)
    tracemalloc.start()
    try:
        (outcome,) = scp.receive_files([src])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert outcome.status == 0, outcome
    assert peak < 1.5 * size, f"{peak / size:.1f} times the instance's size"


def test_a_body_cut_by_a_crash_is_gone_at_the_next_start_never_quarantined(
    tmp_path: Path,
) -> None:
    """The parts of a body still arriving when the gateway stopped are fragments, never
    instances a sender was told were stored: the next start removes them (they were
    quarantined as an interrupted association, and counted as quarantined instances)."""
    spool = tmp_path / "spool"
    before = StorageSCP(spool, port=0)
    folder = before.receiving_folder()  # where the API streams a request's parts
    (folder / "000000.dcm").write_bytes(b"\0" * 128 + b"DICM" + b"half a part")
    after = StorageSCP(spool, port=0)
    after.start()
    try:
        assert not folder.exists()
        assert not [p for p in (spool / "quarantine").rglob("*") if p.is_file()]
        assert not [p for p in (spool / "incoming").rglob("*") if p.is_file()]
    finally:
        after.stop()


def test_a_body_the_disk_cannot_take_is_503_and_stores_nothing(
    stow: Stow, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A write of the body that fails (a full disk; here the process's file size limit, so
    the write fails as it would: EFBIG, Python ignores SIGXFSZ) is the server's condition, said
    as such (503, retry later), not an 'Internal Server Error' with a traceback."""
    study = make_study(tmp_path / "s", classes=("T1",), n_slices=1, size=256, patient_id="DISK")
    body, ct = _body(tmp_path, list(study.files))
    assert 100_000 < body.stat().st_size < MAX_BODY
    # the limit is the whole process's: the studies earlier tests sent must be evaluated (and
    # their files written) before it is set, or their runs fail for it
    time.sleep(QUIET_S + 1.0)
    assert stow.gw.pipeline.wait_idle(120)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64_000, hard))
    try:
        code, answer = stow.post(body, ct)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert code == 503 and "nothing stored" in answer.get("detail", ""), answer
    assert not [n for n in stow.spooled() if n.startswith((study.study_uid, "receiving/"))]
    # one line for the operator, no traceback
    assert not [r for r in caplog.records if r.exc_info or "ASGI" in r.getMessage()]
    assert any("could not be written" in r.getMessage() for r in caplog.records)
    assert stow.post(body, ct)[0] == 200  # once the disk takes it again
