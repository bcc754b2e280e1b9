"""The main job in one command, through the product's own path: the local PACS and the gateway
(DICOM node, pipeline, API), the phantom studies sent to the gateway's DICOM node by C-STORE,
evaluated by the pipeline, SR and PDF written back, every case in the review queue.

Steps (each prints what it does and how long it took):
1. start the embedded Orthanc on loopback (``neurosandbox pacs up``);
2. generate the phantom suite (reused when the same cases and seed are already on disk);
3. start the gateway (``neurosandbox serve``) with the suite registered as the team's cases
   (``NEUROSANDBOX_CASES``: each study is evaluated as its case, record, note and truth
   included), a routing rule for every task family with the reference models plus every
   litellm model named in ``NEUROSANDBOX_MODELS``, and a short quiet time;
4. send every study to the gateway's DICOM node with dcmtk's storescu; the node forwards each
   instance to Orthanc as it arrives and, once the study is complete, the pipeline evaluates
   it, writes an UNVERIFIED SR per model and the checklist PDF into the study in Orthanc, and
   puts the case into the review queue (a study whose evaluation is still current is not sent
   again);
5. the leaderboard and the run summary (HTML, PDF, JSON) over the gateway's runs;
6. a reviewer token and the review URL; stop the gateway and Orthanc unless ``keep``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from gateway.cli import demo_state as state
from gateway.cli.console import cli_console
from gateway.settings import Settings, get_settings

REFERENCE_MODELS = ["reference/image-rules", "reference/text-prior"]
STORESCU = "/usr/bin/storescu"
DEMO_AET = "DEMO_SCANNER"  # the calling AE title the demo's studies come from
QUIET_S = 1.0  # the demo's quiet time: storescu sends each study in one association
INDEX_FILE = ".demo-index.json"  # the ReportIndex of the last report, for a reused report
console = cli_console(stderr=True)  # not wrapped when not a terminal (make demo | tee)


class DemoError(RuntimeError):
    """A demo step failed; the message says which and what to do."""


def _step(n: int, text: str) -> float:
    console.print(f"[bold cyan]{n}.[/bold cyan] {text}")
    return time.perf_counter()


def _done(t0: float, text: str = "") -> None:
    console.print(f"   done in {time.perf_counter() - t0:.1f} s {escape(text)}")


def _suite(out: Path, cases: int, seed: int, cache: Path | None) -> Path:
    import shutil

    from evaluation.datasets import GENERATOR_VERSION, SuiteManifest, generate_suite

    suite = out / "suite"
    manifest = suite / "suite.json"
    if manifest.exists():
        try:
            m = SuiteManifest.model_validate_json(manifest.read_text())
            same = m.generator_version == GENERATOR_VERSION
            if same and m.seed == seed and len(m.cases) == cases:
                console.print(f"   reusing {len(m.cases)} cases in {escape(str(suite))}")
                return suite
        except ValueError:
            pass
        shutil.rmtree(suite)

    def progress(done: int, total: int, case_id: str) -> None:
        console.print(f"   [{done}/{total}] {escape(case_id)}")

    generate_suite(suite, cases, seed, progress=progress, cache=cache)
    return suite


def _studies(suite: Path) -> list[tuple[str, str, Path]]:
    """(case id, its first StudyInstanceUID, DICOM folder) of every case of the suite, once
    each (a case may name two studies: both are sent, the first is waited for), from the
    registry the gateway is given."""
    from evaluation.datasets import case_registry

    cases, _problems = case_registry(suite)
    unique = {c.case_id: c for c in cases.values()}
    return sorted(
        (c.case_id, c.provenance.study_uids[0], Path(c.root or suite) / (c.study_path or "dicom"))
        for c in unique.values()
    )


def _routing(out: Path, models: list[str], inputs: dict[str, Any], orthanc_aet: str) -> Path:
    """The demo's routing rule: every study from the demo's AE or from the local Orthanc (a
    study sent from Orthanc's preconfigured destination, the gateway), every task family. Its
    name carries the demo's inputs (suite, models, code): changed inputs evaluate again."""
    from evaluation import TaskFamily

    tag = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:12]
    rules = {
        "rules": [
            {
                "name": f"demo-{tag}",
                "match": {"calling_aet": [DEMO_AET, orthanc_aet]},
                "evaluate": {"models": models, "tasks": [t.value for t in TaskFamily]},
            }
        ]
    }
    path = out / "routing.json"  # JSON is YAML
    path.write_text(json.dumps(rules, indent=2))
    return path


# --------------------------------------------------------------------------- the gateway


