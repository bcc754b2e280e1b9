"""The clinician review pages (reviewer role): sign in, queue, checklist with per-item verdicts,
diagnosis, error-category override, rating, comment, sign-off (which sends the VERIFIED report
to the PACS), sending it again; the live run summary; the review log as CSV and JSON. Every
action is appended to the review log."""

from __future__ import annotations

import re
import secrets
import threading
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Form, HTTPException, Path, Query, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response

from dicom import InvalidUIDError
from evaluation import ErrorCategory
from evaluation.reports import (
    CaseChecklist,
    ImageLoader,
    PdfError,
    ReviewView,
    csp,
    pdf_bytes,
    render_checklist,
    render_page,
    render_summary,
)
from evaluation.review import (
    Action,
    ReviewError,
    Superseded,
    Verdict,
    export_csv,
    export_json,
    missing_items,
)
from gateway.api.deps import Ctx
from gateway.auth import Role
from gateway.orthanc import OrthancError
from gateway.review.actions import (
    MAX_BATCH,
    CaseUnderReview,
    ItemVerdict,
    Pacs,
    PacsOutcome,
    PacsStatus,
    ReviewForbiddenError,
    SignedOff,
    accept_remaining,
    adjudicate,
    in_pacs,
    open_case,
    outcome,
    preview,
    record,
    record_verdicts,
    reissue,
    save_block,
    sign_off,
    study_of,
    where_to,
)
from gateway.review.auth import (
    COOKIE_PATH,
    LOGIN_COOKIE,
    SESSION_COOKIE,
    Reviewer,
    csrf_ok,
    identify,
)
from gateway.review.queue import CaseStatus, queue
from gateway.review.reissue import Reissued, ReissueError
from gateway.review.runs_page import runs_index_page
from gateway.review.service import ReportNotFoundError, ReviewService
from gateway.viewer import PLANES, viewer_open_url

BASE = "/review"
router = APIRouter(prefix=BASE, tags=["review"], include_in_schema=True)
Report = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")]
Slug = Annotated[str, Path(pattern=r"^[A-Za-z0-9._-]{1,80}$")]
Text = Annotated[str, Form(max_length=4000)]
Csrf = Annotated[str, Form(max_length=200)]
DONE = {
    "item": "Verdict saved.",
    "diagnosis": "Diagnosis saved.",
    "error": "Error category overridden.",
    "rating": "Rating saved.",
    "comment": "Comment added.",
    "accept": "Remaining items accepted.",
    "block": "Block saved.",
    "signoff": "Case signed off. Your review is final.",
    "adjudication": "Ruling recorded.",
    "reissue": "Sent to the PACS as VERIFIED.",
}
# what a sign-off or ruling did in the PACS (the redirect's ``pacs``; a failure is shown as is)
PACS_DONE = {
    PacsStatus.SENT: "The VERIFIED report (an SR per model and the checklist PDF) is in the PACS.",
    PacsStatus.NOT_IN_PACS: "Nothing was sent to a PACS: this case's study is not in one the "
    "gateway reaches (an evaluation outside the gateway). Your review is recorded here.",
    PacsStatus.PENDING: "Nothing was sent to the PACS yet: the case is verified once the "
    "signed-off reviews agree (an admin adjudicates where they do not).",
}
_service_lock = threading.Lock()
_ANCHOR = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
Anchor = Annotated[str, Form(max_length=100)]
PassedOver = Annotated[str, Form(max_length=100)]  # the newer version's gateway run id


def service(ctx: Ctx, request: Request) -> ReviewService:
    svc: ReviewService | None = getattr(request.app.state, "review", None)
    if svc is None:
        with _service_lock:
            svc = getattr(request.app.state, "review", None)
            if svc is None:
                svc = ReviewService(ctx.settings, ctx.runs)
                request.app.state.review = svc
    return svc


