"""The DICOM node against real peers: dcmtk's storescu/echoscu and pynetdicom as SCU."""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pydicom
import pytest
from gateway_synth import make_study
from pynetdicom import AE
from pynetdicom.sop_class import MRImageStorage, Verification  # type: ignore[attr-defined]

from gateway.pacs_local import free_port
from gateway.scp import ReceivedStudy, StorageSCP
from gateway.spool import Syncer

STORESCU = "/usr/bin/storescu"
ECHOSCU = "/usr/bin/echoscu"
QUIET = 1.0
pytestmark = pytest.mark.integration

if not Path(STORESCU).exists():  # pragma: no cover
    pytest.skip("dcmtk is not installed (apt-get install dcmtk)", allow_module_level=True)


class Node:
    def __init__(self, spool: Path, **kw: object) -> None:
        self.done: list[ReceivedStudy] = []
        self.event = threading.Event()
        self.scp = StorageSCP(spool, port=0, quiet_s=QUIET, on_complete=self._on, **kw)  # type: ignore[arg-type]

    def _on(self, study: ReceivedStudy) -> None:
        self.done.append(study)
        self.event.set()

    def wait(self, n: int, timeout: float = 20.0) -> list[ReceivedStudy]:
        deadline = time.monotonic() + timeout
        while len(self.done) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        return list(self.done)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "spool")
    n.scp.start()
    try:
        yield n
    finally:
        n.scp.stop()


def storescu(
    port: int, files: list[Path], *extra: str, aet: str = "MODALITY1"
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            STORESCU,
            "-v",
            "-aet",
            aet,
            "-aec",
            "NEUROSANDBOX",
            *extra,
            "127.0.0.1",
            str(port),
            *map(str, files),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, TCP_NODELAY="1"),
    )


def test_a_study_is_spooled_byte_for_byte_and_completes_once(node: Node, tmp_path: Path) -> None:
    study = make_study(tmp_path / "src")
    r = storescu(node.scp.port, study.files)
    assert r.returncode == 0, r.stderr
    done = node.wait(1)
    time.sleep(QUIET + 0.5)  # nothing else may follow
    assert len(node.done) == 1
    got = done[0]
    assert got.study_uid == study.study_uid and got.n_instances == 12 == got.n_new
    assert got.calling_aets == ["MODALITY1"]
    for src in study.files:
        a = pydicom.dcmread(src)
        folder = Path(got.folder) / a.SeriesInstanceUID
        b = pydicom.dcmread(folder / f"{a.SOPInstanceUID}.dcm")
        assert b.PixelData == a.PixelData and b.PatientName == a.PatientName
        assert b.file_meta.SourceApplicationEntityTitle == "MODALITY1"
    assert not any((node.scp.spool / "incoming").iterdir())


def test_echo_answers() -> None:
    port = free_port()
    scp = StorageSCP(Path("/tmp") / f"nsbx-echo-{port}", port=port)
    scp.start()
    try:
        r = subprocess.run(
            [ECHOSCU, "-aec", "NEUROSANDBOX", "127.0.0.1", str(port)],
            capture_output=True,
            timeout=30,
        )
        assert r.returncode == 0
        wrong = subprocess.run(
            [ECHOSCU, "-aec", "SOMEONEELSE", "127.0.0.1", str(port)],
            capture_output=True,
            timeout=30,
        )
        assert wrong.returncode != 0  # the called AE title must be ours
    finally:
        scp.stop()


def test_an_aborted_association_is_quarantined_and_never_completes(
    node: Node, tmp_path: Path
) -> None:
    study = make_study(tmp_path / "src")
    r = storescu(node.scp.port, study.files, "--abort")
    assert r.returncode == 0, r.stderr
    time.sleep(QUIET + 1.5)
    assert node.done == []
    assert not (node.scp.spool / "studies" / study.study_uid).exists()
    quarantined = list((node.scp.spool / "quarantine").rglob("*.dcm"))
    assert len(quarantined) == 12