class GatewayProcess:
    """``neurosandbox serve`` in its own session, stopped by PID (DATA_DIR/gateway.pid)."""

    def __init__(self, settings: Settings, log: Path) -> None:
        self.settings, self.log = settings, log
        self.pid_file = settings.data_dir / "gateway.pid"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str], api_url: str, timeout_s: float = 90.0) -> None:
        from gateway.pacs_local import stop_gateway

        stop_gateway(self.settings.data_dir)  # one left running by an earlier KEEP=1
        self.log.parent.mkdir(parents=True, exist_ok=True)
        binary = Path(sys.executable).with_name("neurosandbox")
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen(
                [str(binary), "serve"],
                env=env,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        self.pid_file.write_text(str(self.proc.pid))
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise DemoError(f"the gateway did not start: {self.tail()}")
            try:
                if httpx.get(f"{api_url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise DemoError(f"the gateway did not answer at {api_url} within {timeout_s:g} s")

    def tail(self, n: int = 1500) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return "(no log)"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        from gateway.pacs_local import stop_gateway

        stop_gateway(self.settings.data_dir)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)


def _gateway_env(settings: Settings, suite: Path, routing: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        NEUROSANDBOX_CASES=str(suite.resolve()),
        NEUROSANDBOX_ROUTING_FILE=str(routing.resolve()),
        NEUROSANDBOX_STUDY_QUIET_S=str(QUIET_S),
        NEUROSANDBOX_FOLLOW_CHANGES="false",
        NEUROSANDBOX_DATA_DIR=str(settings.data_dir.resolve()),
        NEUROSANDBOX_RUN_SOURCE="demo",  # the runs index lists its runs as the demo's
    )
    return env


# --------------------------------------------------------------------------- sending, waiting


def _send(folder: Path, endpoints: Any) -> None:
    from gateway.pacs_local import dcmtk_env

    cmd = [STORESCU, "-aet", DEMO_AET, "-aec", endpoints.gateway_aet, "+sd", "+r", "-q",
           "127.0.0.1", str(endpoints.gateway_dicom_port), str(folder)]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, check=False, env=dcmtk_env()
    )
    if proc.returncode != 0:
        raise DemoError(
            f"storescu to the gateway failed for {folder.parent.name} (exit {proc.returncode}): "
            f"{proc.stderr[-400:]}"
        )


def _current_run(runs: Any, mark: dict[str, Any], case_id: str, orthanc: Any) -> str | None:
    """The gateway run of this case that is still current: recorded for these inputs, done,
    its report bundle on disk and its SRs and PDF still in Orthanc."""
    from gateway.runs import RunNotFoundError, RunStatus

    run_id = (mark.get("cases") or {}).get(case_id)
    if not isinstance(run_id, str):
        return None
    try:
        rec = runs.get(run_id)
        runs.report_path(run_id, "json")
    except RunNotFoundError:
        return None
    if rec.status is not RunStatus.DONE or not rec.sr_sop_uids or not rec.pdf_sop_uid:
        return None
    if not all(orthanc.find_instance(uid) for uid in [*rec.sr_sop_uids.values(), rec.pdf_sop_uid]):
        return None
    return run_id


def _wait_runs(
    runs: Any, pending: dict[str, str], after: str, gw: GatewayProcess, timeout_s: float
) -> dict[str, str]:
    """Wait until the pipeline has a finished run for every pending study (StudyInstanceUID ->
    case id), among the runs made after the run id ``after``; returns case id -> run id.
    Prints each as it finishes. Each poll reads only the records of runs not yet finished."""
    from gateway.runs import RunNotFoundError, RunStatus

    found: dict[str, str] = {}
    ended: set[str] = set()  # run ids finished (or of other studies): not read again
    deadline = time.monotonic() + timeout_s
    t0 = time.perf_counter()
    while len(found) < len(pending):
        if not gw.alive():
            raise DemoError(f"the gateway stopped: {gw.tail()}")
        if time.monotonic() > deadline:
            left = sorted(set(pending.values()) - set(found))
            raise DemoError(f"no finished gateway run after {timeout_s:g} s for {left[:5]}")
        for run_id in runs.ids(after=after):
            if run_id in ended:
                continue
            try:
                rec = runs.get(run_id)
            except RunNotFoundError:  # being created
                continue
            case = pending.get(rec.study_uid or "")
            if rec.status in (RunStatus.QUEUED, RunStatus.RUNNING):
                continue
            ended.add(run_id)
            if case is None or case in found:
                continue
            if rec.status is not RunStatus.DONE:
                raise DemoError(
                    f"the gateway's run of {case} {rec.status.value}: {rec.error} "
                    f"(run {rec.run_id}; log {gw.log})"
                )
            found[case] = rec.run_id
            took = rec.timings_s.get("done")
            console.print(
                f"   [{len(found)}/{len(pending)}] {escape(case)}: evaluated"
                + (f" in {took:.1f} s" if took else "")
                + f", {len(rec.sr_sop_uids)} SR + {'1' if rec.pdf_sop_uid else '0'} PDF in Orthanc"
                f" ({time.perf_counter() - t0:.0f} s)"
            )
        time.sleep(0.25)
    return found


