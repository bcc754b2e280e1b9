"""The review actions, shared by the review pages (forms) and the JSON review API: item verdicts
on a model's review block, accept-all-remaining, diagnosis, comment, error-category override,
the two-step sign-off, adjudication and re-issue. Each checks its rule here, once; the routers
only translate requests and answers."""

from __future__ import annotations

from dataclasses import dataclass, field

from evaluation import (
    Action,
    BlockItem,
    CaseReview,
    Decision,
    ErrorCategory,
    ItemKind,
    ReportBlock,
    ReviewError,
    ReviewEvent,
    RunData,
    RunLoadError,
    Superseded,
    Verdict,
    Verification,
    VerifiedBlock,
    case_slug,
    case_verification,
    decision,
    digest,
    may_adjudicate,
    missing_items,
    report_blocks,
    review_preview,
)
from gateway.auth import Role
from gateway.orthanc import OrthancClient
from gateway.reissue import Reissued, reissue_case
from gateway.review_auth import Reviewer
from gateway.review_service import ReportNotFoundError, ReviewService
from gateway.run_report import gateway_info
from gateway.runs import RunRecord

MAX_BATCH = 500


class ReviewForbiddenError(PermissionError):
    """The reviewer's role does not allow the action."""


@dataclass
class CaseUnderReview:
    """A case of a report folder, with its models' review blocks and its reviews."""

    report: str
    slug: str
    run: RunData
    case_id: str
    blocks: list[ReportBlock]
    reviews: list[CaseReview] = field(default_factory=list)
    # a newer report version of the same study (None: this is the newest, or not a gateway run)
    superseded: Superseded | None = None

    def mine(self, who: Reviewer) -> CaseReview | None:
        return next((r for r in self.reviews if r.reviewer == who.name), None)

    def block(self, model: str) -> ReportBlock:
        for b in self.blocks:
            if b.model == model:
                return b
        raise ReviewError(f"no review block for model {model!r} in this case")

    def item(self, model: str, item_id: str) -> BlockItem:
        try:
            return self.block(model).item(item_id)
        except KeyError:
            raise ReviewError(f"{model} has no item {item_id!r} in this case") from None

    @property
    def verification(self) -> Verification:
        return case_verification(self.case_id, self.blocks, self.reviews)


def gateway_run_id(report: str, run: RunData) -> str:
    """The gateway run a report is of (its folder is named after it)."""
    return str(gateway_info(run).get("run_id") or report)


def _slug_in(svc: ReviewService, report: str, slug: str) -> str:
    """The case ``slug`` in another report of the same study ("" when it cannot be told)."""
    try:
        slugs = [case_slug(c.case_id) for c in svc.run(report).cases]
    except (ReportNotFoundError, RunLoadError, OSError):
        return ""
    return slug if slug in slugs else (slugs[0] if len(slugs) == 1 else "")


def superseded_by(
    svc: ReviewService,
    report: str,
    run: RunData,
    slug: str,
    records: list[RunRecord] | None = None,
) -> Superseded | None:
    """The newer version of the study that supersedes this report's (None: none does)."""
    if svc.versions is None:
        return None
    records = svc.versions.records() if records is None else records
    run_id = gateway_run_id(report, run)
    newer = svc.versions.superseding(run_id, records)
    mine = next((r for r in records if r.run_id == run_id), None)
    if newer is None or newer.version is None or mine is None or mine.version is None:
        return None
    return Superseded(
        version=mine.version,
        newer_version=newer.version,
        newer_run_id=newer.run_id,
        newer_slug=_slug_in(svc, newer.run_id, slug),
        newer_finished_at=newer.finished_at or "",
    )


def open_case(svc: ReviewService, report: str, slug: str) -> CaseUnderReview:
    """The case (raises ``ReportNotFoundError``); its blocks come from the run's answers."""
    run = svc.run(report)
    case_id = svc.case_id(report, slug)
    return CaseUnderReview(
        report=report,
        slug=slug,
        run=run,
        case_id=case_id,
        blocks=report_blocks(run.samples_of(case_id)),
        reviews=svc.store.reviews(run.run_id, case_id),
        superseded=superseded_by(svc, report, run, slug),
    )