def test_abort_mid_study_keeps_partial_data_out_of_a_later_complete_send(
    node: Node, tmp_path: Path
) -> None:
    study = make_study(tmp_path / "src")
    ae = AE(ae_title="MODALITY2")
    ae.add_requested_context(MRImageStorage)
    assoc = ae.associate("127.0.0.1", node.scp.port, ae_title="NEUROSANDBOX")
    assert assoc.is_established
    for f in study.files[:4]:
        assert assoc.send_c_store(pydicom.dcmread(f)).Status == 0
    assoc.abort()
    time.sleep(QUIET + 1.0)
    assert node.done == []
    # The modality resends the whole study: exactly its 12 instances complete, once.
    assert storescu(node.scp.port, study.files[6:]).returncode == 0
    done = node.wait(1)
    assert done and done[0].n_instances == 6  # the aborted 4 are not in the study folder
    assert storescu(node.scp.port, study.files[:6]).returncode == 0
    done = node.wait(2)
    assert len(done) == 2 and done[1].n_instances == 12 and done[1].n_new == 6


def test_ten_simultaneous_associations_are_all_stored(node: Node, tmp_path: Path) -> None:
    studies = [make_study(tmp_path / f"s{i}", n_slices=3, patient_id=f"P{i}") for i in range(10)]
    procs = [
        subprocess.Popen(
            [
                STORESCU,
                "-aet",
                f"MOD{i}",
                "-aec",
                "NEUROSANDBOX",
                "127.0.0.1",
                str(node.scp.port),
                *map(str, s.files),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i, s in enumerate(studies)
    ]
    codes = [p.wait(timeout=120) for p in procs]
    assert codes == [0] * 10
    done = node.wait(10, timeout=30)
    assert sorted(d.study_uid for d in done) == sorted(s.study_uid for s in studies)
    assert all(d.n_instances == 6 for d in done)
    assert sum(1 for _ in (node.scp.spool / "studies").rglob("*.dcm")) == 60


def test_a_calling_ae_outside_the_allowed_list_stores_nothing(tmp_path: Path) -> None:
    n = Node(tmp_path / "spool", allowed_calling_aets=["PACS1"])
    n.scp.start()
    try:
        study = make_study(tmp_path / "src", n_slices=2)
        r = storescu(n.scp.port, study.files, aet="INTRUDER")
        assert r.returncode != 0 or "Refused" in r.stderr or "Abort" in r.stderr
        time.sleep(QUIET + 0.5)
        assert n.done == [] and not (n.scp.spool / "studies" / study.study_uid).exists()
    finally:
        n.scp.stop()


SCP_PROCESS = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from gateway.scp import StorageSCP
    scp = StorageSCP(Path(sys.argv[1]), port=int(sys.argv[2]), quiet_s=0.5)
    scp.start()
    print("READY", flush=True)
    sys.stdin.read()
    scp.stop()
    """
)


def _limit_file_size() -> None:
    # A real write failure without root: the kernel refuses files over 200 kB (EFBIG;
    # Python ignores SIGXFSZ, so write() raises OSError like a full disk would).
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))


def test_a_failed_disk_write_answers_out_of_resources(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", SCP_PROCESS, str(tmp_path / "spool"), str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_limit_file_size,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
        big = make_study(tmp_path / "big", classes=("T1",), n_slices=1, size=512).files
        small = make_study(tmp_path / "small", classes=("T1",), n_slices=1).files
        assert big[0].stat().st_size > 200_000
        r = storescu(port, small + big)  # storescu stops at the first refusal
        log = r.stdout + r.stderr
        assert "0xa700" in log.lower() or "Out of Resources" in log or "OutOfResources" in log, log
        time.sleep(1.5)
        stored = list((tmp_path / "spool" / "studies").rglob("*.dcm"))
        assert [p.stem for p in stored] == [pydicom.dcmread(small[0]).SOPInstanceUID]
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)
    assert "answered 0xA700" in (proc.stderr.read() if proc.stderr else "")


@pytest.mark.parametrize("policy", ["instance", "off"])
def test_every_fsync_policy_spools_the_same_files(tmp_path: Path, policy: str) -> None:
    n = Node(tmp_path / "spool", fsync=policy)
    n.scp.start()
    try:
        study = make_study(tmp_path / "src", classes=("T1",), n_slices=4)
        assert storescu(n.scp.port, study.files).returncode == 0
        done = n.wait(1)
        assert done and done[0].n_instances == 4
        for src in study.files:
            a = pydicom.dcmread(src)
            b = pydicom.dcmread(
                Path(done[0].folder) / a.SeriesInstanceUID / f"{a.SOPInstanceUID}.dcm"
            )
            assert b.PixelData == a.PixelData
        assert not list(Path(done[0].folder).rglob("*.part"))
    finally:
        n.scp.stop()


class _FailingSyncer(Syncer):
    # A disk that accepts writes but fails to flush them cannot be staged without root:
    # the fsync call is the one thing replaced, everything around it is the real node.
    @staticmethod
    def _fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")


def test_files_that_never_reach_the_disk_are_not_evaluated(tmp_path: Path) -> None:
    n = Node(tmp_path / "spool")
    n.scp._syncer = _FailingSyncer()
    n.scp.start()
    try:
        study = make_study(tmp_path / "src", classes=("T1",), n_slices=20)
        r = storescu(n.scp.port, study.files)
        time.sleep(QUIET + 1.0)
        assert n.done == []
        assert not (n.scp.spool / "studies" / study.study_uid).exists()
        assert list((n.scp.spool / "quarantine").rglob("*.dcm"))
        # Once the failure is known, the association's later C-STOREs are refused.
        log = (r.stdout + r.stderr).lower()
        assert r.returncode != 0 or "0xa700" in log or "out of resources" in log, log
    finally:
        n.scp.stop()


def test_a_c_store_from_a_c_move_takes_pynetdicoms_own_path_and_is_kept(
    node: Node, tmp_path: Path
) -> None:
    study = make_study(tmp_path / "src", classes=("T1",), n_slices=2)
    ae = AE(ae_title="PACS")
    ae.add_requested_context(MRImageStorage)
    ae.add_requested_context(Verification)
    assoc = ae.associate("127.0.0.1", node.scp.port, ae_title="NEUROSANDBOX")
    assert assoc.is_established
    for f in study.files:  # Move Originator fields: not the fast reader's, the stock decoder's
        st = assoc.send_c_store(pydicom.dcmread(f), originator_aet="PACS", originator_id=7)
        assert st.Status == 0
    assert assoc.send_c_echo().Status == 0
    assoc.release()
    done = node.wait(1)
    assert done and done[0].n_instances == 2 and done[0].calling_aets == ["PACS"]
    for f in study.files:
        a = pydicom.dcmread(f)
        b = pydicom.dcmread(Path(done[0].folder) / a.SeriesInstanceUID / f"{a.SOPInstanceUID}.dcm")
        assert b.PixelData == a.PixelData and b.PatientName == a.PatientName


def test_the_quiet_time_runs_from_the_last_instance_not_from_the_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A study is complete once no association sends to it and the quiet time has passed since
    its last instance: a slow commit (fsync of a large association) is not followed by a whole
    quiet time more."""
    from gateway.spool import SyncBatch

    slow = 2.5 * QUIET
    real = SyncBatch.wait

    def slow_fsync(self: SyncBatch) -> None:  # the association's files on disk, slowly
        time.sleep(slow)
        real(self)

    monkeypatch.setattr(SyncBatch, "wait", slow_fsync)
    completed: list[float] = []
    n = Node(tmp_path / "spool")
    on = n._on

    def timed(study: ReceivedStudy) -> None:
        completed.append(time.time())
        on(study)

    n.scp.on_complete = timed
    n.scp.start()
    try:
        study = make_study(tmp_path / "src")
        r = storescu(n.scp.port, study.files)
        assert r.returncode == 0, r.stderr
        (got,) = n.wait(1, timeout=30)
    finally:
        n.scp.stop()
    after_last = completed[0] - got.last_received
    # the commit alone takes `slow` (> the quiet time): complete right after it, not a quiet
    # time later
    assert slow <= after_last < slow + 0.6 * QUIET, after_last