def _headers() -> dict[str, str]:
    return {
        "Content-Security-Policy": csp() + "; frame-ancestors 'none'",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "same-origin",  # no-referrer makes Chromium send Origin: null
        "Cache-Control": "no-store",
        "X-Frame-Options": "DENY",
    }


def _html(body: str, code: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=code, headers=_headers())


def signed_in(ctx: Ctx, request: Request) -> Reviewer | None:
    return identify(request, ctx.tokens, service(ctx, request).sessions)


def _missing(what: str) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no such {what}")


def _login_redirect() -> RedirectResponse:
    return RedirectResponse(f"{BASE}/login", status.HTTP_303_SEE_OTHER)


@router.get("/login", response_class=HTMLResponse, summary="Sign-in form")
def login_form(ctx: Ctx, request: Request) -> HTMLResponse:
    token = secrets.token_urlsafe(24)
    resp = _html(render_page("login.html.j2", action=f"{BASE}/login", login_csrf=token))
    resp.set_cookie(LOGIN_COOKIE, token, max_age=900, path=COOKIE_PATH, httponly=True,
                    samesite="strict", secure=ctx.settings.review_cookie_secure)  # fmt: skip
    return resp


@router.post("/login", summary="Exchange a reviewer token for a session cookie")
def login(
    ctx: Ctx, request: Request, token: Annotated[str, Form(max_length=200)], csrf: Csrf
) -> Response:
    expected = request.cookies.get(LOGIN_COOKIE, "")
    if not expected or not secrets.compare_digest(expected.encode(), csrf.encode()):
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail="sign-in form expired; reload it")
    rec = ctx.tokens.verify(token)
    if rec is None:
        ctx.audit.write("anonymous", "review login", "", "refused")
        page = render_page("login.html.j2", action=f"{BASE}/login", login_csrf=expected,
                           message="Unknown or revoked token.", message_error=True)  # fmt: skip
        return _html(page, status.HTTP_401_UNAUTHORIZED)
    sid, _ = service(ctx, request).sessions.create(rec)
    ctx.audit.write(rec.id, "review login", "", "ok")
    resp = RedirectResponse(BASE, status.HTTP_303_SEE_OTHER)
    resp.set_cookie(SESSION_COOKIE, sid, max_age=int(ctx.settings.review_session_hours * 3600),
                    path=COOKIE_PATH, httponly=True, samesite="strict",
                    secure=ctx.settings.review_cookie_secure)  # fmt: skip
    resp.delete_cookie(LOGIN_COOKIE, path=COOKIE_PATH)
    return resp


@router.post("/logout", summary="End the browser session")
def logout(ctx: Ctx, request: Request, csrf: Csrf = "") -> Response:
    who = signed_in(ctx, request)
    if who is not None and who.session_id and csrf_ok(request, who, csrf):
        service(ctx, request).sessions.drop(who.session_id)
    resp = _login_redirect()
    resp.delete_cookie(SESSION_COOKIE, path=COOKIE_PATH)
    return resp


def _view(ctx: Ctx, request: Request, who: Reviewer, report: str, slug: str = "") -> ReviewView:
    return ReviewView(
        me=who.name,
        csrf=who.csrf,
        post_url=f"{BASE}/runs/{report}/cases/{slug}",
        queue_url=f"{BASE}/runs/{report}",
        summary_url=f"{BASE}/runs/{report}/summary",
        logout_url=f"{BASE}/logout",
    )


StatusFilter = Annotated[str, Query(max_length=20, pattern=r"^[a-z ]*$")]
ModelFilter = Annotated[str, Query(max_length=400)]


