"""The edges of `neurosandbox serve` and of the command line a hospital team meets first: a port
already taken (one line naming the port and what holds it, exit 2, nothing started), and output
that is not a terminal (tokens and run ids printed whole, never wrapped)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gateway_process import send
from gateway_synth import make_study
from orthanc_fixture import OrthancServer

from gateway.pacs_local import free_port
from gateway.ports import holder
from gateway.runs import FINAL, RunRecord
from gateway.serve import Gateway

BIN = Path(sys.executable).parent / "neurosandbox"


@pytest.fixture()
def held() -> Iterator[int]:
    """A port this test process listens on (a real socket, as another server would)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def _serve(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {
        **os.environ,
        "NEUROSANDBOX_DATA_DIR": str(tmp_path / "var"),
        "NEUROSANDBOX_ORTHANC_URL": f"http://127.0.0.1:{free_port()}",
        "NEUROSANDBOX_FOLLOW_CHANGES": "false",
        "NEUROSANDBOX_WARM_WORKER": "false",
        **env,
    }
    return subprocess.run(
        [str(BIN), "serve"], env=full, capture_output=True, text=True, timeout=60, cwd=tmp_path
    )


@pytest.mark.parametrize(
    ("setting", "what"),
    [("NEUROSANDBOX_API_PORT", "API"), ("NEUROSANDBOX_GATEWAY_DICOM_PORT", "DICOM")],
)
def test_serve_with_a_port_taken_says_which_and_by_whom_in_one_line_and_exits_2(
    tmp_path: Path, held: int, setting: str, what: str
) -> None:
    ports = {"NEUROSANDBOX_API_PORT": str(free_port()),
             "NEUROSANDBOX_GATEWAY_DICOM_PORT": str(free_port())}  # fmt: skip
    ports[setting] = str(held)
    r = _serve(tmp_path, **ports)
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(lines) == 1, lines
    (line,) = lines
    assert f"{what} port {held} on 127.0.0.1 is already in use" in line
    assert f"process {os.getpid()} (" in line and setting in line
    # nothing started: a gateway already serving this DATA_DIR keeps its runs and its spool
    assert not (tmp_path / "var" / "runs").exists() and not (tmp_path / "var" / "spool").exists()


def test_the_holder_of_a_port_is_named_where_readable_else_another_process(
    held: int, tmp_path: Path
) -> None:
    assert holder(held).startswith(f"process {os.getpid()} (")
    assert holder(free_port()) == "another process"  # nothing listens there
    assert holder(held, proc=tmp_path) == "another process"  # no /proc to read


@pytest.mark.parametrize("taken", ["api_port", "gateway_dicom_port"])
@pytest.mark.parametrize("checked", [True, False])
def test_the_service_itself_stops_on_a_port_taken_with_the_same_error(
    tmp_path: Path, held: int, taken: str, checked: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`serve` behind another front end (no CLI check), and the DICOM port taken between the
    check and the node's bind (``checked`` False): the same error, every part stopped."""
    import threading

    import gateway.serve
    from gateway.ports import PortUnavailableError
    from gateway.settings import Settings

    if not checked:
        monkeypatch.setattr(gateway.serve, "check_free", lambda *a: None)
    ports = {"api_port": free_port(), "gateway_dicom_port": free_port(), taken: held}
    settings = Settings(data_dir=tmp_path / "var", orthanc_url=f"http://127.0.0.1:{free_port()}",
                        warm_worker=False, **ports)  # fmt: skip
    before = set(threading.enumerate())
    with pytest.raises(PortUnavailableError, match=f"port {held} on 127.0.0.1 is already in use"):
        gateway.serve.serve(settings)
    left = [t for t in threading.enumerate() if t not in before and not t.daemon]
    assert not left, left  # nothing keeps the process alive
    with socket.socket() as probe:  # the API's socket was closed
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", ports["api_port"] if taken != "api_port" else free_port()))


# --------------------------------------------------------------------------- routing, the queue


def _record(runs: object, status: object, **changes: object) -> str:
    from gateway.runs import RunRecord, StudyRunStore

    assert isinstance(runs, StudyRunStore)
    run_id = runs.new_id()
    runs.create(RunRecord(run_id=run_id, trigger="dicom", study_uid=f"1.2.3.{run_id[-6:]}"))
    runs.finish(run_id, status, **changes)  # type: ignore[arg-type]
    return run_id


def test_the_queue_lists_a_study_no_rule_selects_but_not_the_normal_skips(tmp_path: Path) -> None:
    from gateway.review.queue import CaseStatus, failed_rows
    from gateway.runs import RunStatus, SkipKind, StudyRunStore

    runs = StudyRunStore(tmp_path)
    why = f"{SkipKind.NOT_ROUTED.value} (calling AE ORTHANC; modality MR; series T2)"
    not_routed = _record(runs, RunStatus.SKIPPED, skip=SkipKind.NOT_ROUTED, error=why)
    for kind in (SkipKind.UNCHANGED, SkipKind.RESTARTED):  # normal: nothing new to evaluate
        _record(runs, RunStatus.SKIPPED, skip=kind, error=kind.value)
    failed = _record(runs, RunStatus.FAILED, error="no DICOM series in the study folder")
    rows = {r.run_id: r for r in failed_rows(runs)}
    assert set(rows) == {not_routed, failed}
    assert rows[not_routed].status is CaseStatus.NOT_ROUTED and rows[not_routed].error == why


@pytest.fixture()
def demo_gateway(orthanc_server: OrthancServer, tmp_path: Path) -> Iterator[Gateway]:
    """The gateway as `serve` wires it, with the demo's routing rule, on the DICOM port the
    session Orthanc's preconfigured destination ("neurosandbox") sends to."""
    from gateway.cli.demo import REFERENCE_MODELS, _routing
    from gateway.serve import build_gateway

    ep = orthanc_server.endpoints
    routing = _routing(tmp_path, REFERENCE_MODELS, {}, ep.orthanc_aet)
    settings = orthanc_server.settings.model_copy(
        update={"data_dir": tmp_path / "var", "study_quiet_s": 1.0, "warm_worker": False,
                "routing_file": routing, "orthanc_url": ep.orthanc_url,
                "orthanc_password_file": Path(ep.password_file or "")}
    )  # fmt: skip
    gw = build_gateway(settings)
    gw.start()
    try:
        yield gw
    finally:
        gw.stop()


def _runs_of(gw: Gateway, study_uid: str, n: int, routed: bool = False) -> list[RunRecord]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        recs = gw.pipeline.runs.list(study_uid=study_uid)
        if len(recs) >= n and (recs[0].status in FINAL or (routed and recs[0].route is not None)):
            return recs
        time.sleep(0.2)
    raise AssertionError(f"no {n} runs of the study: {gw.pipeline.runs.list(study_uid=study_uid)}")


@pytest.mark.integration
def test_a_study_no_rule_selects_is_in_the_queue_and_the_demo_takes_one_sent_from_orthanc(
    demo_gateway: Gateway, tmp_path: Path
) -> None:
    from gateway.review.queue import CaseStatus, failed_rows
    from gateway.runs import RunStatus, SkipKind

    gw = demo_gateway
    study = make_study(tmp_path / "src", classes=("T2",), n_slices=4, patient_id="NSBX-ROUTE")
    send(gw.scp.port, study.files)  # from MRI_SCANNER: not the demo's, not Orthanc's AE
    (skipped,) = _runs_of(gw, study.study_uid, 1)
    assert skipped.status is RunStatus.SKIPPED and skipped.skip is SkipKind.NOT_ROUTED
    (row,) = [r for r in failed_rows(gw.pipeline.runs) if r.run_id == skipped.run_id]
    assert row.status is CaseStatus.NOT_ROUTED and row.study_uid == study.study_uid
    assert row.error.startswith("no routing rule selects this study") and "MRI_SCANNER" in row.error
    # Orthanc's preconfigured destination sends it on (calling AE: Orthanc's): the demo's rule
    # selects it
    sid = gw.ctx.orthanc.find_study(study.study_uid)
    assert sid is not None
    orthanc = gw.ctx.orthanc
    r = orthanc.api.post(f"{orthanc.url}/modalities/neurosandbox/store", json={"Resources": [sid]})
    assert r.status_code == 200, r.text
    latest = _runs_of(gw, study.study_uid, 2, routed=True)[0]
    assert latest.skip is None and latest.route is not None, latest
    assert latest.route.rule.startswith("demo-")


# --------------------------------------------------------------------------- output to a pipe

_TOKEN = re.compile(r"nsbx_[A-Za-z0-9_-]{20,}")


def test_a_token_created_on_the_command_line_is_one_whole_line_in_a_pipe(tmp_path: Path) -> None:
    name = "nightly export job of the stroke unit, second site, scanner 3"
    env = {**os.environ, "NEUROSANDBOX_DATA_DIR": str(tmp_path / "var"), "COLUMNS": "80"}
    r = subprocess.run(
        [str(BIN), "tokens", "create", "--program", "--role", "admin", "--name", name],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    (line,) = r.stdout.splitlines()
    assert _TOKEN.fullmatch(line), line
    listed = subprocess.run([str(BIN), "tokens", "list"], env=env, capture_output=True,
                            text=True, timeout=60, check=True).stdout  # fmt: skip
    (row,) = listed.splitlines()
    assert row.endswith(f"\t{name}\t")  # ids and names whole, one row per token


def test_the_demos_review_lines_are_whole_in_a_pipe() -> None:
    """`make demo | tee`: the review URL and the reviewer token, each on one line, whole."""
    token = "nsbx_" + "Ab3-_x" * 12
    url = "http://127.0.0.1:48123/review"
    code = (
        "from gateway.cli.demo import _print_review, console; "
        f"console.print('  checklists: /a/long/path/' + 'x' * 90); "
        f"_print_review({url!r}, {token!r}, False)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "COLUMNS": "80"}, check=True)  # fmt: skip
    lines = r.stderr.splitlines()
    assert lines[0] == "  checklists: /a/long/path/" + "x" * 90  # not folded at 80 columns
    assert lines[1].startswith(f"  review queue: {url} ")
    assert lines[2] == f"  reviewer token {token}"


def test_a_commands_message_naming_a_long_path_is_one_line_in_a_pipe(tmp_path: Path) -> None:
    """Every command's console (not only the shared one): `report` on a folder that holds no
    run says so in one line, the path whole."""
    deep = tmp_path / ("runs-of-the-stroke-unit-" * 4) / "b6f0c1d2e3a4958677a8b9c0d1e2f3a4"
    deep.mkdir(parents=True)
    r = subprocess.run([str(BIN), "report", str(deep)], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "COLUMNS": "80"})  # fmt: skip
    assert r.returncode == 2
    (line,) = r.stderr.splitlines()
    assert str(deep) in line and line.startswith("error: ")
