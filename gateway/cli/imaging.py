"""``neurosandbox inspect`` and ``render``: the imaging core on a file, folder, zip or NIfTI."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gateway.cli.console import console
from gateway.settings import get_settings


def _progress(done: int, total: int) -> None:
    if total >= 100:
        console.print(f"  read {done}/{total} headers", end="\r")


def inspect(
    path: Annotated[
        Path, typer.Argument(help="DICOM file, folder (recursive), zip archive or NIfTI file")
    ],
    as_json: Annotated[
        bool, typer.Option("--json", help="print a JSON list instead of a table")
    ] = False,
    frames: Annotated[
        bool, typer.Option(help="with --json, include every frame reference")
    ] = False,
) -> None:
    """List the series found under PATH: class (with the reason), plane, shape, geometry, errors.

    With --json, prints a JSON list: one object per series stack (class, reason, plane, shape,
    spacing, affine as 4x4 RAS, n_files, errors...), then one object per file that could not be
    used, with "class": "ERROR" and its message in "errors". Exits 1 when nothing under PATH
    could be read (every file an error), 2 when PATH does not exist.
    """
    from dicom import index_path

    settings = get_settings()
    if not path.exists():
        console.print(f"[red]error:[/red] no such file or folder: {escape(str(path))}")
        raise typer.Exit(2)
    result = index_path(
        path, memory_cap=settings.memory_cap, workers=settings.workers, progress=_progress
    )
    if as_json:
        rows: list[dict[str, object]] = []
        for s in result.series:
            row = s.model_dump(mode="json", by_alias=True, exclude=None if frames else {"volumes"})
            row["errors"] = [e.message for e in s.errors]
            rows.append(row)
        for e in result.errors:
            rows.append(
                {
                    "path": e.path,
                    "series_uid": None,
                    "class": "ERROR",
                    "kind": e.kind,
                    "errors": [e.message],
                }
            )
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        if not result.series and result.errors:
            raise typer.Exit(1)
        return
    table = Table(title=f"{len(result.series)} series stack(s) in {result.n_files} file(s)")
    for col in ("series", "class", "plane", "shape", "spacing mm", "files", "reason"):
        table.add_column(col, overflow="fold")
    for s in result.series:
        uid = s.key if s.series_uid else "-"
        desc = f"{s.series_number if s.series_number is not None else ''} {s.description}".strip()
        label = f" [{s.stack_label}]" if s.stack_label else ""
        table.add_row(
            escape(f"{desc}{label}\n{uid}"),
            escape(f"{s.series_class.value} ({s.confidence:.2f})\n{s.detail}"),
            s.plane.value if s.plane else "-",
            "x".join(str(v) for v in s.shape) or "-",
            "x".join(f"{v:g}" for v in s.spacing) or "-",
            str(s.n_files),
            escape(s.reason + ("" if not s.warnings else "\n! " + "\n! ".join(s.warnings))),
        )
    Console().print(table)
    if result.errors:
        err = Table(title=f"{len(result.errors)} file(s) not used")
        err.add_column("kind")
        err.add_column("message", overflow="fold")
        for e in result.errors:
            err.add_row(e.kind, escape(e.message))
        Console().print(err)
    if not result.series and result.errors:
        raise typer.Exit(1)  # nothing under PATH could be read


def render(
    path: Annotated[Path, typer.Argument(help="DICOM file, folder, zip archive or NIfTI file")],
    out: Annotated[Path, typer.Option("--out", help="output folder for PNGs and manifest.json")],
    series: Annotated[
        str | None,
        typer.Option(
            "--series", help="series UID (or UID#stack) to render; default: every clinical series"
        ),
    ] = None,
    slices: Annotated[
        int, typer.Option("--slices", help="number of evenly spaced slices over the head")
    ] = 12,
    indices: Annotated[
        str | None,
        typer.Option("--indices", help="explicit slice indices, e.g. 3,5,7 (display order)"),
    ] = None,
    window: Annotated[
        str,
        typer.Option(
            "--window", help="auto, brain, subdural, stroke, bone, soft, percentile or CENTER/WIDTH"
        ),
    ] = "auto",
    mask_series: Annotated[
        str | None,
        typer.Option(
            "--mask-series",
            help="series UID of a mask on the same grid: render the slices through it",
        ),
    ] = None,
    diffusion: Annotated[
        str, typer.Option("--diffusion", help="for DWI: trace, b1000 or b0")
    ] = "trace",
    native_plane: Annotated[
        bool,
        typer.Option(
            "--native-plane",
            help="keep sagittal/coronal acquisitions in their plane instead of reslicing to axial",
        ),
    ] = False,
    tile_size: Annotated[int, typer.Option("--tile-size", help="pixels per montage tile")] = 256,
    columns: Annotated[int, typer.Option("--columns", help="tiles per montage row")] = 4,
    singles: Annotated[
        bool, typer.Option("--singles", help="also write one PNG per slice")
    ] = False,
) -> None:
    """Render VLM-ready PNGs (labelled montages, optionally single slices) and manifest.json."""
    from dicom import ImagingError, RenderOptions, render_path

    settings = get_settings()
    if not path.exists():
        console.print(f"[red]error:[/red] no such file or folder: {escape(str(path))}")
        raise typer.Exit(2)
    try:
        idx = [int(v) for v in indices.split(",")] if indices else None
    except ValueError:
        console.print(
            f"[red]error:[/red] --indices takes integers separated by commas, not {escape(indices or '')!r}"
        )
        raise typer.Exit(2) from None
    options = RenderOptions(
        n_slices=slices,
        indices=idx,
        window=window,
        reslice_axial=not native_plane,
        tile_size=tile_size,
        columns=columns,
        diffusion=diffusion,
        singles=singles,
        memory_cap=settings.memory_cap,
    )
    t0 = time.perf_counter()
    try:
        manifest = render_path(path, out, options, series_uid=series, mask_uid=mask_series)
    except ImagingError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(1) from None
    for img in manifest.images:
        console.print(
            f"  wrote {escape(str(out / img.file))}  ({escape(img.label)}; {escape(img.window)})"
        )
    for w in manifest.warnings:
        console.print(f"  [yellow]warning:[/yellow] {escape(w)}")
    for e in manifest.errors:
        console.print(f"  [yellow]skipped:[/yellow] {escape(e.message)}")
    console.print(
        f"{len(manifest.images)} image(s), manifest {escape(str(out / 'manifest.json'))} "
        f"({time.perf_counter() - t0:.1f} s)"
    )
    if not manifest.images:
        raise typer.Exit(1)