def _queue_page(ctx: Ctx, request: Request, report: str | None, status_f: str,
                model: str) -> Response:  # fmt: skip
    who = signed_in(ctx, request)
    if who is None:
        return _login_redirect()
    svc = service(ctx, request)
    try:
        rows, models = queue(svc, ctx.runs, who, report=report, status=status_f, model=model)
        run = svc.run(report) if report else None
    except ReportNotFoundError:
        raise _missing("report") from None
    rv = _view(ctx, request, who, report or "")
    rv.queue_url = f"{BASE}/runs/{report}" if report else BASE
    return _html(render_page("queue.html.j2", review=rv, base=BASE, report=report, run=run,
                             rows=rows, models=models, statuses=[s.value for s in CaseStatus],
                             status=status_f, model=model,
                             reports=svc.reports() if report is None else []))  # fmt: skip


@router.get("", response_class=HTMLResponse, summary="Review queue: the cases of every run")
def reports(ctx: Ctx, request: Request, status: StatusFilter = "", model: ModelFilter = "") -> Response:  # fmt: skip
    return _queue_page(ctx, request, None, status, model)


DatasetFilter = Annotated[str, Query(max_length=200)]


@router.get("/runs", response_class=HTMLResponse, summary="Every run of the install (runs index)")
def runs_page(ctx: Ctx, request: Request, dataset: DatasetFilter = "", model: ModelFilter = "") -> Response:  # fmt: skip
    who = signed_in(ctx, request)
    if who is None:
        return _login_redirect()
    page = runs_index_page(ctx.settings, service(ctx, request), BASE, dataset, model)
    return _html(render_page("runs.html.j2", review=_view(ctx, request, who, ""), **page))


@router.get("/runs/{report}", response_class=HTMLResponse, summary="Review queue of one run")
def run_queue(ctx: Ctx, request: Request, report: Report, status: StatusFilter = "",
              model: ModelFilter = "") -> Response:  # fmt: skip
    return _queue_page(ctx, request, report, status, model)


@router.get("/runs/{report}/summary", response_class=HTMLResponse, summary="Live run summary")
def summary_page(ctx: Ctx, request: Request, report: Report) -> Response:
    who = signed_in(ctx, request)
    if who is None:
        return _login_redirect()
    try:
        summary, plots = service(ctx, request).summary_with_plots(report)
    except ReportNotFoundError:
        raise _missing("report") from None
    rv = _view(ctx, request, who, report)
    href: Callable[[str], str] = lambda slug: f"{BASE}/runs/{report}/cases/{slug}"  # noqa: E731
    return _html(render_summary(summary, plots, case_href=href, review=rv))


RunId = Annotated[str, Query(max_length=100, pattern=r"^([A-Za-z0-9][A-Za-z0-9._-]*)?$")]


@router.get("/compare", response_class=HTMLResponse, summary="Two runs of one dataset compared")
def compare_page(ctx: Ctx, request: Request, a: RunId = "", b: RunId = "") -> Response:
    """Run B against run A (``runs compare A B``): per model and metric, the flipped cases with
    their checklists; refused across datasets or scoring versions (the page says why)."""
    from gateway.runs.comparing import compare_run_ids

    who = signed_in(ctx, request)
    if who is None:
        return _login_redirect()
    found, said, code = None, "", 200
    if a and b:
        found, said, code = compare_run_ids(ctx.settings, a, b)
    page = render_page("compare.html.j2", review=_view(ctx, request, who, ""), base=BASE, a=a, b=b,
                       c=found, message=said, message_error=bool(said))  # fmt: skip
    return _html(page, code)


@router.get("/runs/{report}/summary.json", summary="Live run summary (JSON)")
def summary_json(ctx: Ctx, request: Request, report: Report) -> Response:
    if signed_in(ctx, request) is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, detail="sign in or send a bearer token")
    try:
        summary = service(ctx, request).summary(report)
    except ReportNotFoundError:
        raise _missing("report") from None
    return Response(summary.model_dump_json(indent=2), media_type="application/json")


