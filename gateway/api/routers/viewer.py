"""The web DICOM viewer (OHIF) for signed-in reviewers: its static files, its configuration,
a read-only DICOMweb proxy of Orthanc (the gateway adds Orthanc's credentials), and a link
that opens a series at the slice a montage tile or a finding names.

Every request needs a reviewer (the review session cookie, or a bearer token): pages without
one go to the sign-in page, everything else gets 401. Opening a series is audited; the static
files and DICOMweb reads it makes are not, one by one (the access log's audit skips them unless
refused)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from html import escape
from typing import Annotated, Literal

import httpx
from fastapi import APIRouter, Query, Request, status
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from pydantic import AfterValidator

from dicom import check_uid
from gateway.api.deps import Ctx, errors
from gateway.api.routers.review import signed_in
from gateway.orthanc import OrthancError
from gateway.viewer import (
    BASE,
    ViewerFileError,
    ViewerFiles,
    ViewerNotInstalledError,
    app_config_js,
    content_security_policy,
    viewer_url,
)
from gateway.viewer_pacs import (
    SHARED_STUDY_UID,
    behind_gateway,
    dicomweb_read_path,
    instance_at,
    opening_series,
    study_of_path,
)

log = logging.getLogger(__name__)
router = APIRouter(prefix=BASE, tags=["viewer"])
Uid = Annotated[str, Query(max_length=64), AfterValidator(check_uid)]  # 422 if not a UID
ORTHANC_TIMEOUT = httpx.Timeout(60.0, connect=5.0, pool=10.0)
MAX_QUERY = 4096
STREAM_CHUNK = 1 << 16
_files_lock = threading.Lock()
# Answers in which Orthanc names itself (JSON: RetrieveURL, BulkDataURI; multipart: the parts'
# Content-Location), rewritten on the way through.
_REWRITTEN = ("application/dicom+json", "application/json", "multipart/related")


def _files(ctx: Ctx, request: Request) -> ViewerFiles:
    files: ViewerFiles | None = getattr(request.app.state, "viewer_files", None)
    if files is None or files.root != ctx.settings.viewer_dir:
        with _files_lock:
            files = ViewerFiles(ctx.settings.viewer_dir)
            request.app.state.viewer_files = files
    return files


def _page_request(request: Request) -> bool:
    """A browser navigation (which should land on the sign-in page), not a script's fetch."""
    dest = request.headers.get("sec-fetch-dest")
    if dest is not None:
        return dest in ("document", "iframe")
    return "text/html" in request.headers.get("accept", "")


def _refused(request: Request) -> Response:
    if _page_request(request):
        return RedirectResponse("/review/login", status.HTTP_303_SEE_OTHER)
    return JSONResponse(
        {"detail": "sign in to the review pages (or send a bearer token) to use the viewer"},
        status.HTTP_401_UNAUTHORIZED,
        headers={"Cache-Control": "no-store"},
    )


def _error_page(code: int, message: str) -> HTMLResponse:
    body = (
        "<!doctype html><meta charset=utf-8><title>Viewer unavailable</title>"
        f"<h1>The DICOM viewer is unavailable</h1><p>{escape(message)}</p>"
        '<p><a href="/review">Back to the review queue</a></p>'
    )
    return HTMLResponse(
        body,
        code,
        headers={
            "Content-Security-Policy": "default-src 'none'; frame-ancestors 'self'",
            "Cache-Control": "no-store",
            "X-Content-Type-Options": "nosniff",
        },
    )


@router.get(
    "/open",
    summary="Open a study, or one series at the slice nearest a position, in the web DICOM viewer",
    response_class=RedirectResponse,
    status_code=status.HTTP_303_SEE_OTHER,
    responses=errors(401, 404, 409, 502),
)
def open_series(
    ctx: Ctx,
    request: Request,
    study: Uid,
    series: Uid | None = None,
    z: Annotated[float | None, Query(ge=-100_000, le=100_000)] = None,
    plane: Literal["axial", "coronal", "sagittal"] | None = None,
) -> Response:
    """Redirect (303) to OHIF showing ``series`` of ``study`` at the instance nearest ``z``
    (mm; RAS coordinate of the slice centre along ``plane``'s axis, as montage tiles record it),
    or at the middle slice without ``z``. Without ``series``: the whole study (its SR and PDF
    series too), opened at the middle slice of ``viewer_pacs.opening_series`` (never the first
    image OHIF would show, which is often outside the head)."""
    who = signed_in(ctx, request)
    if who is None:
        return _refused(request)
    whole_study = series is None
    try:
        studies = ctx.study_owners.studies(study, ctx.orthanc.studies_with_uid)
        if len(studies) > 1:
            ctx.audit.write(who.token_id, "viewer open", "", "refused: study UID of two patients")
            return _error_page(status.HTTP_409_CONFLICT, SHARED_STUDY_UID)
        if series is None:
            study_id = studies[0] if studies else None
            chosen = opening_series(ctx.orthanc.list_series(study_id)) if study_id else None
            if chosen is None:
                ctx.audit.write(who.token_id, "viewer open", "", "not found")
                return _error_page(status.HTTP_404_NOT_FOUND, "no study with images of that UID in the PACS")  # fmt: skip
            series = chosen.series_uid
        datasets = ctx.orthanc.series_metadata(study, series)
        orthanc_id = ctx.orthanc.find_series(series) or "unknown"
    except OrthancError as exc:
        if exc.status == 404:
            datasets, orthanc_id = [], "unknown"
        else:
            log.warning("viewer open: %s", exc)
            return _error_page(
                status.HTTP_502_BAD_GATEWAY,
                "the PACS (Orthanc) did not answer (see the gateway's log)",
            )
    try:
        sop = instance_at(datasets, z, plane)
    except LookupError:
        ctx.audit.write(who.token_id, "viewer open", "", "not found")
        return _error_page(status.HTTP_404_NOT_FOUND, "no such series in the PACS")
    ctx.audit.write(who.token_id, "viewer open", f"series={orthanc_id}", "ok")
    assert series is not None  # given, or chosen above
    return RedirectResponse(viewer_url(study, series, sop, whole_study), status.HTTP_303_SEE_OTHER)


