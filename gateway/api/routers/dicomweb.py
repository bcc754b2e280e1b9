"""STOW-RS: a study sent over HTTP to be evaluated, the second way in beside C-STORE.

``POST /dicomweb/studies`` (and ``/dicomweb/studies/{StudyInstanceUID}``, which takes only that
study's instances) with an admin or a ``sender`` token and a ``multipart/related;
type="application/dicom"`` body. The body is streamed part by part into a folder of its own
(``gateway.pacs.multipart``: bounded, never held whole in memory); only when the whole body has
been read and is well formed do its files go, one by one, through the DICOM node's own path
(``StorageSCP.receive_files``: the spool, the same identity rules, the quiet time), as the
instances of one association. A malformed or oversize body stores nothing. The answer is the
DICOM JSON of PS3.18 10.5.3: the stored instances in ReferencedSOPSequence, the others in
FailedSOPSequence with their reason; 200 all stored, 202 some, 409 none.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Annotated, Any, BinaryIO

from fastapi import APIRouter, HTTPException, Request, status
from fastapi import Path as PathParam
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from dicom import InvalidUIDError, check_uid
from gateway.api.context import GatewayContext
from gateway.api.deps import Ctx, ErrorBody, Sender, errors
from gateway.auth import TokenRecord
from gateway.pacs.multipart import (
    MultipartError,
    MultipartReader,
    PartTooLargeError,
    related_boundary,
)
from gateway.scp import STATUS_SUCCESS, STOW_SENDER, StoreOutcome

# the body, for the OpenAPI document (read by the route itself, streamed)
BODY = {
    "requestBody": {
        "required": True,
        "content": {
            'multipart/related; type="application/dicom"': {
                "schema": {"type": "string", "format": "binary"}
            }
        },
    }
}
RESPONSES: dict[int | str, dict[str, Any]] = {
    **errors(400, 401, 403, 413),
    202: {"description": "some instances stored (DICOM JSON: ReferencedSOPSequence, "
          "FailedSOPSequence with FailureReason)"},
    409: {"description": "no instance stored (DICOM JSON: FailedSOPSequence with FailureReason)"},
    415: {"model": ErrorBody, "description": "not multipart/related; type=\"application/dicom\""},
    503: {"model": ErrorBody, "description": "the DICOM node is not running"},
}  # fmt: skip
log = logging.getLogger(__name__)
router = APIRouter(prefix="/dicomweb", tags=["dicomweb"], responses=RESPONSES)

DICOM_JSON = "application/dicom+json"
MAX_PARTS = 20_000  # instances in one request
FEED_BYTES = 1 << 20  # body bytes gathered before each hand-over to the parser


def _sop_item(o: StoreOutcome) -> dict[str, Any]:
    item: dict[str, Any] = {}
    if o.sop_class:
        item["00081150"] = {"vr": "UI", "Value": [o.sop_class]}
    if o.sop_instance:
        item["00081155"] = {"vr": "UI", "Value": [o.sop_instance]}
    if o.status != STATUS_SUCCESS:
        item["00081197"] = {"vr": "US", "Value": [o.status & 0xFFFF]}
    return item


def stow_answer(outcomes: list[StoreOutcome]) -> JSONResponse:
    """The STOW-RS response: 200 every instance stored, 202 some, 409 none."""
    stored = [o for o in outcomes if o.status == STATUS_SUCCESS]
    failed = [o for o in outcomes if o.status != STATUS_SUCCESS]
    body: dict[str, Any] = {}
    if stored:
        body["00081199"] = {"vr": "SQ", "Value": [_sop_item(o) for o in stored]}
    if failed:
        body["00081198"] = {"vr": "SQ", "Value": [_sop_item(o) for o in failed]}
    code = 200 if not failed else 202 if stored else 409
    return JSONResponse(body, status_code=code, media_type=DICOM_JSON)


async def _read_parts(request: Request, folder: Path, max_part_bytes: int) -> list[Path]:
    """Stream the body's parts into ``folder``; HTTPException on a bad body (nothing kept)."""
    try:
        boundary = related_boundary(request.headers.get("content-type", ""))
    except MultipartError as exc:
        raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, detail=str(exc)) from None
    paths: list[Path] = []
    current: list[BinaryIO] = []

    def on_part(headers: dict[str, str]) -> BinaryIO:
        for fh in current:
            fh.close()
        current.clear()
        kind = headers.get("content-type", "application/dicom").split(";")[0].strip().lower()
        if kind != "application/dicom":
            raise MultipartError(f"part {len(paths) + 1} is {kind[:60]!r}, not application/dicom")
        paths.append(folder / f"{len(paths):06d}.dcm")
        fh = open(paths[-1], "wb")  # noqa: SIM115 (closed by the next part or below)
        current.append(fh)
        return fh

    reader = MultipartReader(boundary, on_part, max_part_bytes=max_part_bytes, max_parts=MAX_PARTS)
    try:
        # the parser writes the parts to disk: in a worker thread, a megabyte at a time, so a
        # slow disk under a large study does not stall the event loop (and every other request)
        pending = bytearray()
        async for chunk in request.stream():
            pending += chunk
            if len(pending) >= FEED_BYTES:
                await run_in_threadpool(reader.feed, bytes(pending))
                pending.clear()
        await run_in_threadpool(reader.feed, bytes(pending))
        reader.close()
    except ClientDisconnect:  # the sender left mid-body: nothing stored, nothing to log loudly
        log.info("STOW-RS: the client left before the end of its body; nothing stored")
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST, detail="the body ended early (disconnected)"
        ) from None
    except OSError as exc:  # disk full, file size limit, I/O error: ours, not the sender's
        log.error("STOW-RS: the body could not be written (%s)", exc.strerror or type(exc).__name__)
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            detail=f"the gateway could not write the body to its spool "
            f"({exc.strerror or type(exc).__name__}): nothing stored; send it again later",
        ) from None
    except PartTooLargeError as exc:
        raise HTTPException(status.HTTP_413_REQUEST_ENTITY_TOO_LARGE, detail=str(exc)) from None
    except MultipartError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, detail=f"malformed body: {exc}") from None
    finally:
        for fh in current:
            fh.close()
    return paths