@router.get("/runs/{report}/summary.pdf", summary="Live run summary (PDF, Chromium)")
def summary_pdf(ctx: Ctx, request: Request, report: Report) -> Response:
    if signed_in(ctx, request) is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, detail="sign in or send a bearer token")
    try:
        summary, plots = service(ctx, request).summary_with_plots(report)
        pdf = pdf_bytes(render_summary(summary, plots, print_mode=True))
    except ReportNotFoundError:
        raise _missing("report") from None
    except PdfError as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, detail=str(exc)) from None
    return Response(
        pdf, media_type="application/pdf", headers={"X-Content-Type-Options": "nosniff"}
    )


@router.get("/runs/{report}/reviews.{fmt}", summary="The run's review log (CSV or JSON)")
def export(ctx: Ctx, request: Request, report: Report, fmt: str) -> Response:
    if signed_in(ctx, request) is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, detail="sign in or send a bearer token")
    svc = service(ctx, request)
    try:
        events = svc.store.events(svc.run(report).run_id)
    except ReportNotFoundError:
        raise _missing("report") from None
    if fmt == "csv":
        return PlainTextResponse(export_csv(events), media_type="text/csv; charset=utf-8",
                                 headers={"Content-Disposition": f'attachment; filename="{report}-reviews.csv"'})  # fmt: skip
    if fmt == "json":
        return Response(export_json(events), media_type="application/json")
    raise _missing("export format (csv or json)")


def viewer_link(study: str, series: str | None, z: float | None, plane: str | None) -> str:
    """The review page's link into the DICOM viewer (the study, or a series at a slice)."""
    try:  # without a series: the whole study, at a slice the gateway chooses (not OHIF's first)
        return viewer_open_url(study, series, z, plane if plane in PLANES else None)
    except (InvalidUIDError, ValueError):
        return ""


def _open(
    ctx: Ctx, request: Request, report: str, slug: str
) -> tuple[CaseChecklist, ImageLoader, CaseUnderReview]:
    """A case's checklist, its images and its review state (404 when there is no such case)."""
    svc = service(ctx, request)
    try:
        cl, images = svc.checklist(report, slug)
        return cl, images, open_case(svc, report, slug)
    except (ReportNotFoundError, FileNotFoundError):
        raise _missing("case") from None


def _superseded(cu: CaseUnderReview) -> Superseded | None:
    """The newer version superseding the case's, with the link to it."""
    s = cu.superseded
    return s.model_copy(update={"url": s.href(BASE)}) if s is not None else None


def _case_page(ctx: Ctx, request: Request, who: Reviewer, report: str, slug: str,
               message: str = "", error: bool = False, code: int = 200) -> Response:  # fmt: skip
    cl, images, cu = _open(ctx, request, report, slug)
    cl.blocks = cu.blocks  # from the run's answers: also for bundles written before blocks
    rv = _view(ctx, request, who, report, slug)
    rv.mine = cu.mine(who)
    rv.others = [r for r in cu.reviews if r.reviewer != who.name]
    rv.is_admin = who.role is Role.ADMIN
    rv.missing = missing_items(cu.blocks, rv.mine)
    rv.verification = cu.verification
    rv.viewer = viewer_link
    rv.superseded = _superseded(cu)
    signer = rv.verification.signed_by(who.name)
    # sign-off sends the report; a button only while it is still to be sent (a PACS failed)
    rv.can_reissue = bool(rv.verification.complete and cl.study_uids and (signer or rv.is_admin)
                          and not in_pacs(service(ctx, request), cu))  # fmt: skip
    body = render_checklist(cl, images, review=rv, message=message, message_error=error)
    return _html(body, code)


@router.get(
    "/runs/{report}/cases/{slug}", response_class=HTMLResponse, summary="Checklist to review"
)
def case_page(ctx: Ctx, request: Request, report: Report, slug: Slug, done: str = "",
              pacs: str = "") -> Response:  # fmt: skip
    who = signed_in(ctx, request)
    if who is None:
        return _login_redirect()
    said = DONE.get(done, "")
    if done in ("signoff", "adjudication") and pacs in PACS_DONE:
        said = f"{said} {PACS_DONE[PacsStatus(pacs)]}"
    return _case_page(ctx, request, who, report, slug, said)


