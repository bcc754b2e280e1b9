"""Nothing lost, and nothing left half done (issue 34).

Real parts throughout: dcmtk's storescu (or a pynetdicom SCU that stops half way) as the
sender, the session's real Orthanc (``OverwriteInstances`` false), the gateway as ``serve``
wires it, in this process, or as a ``neurosandbox serve`` process where it must be killed.

- The same instance twice in one association (a sender retrying, an export folder holding a
  copy under another name) is committed and evaluated once; nothing stays in the incoming
  folder.
- A failure while committing puts the study in the review queue as failed, with its reason;
  the node goes on with the next study, and what the sender was told is stored stays in the
  PACS.
- A re-send under the same UIDs with other pixels: while the PACS keeps the original, the
  spool does too and nothing new is evaluated; with a PACS that overwrites, the spool takes
  the new bytes and a new version is evaluated with a warning.
- ``kill -9`` of the gateway: what a half-sent association forwarded to Orthanc is deleted at
  the next start and its files quarantined; a run killed mid-evaluation is marked interrupted
  (runs store and review queue); the restart makes no run for a study evaluated before.

Every assertion is on behaviour a sender, the PACS or a reviewer can see (runs, queue rows,
spool and Orthanc contents), so the code before the fix fails on behaviour, not on a name.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
import pytest
import yaml
from gateway_process import send
from gateway_synth import SynthStudy, make_study
from guard import procs, wait_healthy
from openai_server import OpenAIServer, Script
from orthanc_fixture import OrthancServer
from pynetdicom import AE
from pynetdicom.sop_class import MRImageStorage  # type: ignore[attr-defined]

from gateway.orthanc import OrthancClient
from gateway.pacs_local import free_port
from gateway.review.queue import failed_rows
from gateway.runs import RunRecord, RunStatus, StudyRunStore
from gateway.serve import Gateway, build_gateway
from gateway.settings import Settings
from gateway.study_run import DefaultEvaluator

pytestmark = pytest.mark.integration
QUIET = 1.0
REFERENCE = {"name": "mr", "evaluate": {"tasks": ["differential"]}}
STUCK = {
    "name": "stuck-model",
    "match": {"calling_aet": ["HANG_*"]},
    "evaluate": {"models": ["stuck-vlm"], "tasks": ["differential"]},
}
SERVE = Path(sys.executable).parent / "neurosandbox"


# --------------------------------------------------------------------------- helpers


@dataclass
class Node:
    """An in-process gateway and every study its DICOM node said was complete."""

    gw: Gateway
    data: Path
    emitted: list[Any] = field(default_factory=list)  # ReceivedStudy, in order

    @property
    def port(self) -> int:
        return self.gw.scp.port

    def emitted_for(self, study_uid: str) -> list[Any]:
        return [s for s in self.emitted if s.study_uid == study_uid]


def _settings(
    orthanc_server: OrthancServer, data: Path, rules: list[dict[str, Any]], **extra: Any
) -> Settings:
    ep = orthanc_server.endpoints
    data.mkdir(parents=True, exist_ok=True)
    routing = data.parent / f"{data.name}-rules.yaml"
    routing.write_text(yaml.safe_dump({"rules": rules}))
    return orthanc_server.settings.model_copy(
        update={
            "data_dir": data,
            "study_quiet_s": QUIET,
            "routing_file": routing,
            "orthanc_url": ep.orthanc_url,
            "orthanc_password_file": Path(ep.password_file or ""),
            "gateway_dicom_port": free_port(),
            **extra,
        }
    )


def _start(
    orthanc_server: OrthancServer,
    data: Path,
    rules: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> Node:
    settings = _settings(orthanc_server, data, rules or [REFERENCE], **extra)
    gw = build_gateway(settings)
    gw.pipeline.evaluator = DefaultEvaluator(settings)  # in process: fast, same code
    node = Node(gw, data)
    handler = gw.scp.on_complete
    assert handler is not None

    def record(study: Any) -> object:
        node.emitted.append(study)
        return handler(study)

    gw.scp.on_complete = record
    gw.start()
    return node


def _finished(runs: StudyRunStore, study_uid: str, n: int, timeout_s: float) -> list[RunRecord]:
    """The study's runs once ``n`` of them have finished (newest first); all of them (maybe
    fewer) when ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = runs.list(study_uid=study_uid)
        done = [r for r in found if r.status not in (RunStatus.QUEUED, RunStatus.RUNNING)]
        if len(done) >= n or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def _runs(node: Node, study_uid: str, n: int, timeout_s: float = 30) -> list[RunRecord]:
    found = _finished(node.gw.ctx.runs, study_uid, n, timeout_s)
    node.gw.pipeline.wait_idle(10)
    return found


