"""The review as JSON: the same actions as the review pages (block item verdicts, corrections,
comments, diagnosis, error-category override, accept-all-remaining, two-step sign-off that
sends the VERIFIED report to the PACS, adjudication, sending again), with the same roles, audit and rules (gateway.review.actions), so a team
can import reviews made elsewhere. A bearer token, or the review session cookie with the
session's CSRF token in the ``X-CSRF-Token`` header."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, TypeVar

from fastapi import APIRouter, HTTPException, Request, status
from pydantic import BaseModel, ConfigDict, Field

from evaluation import ErrorCategory
from evaluation.review import (
    Action,
    Decision,
    ReportBlock,
    ReviewError,
    Verdict,
    Verification,
    VerifiedBlock,
    decision,
    decisions,
    missing_items,
)
from gateway.api.deps import Ctx, ErrorBody, errors
from gateway.api.routers.review import Report, Slug, service, signed_in
from gateway.orthanc import OrthancError
from gateway.review.actions import (
    MAX_BATCH,
    CaseUnderReview,
    ItemVerdict,
    Pacs,
    PacsOutcome,
    ReviewForbiddenError,
    accept_remaining,
    adjudicate,
    open_case,
    outcome,
    override_error,
    preview,
    record,
    record_verdicts,
    reissue,
    sign_off,
)
from gateway.review.auth import Reviewer, csrf_ok
from gateway.review.reissue import ReissueError
from gateway.review.service import ReportNotFoundError, ReviewService

router = APIRouter(prefix="/review/api", tags=["review (JSON)"])
Short = Annotated[str, Field(max_length=400)]
Long = Annotated[str, Field(max_length=4000)]
T = TypeVar("T")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class VerdictIn(_Strict):
    model: Short
    item_id: Annotated[str, Field(max_length=100)]
    verdict: Verdict
    text: Long = ""  # the correction (for "correct"); an error category for an error item


class VerdictsIn(_Strict):
    verdicts: list[VerdictIn] = Field(max_length=MAX_BATCH)


class ModelIn(_Strict):
    model: Short


class TextIn(_Strict):
    text: Long = Field(min_length=1)


class ErrorOverrideIn(_Strict):
    model: Short
    item_id: Annotated[str, Field(max_length=100)]
    category: ErrorCategory
    evidence: Long = ""


class SignoffIn(_Strict):
    digest: Annotated[str, Field(max_length=100)]  # from GET .../signoff: what was shown
    # a superseded report version: the newer version's gateway run id, passed over knowingly
    passed_over: Annotated[str, Field(max_length=100)] = ""


class ReissueIn(_Strict):
    passed_over: Annotated[str, Field(max_length=100)] = ""  # as for SignoffIn


class RulingsIn(_Strict):
    rulings: list[VerdictIn] = Field(max_length=MAX_BATCH)


class BlockItemState(BaseModel):
    item_id: str
    label: str
    kind: str
    text: str
    origin: str
    mine: Decision | None = None
    others: dict[str, Decision] = Field(default_factory=dict)


class BlockState(BaseModel):
    model: str
    items: list[BlockItemState]


class CaseState(BaseModel):
    """A case under review as the caller sees it."""

    report: str
    case_id: str
    run_id: str
    blocks: list[BlockState]
    missing: list[str]  # items without the caller's verdict
    signed_off_at: str | None = None
    verification: Verification


class SignoffPreviewOut(BaseModel):
    blocks: list[VerifiedBlock]
    missing: list[str]
    digest: str


class SignedOut(CaseState):
    """The case after a sign-off or an adjudication, and what it did in the PACS: ``sent``, or
    why not (``not_in_pacs``: the study is in no PACS; ``pending``: not verified yet;
    ``failed``: recorded, not stored, send it again with ``reissue``)."""

    pacs: PacsOutcome


class ReissueOut(BaseModel):
    sr_sop_instance_uids: list[str]  # stored now
    pdf_sop_instance_uid: str | None
    warnings: list[str]
    # not stored (a gateway run's): kept, and sent by the write-back retry loop
    kept_sop_instance_uids: list[str] = []


def _who(ctx: Ctx, request: Request, write: bool) -> Reviewer:
    who = signed_in(ctx, request)
    if who is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, detail="send a bearer token")
    if write and not csrf_ok(request, who, ""):
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail="CSRF check failed (X-CSRF-Token)")
    return who


def _case(
    ctx: Ctx, request: Request, report: str, slug: str
) -> tuple[ReviewService, CaseUnderReview]:
    svc = service(ctx, request)
    try:
        return svc, open_case(svc, report, slug)
    except ReportNotFoundError:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail="no such case") from None


def _block_state(b: ReportBlock, cu: CaseUnderReview, who: Reviewer) -> BlockState:
    mine = cu.mine(who)
    rest = [r for r in cu.reviews if r.reviewer != who.name]
    items = []
    for it in b.items:
        items.append(
            BlockItemState(
                item_id=it.item_id,
                label=it.label,
                kind=it.kind.value,
                text=it.text,
                origin=it.origin,
                mine=decision(it, mine) if mine else None,
                others=decisions(it, rest),
            )
        )
    return BlockState(model=b.model, items=items)


def _state(report: str, cu: CaseUnderReview, who: Reviewer) -> CaseState:
    mine = cu.mine(who)
    return CaseState(
        report=report,
        case_id=cu.case_id,
        run_id=cu.run.run_id,
        blocks=[_block_state(b, cu, who) for b in cu.blocks],
        missing=missing_items(cu.blocks, mine),
        signed_off_at=mine.signed_off_at if mine else None,
        verification=cu.verification,
    )


def _act(ctx: Ctx, request: Request, report: str, slug: str, what: str,
         act: Callable[[ReviewService, Reviewer, CaseUnderReview], T]) -> T:  # fmt: skip
    who = _who(ctx, request, write=True)
    svc, cu = _case(ctx, request, report, slug)
    try:
        out = act(svc, who, cu)
    except ReviewForbiddenError as exc:
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail=str(exc)) from None
    except OrthancError as exc:
        ctx.audit.write(who.token_id, f"review {what}", f"run={cu.run.run_id}", "failed")
        raise HTTPException(status.HTTP_502_BAD_GATEWAY, detail=str(exc)) from None
    except (ReviewError, ReissueError, ValueError) as exc:
        ctx.audit.write(who.token_id, f"review {what}", f"run={cu.run.run_id}", "refused")
        raise HTTPException(status.HTTP_409_CONFLICT, detail=str(exc)) from None
    ctx.audit.write(who.token_id, f"review {what}", f"run={cu.run.run_id}", "ok")
    return out


BASE = "/runs/{report}/cases/{slug}"
ERR = errors(401, 403, 404, 409, 422)


@router.get(BASE, response_model=CaseState, responses=errors(401, 404), summary="A case's review blocks and reviews")  # fmt: skip
def get_case(ctx: Ctx, request: Request, report: Report, slug: Slug) -> CaseState:
    who = _who(ctx, request, write=False)
    _, cu = _case(ctx, request, report, slug)
    return _state(report, cu, who)


@router.post(f"{BASE}/verdicts", response_model=CaseState, responses=ERR,
             summary="Accept, reject or correct review-block items (all or none)")  # fmt: skip
def post_verdicts(ctx: Ctx, request: Request, report: Report, slug: Slug, body: VerdictsIn) -> CaseState:  # fmt: skip
    verdicts = [ItemVerdict(v.model, v.item_id, v.verdict, v.text) for v in body.verdicts]
    _act(ctx, request, report, slug, "item", lambda svc, who, cu: record_verdicts(svc, who, cu, verdicts))  # fmt: skip
    return get_case(ctx, request, report, slug)


@router.post(f"{BASE}/accept-remaining", response_model=CaseState, responses=ERR,
             summary="Accept every item of a model's block without a verdict")  # fmt: skip
def post_accept_remaining(ctx: Ctx, request: Request, report: Report, slug: Slug, body: ModelIn) -> CaseState:  # fmt: skip
    _act(ctx, request, report, slug, "accept", lambda svc, who, cu: accept_remaining(svc, who, cu, body.model))  # fmt: skip
    return get_case(ctx, request, report, slug)


@router.post(f"{BASE}/comments", response_model=CaseState, responses=ERR, summary="Add a comment")  # fmt: skip
def post_comment(ctx: Ctx, request: Request, report: Report, slug: Slug, body: TextIn) -> CaseState:  # fmt: skip
    _act(ctx, request, report, slug, "comment", lambda svc, who, cu: record(svc, who, cu, Action.COMMENT, text=body.text.strip()))  # fmt: skip
    return get_case(ctx, request, report, slug)


@router.post(f"{BASE}/diagnosis", response_model=CaseState, responses=ERR, summary="The clinician's diagnosis")  # fmt: skip
def post_diagnosis(ctx: Ctx, request: Request, report: Report, slug: Slug, body: TextIn) -> CaseState:  # fmt: skip
    _act(ctx, request, report, slug, "diagnosis", lambda svc, who, cu: record(svc, who, cu, Action.DIAGNOSIS, text=body.text.strip()))  # fmt: skip
    return get_case(ctx, request, report, slug)


@router.post(f"{BASE}/error-category", response_model=CaseState, responses=ERR,
             summary="Override the category of a block's error item")  # fmt: skip
def post_error(ctx: Ctx, request: Request, report: Report, slug: Slug, body: ErrorOverrideIn) -> CaseState:  # fmt: skip
    _act(ctx, request, report, slug, "error",
         lambda svc, who, cu: override_error(svc, who, cu, body.model, body.item_id, body.category, body.evidence))  # fmt: skip
    return get_case(ctx, request, report, slug)


@router.get(f"{BASE}/signoff", response_model=SignoffPreviewOut, responses=errors(401, 404),
            summary="Sign-off, step 1: the VERIFIED content, what is missing, its digest")  # fmt: skip
def get_signoff(ctx: Ctx, request: Request, report: Report, slug: Slug) -> SignoffPreviewOut:
    who = _who(ctx, request, write=False)
    _, cu = _case(ctx, request, report, slug)
    p = preview(cu, who)
    return SignoffPreviewOut(blocks=p.blocks, missing=p.missing, digest=p.digest)


def _pacs(ctx: Ctx) -> Pacs:
    pipe = ctx.pipeline  # a gateway's: its write-back destination, and where it keeps objects
    return Pacs(ctx.orthanc, ctx.settings.verifying_organization,
                pipe.writeback if pipe is not None else None,
                pipe.kept_dir if pipe is not None else None)  # fmt: skip


def _signed(ctx: Ctx, request: Request, report: str, slug: str, pacs: PacsOutcome) -> SignedOut:
    state = get_case(ctx, request, report, slug)
    return SignedOut(**state.model_dump(), pacs=pacs)


@router.post(f"{BASE}/signoff", response_model=SignedOut, responses=ERR,
             summary="Sign-off, step 2: confirm the content shown (its digest); final, and sent to the PACS")  # fmt: skip
def post_signoff(ctx: Ctx, request: Request, report: Report, slug: Slug, body: SignoffIn) -> SignedOut:  # fmt: skip
    out = _act(ctx, request, report, slug, "signoff", lambda svc, who, cu: sign_off(svc, who, cu, body.digest, _pacs(ctx), body.passed_over))  # fmt: skip
    return _signed(ctx, request, report, slug, out.pacs)


@router.post(f"{BASE}/adjudication", response_model=SignedOut, responses=ERR,
             summary="An admin's rulings on disputed items; settling the last sends the report to the PACS")  # fmt: skip
def post_adjudication(ctx: Ctx, request: Request, report: Report, slug: Slug, body: RulingsIn) -> SignedOut:  # fmt: skip
    rulings = [ItemVerdict(v.model, v.item_id, v.verdict, v.text) for v in body.rulings]
    pacs = _act(ctx, request, report, slug, "adjudication", lambda svc, who, cu: adjudicate(svc, who, cu, rulings, _pacs(ctx)))  # fmt: skip
    return _signed(ctx, request, report, slug, pacs)


@router.post(f"{BASE}/reissue", response_model=ReissueOut, responses={**ERR, **errors(502)},
             summary="Send the VERIFIED SRs and PDF to the PACS again (sign-off sends them first)")  # fmt: skip
def post_reissue(ctx: Ctx, request: Request, report: Report, slug: Slug, body: ReissueIn | None = None) -> ReissueOut:  # fmt: skip
    passed_over = body.passed_over if body else ""
    out = _act(ctx, request, report, slug, "reissue", lambda svc, who, cu: reissue(svc, who, cu, _pacs(ctx), passed_over))  # fmt: skip
    kept = [wb.sop_instance_uid for wb in out.pending]
    said = [outcome("", out).message] if out.pending else []
    return ReissueOut(sr_sop_instance_uids=out.sr_uids, pdf_sop_instance_uid=out.pdf_uid, warnings=[*out.warnings, *said], kept_sop_instance_uids=kept)  # fmt: skip


__all__ = ["ErrorBody", "router"]