def _act(ctx: Ctx, request: Request, report: str, slug: str, csrf: str, code: str,
         act: Callable[[ReviewService, Reviewer, CaseUnderReview], object],
         anchor: str = "") -> Response:  # fmt: skip
    """Run one review action for a form POST; back to the case page after, at ``anchor`` (the
    item or block the form was in: the reader stays where they were)."""
    who = signed_in(ctx, request)
    if who is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, detail="sign in or send a bearer token")
    if not csrf_ok(request, who, csrf):
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail="CSRF check failed; reload the page")
    svc = service(ctx, request)
    try:
        cu = open_case(svc, report, slug)
    except ReportNotFoundError:
        raise _missing("case") from None
    try:
        out = act(svc, who, cu)
    except ReviewForbiddenError as exc:
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail=str(exc)) from None
    except (ReviewError, ReissueError, OrthancError, ValueError) as exc:
        ctx.audit.write(who.token_id, f"review {code}", f"run={cu.run.run_id}", "refused")
        return _case_page(ctx, request, who, report, slug, f"Not recorded: {exc}", True, 409)
    ctx.audit.write(who.token_id, f"review {code}", f"run={cu.run.run_id}", "ok")
    pacs = out.pacs if isinstance(out, SignedOff) else out
    if isinstance(pacs, Reissued):  # sent again by hand: stored, or kept for the retry loop
        pacs = outcome(study_of(cu), pacs)
    query = f"done={code}"
    if isinstance(pacs, PacsOutcome):
        ctx.audit.write(who.token_id, f"review {code}: to PACS", f"run={cu.run.run_id}",
                        pacs.status.value)  # fmt: skip
        # recorded, not (all) stored: say exactly why, here; kept objects are sent later
        if pacs.status in (PacsStatus.FAILED, PacsStatus.KEPT):
            said = f"{DONE[code] if code != 'reissue' else ''} {pacs.message}".strip()
            failed = pacs.status is PacsStatus.FAILED
            return _case_page(ctx, request, who, report, slug, said, True, 502 if failed else 202)
        query = f"pacs={pacs.status.value}&{query}"
    url = f"{BASE}/runs/{report}/cases/{slug}?{query}"
    if _ANCHOR.match(anchor):
        url += f"#{anchor}"
    return RedirectResponse(url, status.HTTP_303_SEE_OTHER)


@router.post("/runs/{report}/cases/{slug}/items", summary="Accept, reject or correct an item")
def post_item(ctx: Ctx, request: Request, report: Report, slug: Slug,
              item_id: Annotated[str, Form(max_length=100)], verdict: Annotated[Verdict, Form()],
              model: Annotated[str, Form(max_length=400)] = "",
              answer_key: Annotated[str, Form(max_length=400)] = "",
              text: Text = "", csrf: Csrf = "", anchor: Anchor = "") -> Response:  # fmt: skip
    """A verdict on an item of a model's review block (``model``), or on an item of one answer
    outside any block (``answer_key``: a structured classification answer)."""

    def act(svc: ReviewService, who: Reviewer, cu: CaseUnderReview) -> object:
        if model:
            return record_verdicts(svc, who, cu, [ItemVerdict(model, item_id, verdict, text)])
        in_block = any(
            s.answer_key == answer_key and s.item_id == item_id
            for b in cu.blocks
            for it in b.items
            for s in it.sources
        )
        if not answer_key or in_block:
            raise ReviewError("this item is reviewed in its model's block: name the model")
        return record(svc, who, cu, Action.ITEM, answer_key=answer_key, item_id=item_id,
                      verdict=verdict, text=text.strip())  # fmt: skip

    return _act(ctx, request, report, slug, csrf, "item", act, anchor)