# --------------------------------------------------------------------------- the report


def _merged(store: Any, runs: dict[str, str]) -> Any:
    """One run of every case: the gateway runs, read from their run logs, together."""
    from evaluation.log import RunData
    from gateway.runs.reading import read_run

    parts = [read_run(store, run_id) for _case, run_id in sorted(runs.items())]
    first = parts[0]
    digest = hashlib.sha256("\n".join(sorted(runs.values())).encode()).hexdigest()[:8]
    return RunData(
        run_id=f"demo-{digest}",
        title=f"NeuroSandbox demo: {len(parts)} studies through the gateway",
        created_at=first.created_at,
        config={k: v for k, v in first.config.items() if k != "gateway"},
        code_version=first.code_version,
        cases=[c for p in parts for c in p.cases],
        case_roots={k: v for p in parts for k, v in p.case_roots.items()},
        samples=[s for p in parts for s in p.samples],
    )


def _print_leaderboard(report_dir: Path) -> None:
    """The leaderboard of the report just written (or reused): its summary.json."""
    from evaluation.reports import SummaryReport
    from gateway.cli.console import print_leaderboard

    report = SummaryReport.model_validate_json((report_dir / "summary.json").read_text())
    if report.summary is not None and report.summary.leaderboard:
        print_leaderboard(report.summary)


def _reviewer_token(settings: Settings) -> str:
    from gateway.auth import Role, TokenStore, tokens_file

    name = "demo reviewer"
    tokens = TokenStore(tokens_file(settings.data_dir))
    for rec in tokens.list():  # the secret is shown once: an earlier demo's token goes
        if rec.name == name and not rec.revoked:
            tokens.revoke(rec.id)
    _rec, secret = tokens.create(Role.REVIEWER, name=name, person="Demo^Reviewer")
    return secret


@contextlib.contextmanager
def _services(settings: Settings, keep: bool) -> Iterator[tuple[Any, GatewayProcess]]:
    from gateway.pacs_local import LocalPacs

    pacs = LocalPacs(settings)
    gw = GatewayProcess(settings, settings.data_dir / "gateway.log")
    t = _step(1, "starting the local Orthanc (embedded PACS) on loopback")
    endpoints = pacs.up()
    _done(t, f"at {endpoints.orthanc_url}")
    try:
        yield endpoints, gw
    finally:
        if not keep:
            gw.stop()
            pacs.down()
            console.print("gateway and Orthanc stopped (KEEP=1 leaves them running)")


