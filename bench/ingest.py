"""Benchmark: C-STORE ingest of the gateway's DICOM node against dcmtk's storescp.

Part 1, throughput: the 819-file Siemens DWI (unzipped to a temp dir) is sent with dcmtk's
/usr/bin/storescu over one association to (a) the gateway's storage SCP (gateway/scp.py, the
real class with its spool, in this process) and (b) dcmtk's /usr/bin/storescp writing the files
with ``-od``, interleaved, N repetitions each. The time is the sender's: storescu's start to its
exit (every instance acknowledged, association released). Prints the medians and the ratio
storescp_time / gateway_time (1.0 = as fast as dcmtk; goal >= 0.5) for each fsync policy of
the gateway (storescp itself never fsyncs), plus "until committed": the gateway's time until
the files are in the study folder (on disk, unless fsync is off). For reference, a bare stock pynetdicom SCP whose
handler keeps nothing. Both dcmtk ends run with TCP_NODELAY=1: the Debian build leaves Nagle's
algorithm on, which makes dcmtk ~25x slower on loopback (``--dcmtk-defaults`` measures that).

Part 2, latency: a local Orthanc (Debian package, temp folder) and the gateway (DICOM node
forwarding each instance to Orthanc as it arrives, pipeline, evaluation worker); the DWI is
sent once more to a fresh gateway, N times, and the time from the last instance received to
the SR being readable in Orthanc, minus the quiet time, is printed beside the floor: the same
study indexed and evaluated by the reference model in its worker process, as the pipeline
does (its worker started ahead while idle, NEUROSANDBOX_WARM_WORKER), with nothing else (goal:
within 1.0 s of the floor); beside it, for reference, the floor with a worker spawned for the
study. Medians; the pipeline's stage times.

``--profile FILE`` profiles the gateway's side of each latency run (cProfile in the threads that
run the study's job, build the checklist and print it: the pipeline, its checklist thread and
the printer) and writes the top entries by cumulative time to FILE.

Run: .venv/bin/python bench/ingest.py [--reps 5] [--quiet 2] [--latency-reps 3] [--no-latency]
     [--no-throughput] [--profile FILE] [--dcmtk-defaults]
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gzip
import io
import os
import pstats
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.scp import ReceivedStudy, StorageSCP  # noqa: E402
from gateway.spool import FsyncPolicy  # noqa: E402

CORPUS = ROOT.parent / "shared" / "data" / "dicom"
STORESCU, STORESCP = "/usr/bin/storescu", "/usr/bin/storescp"
GOAL_OVERHEAD_S = 1.0  # last instance -> SR in Orthanc, over the floor (issue 41)


def unzip_dwi(dst: Path) -> Path:
    src = CORPUS / "siemens_xa30/In/11001_DWI_dir80_AP"
    if not src.exists():
        raise SystemExit(f"benchmark: the DWI series is not at {src}")
    out = dst / "dwi819"
    out.mkdir()
    for f in sorted(src.iterdir()):
        with gzip.open(f) as g:
            (out / f.name.removesuffix(".gz")).write_bytes(g.read())
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def send(folder: Path, port: int, aec: str, nodelay: bool) -> float:
    env = dict(os.environ, TCP_NODELAY="1" if nodelay else "0")
    t0 = time.perf_counter()
    r = subprocess.run(
        [STORESCU, "-aec", aec, "+sd", "127.0.0.1", str(port), str(folder)],
        capture_output=True,
        text=True,
        env=env,
    )
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"storescu failed: {r.stderr[-500:]}")
    return dt


def gateway_once(
    folder: Path, work: Path, fsync: FsyncPolicy, nodelay: bool
) -> tuple[float, float]:
    """(sender's time, time until the files are committed in the study folder)."""
    spool = work / "spool"
    shutil.rmtree(spool, ignore_errors=True)
    scp = StorageSCP(spool, port=0, quiet_s=3600, fsync=fsync)
    scp.start()
    try:
        t0 = time.perf_counter()
        dt = send(folder, scp.port, "NEUROSANDBOX", nodelay)
        if not scp.wait_idle(120):
            raise SystemExit("gateway did not commit the association")
        committed = time.perf_counter() - t0
    finally:
        scp.stop()
    n = sum(1 for _ in (spool / "studies").rglob("*.dcm"))
    if n != 819:
        raise SystemExit(f"gateway stored {n} of 819 instances")
    return dt, committed


def storescp_once(folder: Path, work: Path, nodelay: bool) -> float:
    out = work / "storescp"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    port = free_port()
    env = dict(os.environ, TCP_NODELAY="1" if nodelay else "0")
    proc = subprocess.Popen([STORESCP, "-od", str(out), str(port)], env=env)
    try:
        for _ in range(100):  # wait until it listens
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        dt = send(folder, port, "ANY-SCP", nodelay)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    n = sum(1 for _ in out.iterdir())
    if n != 819:
        raise SystemExit(f"storescp stored {n} of 819 instances")
    return dt


def pynetdicom_floor_once(folder: Path, nodelay: bool) -> float:
    """A bare pynetdicom SCP whose handler keeps nothing: the library's own cost."""
    from pynetdicom import AE, ALL_TRANSFER_SYNTAXES, AllStoragePresentationContexts, evt

    ae = AE(ae_title="FLOOR")
    ae.maximum_pdu_size = 0
    for cx in AllStoragePresentationContexts:
        if cx.abstract_syntax is not None:
            ae.add_supported_context(cx.abstract_syntax, ALL_TRANSFER_SYNTAXES)
    server = ae.start_server(
        ("127.0.0.1", 0), block=False, evt_handlers=[(evt.EVT_C_STORE, lambda _e: 0x0000)]
    )
    assert server is not None
    try:
        return send(folder, server.server_address[1], "FLOOR", nodelay)
    finally:
        server.shutdown()


GATEWAY_RUNS: dict[str, FsyncPolicy] = {
    "gateway, fsync per association (default)": "association",
    "gateway, fsync per instance": "instance",
    "gateway, no fsync": "off",
}


def throughput(folder: Path, work: Path, reps: int, nodelay: bool) -> float:
    """Print the table; return the ratio of the default configuration."""
    sender: dict[str, list[float]] = {"storescp": [], **{k: [] for k in GATEWAY_RUNS}}
    committed: dict[str, list[float]] = {k: [] for k in GATEWAY_RUNS}
    sender["stock pynetdicom, no-op handler"] = []
    for _ in range(reps):  # interleaved, so load from other processes hits every peer alike
        sender["storescp"].append(storescp_once(folder, work, nodelay))
        for name, policy in GATEWAY_RUNS.items():
            dt, until = gateway_once(folder, work, policy, nodelay)
            sender[name].append(dt)
            committed[name].append(until)
        sender["stock pynetdicom, no-op handler"].append(pynetdicom_floor_once(folder, nodelay))
    peer = statistics.median(sender["storescp"])
    label = "TCP_NODELAY=1" if nodelay else "dcmtk defaults (Nagle on)"
    print(
        f"\nC-STORE of 819 files (138 MB) by storescu, one association, {label}, median of {reps}"
    )
    print(f"  {'receiver':42} {'time':>7} {'inst/s':>7} {'ratio':>6}   until committed (ratio)")
    for name, ts in sender.items():
        med = statistics.median(ts)
        ratio = "" if name == "storescp" else f"{peer / med:6.2f}"
        line = f"  {name:42} {med:6.2f}s {819 / med:7.0f} {ratio:>6}"
        if name in committed:
            until = statistics.median(committed[name])
            line += f"   {until:6.2f}s ({peer / until:.2f})"
        print(line)
    default = peer / statistics.median(sender["gateway, fsync per association (default)"])
    verdict = "met" if default >= 0.5 else "NOT met"
    print(
        f"  => throughput ratio storescp/gateway (default) = {default:.2f} (goal >= 0.5: {verdict})"
    )
    print(
        "  ratio = storescp's median time / the receiver's; storescp never fsyncs. The stock"
        " pynetdicom\n  no-op (its 1 ms polling loops and pydicom command sets, a handler"
        " that keeps nothing)\n  is the library without gateway/scp_transport.py."
    )
    return default


class ThreadProfiles:
    """cProfile of chosen calls, in whichever thread runs them (cProfile profiles one thread)."""

    def __init__(self) -> None:
        self.profiles: list[cProfile.Profile] = []
        self._lock = threading.Lock()

    def wrap(self, fn):  # type: ignore[no-untyped-def]
        @functools.wraps(fn)
        def profiled(*args, **kwargs):  # type: ignore[no-untyped-def]
            prof = cProfile.Profile()
            prof.enable()
            try:
                return fn(*args, **kwargs)
            finally:
                prof.disable()
                with self._lock:
                    self.profiles.append(prof)

        return profiled

    def write(self, path: Path, header: str, top: int = 45) -> None:
        out = io.StringIO()
        out.write(header)
        for key in ("cumulative", "tottime"):
            stats = pstats.Stats(*self.profiles, stream=out)  # type: ignore[arg-type]
            stats.sort_stats(key).print_stats(top)
        path.write_text(out.getvalue())


def _profile_gateway(gw: object, profiles: ThreadProfiles) -> None:
    """Profile the study's job (the pipeline thread), the checklist's build and its print."""
    import gateway.pipeline as pipeline_module

    pipeline = gw.pipeline  # type: ignore[attr-defined]
    pipeline._run = profiles.wrap(pipeline._run)
    if not hasattr(pipeline_module.write_checklist, "__wrapped__"):
        pipeline_module.write_checklist = profiles.wrap(pipeline_module.write_checklist)
    if pipeline.printer is not None:
        pipeline.printer._print = profiles.wrap(pipeline.printer._print)


def _sr_count(client: object, study_uid: str) -> int:
    from gateway.sr import series_uid_for

    sid = client.find_study(study_uid)  # type: ignore[attr-defined]
    if sid is None:
        return 0
    want = series_uid_for(study_uid, "sr")
    for s in client.list_series(sid, classify=False):  # type: ignore[attr-defined]
        if s.series_uid == want:
            return len(client.series_instances(s.orthanc_id))  # type: ignore[attr-defined]
    return 0


def latency(
    folder: Path, work: Path, quiet: float, reps: int, profile: Path | None = None
) -> tuple[float, float]:
    """Print and return the medians of (a) the seconds from the last instance received to the
    SR readable in Orthanc, minus the quiet time, and (b) the floor: the same pipeline with
    nothing but the reference model's evaluation (the study's index and the evaluation in its
    worker process, as the pipeline runs them)."""
    from dicom import index_path
    from gateway.logs import configure_logging
    from gateway.orthanc import OrthancClient
    from gateway.pacs_local import LocalPacs
    from gateway.pacs_local import free_port as fp
    from gateway.routing import Router, StudyFacts
    from gateway.serve import build_gateway
    from gateway.settings import Settings
    from gateway.study_run import DefaultEvaluator
    from gateway.workers import ProcessEvaluator

    configure_logging()
    base = Settings(
        data_dir=work / "data",
        orthanc_http_port=fp(),
        orthanc_dicom_port=fp(),
        gateway_dicom_port=fp(),
        api_port=fp(),
        study_quiet_s=quiet,
    )
    pacs = LocalPacs(base)
    ep = pacs.up()
    after_quiet: list[float] = []
    floors: list[float] = []
    cold: list[float] = []
    timings: list[dict[str, float]] = []
    writeback: list[float] = []  # the evaluation back -> SR readable in Orthanc
    evaluation: list[float] = []  # the pipeline's evaluating stage (worker: job in, outcome out)
    profiles = ThreadProfiles() if profile is not None else None
    client = OrthancClient(ep.orthanc_url, ep.username, pacs.password())
    try:
        for rep in range(reps):
            # a fresh gateway (spool, run store) each time: the same study is new to it
            settings = base.model_copy(
                update={
                    "data_dir": work / f"gateway-{rep}",
                    "orthanc_url": ep.orthanc_url,
                    "orthanc_password_file": Path(ep.password_file or ""),
                }
            )
            gw = build_gateway(settings)
            received: list[ReceivedStudy] = []
            done = threading.Event()
            on_received = gw.pipeline.on_received

            def hook(study: ReceivedStudy, on_received=on_received, received=received,
                     done=done) -> str | None:  # fmt: skip
                received.append(study)
                done.set()
                return on_received(study)

            gw.scp.on_complete = hook
            started: list[float] = []  # the job's start (wall clock), for the write-back's share
            run_job = gw.pipeline._run

            def timed(job: object, run_job=run_job, started=started) -> None:  # fmt: skip
                started.append(time.time())
                run_job(job)

            gw.pipeline._run = timed  # type: ignore[method-assign]
            if profiles is not None:
                _profile_gateway(gw, profiles)
            gw.start()
            try:
                send(folder, gw.scp.port, gw.scp.ae_title, True)
                done.wait(600)
                uid = received[0].study_uid
                last = received[0].last_received
                before = len(timings)  # SRs of earlier reps are in Orthanc: wait for one more
                seen = None
                while seen is None and time.time() - last < 900:
                    if _sr_count(client, uid) > before:
                        seen = time.time()
                    time.sleep(0.05)
                if seen is None:
                    raise SystemExit("no SR appeared in Orthanc")
                after_quiet.append(seen - last - quiet)
                timings.append(gw.ctx.runs.list(limit=1)[0].timings_s)
                # the write-back's share: the evaluation back (its stage's end) -> SR readable
                back = started[0] + timings[-1]["writing the checklist"]
                writeback.append(seen - back)
                evaluation.append(timings[-1]["writing the checklist"] - timings[-1]["evaluating"])
                # the floor: the same study, indexed and evaluated as the pipeline does (its
                # worker started ahead, NEUROSANDBOX_WARM_WORKER), and with a worker spawned
                # for the study (the pipeline without a spare) for reference
                study = Path(received[0].folder)  # the spool folder: UID and patient
                for warm, into in ((True, floors), (False, cold)):
                    evaluator = ProcessEvaluator(DefaultEvaluator(settings), 600, warm=warm)
                    evaluator.prepare()
                    time.sleep(quiet + 1.0 if warm else 0.0)  # the spare's start, while idle
                    t0 = time.perf_counter()
                    index = index_path(study, workers=1, keep_headers=True)
                    route = Router().route(StudyFacts.from_index(index))
                    assert route is not None
                    evaluator.evaluate(
                        study, route, work / f"floor-{rep}-{warm}" / ("0" * 32), index
                    )
                    into.append(time.perf_counter() - t0)
            finally:
                gw.stop()
            print(
                f"  rep {rep + 1}: {after_quiet[-1]:.2f} s after the quiet time, floor"
                f" {floors[-1]:.2f} s (worker spawned for the study: {cold[-1]:.2f} s);"
                f" evaluating stage {evaluation[-1]:.2f} s, then SR readable"
                f" {writeback[-1]:.2f} s later; stages {timings[-1]}"
            )
    finally:
        client.close()
        pacs.down()
    lat, floor = statistics.median(after_quiet), statistics.median(floors)
    verdict = "met" if lat - floor <= GOAL_OVERHEAD_S else "NOT met"
    if profiles is not None and profile is not None:
        profiles.write(profile, (
            f"bench/ingest.py latency, {reps} run(s): the gateway's job, checklist and print "
            f"threads (cProfile)\nafter the quiet time {after_quiet}, floor {floors}\n"
            f"stages {timings}\nload {os.getloadavg()}\n\n"
        ))  # fmt: skip
        print(f"  profile: {profile}")
    print(
        f"\nLatency, last instance received -> SR readable in Orthanc (819-file DWI, quiet time"
        f" {quiet:g} s), median of {reps}:"
    )
    print(f"  => {lat:.2f} s after the quiet time; floor (index + reference evaluation in its")
    print(
        f"     worker) {floor:.2f} s; overhead {lat - floor:.2f} s (goal <= {GOAL_OVERHEAD_S:g} s: {verdict})"
    )
    print(
        f"     (a worker spawned per study instead of the spare started ahead: floor"
        f" {statistics.median(cold):.2f} s)"
    )
    print(
        f"     of which: the pipeline's evaluating stage {statistics.median(evaluation):.2f} s"
        f" (worker's index + evaluation in the floor), the evaluation back -> SR readable"
        f" {statistics.median(writeback):.2f} s (medians)"
    )
    return lat, floor


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quiet", type=float, default=2.0, help="study quiet time for the latency run")
    ap.add_argument("--latency-reps", type=int, default=3, help="latency runs (median)")
    ap.add_argument("--no-latency", action="store_true")
    ap.add_argument("--no-throughput", action="store_true", help="the latency part only")
    ap.add_argument("--profile", type=Path, help="write the gateway's cProfile top entries here")
    ap.add_argument(
        "--dcmtk-defaults", action="store_true", help="also measure with Nagle on (slow)"
    )
    args = ap.parse_args()
    for tool in (STORESCU, STORESCP):
        if not Path(tool).exists():
            raise SystemExit(f"benchmark needs dcmtk ({tool})")
    with tempfile.TemporaryDirectory(prefix="nsbx-bench-ingest-") as tmp:
        work = Path(tmp)
        folder = unzip_dwi(work)
        ratio = None if args.no_throughput else throughput(folder, work, args.reps, True)
        if args.dcmtk_defaults:
            throughput(folder, work, 1, nodelay=False)
        lat = (
            None
            if args.no_latency
            else latency(folder, work, args.quiet, args.latency_reps, args.profile)
        )
    print(f"\nSummary (819-file DWI; load {' '.join(f'{x:.2f}' for x in os.getloadavg())}):")
    if ratio is not None:
        print(f"  C-STORE throughput, storescp/gateway: {ratio:.2f} (goal >= 0.5)")
    if lat is not None:
        print(
            f"  last instance -> SR in Orthanc, after the quiet time: {lat[0]:.2f} s; floor"
            f" {lat[1]:.2f} s; overhead {lat[0] - lat[1]:.2f} s (goal <= {GOAL_OVERHEAD_S:g} s)"
        )


if __name__ == "__main__":
    main()