def open_cases(
    svc: ReviewService, report: str, records: list[RunRecord] | None = None
) -> list[CaseUnderReview]:
    """Every case of a report folder (the queue), the run's reviews read once for all.
    ``records``: the gateway's runs (``ReportVersions.records``), read once for many reports."""
    run = svc.run(report)
    by_case: dict[str, list[CaseReview]] = {}
    for r in svc.store.reviews(run.run_id):
        by_case.setdefault(r.case_id, []).append(r)
    out = []
    for c in run.cases:
        slug = case_slug(c.case_id)
        out.append(
            CaseUnderReview(
                report=report,
                slug=slug,
                run=run,
                case_id=c.case_id,
                blocks=report_blocks(run.samples_of(c.case_id)),
                reviews=by_case.get(c.case_id, []),
                superseded=superseded_by(svc, report, run, slug, records),
            )
        )
    return out


def knowingly(cu: CaseUnderReview, passed_over: str, act: str) -> str:
    """What a sign-off or re-issue (``act``) of the case records as passed over: "" for the
    newest version of its study; for a superseded one the newer version, when the reviewer
    confirmed passing over exactly that version (``passed_over``: its gateway run id), else
    refused. A confirmation given while another version was the newest confirms nothing."""
    s = cu.superseded
    if s is None:
        return ""
    if passed_over == s.newer_run_id:
        return s.newer
    if passed_over:
        raise ReviewError(
            f"{s.newer} now supersedes this version {s.version} of the study, not the version "
            f"your confirmation names: review it again, and {act} {s.newer} instead or confirm "
            f"that you {act} this older version although {s.newer} supersedes it"
        )
    raise ReviewError(
        f"this is version {s.version} of the study and {s.newer} supersedes it: {act} the "
        f"newer version, or confirm that you {act} this older version although {s.newer} "
        "supersedes it"
    )


def _event(who: Reviewer, cu: CaseUnderReview, action: Action, **kw: object) -> ReviewEvent:
    return ReviewEvent(
        reviewer=who.name,
        run_id=cu.run.run_id,
        case_id=cu.case_id,
        action=action,
        person=who.person,
        **kw,
    )


def _item_events(
    who: Reviewer, cu: CaseUnderReview, item: BlockItem, verdict: Verdict, text: str, action: Action
) -> list[ReviewEvent]:
    """One verdict on a block item, recorded for every answer item it merges."""
    text = text.strip()
    if verdict is not Verdict.CORRECT:
        text = ""
    elif not text:
        raise ReviewError(f"a correction of {item.label} needs the corrected text")
    elif item.kind is ItemKind.NO_FINDING:
        raise ReviewError(
            "'no lesion reported' cannot be corrected: reject it, and describe what you see in "
            "a comment or your diagnosis"
        )
    if item.kind is ItemKind.ERROR and verdict is Verdict.CORRECT:
        try:
            category = ErrorCategory(text)
        except ValueError:
            allowed = ", ".join(c.value for c in ErrorCategory)
            raise ReviewError(f"{text!r} is not an error category; one of: {allowed}") from None
        if action is Action.ITEM:  # an override of the category, as the per-answer form makes
            return _override_events(who, cu, item, category, "corrected in the review block")
        text = category.value
    return [
        _event(
            who, cu, action, answer_key=s.answer_key, item_id=s.item_id, verdict=verdict, text=text
        )
        for s in item.sources
    ]


def _override_events(
    who: Reviewer, cu: CaseUnderReview, item: BlockItem, category: ErrorCategory, evidence: str
) -> list[ReviewEvent]:
    """An error-category override of a block's error item, for every answer it merges."""
    return [
        _event(who, cu, Action.ERROR, answer_key=s.answer_key, category=category, text=evidence)
        for s in item.sources
    ]


@dataclass
class ItemVerdict:
    model: str
    item_id: str
    verdict: Verdict
    text: str = ""


