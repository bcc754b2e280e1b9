"""The main job in one command: local PACS, phantom suite, evaluation, reports, write-back.

Steps (each prints what it does and how long it took):
1. start the embedded Orthanc on loopback (``neurosandbox pacs up``);
2. generate the phantom suite (reused when the same cases and seed are already on disk);
3. send every study to Orthanc by DICOM C-STORE with dcmtk's storescu as the gateway's AE
   (studies Orthanc already holds are skipped);
4. evaluate every task family with the reference models plus every litellm model named in
   ``NEUROSANDBOX_MODELS``;
5. write checklists and the run summary (HTML, PDF, JSON), and an UNVERIFIED SR and the
   checklist PDF back into each study in Orthanc;
6. stop Orthanc unless ``keep`` (``KEEP=1`` in ``make demo``).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Annotated

import pydicom
import typer
from rich.console import Console
from rich.markup import escape

from gateway.cli import demo_state as state
from gateway.settings import Settings, get_settings

REFERENCE_MODELS = ["reference/image-rules", "reference/text-prior"]
STORESCU = "/usr/bin/storescu"
INDEX_FILE = ".demo-index.json"  # the ReportIndex of the last report, for a reused report
console = Console(stderr=True)


class DemoError(RuntimeError):
    """A demo step failed; the message says which and what to do."""


def _step(n: int, text: str) -> float:
    console.print(f"[bold cyan]{n}.[/bold cyan] {text}")
    return time.perf_counter()


def _done(t0: float, text: str = "") -> None:
    console.print(f"   done in {time.perf_counter() - t0:.1f} s {escape(text)}")


def _suite(out: Path, cases: int, seed: int) -> Path:
    from evaluation import GENERATOR_VERSION, SuiteManifest, generate_suite

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

    generate_suite(suite, cases, seed, progress=progress)
    return suite


def _send(suite: Path, settings: Settings, endpoints: object) -> tuple[int, int]:
    """C-STORE every case study Orthanc lacks; returns (studies sent, studies already there)."""
    import json

    from gateway.orthanc import OrthancClient
    from gateway.pacs_local import dcmtk_env

    client = OrthancClient.from_settings(settings)
    sent = skipped = 0
    try:
        for case_dir in sorted(p for p in suite.iterdir() if (p / "case.json").exists()):
            case = json.loads((case_dir / "case.json").read_text())
            uids = case.get("provenance", {}).get("study_uids") or []
            if uids and all(client.find_study(u) for u in uids):
                skipped += 1
                continue
            cmd = [
                STORESCU,
                "-aet",
                settings.gateway_aet,
                "-aec",
                getattr(endpoints, "orthanc_aet", settings.orthanc_aet),
                "+sd",
                "+r",
                "-q",
                "127.0.0.1",
                str(getattr(endpoints, "orthanc_dicom_port")),  # noqa: B009
                str(case_dir / "dicom"),
            ]
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=600, check=False, env=dcmtk_env()
            )
            if proc.returncode != 0:
                raise DemoError(
                    f"storescu failed for {case_dir.name} (exit {proc.returncode}): {proc.stderr[-400:]}"
                )
            missing = [u for u in uids if not client.find_study(u)]
            if missing:
                raise DemoError(f"Orthanc did not store study {missing[0]} of {case_dir.name}")
            sent += 1
            console.print(f"   sent {escape(case_dir.name)}")
    finally:
        client.close()
    return sent, skipped


def _evaluate(
    suite: Path, run_dir: Path, settings: Settings, samples: int, extra: list[str]
) -> None:
    from evaluation import DatasetSpec, RunConfig, start_run
    from gateway.cli.console import ProgressBar, print_run

    config = RunConfig.from_settings(
        settings, DatasetSpec(path=str(suite)), models=REFERENCE_MODELS + extra, samples=samples
    )
    with ProgressBar() as bar:
        stats = asyncio.run(start_run(config, run_dir, on_progress=bar))
    print_run(stats, run_dir)


def _write_back(run_dir: Path, report_dir: Path, settings: Settings) -> list[str]:
    """One UNVERIFIED SR per model and the checklist PDF into each case's study in Orthanc.

    Returns the Orthanc ids of the instances stored."""
    from evaluation import load_run, report_blocks, unverified_content
    from gateway.orthanc import OrthancClient
    from gateway.sr import build_pdf, build_sr, encode

    run = load_run(run_dir)
    client = OrthancClient.from_settings(settings)
    stored: list[str] = []
    try:
        for case in run.cases:
            root = Path(run.case_roots.get(case.case_id, "")) or None
            study = (root / (case.study_path or "dicom")) if root else None
            if study is None or not study.is_dir():
                console.print(f"   [yellow]no study folder for {escape(case.case_id)}[/yellow]")
                continue
            wanted = {i.series_uid for i in case.images if i.series_uid}
            headers = []
            for f in sorted(study.rglob("*")):
                if not f.is_file():
                    continue
                ds = pydicom.dcmread(f, stop_before_pixels=True)
                if not wanted or ds.SeriesInstanceUID in wanted:
                    headers.append(ds)
                if len(headers) >= 400:
                    break
            if not headers:
                continue
            modality = "CT" if all(h.Modality == "CT" for h in headers) else "MR"
            for block in report_blocks(run.samples_of(case.case_id)):
                content = unverified_content(block)
                sr = build_sr(
                    headers, content, block.model, "demo", instance_number=1, modality=modality
                )
                stored.append(client.upload(encode(sr)))
            pdf = report_dir / "cases" / f"{case.case_id}.pdf"
            if pdf.exists():
                doc = build_pdf(headers[0], pdf.read_bytes(), "NeuroSandbox checklist", 1)
                stored.append(client.upload(encode(doc)))
    finally:
        client.close()
    return stored


def _already_written_back(run_dir: Path, settings: Settings) -> int | None:
    from gateway.orthanc import OrthancClient, OrthancError

    client = OrthancClient.from_settings(settings)

    def exists(orthanc_id: str) -> bool:
        try:
            client.get_json(f"/instances/{orthanc_id}")
        except OrthancError:
            return False
        return True

    try:
        return state.written_back(run_dir, exists)
    finally:
        client.close()


def run_demo(
    settings: Settings, out: Path, cases: int, seed: int, samples: int, keep: bool, extra: list[str]
) -> Path:
    """Run every step; returns the report folder."""
    from evaluation import ReportIndex, load_run, write_report
    from gateway.pacs_local import LocalPacs, orthanc_password

    t_all = time.perf_counter()
    pacs = LocalPacs(settings)
    t = _step(1, "starting the local Orthanc (embedded PACS) on loopback")
    endpoints = pacs.up()
    _done(t, f"at {endpoints.orthanc_url}")
    try:
        t = _step(2, f"phantom suite: {cases} cases, seed {seed}")
        suite = _suite(out, cases, seed)
        _done(t)
        t = _step(3, "sending the studies to Orthanc by DICOM C-STORE (dcmtk storescu)")
        sent, skipped = _send(suite, settings, endpoints)
        _done(t, f"({sent} sent, {skipped} already in Orthanc)")
        names = ", ".join(REFERENCE_MODELS + extra)
        t = _step(4, f"evaluating every task family with {names}")
        inputs = state.run_inputs(suite, REFERENCE_MODELS + extra, samples)
        reused = state.reusable_run(out / "runs", inputs)
        if reused is not None:
            run_dir = reused
            console.print(
                f"   reusing run {escape(run_dir.name)}: same suite, models, samples and code "
                f"(delete {escape(str(out / 'runs'))} to evaluate afresh)"
            )
        else:
            run_dir = out / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
            _evaluate(suite, run_dir, settings, samples, extra)
            state.mark_run(run_dir, inputs)
        _done(t, f"run folder {run_dir}")
        t = _step(5, "writing checklists and the run summary (HTML, PDF, JSON)")
        report_dir = out / "report"
        if state.report_is_current(report_dir, run_dir):
            console.print("   the report of this run is already written: reusing it")
            index = ReportIndex.model_validate_json((report_dir / INDEX_FILE).read_text())
        else:
            if report_dir.exists():
                shutil.rmtree(report_dir)
            index = write_report(load_run(run_dir), report_dir)
            (report_dir / INDEX_FILE).write_text(index.model_dump_json(indent=2))
            state.mark_report(report_dir, run_dir)
        _done(t)
        t = _step(6, "writing SR and checklist PDF back into each study in Orthanc (UNVERIFIED)")
        n = None if sent else _already_written_back(run_dir, settings)
        if n is not None:
            _done(t, f"({n} instances from this run already in Orthanc)")
        else:
            stored = _write_back(run_dir, report_dir, settings)
            state.mark_written_back(run_dir, stored)
            _done(t, f"({len(stored)} instances stored)")
    finally:
        if keep:
            pw = orthanc_password(settings, endpoints)
            console.print(
                f"Orthanc keeps running: {endpoints.orthanc_url} user {settings.orthanc_username} "
                f"password {pw or '(see neurosandbox pacs status --json)'}; stop it with "
                "`neurosandbox pacs down`"
            )
        else:
            pacs.down()
            console.print("Orthanc stopped (KEEP=1 leaves it running)")
    console.print(f"[bold green]demo finished in {time.perf_counter() - t_all:.0f} s[/bold green]")
    console.print(f"  run summary: {escape(str(Path(index.summary_html).resolve()))}")
    if index.summary_pdf:
        console.print(f"  summary PDF: {escape(str(Path(index.summary_pdf).resolve()))}")
    console.print(f"  checklists:  {escape(str((report_dir / 'cases').resolve()))}")
    console.print(f"  run store:   {escape(str((run_dir / 'run.sqlite').resolve()))}")
    for w in index.warnings:
        console.print(f"  [yellow]warning:[/yellow] {escape(w)}")
    return report_dir


def demo_command(
    out: Annotated[Path, typer.Option("--out", help="output folder")] = Path("out/demo"),
    cases: Annotated[int, typer.Option(help="phantom cases to generate")] = 25,
    seed: Annotated[int, typer.Option(help="phantom suite seed")] = 0,
    samples: Annotated[int, typer.Option(help="independent samples per task (pass@k)")] = 1,
    keep: Annotated[
        bool, typer.Option("--keep", envvar="KEEP", help="leave Orthanc running afterwards")
    ] = False,
) -> None:
    """The main job: local Orthanc, phantom suite sent by C-STORE, evaluation of every task
    family with the reference models (plus NEUROSANDBOX_MODELS), reports, SR and PDF back in
    Orthanc, leaderboard. A second run reuses the suite, the studies and the render cache."""
    import os

    settings = get_settings()
    extra = (
        [m for m in settings.models if m not in REFERENCE_MODELS]
        if os.environ.get("NEUROSANDBOX_MODELS")
        else []
    )
    try:
        run_demo(settings, out, cases, seed, samples, keep, extra)
    except DemoError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(1) from None
