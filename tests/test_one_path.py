"""One straight path for one study received by C-STORE: every file's header read once, the
instances in Orthanc while they arrive, one write-back (a real Orthanc, dcmtk's storescu as the
sender, the gateway's DICOM node, pipeline and evaluator in this process)."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pydicom
import pytest
from conftest import corpus_path
from gateway_process import send
from gateway_synth import make_study
from orthanc_fixture import OrthancServer

from evaluation.log import STORE_FILE, RunStore
from evaluation.reports import RUNDATA_FILE, load_run
from gateway.runs import GATEWAY_NOTE, RunStatus
from gateway.serve import Gateway, build_gateway
from gateway.sr import series_uid_for
from gateway.study_key import StudyKey
from gateway.study_run import DefaultEvaluator

pytestmark = pytest.mark.integration

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


@pytest.fixture()
def gw(orthanc_server: OrthancServer, tmp_path: Path) -> Iterator[Gateway]:
    """The gateway as `serve` wires it, but its evaluator in this process (the audit hook sees
    its reads; the service's worker process would hide them)."""
    ep = orthanc_server.endpoints
    settings = orthanc_server.settings.model_copy(
        update={
            "data_dir": tmp_path / "data",
            "memory_cap": 256 << 20,
            "study_quiet_s": 4.0,
            "orthanc_url": ep.orthanc_url,
            "orthanc_password_file": Path(ep.password_file or ""),
        }
    )
    gateway = build_gateway(settings)
    gateway.pipeline.evaluator = DefaultEvaluator(settings)
    gateway.start()
    try:
        yield gateway
    finally:
        gateway.stop()


def _wait_done(gw: Gateway, study_uid: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs = gw.pipeline.runs.list(study_uid=study_uid)
        if runs and runs[0].status not in (RunStatus.QUEUED, RunStatus.RUNNING):
            assert runs[0].status is RunStatus.DONE, runs[0]
            return
        time.sleep(0.2)
    raise AssertionError("the pipeline did not finish the study")


@contextlib.contextmanager
def _counting(spool: Path) -> Iterator[None]:
    """Count the opens of the files under ``spool`` while the block runs."""
    _WATCHED.append(str(spool))
    _OPENS.clear()
    _COUNTING.set()
    try:
        yield
    finally:
        _COUNTING.clear()
        _WATCHED.clear()


def _reads(spool: Path) -> dict[str, int]:
    """Each spooled file's header reads, by its path in the spool."""
    return {
        str(p.relative_to(spool)): _OPENS[(p.stat().st_dev, p.stat().st_ino)]
        for p in spool.rglob("*.dcm")
    }


def _written_back(gw: Gateway, study_uid: str, *kinds: str) -> bool:
    sid = gw.ctx.orthanc.find_study(study_uid)
    assert sid is not None
    uids = {s.series_uid for s in gw.ctx.orthanc.list_series(sid, classify=False)}
    return all(series_uid_for(study_uid, kind) in uids for kind in kinds)


def test_a_c_store_study_has_each_header_read_once_and_is_in_orthanc_as_it_arrives(
    gw: Gateway, tmp_path: Path
) -> None:
    study = make_study(tmp_path / "src", classes=("FLAIR", "T2", "T1"), n_slices=8,
                       patient_id="NSBX-ONE-PATH")  # fmt: skip
    key = StudyKey(study_uid=study.study_uid, patient_id=study.patient_id)
    spool = gw.scp.studies_dir / key.name
    with _counting(spool):
        send(gw.scp.port, study.files)
        sent = time.monotonic()
        # Forwarded while arriving: in Orthanc before the study is even complete (quiet 4 s).
        in_orthanc = 0
        while time.monotonic() - sent < 3.0:
            sid = gw.ctx.orthanc.find_study(study.study_uid)
            if sid is not None:
                in_orthanc = len(gw.ctx.orthanc.get_json(f"/studies/{sid}/instances"))
                if in_orthanc == len(study.files):
                    break
            time.sleep(0.1)
        assert in_orthanc == len(study.files), "instances not forwarded on arrival"
        assert not gw.pipeline.runs.list(study_uid=study.study_uid), "study already complete?"
        _wait_done(gw, study.study_uid)
    reads = _reads(spool)
    assert len(reads) == len(study.files)
    # Every file read exactly once: the pipeline's one index (no evaluator, renderer, identity
    # or evidence reading headers again).
    assert set(reads.values()) == {1}, Counter(reads.values())
    # ... and the one write-back put an SR and the PDF into the study.
    assert _written_back(gw, study.study_uid, "sr", "pdf")
    _one_record(gw, study.study_uid)


def _one_record(gw: Gateway, study_uid: str) -> None:
    """The run's one record is the engine's run store in the run folder: the engine's run and
    the gateway's part (status, what was written back) in one file, nothing beside it; its one
    result type is the RunData of the report bundle."""
    (rec,) = gw.pipeline.runs.list(study_uid=study_uid)
    folder = gw.pipeline.runs.run_dir(rec.run_id)
    records = {p.name for p in folder.iterdir() if p.suffix in (".json", ".sqlite") or p.is_dir()}
    assert records == {STORE_FILE, "config.json", "images", "render"}, records
    store = RunStore(folder)
    try:
        assert store.has_run() and store.run_log().run_id == rec.run_id
        noted = store.gateway_run()
        assert noted is not None and store.note(GATEWAY_NOTE) is None
        answered = {r.model for r in store.samples() if r.status == "ok"}
    finally:
        store.close()
    assert noted.status is RunStatus.DONE and noted.sr_sop_uids and noted.pdf_sop_uid
    sid = gw.ctx.orthanc.find_study(study_uid)
    in_pacs = {sop for s in gw.ctx.orthanc.list_series(sid or "", classify=False)
               for sop in (k.sop_uid for k in gw.ctx.orthanc.series_instances(s.orthanc_id))}  # fmt: skip
    assert {*noted.sr_sop_uids.values(), noted.pdf_sop_uid} <= in_pacs
    # the report (API report.json, the review pages, `neurosandbox report`): the bundle's RunData,
    # the same run as the store's
    report = gw.pipeline.runs.report_path(rec.run_id, "json")
    assert report == gw.pipeline.reports_dir / rec.run_id / RUNDATA_FILE
    bundle, stored = load_run(report), load_run(folder)
    assert [s.answer for s in bundle.samples] == [s.answer for s in stored.samples]
    assert {s.scored.model for s in bundle.samples} == answered
    # the SR's evidence from the one index, recorded in the run's record for a re-issue (no
    # PACS header read then); nothing of it in the bundle
    evidence = gw.pipeline.runs.evidence(rec.run_id)
    assert not (report.parent / "evidence.json").exists()
    assert {str(d.SOPInstanceUID) for d in evidence} <= in_pacs and evidence[0].PatientID


def test_a_real_scanner_study_has_each_header_read_once(gw: Gateway) -> None:
    """The same rule on a real study (BRAINIX: 88 MR slices in four series, as a scanner wrote
    them), not only on synthetic headers."""
    folder = corpus_path() / "brainix" / "BRAINIX" / "DICOM"
    files = sorted(folder.rglob("*.dcm"))
    assert files, f"no .dcm files under {folder}"
    first = pydicom.dcmread(files[0], stop_before_pixels=True)
    study_uid = str(first.StudyInstanceUID)
    key = StudyKey(study_uid=study_uid, patient_id=str(first.PatientID))
    spool = gw.scp.studies_dir / key.name
    with _counting(spool):
        send(gw.scp.port, files)
        _wait_done(gw, study_uid, timeout_s=300)
    reads = _reads(spool)
    assert len(reads) == len(files)
    assert set(reads.values()) == {1}, Counter(reads.values())
    assert _written_back(gw, study_uid, "sr")
    _one_record(gw, study_uid)