def record_verdicts(
    svc: ReviewService, who: Reviewer, cu: CaseUnderReview, verdicts: list[ItemVerdict]
) -> list[ReviewEvent]:
    """Verdicts on review-block items (all recorded, or none when one is invalid)."""
    if len(verdicts) > MAX_BATCH:
        raise ReviewError(f"at most {MAX_BATCH} verdicts per request")
    events = []
    for v in verdicts:
        item = cu.item(v.model, v.item_id)
        events += _item_events(who, cu, item, v.verdict, v.text, Action.ITEM)
    return svc.store.append_many(events)


def accept_remaining(
    svc: ReviewService, who: Reviewer, cu: CaseUnderReview, model: str
) -> list[ReviewEvent]:
    """Accept, as the model gave them, the block's items that have no verdict of this reviewer."""
    block = cu.block(model)
    mine = cu.mine(who)
    events = []
    for item in block.items:
        if mine is None or decision(item, mine) is None:
            events += _item_events(who, cu, item, Verdict.ACCEPT, "", Action.ITEM)
    if not events:
        raise ReviewError(f"every item of {model}'s block already has your verdict")
    return svc.store.append_many(events)


def save_block(
    svc: ReviewService,
    who: Reviewer,
    cu: CaseUnderReview,
    model: str,
    verdicts: list[ItemVerdict],
    accept_rest: bool = False,
) -> list[ReviewEvent]:
    """A model's block saved in one go: the verdicts that differ from the reviewer's current
    ones and, with ``accept_rest``, an accept for every other item still without a verdict.
    All recorded, or none when one is invalid (an unknown item, a correction without text)."""
    if len(verdicts) > MAX_BATCH:
        raise ReviewError(f"at most {MAX_BATCH} verdicts per request")
    block = cu.block(model)
    mine = cu.mine(who)
    events: list[ReviewEvent] = []
    named: set[str] = set()
    for v in verdicts:
        item = cu.item(model, v.item_id)
        named.add(item.item_id)
        now = decision(item, mine) if mine else None
        if now is not None and now.same(Decision(verdict=v.verdict, text=v.text.strip())):
            continue
        events += _item_events(who, cu, item, v.verdict, v.text, Action.ITEM)
    if accept_rest:
        for item in block.items:
            if item.item_id not in named and (mine is None or decision(item, mine) is None):
                events += _item_events(who, cu, item, Verdict.ACCEPT, "", Action.ITEM)
    if not events:
        raise ReviewError("nothing to save: choose a verdict for an item, or accept the rest")
    return svc.store.append_many(events)


def record(svc: ReviewService, who: Reviewer, cu: CaseUnderReview, action: Action,
           **kw: object) -> ReviewEvent:  # fmt: skip
    """A case-level action (diagnosis, comment) or a per-answer one (rating, error override)."""
    return svc.store.append(_event(who, cu, action, **kw))


def override_error(
    svc: ReviewService,
    who: Reviewer,
    cu: CaseUnderReview,
    model: str,
    item_id: str,
    category: ErrorCategory,
    evidence: str,
) -> list[ReviewEvent]:
    """Override the category of a block's error item (recorded for each answer it merges)."""
    item = cu.item(model, item_id)
    if item.kind is not ItemKind.ERROR:
        raise ReviewError(f"{item.label} is not an error category")
    events = _override_events(who, cu, item, category, evidence.strip() or "clinician override")
    return svc.store.append_many(events)


@dataclass
class SignoffPreview:
    """Step 1 of sign-off: what it would verify, what is missing, and the content's digest."""

    blocks: list[VerifiedBlock]
    missing: list[str]
    digest: str


def preview(cu: CaseUnderReview, who: Reviewer) -> SignoffPreview:
    mine = cu.mine(who) or CaseReview(reviewer=who.name, run_id=cu.run.run_id, case_id=cu.case_id)
    blocks = review_preview(cu.blocks, mine)
    return SignoffPreview(
        blocks=blocks, missing=missing_items(cu.blocks, mine), digest=digest(blocks)
    )