def _client(orthanc_server: OrthancServer) -> OrthancClient:
    ep = orthanc_server.endpoints
    return OrthancClient(ep.orthanc_url, ep.username, orthanc_server.password, timeout_s=60)


def _in_orthanc(client: OrthancClient, study_uid: str) -> dict[str, str]:
    """SOP Instance UID -> Orthanc instance id, for every instance of the study in Orthanc."""
    r = client.api.post(
        f"{client.url}/tools/find",
        json={"Level": "Instance", "Query": {"StudyInstanceUID": study_uid}, "Expand": True},
    )
    r.raise_for_status()
    return {i["MainDicomTags"]["SOPInstanceUID"]: i["ID"] for i in r.json()}


def _orthanc_file(client: OrthancClient, orthanc_id: str) -> bytes:
    r = client.api.get(f"{client.url}/instances/{orthanc_id}/file")
    r.raise_for_status()
    return bytes(r.content)


def _spooled(data: Path, study_uid: str) -> list[Path]:
    """The study's instances in the spool (its folder is named by the UID, whatever follows)."""
    studies = data / "spool" / "studies"
    return sorted(p for d in studies.glob(f"{study_uid}*") if d.is_dir() for p in d.rglob("*.dcm"))


def _incoming(data: Path) -> list[Path]:
    return sorted((data / "spool" / "incoming").rglob("*.dcm"))


def _sop(path: Path) -> str:
    return str(pydicom.dcmread(path, stop_before_pixels=True).SOPInstanceUID)


def _pixels(path: Path | bytes) -> bytes:
    src = io.BytesIO(path) if isinstance(path, bytes) else path
    return bytes(pydicom.dcmread(src).PixelData)


def _other_pixels(path: Path, dest: Path) -> Path:
    """A re-send: the same file (every UID kept) with other pixels."""
    ds = pydicom.dcmread(path)
    ds.PixelData = np.ascontiguousarray(ds.pixel_array[::-1, ::-1]).tobytes()
    dest.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(dest, enforce_file_format=True)
    assert _pixels(dest) != _pixels(path)
    return dest


def _spool_folder_names(study: SynthStudy) -> list[str]:
    """Where the node puts a study's folder: ``<UID>_<patient hash>`` (a study is its UID and
    its patient), ``<UID>`` before that."""
    names = [study.study_uid]
    try:
        from gateway.study_key import StudyKey
    except ImportError:  # the layout before study keys
        return names
    return [*names, StudyKey(study_uid=study.study_uid, patient_id=study.patient_id).name]


# --------------------------------------------------------------------------- in process