async def _stow(
    request: Request, ctx: GatewayContext, sender: TokenRecord, study_uid: str | None
) -> JSONResponse:
    try:  # the request's form first: a wrong one is the client's error, whatever our state
        related_boundary(request.headers.get("content-type", ""))
    except MultipartError as exc:
        raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, detail=str(exc)) from None
    scp = ctx.scp
    if scp is None:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE, detail="the DICOM node is not running"
        )
    # a folder of its own, removed at the next start if a crash cuts the body short
    folder = await run_in_threadpool(scp.receiving_folder)
    try:
        paths = await _read_parts(request, folder, ctx.settings.stow_max_body_bytes)
        # only this study's instances when the URL names one (PS3.18 10.5.1): the node refuses
        # another's by its UIDs, read once with the rest (0xA900, the instance named)
        outcomes = await run_in_threadpool(scp.receive_files, paths, STOW_SENDER, study_uid)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    answer = stow_answer(outcomes)
    # the route's own audit line says who and the status; this one what came of it
    n_ok = sum(o.status == STATUS_SUCCESS for o in outcomes)
    detail = f"{n_ok} stored, {len(outcomes) - n_ok} refused"
    ctx.audit.write(sender.id, "stow-rs store", "", str(answer.status_code), detail)
    log.info("STOW-RS: %s", detail)
    return answer


@router.post(
    "/studies",
    summary="STOW-RS: send instances to be evaluated (admin or sender token)",
    openapi_extra=BODY,
)
async def stow_studies(request: Request, ctx: Ctx, sender: Sender) -> JSONResponse:
    return await _stow(request, ctx, sender, None)


@router.post(
    "/studies/{study_uid}",
    summary="STOW-RS: send one study's instances to be evaluated (admin or sender token)",
    openapi_extra=BODY,
)
async def stow_study(
    request: Request,
    ctx: Ctx,
    sender: Sender,
    study_uid: Annotated[str, PathParam(max_length=64, description="StudyInstanceUID")],
) -> JSONResponse:
    try:  # the one UID rule (dicom.check_uid)
        uid = check_uid(study_uid)
    except InvalidUIDError:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, detail="not a valid UID") from None
    return await _stow(request, ctx, sender, uid)