_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


@router.api_route("/dicom-web/{path:path}", methods=_METHODS, include_in_schema=False)
def dicomweb(ctx: Ctx, request: Request, path: str) -> Response:
    """Orthanc's DICOMweb, read-only, with the gateway's credentials."""
    if request.method != "GET":
        return JSONResponse(
            {"detail": "the viewer's DICOMweb is read-only: GET only"},
            status.HTTP_405_METHOD_NOT_ALLOWED,
            headers={"Allow": "GET"},
        )
    if signed_in(ctx, request) is None:
        return _refused(request)
    query = request.url.query
    if not dicomweb_read_path(path) or len(query) > MAX_QUERY:
        return JSONResponse(
            {"detail": "not a DICOMweb read the viewer may make"}, status.HTTP_404_NOT_FOUND
        )
    accept = request.headers.get("accept", "application/dicom+json")[:512]
    try:
        uid = study_of_path(path)
        if uid is not None and ctx.study_owners.shared(uid, ctx.orthanc.studies_with_uid):
            return JSONResponse({"detail": SHARED_STUDY_UID}, status.HTTP_409_CONFLICT)
        upstream = ctx.orthanc.open_stream(
            f"/dicom-web/{path}",
            query,
            {"Accept": accept, "Accept-Encoding": "identity"},
            ORTHANC_TIMEOUT,
        )
    except OrthancError as exc:
        log.warning("viewer DICOMweb: %s", exc)
        return JSONResponse(
            {"detail": "the PACS (Orthanc) did not answer"}, status.HTTP_502_BAD_GATEWAY
        )
    if upstream.status_code in (401, 403):
        upstream.close()  # never pass Orthanc's WWW-Authenticate on to the browser
        log.error("viewer DICOMweb: Orthanc refused the gateway's credentials")
        return JSONResponse(
            {"detail": "the PACS (Orthanc) refused the gateway's credentials"},
            status.HTTP_502_BAD_GATEWAY,
        )
    media = upstream.headers.get("content-type", "application/octet-stream")
    headers = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
    body = _stream(upstream)
    if media.split(";")[0].strip().lower() in _REWRITTEN:
        body = behind_gateway(body)  # lengths change: no Content-Length
    elif "content-length" in upstream.headers:
        headers["Content-Length"] = upstream.headers["content-length"]
    return StreamingResponse(body, upstream.status_code, headers, media)


def _stream(upstream: httpx.Response) -> Iterator[bytes]:
    try:
        yield from upstream.iter_raw(STREAM_CHUNK)
    finally:
        upstream.close()  # also when the browser goes away mid-stream


@router.get("/app-config.js", include_in_schema=False)
def app_config(ctx: Ctx, request: Request) -> Response:
    if signed_in(ctx, request) is None:
        return _refused(request)
    return PlainTextResponse(
        app_config_js(),
        media_type="text/javascript",
        headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"},
    )


@router.get("", include_in_schema=False)
def viewer_root() -> Response:
    # The viewer needs a study: the review queue is where a reviewer picks one.
    return RedirectResponse("/review", status.HTTP_303_SEE_OTHER)


@router.get("/{path:path}", include_in_schema=False)
def static(ctx: Ctx, request: Request, path: str) -> Response:
    """OHIF's files; any other path without a file extension is one of OHIF's client routes
    (index.html)."""
    if signed_in(ctx, request) is None:
        return _refused(request)
    if path == "":
        return viewer_root()
    files = _files(ctx, request)
    try:
        asset = files.asset(path)
        if asset is None and files.client_route(path):
            page = files.index()
            return HTMLResponse(
                page.html,
                headers={
                    "Content-Security-Policy": content_security_policy(page.script_hashes),
                    "X-Content-Type-Options": "nosniff",
                    "X-Frame-Options": "SAMEORIGIN",
                    "Referrer-Policy": "same-origin",
                    "Cache-Control": "no-store",
                },
            )
    except (ViewerNotInstalledError, ViewerFileError) as exc:
        return _error_page(status.HTTP_503_SERVICE_UNAVAILABLE, str(exc))
    if asset is None:
        return PlainTextResponse("not found", status.HTTP_404_NOT_FOUND)
    headers = {"Cache-Control": asset.cache_control, "X-Content-Type-Options": "nosniff"}
    if asset.body is not None:
        return Response(asset.body, media_type=asset.media_type, headers=headers)
    assert asset.path is not None
    return FileResponse(asset.path, media_type=asset.media_type, headers=headers)
