"""`neurosandbox phantoms`: generate the synthetic phantom suite (registered in gateway/cli/)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from gateway.cli.console import cli_console

console = cli_console(stderr=True)


def phantoms_command(
    cases: Annotated[
        int, typer.Option("--cases", help="number of cases (30 cover every group x L1-L3)")
    ] = 30,
    seed: Annotated[
        int, typer.Option("--seed", help="random seed: same seed, byte-identical files")
    ] = 0,
    out: Annotated[
        Path, typer.Option("--out", help="output folder (one sub-folder per case + suite.json)")
    ] = Path("out/phantoms"),
    only: Annotated[
        str | None,
        typer.Option("--only", help="generate only these 1-based case indices, e.g. 1,5,7"),
    ] = None,
) -> None:
    """Generate synthetic neuro MRI/CT cases with lesions, EHR, planted PHI and exact ground truth."""
    from evaluation.datasets import AnatomyError, generate_suite
    from gateway.settings import get_settings

    try:
        picks = [int(v) for v in only.split(",")] if only else None
    except ValueError:
        console.print(
            f"[red]error:[/red] --only takes integers separated by commas, not {escape(only or '')!r}"
        )
        raise typer.Exit(2) from None
    t0 = time.perf_counter()
    last = [t0]

    def progress(done: int, total: int, case_id: str) -> None:
        now = time.perf_counter()
        console.print(f"  [{done}/{total}] {escape(case_id)}  ({now - last[0]:.1f} s)")
        last[0] = now

    try:
        manifest = generate_suite(
            out, cases, seed, progress=progress, only=picks, cache=get_settings().cache
        )
    except (AnatomyError, ValueError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    n_files = sum(len(c.files) for c in manifest.cases)
    console.print(
        f"{len(manifest.cases)} case(s), {n_files} files, manifest {escape(str(out / 'suite.json'))} "
        f"({time.perf_counter() - t0:.1f} s)"
    )