def sign_off(
    svc: ReviewService, who: Reviewer, cu: CaseUnderReview, confirm: str, passed_over: str = ""
) -> ReviewEvent:
    """Step 2: sign off the content the reviewer was shown (``confirm``: its digest). A
    superseded report version only with ``passed_over``, the newer version's gateway run id
    (:func:`knowingly`); the sign-off records that version."""
    if not who.person:
        raise ReviewError(
            "your token has no person name (family^given), which a VERIFIED report names as "
            "its verifying observer: ask for a token made with --person"
        )
    p = preview(cu, who)
    if p.missing:
        shown = "; ".join(p.missing[:10]) + ("; ..." if len(p.missing) > 10 else "")
        raise ReviewError(
            f"{len(p.missing)} item(s) have no verdict ({shown}): give each a verdict or accept "
            "all remaining items of a block"
        )
    if not confirm or confirm != p.digest:
        raise ReviewError(
            "the content to verify changed since it was shown (or was never shown): review the "
            "sign-off preview again"
        )
    passed = knowingly(cu, passed_over, "sign off")
    mine = cu.mine(who)
    (event,) = svc.store.append_many(
        [_event(who, cu, Action.SIGNOFF, text=p.digest, passed_over=passed)],
        expect_last=mine.last_id if mine else 0,
    )
    return event


def adjudicate(
    svc: ReviewService, who: Reviewer, cu: CaseUnderReview, rulings: list[ItemVerdict]
) -> list[ReviewEvent]:
    """An admin's rulings on items the signed-off reviewers disagree on."""
    if who.role is not Role.ADMIN:
        raise ReviewForbiddenError("adjudication is an admin action")
    if not who.person:
        raise ReviewError("your token has no person name (family^given): ask for one with --person")
    v = cu.verification
    me = cu.mine(who) or CaseReview(reviewer=who.name, run_id="", case_id="", person=who.person)
    if not may_adjudicate(me.model_copy(update={"person": who.person}), [r for r in cu.reviews if r.signed_off_at]):  # fmt: skip
        raise ReviewError("a clinician who reviewed the case cannot adjudicate it")
    disputed = {(d.model, d.item_id) for d in v.disputes}
    if not disputed:
        raise ReviewError("nothing to adjudicate: the signed-off reviews agree")
    if len(rulings) > MAX_BATCH:
        raise ReviewError(f"at most {MAX_BATCH} rulings per request")
    events = []
    for r in rulings:
        if (r.model, r.item_id) not in disputed:
            raise ReviewError(f"{r.model}: {r.item_id} is not disputed")
        item = cu.item(r.model, r.item_id)
        events += _item_events(who, cu, item, r.verdict, r.text, Action.ADJUDICATE)
    return svc.store.append_many(events)


def reissue(
    svc: ReviewService,
    who: Reviewer,
    cu: CaseUnderReview,
    orthanc: OrthancClient,
    organization: str,
    passed_over: str = "",
) -> Reissued:
    """Store the VERIFIED SRs and PDF of a verified case in PACS (a signer or an admin). A
    superseded report version only with ``passed_over`` (:func:`knowingly`): each re-issue
    record and the VERIFIED report name the newer version passed over."""
    v = cu.verification
    if who.role is not Role.ADMIN and not v.signed_by(who.name):
        raise ReviewError("Sign the case off before re-issuing it.")
    passed = knowingly(cu, passed_over, "re-issue")
    note = ""
    if passed and cu.superseded is not None:
        note = (
            f"Verified on report version {cu.superseded.version} (gateway run "
            f"{gateway_run_id(cu.report, cu.run)}) knowingly, although {passed} supersedes it"
        )

    def stored(uid: str) -> None:  # logged as each object reaches PACS, not after all
        svc.store.append(_event(who, cu, Action.REISSUE, text=uid, passed_over=passed))

    # the report's bundle: a gateway run's holds the evidence recorded at write-back
    return reissue_case(orthanc, cu.run, cu.case_id, v, organization, on_stored=stored,
                        bundle=svc.folder(cu.report), note=note)  # fmt: skip