@router.post("/runs/{report}/cases/{slug}/block",
             summary="Save a model's review block in one go (form fields v:ITEM, t:ITEM)")  # fmt: skip
async def post_block(ctx: Ctx, request: Request, report: Report, slug: Slug) -> Response:
    """Every item's verdict of one block (radio ``v:<item id>``, correction ``t:<item id>``),
    and with ``rest=accept`` an accept for every item left without a verdict."""
    form = await request.form(max_fields=2 * MAX_BATCH + 10)
    model = str(form.get("model", ""))[:400]
    verdicts, bad = [], []
    for key, value in form.multi_items():
        if not key.startswith("v:") or not value:
            continue
        item_id = key[2:102]
        try:
            verdict = Verdict(str(value))
        except ValueError:
            bad.append(item_id)
            continue
        text = str(form.get(f"t:{item_id}", ""))[:4000]
        verdicts.append(ItemVerdict(model, item_id, verdict, text))
    accept_rest = form.get("rest") == "accept"

    def act(svc: ReviewService, who: Reviewer, cu: CaseUnderReview) -> object:
        if bad:
            raise ReviewError(f"unknown verdict for {', '.join(bad)}: accept, reject or correct")
        return save_block(svc, who, cu, model, verdicts, accept_rest)

    return await run_in_threadpool(
        _act, ctx, request, report, slug, str(form.get("csrf", ""))[:200], "block", act,
        str(form.get("anchor", ""))[:100],
    )  # fmt: skip


@router.post("/runs/{report}/cases/{slug}/accept-remaining",
             summary="Accept every item of a model's block that has no verdict yet")  # fmt: skip
def post_accept_remaining(ctx: Ctx, request: Request, report: Report, slug: Slug,
                          model: Annotated[str, Form(max_length=400)], csrf: Csrf = "",
                          anchor: Anchor = "") -> Response:  # fmt: skip
    return _act(ctx, request, report, slug, csrf, "accept",
                lambda svc, who, cu: accept_remaining(svc, who, cu, model), anchor)  # fmt: skip


@router.post("/runs/{report}/cases/{slug}/diagnosis", summary="The clinician's diagnosis")
def post_diagnosis(ctx: Ctx, request: Request, report: Report, slug: Slug, text: Text, csrf: Csrf = "") -> Response:  # fmt: skip
    return _act(ctx, request, report, slug, csrf, "diagnosis",
                lambda svc, who, cu: record(svc, who, cu, Action.DIAGNOSIS, text=text.strip()))  # fmt: skip


@router.post("/runs/{report}/cases/{slug}/error", summary="Override an answer's error category")
def post_error(ctx: Ctx, request: Request, report: Report, slug: Slug,
               answer_key: Annotated[str, Form(max_length=400)],
               category: Annotated[ErrorCategory, Form()], text: Text = "", csrf: Csrf = "") -> Response:  # fmt: skip
    return _act(ctx, request, report, slug, csrf, "error",
                lambda svc, who, cu: record(svc, who, cu, Action.ERROR, answer_key=answer_key,
                                            category=category, text=text.strip()))  # fmt: skip


@router.post("/runs/{report}/cases/{slug}/rating", summary="Rate an answer 0-5")
def post_rating(ctx: Ctx, request: Request, report: Report, slug: Slug,
                answer_key: Annotated[str, Form(max_length=400)],
                rating: Annotated[float, Form(ge=0, le=5)], csrf: Csrf = "") -> Response:  # fmt: skip
    return _act(ctx, request, report, slug, csrf, "rating",
                lambda svc, who, cu: record(svc, who, cu, Action.RATING, answer_key=answer_key,
                                            rating=rating))  # fmt: skip


@router.post("/runs/{report}/cases/{slug}/comment", summary="Add a comment")
def post_comment(ctx: Ctx, request: Request, report: Report, slug: Slug, text: Text, csrf: Csrf = "") -> Response:  # fmt: skip
    return _act(ctx, request, report, slug, csrf, "comment",
                lambda svc, who, cu: record(svc, who, cu, Action.COMMENT, text=text.strip()))  # fmt: skip