def run_demo(
    settings: Settings, out: Path, cases: int, seed: int, samples: int, keep: bool, extra: list[str]
) -> Path:
    """Run every step; returns the report folder."""
    from evaluation.reports import ReportIndex, write_report
    from gateway.orthanc import OrthancClient
    from gateway.pacs_local import orthanc_password
    from gateway.runs import StudyRunStore

    if samples != 1:
        raise DemoError("the demo evaluates through the gateway, one sample per task (--samples 1)")
    t_all = time.perf_counter()
    models = REFERENCE_MODELS + extra
    out.mkdir(parents=True, exist_ok=True)
    with _services(settings, keep) as (endpoints, gw):
        t = _step(2, f"phantom suite: {cases} cases, seed {seed}")
        suite = _suite(out, cases, seed, settings.cache)
        _done(t)
        inputs = state.run_inputs(suite, models, samples)
        routing = _routing(out, models, inputs, endpoints.orthanc_aet)
        t = _step(
            3, "starting the gateway (DICOM node, pipeline, API) with the suite as the team's cases"
        )
        gw.start(_gateway_env(settings, suite, routing), endpoints.api_url)
        _done(
            t,
            f"DICOM {endpoints.gateway_aet}@127.0.0.1:{endpoints.gateway_dicom_port}, API {endpoints.api_url}",
        )
        t = _step(4, "sending each study to the gateway's DICOM node (dcmtk storescu); the pipeline "
                     "evaluates it and writes SR + PDF back into Orthanc")  # fmt: skip
        mark_file = out / state.GATEWAY_MARK
        mark = state.read_mark(mark_file, inputs)
        orthanc = OrthancClient.from_settings(settings)
        store = StudyRunStore(settings.runs_root, settings.reports_root, settings.database_url)
        try:
            studies = _studies(suite)
            runs: dict[str, str] = {}
            for case_id, _uid, _folder in studies:
                current = _current_run(store, mark, case_id, orthanc)
                if current is not None:
                    runs[case_id] = current
            todo = [(c, u, f) for c, u, f in studies if c not in runs]
            if runs:
                console.print(
                    f"   {len(runs)} studies already evaluated with these inputs, their SR and "
                    f"PDF in Orthanc: not sent again (delete {escape(str(mark_file))} to redo)"
                )
            after = f"{time.time_ns():016x}"  # run ids are time-ordered (StudyRunStore.new_id)
            for _case, _uid, folder in todo:
                _send(folder, endpoints)
            if todo:
                console.print(f"   sent {len(todo)} studies; waiting for the pipeline")
            runs |= _wait_runs(store, {u: c for c, u, _ in todo}, after, gw, 600 + 60 * len(todo))
        finally:
            orthanc.close()
        state.write_mark(mark_file, inputs, runs)
        _done(t, f"({len(todo)} sent and evaluated, {len(studies) - len(todo)} reused)")

        t = _step(5, "leaderboard and run summary (HTML, PDF, JSON) over the gateway's runs")
        run = _merged(store, runs)
        report_dir = out / "report"
        if state.report_is_current(report_dir, run.run_id):
            console.print("   the report of these runs is already written: reusing it")
            index = ReportIndex.model_validate_json((report_dir / INDEX_FILE).read_text())
        else:
            import shutil

            if report_dir.exists():
                shutil.rmtree(report_dir)
            index = write_report(run, report_dir)
            (report_dir / INDEX_FILE).write_text(index.model_dump_json(indent=2))
            state.mark_report(report_dir, run.run_id)
        _print_leaderboard(report_dir)
        _done(t)
        t = _step(6, "review queue: a reviewer token")
        token = _reviewer_token(settings)
        _done(t)
        if keep:
            pw = orthanc_password(settings, endpoints)
            console.print(
                f"Orthanc keeps running: {endpoints.orthanc_url} user {settings.orthanc_username} "
                f"password {pw or '(see neurosandbox pacs status --json)'}; the gateway too "
                f"(API {endpoints.api_url}, log {escape(str(gw.log))}); stop both with "
                "`neurosandbox pacs down`"
            )
    console.print(f"[bold green]demo finished in {time.perf_counter() - t_all:.0f} s[/bold green]")
    console.print(f"  run summary: {escape(str(Path(index.summary_html).resolve()))}")
    if index.summary_pdf:
        console.print(f"  summary PDF: {escape(str(Path(index.summary_pdf).resolve()))}")
    console.print(f"  checklists:  {escape(str((report_dir / 'cases').resolve()))}")
    console.print(f"  gateway runs: {escape(str(store.runs_dir.resolve()))} "
                  "(`neurosandbox runs list`)")  # fmt: skip
    _print_review(f"{endpoints.api_url}/review", token, keep)
    for w in index.warnings:
        console.print(f"  [yellow]warning:[/yellow] {escape(w)}")
    return report_dir


def _print_review(url: str, token: str, keep: bool) -> None:
    """Where to review, and the reviewer token on a line of its own, whole (to copy)."""
    stays = "" if keep else " (with KEEP=1 the gateway stays up to review)"
    console.print(f"  review queue: {escape(url)}{stays}")
    console.print(f"  reviewer token {escape(token)}", soft_wrap=True, highlight=False)


def demo_command(
    out: Annotated[
        Path | None,
        typer.Option("--out", help="output folder (default: NEUROSANDBOX_OUT/demo, out/demo)"),
    ] = None,
    cases: Annotated[int, typer.Option(help="phantom cases to generate")] = 25,
    seed: Annotated[int, typer.Option(help="phantom suite seed")] = 0,
    samples: Annotated[int, typer.Option(help="samples per task (the gateway takes 1)")] = 1,
    keep: Annotated[
        bool,
        typer.Option(
            "--keep", envvar="KEEP", help="leave Orthanc and the gateway running afterwards"
        ),
    ] = False,
) -> None:
    """The main job, through the product: local Orthanc and the gateway, the phantom studies
    sent to the gateway's DICOM node by C-STORE, evaluated by its pipeline (every task family,
    reference models plus NEUROSANDBOX_MODELS), SR and PDF back in Orthanc, every case in the
    review queue, leaderboard and run summary. A second run reuses what is still current."""
    settings = get_settings()
    extra = (
        [m for m in settings.models if m not in REFERENCE_MODELS]
        if "models" in settings.model_fields_set  # NEUROSANDBOX_MODELS given
        else []
    )
    try:
        run_demo(settings, out or settings.out / "demo", cases, seed, samples, keep, extra)
    except DemoError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(1) from None
