"""Evaluation runs: status and progress, reports (JSON, HTML, PDF), the images shown."""

from __future__ import annotations

import re
from pathlib import PurePath
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Path, Query, status
from fastapi.responses import FileResponse, Response

from evaluation import ImageRef
from evaluation.log import RunData
from evaluation.reports import csp
from gateway.api.deps import Ctx, Token, errors
from gateway.runs import RunNotFoundError, RunStatus
from gateway.runs.reading import read_run
from gateway.runs.view import RunView

router = APIRouter(prefix="/runs", tags=["runs"], responses=errors(400, 401, 404, 413))
RunId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$", description="run id")]
_PNG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,120}\.png$")
MEDIA = {"json": "application/json", "html": "text/html; charset=utf-8", "pdf": "application/pdf"}


def _missing(what: str) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no such {what}")


@router.get("", response_model=list[RunView], summary="Recent runs, newest first")
def list_runs(
    ctx: Ctx, _t: Token, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> list[RunView]:
    return [RunView.of(r) for r in ctx.runs.list(limit=limit)]


@router.get("/{run_id}", response_model=RunView, summary="Status and progress of a run")
def get_run(ctx: Ctx, _t: Token, run_id: RunId) -> RunView:
    try:
        return RunView.of(ctx.runs.get(run_id))
    except RunNotFoundError:
        raise _missing("run") from None


@router.get(
    "/{run_id}/report.{fmt}",
    summary="The run's report: JSON (the run's RunData), the checklist as HTML or PDF",
    description="`report.json` is the run as its run log holds it now (the cases, and per "
    "model and task the answer, raw reply and scores: the one result type `neurosandbox report` "
    "reads too; a `runs rescore` shows at once). `report.html` and `report.pdf` are the study's "
    "checklist page and its print from the run's published report bundle, an export of the log "
    "(rebuilt by `runs rescore`; the PDF stays the one written back to PACS). Reviewers sign it "
    "off at `/review/runs/{run_id}`.",
    responses={200: {"content": {m: {} for m in MEDIA.values()}}},
    response_class=Response,
)
def get_report(ctx: Ctx, _t: Token, run_id: RunId, fmt: Literal["json", "html", "pdf"]) -> Response:
    # The checklist holds model and DICOM text: no scripts, its own stylesheet, data: images.
    headers = {
        "Content-Security-Policy": csp("'none'") + "; frame-ancestors 'none'",
        "X-Content-Type-Options": "nosniff",
    }
    if fmt == "json":
        return Response(_run(ctx, run_id).model_dump_json(), media_type=MEDIA[fmt], headers=headers)
    try:
        path = ctx.runs.report_path(run_id, fmt)
    except RunNotFoundError:
        raise _missing("report (the run has not finished, or was skipped)") from None
    return FileResponse(path, media_type=MEDIA[fmt], headers=headers)


def _run(ctx: Ctx, run_id: str) -> RunData:
    """The run, from its log, once evaluated and written back (its report is then complete)."""
    try:
        if ctx.runs.get(run_id).status is not RunStatus.DONE:
            raise RunNotFoundError(run_id)
        return read_run(ctx.runs, run_id)
    except RunNotFoundError:
        raise _missing("report (the run has not finished, or was skipped)") from None


@router.get("/{run_id}/images", response_model=list[ImageRef], summary="Images shown to the models")
def list_images(ctx: Ctx, _t: Token, run_id: RunId) -> list[ImageRef]:
    run = _run(ctx, run_id)
    folder = ctx.runs.run_dir(run_id) / "images"
    # The images the models were shown, as the run records them; served from the run folder
    # as images/<name> by the route below.
    out = []
    for case in run.cases:
        for ref in case.images:
            name = PurePath(ref.path).name
            if _PNG.match(name) and (folder / name).is_file():
                out.append(ref.model_copy(update={"path": f"images/{name}"}))
    return out


@router.get(
    "/{run_id}/images/{name}",
    summary="One rendered image (PNG)",
    responses={200: {"content": {"image/png": {}}}},
    response_class=Response,
)
def get_image(ctx: Ctx, _t: Token, run_id: RunId, name: str) -> Response:
    if not _PNG.match(name):
        raise _missing("image")
    try:
        folder = ctx.runs.run_dir(run_id) / "images"
    except RunNotFoundError:
        raise _missing("run") from None
    path = folder / name
    if not path.is_file() or path.resolve().parent != folder.resolve():
        raise _missing("image")
    return FileResponse(path, media_type="image/png", headers={"X-Content-Type-Options": "nosniff"})