@pytest.fixture(scope="module")
def node(orthanc_server: OrthancServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """One gateway for the tests that need an ordinary one (each with its own study)."""
    n = _start(orthanc_server, tmp_path_factory.mktemp("lost") / "data")
    try:
        yield n
    finally:
        n.gw.stop()


def test_the_same_instance_twice_in_one_association_is_committed_and_evaluated_once(
    node: Node, orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    """storescu given a file twice (first early, then once more at the end) and a copy of
    another file under another name, all in one association: every C-STORE is answered
    Success; the study is committed, emitted once with its four instances and evaluated; no
    file stays in the incoming folder."""
    s = make_study(tmp_path / "s", classes=("FLAIR",), n_slices=4, patient_id="NSBX-DUP")
    copy = tmp_path / "export" / "copy of FLAIR_002.dcm"
    copy.parent.mkdir()
    shutil.copyfile(s.files[2], copy)
    send(node.port, [s.files[0], s.files[0], *s.files[1:], copy, s.files[0]])
    runs = _runs(node, s.study_uid, 1, timeout_s=20)
    assert [r.status for r in runs] == [RunStatus.DONE], (runs, node.emitted_for(s.study_uid))
    assert runs[0].n_instances == 4 and runs[0].version == 1
    time.sleep(QUIET + 0.3)  # a second completion would come after another quiet time
    emitted = node.emitted_for(s.study_uid)
    assert [e.n_instances for e in emitted] == [4], emitted
    assert len(node.gw.ctx.runs.list(study_uid=s.study_uid)) == 1
    assert _incoming(node.data) == []
    assert sorted(map(_sop, _spooled(node.data, s.study_uid))) == sorted(map(_sop, s.files))
    assert set(map(_sop, s.files)) <= set(_in_orthanc(node.gw.ctx.orthanc, s.study_uid))


def test_a_failure_while_committing_queues_the_study_as_failed_and_the_node_goes_on(
    node: Node, orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    """A regular file where the study's spool folder must be made: the commit fails after
    every C-STORE was answered Success. The study is in the review queue as failed with the
    reason (never only a traceback in the log), its files are quarantined, nothing stays in
    the incoming folder, the PACS keeps what the sender was told is stored, and the next
    association, for another study, is evaluated."""
    x = make_study(tmp_path / "x", classes=("FLAIR",), n_slices=3, patient_id="NSBX-BLOCKED")
    studies = node.data / "spool" / "studies"
    for name in _spool_folder_names(x):
        (studies / name).write_text("a file in the way of the study's folder\n")
    quarantined = set((node.data / "spool" / "quarantine").rglob("*.dcm"))
    send(node.port, x.files)
    runs = _runs(node, x.study_uid, 1, timeout_s=15)
    assert [r.status for r in runs] == [RunStatus.FAILED], runs
    failed = runs[0]
    assert failed.error and "could not be committed" in failed.error, failed.error
    assert "NotADirectoryError" in failed.error or "FileExistsError" in failed.error
    assert failed.n_instances == len(x.files)
    assert not failed.sr_sop_uids and failed.pdf_sop_uid is None
    rows = [r for r in failed_rows(node.gw.ctx.runs) if r.study_uid == x.study_uid]
    assert [(r.status.value, r.run_id) for r in rows] == [("failed", failed.run_id)]
    assert "could not be committed" in rows[0].error
    assert _incoming(node.data) == []
    now = set((node.data / "spool" / "quarantine").rglob("*.dcm")) - quarantined
    assert len(now) == len(x.files)
    # the sender was answered Success for each: the PACS holds them, nothing was deleted
    assert sorted(_in_orthanc(node.gw.ctx.orthanc, x.study_uid)) == sorted(map(_sop, x.files))

    y = make_study(tmp_path / "y", classes=("FLAIR",), n_slices=3, patient_id="NSBX-NEXT")
    send(node.port, y.files)
    [after] = _runs(node, y.study_uid, 1, timeout_s=20)
    assert after.status is RunStatus.DONE, after
    assert after.n_instances == len(y.files)


def test_a_resend_with_other_pixels_is_refused_as_the_pacs_refuses_it(
    node: Node, orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    """Orthanc keeps the original of an instance re-sent with other pixels (OverwriteInstances
    false): so does the spool, byte for byte, and no new version is evaluated."""
    s = make_study(tmp_path / "s", classes=("FLAIR",), n_slices=3, patient_id="NSBX-RESEND")
    send(node.port, s.files)
    [first] = _runs(node, s.study_uid, 1, timeout_s=20)
    assert first.status is RunStatus.DONE and first.version == 1, first
    resent = _other_pixels(s.files[1], tmp_path / "resent" / "FLAIR_001.dcm")
    sop = _sop(resent)
    send(node.port, [resent])
    runs = _runs(node, s.study_uid, 2, timeout_s=20)
    assert len(runs) == 2, runs
    assert [r.run_id for r in runs if r.status is RunStatus.DONE] == [first.run_id], runs
    assert all(r.version in (None, 1) for r in runs), runs
    [spooled] = [p for p in _spooled(node.data, s.study_uid) if p.stem == sop]
    held = _orthanc_file(node.gw.ctx.orthanc, _in_orthanc(node.gw.ctx.orthanc, s.study_uid)[sop])
    assert _pixels(held) == _pixels(s.files[1])  # the PACS kept the original
    assert spooled.read_bytes() == held  # and so did the spool: what is evaluated is that


def test_a_resend_the_pacs_takes_makes_a_new_version_with_a_warning(
    orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    """With NEUROSANDBOX_PACS_OVERWRITES_INSTANCES (the session's Orthanc does not overwrite,
    so the node's side alone): the spool takes the re-sent bytes, the node names the revised
    instance, and the pipeline evaluates a new version, saying why."""
    node = _start(orthanc_server, tmp_path / "data", pacs_overwrites_instances=True)
    try:
        s = make_study(tmp_path / "s", classes=("FLAIR",), n_slices=3, patient_id="NSBX-OVERW")
        send(node.port, s.files)
        [first] = _runs(node, s.study_uid, 1, timeout_s=20)
        assert first.status is RunStatus.DONE and first.version == 1, first
        resent = _other_pixels(s.files[2], tmp_path / "resent" / "FLAIR_002.dcm")
        sop = _sop(resent)
        send(node.port, [resent])
        runs = _runs(node, s.study_uid, 2, timeout_s=20)
        latest = runs[0]
        assert latest.status is RunStatus.DONE and latest.version == 2, runs
        assert any("re-sent" in w for w in latest.warnings), latest.warnings
        [spooled] = [p for p in _spooled(node.data, s.study_uid) if p.stem == sop]
        assert _pixels(spooled) == _pixels(resent)
        emitted = node.emitted_for(s.study_uid)
        assert [getattr(e, "revised", None) for e in emitted] == [[], [sop]], emitted
    finally:
        node.gw.stop()


# --------------------------------------------------------------------------- kill -9


@dataclass
class Killed:
    """What was seen around a ``kill -9`` of a gateway process and the restart after it."""

    a: SynthStudy  # evaluated before the kill
    b: SynthStudy  # its run was evaluating when the process was killed
    c: SynthStudy  # half sent in an association open when the process was killed
    c_sent: list[str]  # SOP UIDs of C sent before the kill
    c_in_orthanc_before: set[str] = field(default_factory=set)
    c_in_orthanc_after: set[str] = field(default_factory=set)
    quarantined: list[Path] = field(default_factory=list)  # after the restart
    incoming_after: list[Path] = field(default_factory=list)
    b_run_at_kill: RunRecord | None = None
    runs_before_restart: set[str] = field(default_factory=set)
    runs_after_restart: dict[str, RunRecord] = field(default_factory=dict)  # run id -> record
    b_run_after: RunRecord | None = None
    queue_rows: list[Any] = field(default_factory=list)
    serve_log: str = ""


def _descendants(pid: int) -> list[int]:
    table = procs()
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        kids = [p.pid for p in table if p.ppid == parent]
        out += kids
        todo += kids
    return out


def _serve(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as fh:
        return subprocess.Popen([str(SERVE), "serve"], env=env, stdout=fh, stderr=subprocess.STDOUT)


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process (no shutdown code runs), then what it had started (its evaluation
    worker, its Chromium), each by its pid."""
    kids = _descendants(proc.pid)
    proc.kill()
    proc.wait(timeout=10)
    for pid in kids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _journaled(data: Path) -> int:
    """Lines the forwarder wrote in the open associations' journals (``.forwarded``)."""
    return sum(
        len(p.read_text().split()) for p in (data / "spool" / "incoming").glob("*/.forwarded")
    )


def _until(check: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.fixture(scope="module")
def killed(
    orthanc_server: OrthancServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Killed]:
    """A evaluated by an in-process gateway; then a `neurosandbox serve` on the same data
    folder evaluates B with a model that never answers and receives half of C in an open
    association, and is SIGKILLed; then the gateway starts again (in process: the same start
    as serve's) with a rule that sends B to the reference model."""
    root = tmp_path_factory.mktemp("killed")
    data = root / "data"
    a = make_study(root / "a", classes=("FLAIR",), n_slices=3, patient_id="NSBX-KILL-A")
    b = make_study(root / "b", classes=("FLAIR",), n_slices=3, patient_id="NSBX-KILL-B")
    c = make_study(root / "c", classes=("FLAIR", "T2"), n_slices=6, patient_id="NSBX-KILL-C")
    half = c.files[:6]
    seen = Killed(a=a, b=b, c=c, c_sent=[_sop(p) for p in half])
    client = _client(orthanc_server)
    runs = StudyRunStore(data)

    first = _start(orthanc_server, data)
    try:
        send(first.port, a.files)
        [done] = _runs(first, a.study_uid, 1, timeout_s=20)
        assert done.status is RunStatus.DONE, done
    finally:
        first.gw.stop()

    ep = orthanc_server.endpoints
    with OpenAIServer(Script(hold_after=0)) as model:  # holds every request: never answers
        models = root / "models.yaml"
        models.write_text(
            f"models:\n  - name: stuck-vlm\n    model: openai/stuck\n"
            f"    api_base: {model.url}\n    max_retries: 0\n"
        )
        settings = _settings(orthanc_server, data, [STUCK, REFERENCE])
        api_port = free_port()
        env = dict(
            os.environ,
            NEUROSANDBOX_DATA_DIR=str(data),
            NEUROSANDBOX_ORTHANC_URL=ep.orthanc_url,
            NEUROSANDBOX_ORTHANC_PASSWORD_FILE=str(ep.password_file or ""),
            NEUROSANDBOX_GATEWAY_DICOM_PORT=str(settings.gateway_dicom_port),
            NEUROSANDBOX_API_PORT=str(api_port),
            NEUROSANDBOX_STUDY_QUIET_S=str(QUIET),
            NEUROSANDBOX_ROUTING_FILE=str(settings.routing_file),
            NEUROSANDBOX_MODELS_FILE=str(models),
        )
        log = root / "serve.log"
        proc = _serve(env, log)
        try:
            wait_healthy(f"http://127.0.0.1:{api_port}", proc, 60, log)
            port = int(settings.gateway_dicom_port or 0)
            send(port, b.files, "-aet", "HANG_SCANNER")  # the last -aet wins

            def b_evaluating() -> bool:
                found = runs.list(study_uid=b.study_uid)
                return bool(found) and found[0].stage == "evaluating"

            assert _until(b_evaluating, 30), (runs.list(study_uid=b.study_uid), log.read_text())
            ae = AE(ae_title="MRI_SCANNER")
            ae.add_requested_context(MRImageStorage)
            ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = 60  # 2 busy cores
            assoc = ae.associate("127.0.0.1", port, ae_title="NEUROSANDBOX")
            assert assoc.is_established, log.read_text()[-3000:]
            try:
                for p in half:
                    status = assoc.send_c_store(pydicom.dcmread(p))
                    assert status.get("Status") == 0, (status, log.read_text()[-3000:])
                _until(lambda: len(_in_orthanc(client, c.study_uid)) >= len(half), 15)
                # the forwarder notes what it added in the staging folder right after Orthanc
                # answers (only waited for: what counts is what the next start does)
                _until(lambda: _journaled(data) >= len(half), 5)
                seen.c_in_orthanc_before = set(_in_orthanc(client, c.study_uid))
                [seen.b_run_at_kill] = runs.list(study_uid=b.study_uid)
                _kill_tree(proc)
            finally:
                assoc.abort()
        finally:
            if proc.poll() is None:
                _kill_tree(proc)
            seen.serve_log = log.read_text(errors="replace")[-4000:]

    seen.runs_before_restart = {d.name for d in (data / "runs").iterdir()}
    again = _start(orthanc_server, data)  # B to the reference model now
    try:
        seen.c_in_orthanc_after = set(_in_orthanc(client, c.study_uid))
        seen.quarantined = sorted((data / "spool" / "quarantine").rglob("*.dcm"))
        seen.incoming_after = _incoming(data)
        # B (never evaluated) is offered again and evaluated; A (evaluated) is offered too
        _runs(again, b.study_uid, 2, timeout_s=30)
        time.sleep(0.5)
        again.gw.pipeline.wait_idle(10)
        for d in (data / "runs").iterdir():
            with contextlib.suppress(KeyError):  # not a run
                seen.runs_after_restart[d.name] = again.gw.ctx.runs.get(d.name)
        seen.b_run_after = seen.runs_after_restart.get(
            seen.b_run_at_kill.run_id if seen.b_run_at_kill else ""
        )
        seen.queue_rows = failed_rows(again.gw.ctx.runs)
    finally:
        again.gw.stop()
        client.close()
    yield seen


def test_kill_9_mid_association_leaves_nothing_in_the_pacs_and_quarantines_the_files(
    killed: Killed,
) -> None:
    """What the half-sent association had forwarded to Orthanc is deleted by the next start
    (Orthanc holds none of the partial study), and its staged files are quarantined."""
    assert killed.c_in_orthanc_before == set(killed.c_sent), killed.serve_log
    assert killed.c_in_orthanc_after == set(), "the partial study stayed in Orthanc"
    assert killed.incoming_after == []
    assert sorted(map(_sop, killed.quarantined)) == sorted(killed.c_sent)


def test_a_run_killed_mid_evaluation_is_interrupted_after_the_restart(killed: Killed) -> None:
    """The run that was evaluating when the process was killed is marked interrupted at the
    next start, with a reason, and the review queue lists it as interrupted."""
    at_kill = killed.b_run_at_kill
    assert at_kill is not None and at_kill.status is RunStatus.RUNNING, at_kill
    after = killed.b_run_after
    assert after is not None and after.status.value == "interrupted", after
    assert after.error and after.finished_at, after
    rows = [r for r in killed.queue_rows if r.run_id == at_kill.run_id]
    assert [r.status.value for r in rows] == ["interrupted"], killed.queue_rows
    assert rows[0].error


def test_the_restart_makes_no_run_for_a_study_evaluated_before(killed: Killed) -> None:
    """A spooled study evaluated before the kill gets no new run from the restart (two starts:
    the killed process's and the one after); the interrupted study B, never evaluated, does."""
    new = {
        k: v for k, v in killed.runs_after_restart.items() if k not in killed.runs_before_restart
    }
    assert [r.study_uid for r in new.values()] == [killed.b.study_uid], new
    a_runs = [r for r in killed.runs_after_restart.values() if r.study_uid == killed.a.study_uid]
    assert [r.status for r in a_runs] == [RunStatus.DONE], a_runs
