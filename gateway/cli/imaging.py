"""``neurosandbox inspect`` and ``render``: the imaging core on a file, folder, zip or NIfTI."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from gateway.cli.console import console
from gateway.cli.series_table import choices_table, errors_table, series_table
from gateway.settings import get_settings

if TYPE_CHECKING:
    from dicom import SeriesSelectionError


_WIDE = 100_000  # --wide: lines as long as their content

SERIES_HELP = (
    "series number as inspect shows it, SeriesInstanceUID (or UID#stack), or the short UID "
    "inspect prints"
)


def _progress(done: int, total: int) -> None:
    if total >= 100 and console.is_terminal:
        console.print(f"  read {done}/{total} headers", end="\r" if done < total else "\n")


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
    wide: Annotated[
        bool,
        typer.Option(
            "--wide", help="full UIDs and text, one line per series however long (for a pager)"
        ),
    ] = False,
) -> None:
    """List the series found under PATH: class (with the reason), plane, shape, geometry, errors.

    Each row of the table fits in two lines at any terminal width: a UID shows as … and its last characters, unique within the table (render --series takes this short form, the series number or the whole UID), and long text is cut with …. --wide prints everything whole, one line per series.

    With --json, prints a JSON list: one object per series stack (class, reason, plane, shape, spacing, affine as 4x4 RAS, n_files, errors...), then one object per file that could not be used, with "class": "ERROR" and its message in "errors". Exits 1 when nothing under PATH could be read (every file an error), 2 when PATH does not exist.
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
    out = Console(width=_WIDE) if wide else Console()
    title = f"{len(result.series)} series stack(s) in {result.n_files} file(s)"
    out.print(series_table(result.series, out.width, title, wide=wide))
    if result.errors:
        out.print(errors_table(result.errors, str(path), out.width, wide=wide))
    if not wide and (result.series or result.errors):
        console.print("[dim]UIDs and long text shortened to fit; --wide or --json for all[/dim]")
    if not result.series and result.errors:
        raise typer.Exit(1)  # nothing under PATH could be read


def render(
    path: Annotated[Path, typer.Argument(help="DICOM file, folder, zip archive or NIfTI file")],
    out: Annotated[Path, typer.Option("--out", help="output folder for PNGs and manifest.json")],
    series: Annotated[
        str | None,
        typer.Option(
            "--series",
            help=f"the series to render: {SERIES_HELP}; default: every clinical series",
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
            help=f"a mask on the same grid ({SERIES_HELP}): render the slices through it",
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
    """Render VLM-ready PNGs (labelled montages, optionally single slices) and manifest.json.

    Exits 1 when nothing could be rendered, 2 when PATH does not exist or when --series (or --mask-series) names no series or several: the series to choose from are listed.
    """
    from dicom import ImagingError, RenderOptions, SeriesSelectionError, render_path

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
    except SeriesSelectionError as exc:
        _refuse(exc)
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


def _refuse(exc: SeriesSelectionError) -> NoReturn:
    """A selector naming no series or several: say which, list the choices, exit 2."""
    from dicom import AmbiguousSeriesError

    sel = escape(exc.selector)
    if isinstance(exc, AmbiguousSeriesError):
        studies = len({s.study_uid for s in exc.candidates})
        where = f"in {studies} studies" if studies > 1 else "in one study"
        console.print(
            f"[red]error:[/red] {sel!r} names {len(exc.candidates)} series {where}; "
            "give one by its SeriesInstanceUID or the short uid below:"
        )
    else:
        console.print(
            f"[red]error:[/red] no series {sel!r} here (a series number, a SeriesInstanceUID "
            "or its short form); "
            + ("the series are:" if exc.candidates else "nothing under PATH has a series")
        )
    if exc.candidates:
        console.print(choices_table(exc.candidates, console.width))
    raise typer.Exit(2)
