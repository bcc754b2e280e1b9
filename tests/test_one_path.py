"""One straight path for one study received by C-STORE: every file's header read once, the
instances in Orthanc while they arrive, one write-back (a real Orthanc, dcmtk's storescu as the
sender, the gateway's DICOM node, pipeline and evaluator in this process)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from gateway_synth import make_study
from orthanc_fixture import OrthancServer

from gateway.audit import AuditLog
from gateway.cache import InstanceCache
from gateway.default_evaluator import DefaultEvaluator
from gateway.forward import Forwarder
from gateway.orthanc import OrthancClient
from gateway.pipeline import StudyPipeline
from gateway.routing import Router
from gateway.runs import RunStatus, StudyRunStore
from gateway.scp import StorageSCP
from gateway.settings import Settings
from gateway.sr import series_uid_for

pytestmark = pytest.mark.integration
STORESCU = "/usr/bin/storescu"

# Opens of the spool's files, by inode (a hard link or a copy under another name is the same
# file), except the decoder's reads of the pixels of the slices it renders.
_COUNTING = threading.Event()
_OPENS: Counter[tuple[int, int]] = Counter()
_WATCHED: list[str] = []


def _hook(event: str, args: tuple[object, ...]) -> None:
    if event != "open" or not _COUNTING.is_set() or not _WATCHED:
        return
    path = args[0]
    if isinstance(path, bytes):
        path = path.decode(errors="replace")
    if not isinstance(path, str) or not path.endswith(".dcm"):
        return
    mode = args[1] if len(args) > 1 else "r"
    if isinstance(mode, str) and any(c in mode for c in "wax+"):
        return
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(os.path.join("dicom", "pixels.py")):
            return  # a pixel read of a rendered slice, not a header read
        frame = frame.f_back
    try:
        st = os.stat(path)
    except OSError:
        return
    _OPENS[(st.st_dev, st.st_ino)] += 1


sys.addaudithook(_hook)


class _Node:
    def __init__(self, scp: StorageSCP, pipeline: StudyPipeline, orthanc: OrthancClient) -> None:
        self.scp, self.pipeline, self.orthanc = scp, pipeline, orthanc


@pytest.fixture()
def node(orthanc_server: OrthancServer, tmp_path: Path) -> Iterator[_Node]:
    ep = orthanc_server.endpoints
    orthanc = OrthancClient(ep.orthanc_url, ep.username, orthanc_server.password, timeout_s=60)
    settings = Settings(data_dir=tmp_path / "data", memory_cap=256 << 20)
    runs = StudyRunStore(settings.data_dir)
    forwarder = Forwarder(orthanc.store_instance, orthanc.delete_instance)
    pipeline = StudyPipeline(
        orthanc=orthanc,
        evaluator=DefaultEvaluator(settings),  # in this process: the audit hook sees its reads
        router=Router(),
        runs=runs,
        audit=AuditLog(settings.data_dir / "audit.jsonl"),
        cache=InstanceCache(settings.data_dir / "cache"),
        forwarder=forwarder,
    )
    scp = StorageSCP(
        spool=settings.data_dir / "spool",
        port=0,
        quiet_s=4.0,
        on_complete=pipeline.on_received,
        forwarder=forwarder,
    )
    pipeline.start()
    scp.start()
    try:
        yield _Node(scp, pipeline, orthanc)
    finally:
        scp.stop()
        pipeline.stop()
        forwarder.close()
        orthanc.close()


def _send(node: _Node, files: list[Path]) -> None:
    r = subprocess.run(
        [STORESCU, "-aet", "MRI_SCANNER", "-aec", node.scp.ae_title, "127.0.0.1",
         str(node.scp.port), *map(str, files)],
        capture_output=True, text=True, timeout=120, env=dict(os.environ, TCP_NODELAY="1"),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr


def _wait_done(node: _Node, study_uid: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs = node.pipeline.runs.list(study_uid=study_uid)
        if runs and runs[0].status not in (RunStatus.QUEUED, RunStatus.RUNNING):
            assert runs[0].status is RunStatus.DONE, runs[0]
            return
        time.sleep(0.2)
    raise AssertionError("the pipeline did not finish the study")


def test_a_c_store_study_has_each_header_read_once_and_is_in_orthanc_as_it_arrives(
    node: _Node, tmp_path: Path
) -> None:
    study = make_study(tmp_path / "src", classes=("FLAIR", "T2", "T1"), n_slices=8,
                       patient_id="NSBX-ONE-PATH")  # fmt: skip
    spool = node.scp.studies_dir / study.study_uid
    _WATCHED.append(str(spool))
    _OPENS.clear()
    _COUNTING.set()
    try:
        _send(node, study.files)
        sent = time.monotonic()
        # Forwarded while arriving: in Orthanc before the study is even complete (quiet 4 s).
        in_orthanc = 0
        while time.monotonic() - sent < 3.0:
            sid = node.orthanc.find_study(study.study_uid)
            if sid is not None:
                in_orthanc = len(node.orthanc.get_json(f"/studies/{sid}/instances"))
                if in_orthanc == len(study.files):
                    break
            time.sleep(0.1)
        assert in_orthanc == len(study.files), "instances not forwarded on arrival"
        assert not node.pipeline.runs.list(study_uid=study.study_uid), "study already complete?"
        _wait_done(node, study.study_uid)
    finally:
        _COUNTING.clear()
        _WATCHED.clear()
    spooled = sorted(spool.rglob("*.dcm"))
    assert len(spooled) == len(study.files)
    reads = {p.name: _OPENS[(p.stat().st_dev, p.stat().st_ino)] for p in spooled}
    # Every file read exactly once: the pipeline's one index (no evaluator, renderer, identity
    # or evidence reading headers again).
    assert set(reads.values()) == {1}, Counter(reads.values())
    # ... and the one write-back put an SR and the PDF into the study.
    sid = node.orthanc.find_study(study.study_uid)
    assert sid is not None
    uids = {s.series_uid for s in node.orthanc.list_series(sid, classify=False)}
    assert series_uid_for(study.study_uid, "sr") in uids
    assert series_uid_for(study.study_uid, "pdf") in uids