@router.get("/runs/{report}/cases/{slug}/signoff", response_class=HTMLResponse,
            summary="Sign-off, step 1: the VERIFIED content to confirm")  # fmt: skip
def signoff_page(ctx: Ctx, request: Request, report: Report, slug: Slug) -> Response:
    who = signed_in(ctx, request)
    if who is None:
        return _login_redirect()
    cl, _, cu = _open(ctx, request, report, slug)
    mine = cu.mine(who)
    if mine is not None and mine.signed_off_at:
        return RedirectResponse(f"{BASE}/runs/{report}/cases/{slug}", status.HTTP_303_SEE_OTHER)
    p = preview(cu, who)
    rv = _view(ctx, request, who, report, slug)
    rv.superseded = _superseded(cu)
    message = "" if who.person else (
        "Your token has no person name (family^given): you cannot sign off. Ask for a token "
        "made with --person.")  # fmt: skip
    # the preview is the confirmation: it says where the VERIFIED report goes, or that it stays
    dest = where_to(service(ctx, request), cu, _pacs(ctx)) if not p.missing else None
    body = render_page("signoff.html.j2", review=rv, message=message, message_error=bool(message),
                       c=cl, blocks=p.blocks, missing=p.missing, digest=p.digest, dest=dest,
                       others=[r.reviewer for r in cu.reviews if r.signed_off_at])  # fmt: skip
    return _html(body, 409 if p.missing else 200)


def _pacs(ctx: Ctx) -> Pacs:
    pipe = ctx.pipeline  # a gateway's: its write-back destination, and where it keeps objects
    return Pacs(ctx.orthanc, ctx.settings.verifying_organization,
                pipe.writeback if pipe is not None else None,
                pipe.kept_dir if pipe is not None else None)  # fmt: skip


@router.post("/runs/{report}/cases/{slug}/signoff", summary="Sign-off, step 2: confirm (final)")
def post_signoff(ctx: Ctx, request: Request, report: Report, slug: Slug,
                 digest: Annotated[str, Form(max_length=100)] = "", csrf: Csrf = "",
                 passed_over: PassedOver = "") -> Response:  # fmt: skip
    """``passed_over``: a superseded report version is signed off only with the newer
    version's gateway run id, the reviewer's confirmation that they pass it over knowingly."""
    return _act(ctx, request, report, slug, csrf, "signoff",
                lambda svc, who, cu: sign_off(svc, who, cu, digest, _pacs(ctx), passed_over))  # fmt: skip


@router.post("/runs/{report}/cases/{slug}/adjudication",
             summary="An admin's ruling on an item the reviewers disagree on")  # fmt: skip
def post_adjudication(ctx: Ctx, request: Request, report: Report, slug: Slug,
                      model: Annotated[str, Form(max_length=400)],
                      item_id: Annotated[str, Form(max_length=100)],
                      verdict: Annotated[Verdict, Form()], text: Text = "", csrf: Csrf = "") -> Response:  # fmt: skip
    return _act(ctx, request, report, slug, csrf, "adjudication",
                lambda svc, who, cu: adjudicate(svc, who, cu, [ItemVerdict(model, item_id, verdict, text)], _pacs(ctx)))  # fmt: skip


@router.post("/runs/{report}/cases/{slug}/reissue",
             summary="Send the verified report to the PACS again (sign-off sends it first)")  # fmt: skip
def post_reissue(
    ctx: Ctx, request: Request, report: Report, slug: Slug, csrf: Csrf = "",
    passed_over: PassedOver = "",
) -> Response:  # fmt: skip
    return _act(ctx, request, report, slug, csrf, "reissue",
                lambda svc, who, cu: reissue(svc, who, cu, _pacs(ctx), passed_over))  # fmt: skip
