"""The review actions, shared by the review pages (forms) and the JSON review API: item verdicts
on a model's review block, accept-all-remaining, diagnosis, comment, error-category override,
the two-step sign-off, adjudication and re-issue. Each checks its rule here, once; the routers
only translate requests and answers.

Signing off is final in the PACS: the sign-off (and the adjudication that settles the last
dispute) stores the case's VERIFIED SRs and PDF through the one write-back in the same action
(:func:`deliver`), the preview being the confirmation. A case whose study is in no PACS signs
off all the same and says that nothing was sent. For a gateway run, what the PACS does not take
is kept and waits in the run's record (``WriteBack.verified``) for the write-back retry loop,
which records each object in the review log once stored (:func:`record_stored`); for a run
handed in, a PACS that fails leaves the sign-off recorded and the case to be sent again
(:func:`reissue`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, Field

from evaluation import ErrorCategory
from evaluation.log import RunData, VerifiedBy, WriteBack
from evaluation.reports import RunLoadError, case_slug
from evaluation.review import (
    Action,
    BlockItem,
    CaseReview,
    Decision,
    ItemKind,
    ReportBlock,
    ReviewError,
    ReviewEvent,
    ReviewStore,
    Superseded,
    Verdict,
    Verification,
    VerifiedBlock,
    case_verification,
    decision,
    digest,
    may_adjudicate,
    missing_items,
    report_blocks,
    review_preview,
)
from gateway.auth import Role
from gateway.orthanc import OrthancClient, OrthancError
from gateway.pacs import PacsClient, PacsRequestError
from gateway.review.auth import Reviewer
from gateway.review.reissue import (
    Destination,
    Keeper,
    NotInPacsError,
    Recorded,
    Reissued,
    ReissueError,
    destination,
    local_pacs,
    reissue_case,
)
from gateway.review.service import ReportNotFoundError, ReviewService
from gateway.runs import RunNotFoundError, RunRecord
from gateway.runs.reading import gateway_info
from gateway.writeback import WritebackError
from gateway.writeback_retry import retry_pending

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
        blocks=report_blocks(run.samples_of(case_id), run.images),
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
    images = run.images  # what each finding's place is read on (its SR's SCOORD)
    for c in run.cases:
        slug = case_slug(c.case_id)
        out.append(
            CaseUnderReview(
                report=report,
                slug=slug,
                run=run,
                case_id=c.case_id,
                blocks=report_blocks(run.samples_of(c.case_id), images),
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


class PacsStatus(StrEnum):
    SENT = "sent"  # the VERIFIED SRs and PDF are in the PACS
    NOT_IN_PACS = "not_in_pacs"  # the case's study is in no PACS: nothing was sent
    PENDING = "pending"  # not verified yet (reviewers disagree, a stale sign-off): not sent
    FAILED = "failed"  # the PACS did not take it: send it again
    KEPT = "kept"  # the PACS did not take it (all): kept, the retry loop sends it


class PacsOutcome(BaseModel):
    """What a sign-off (or an adjudication, a re-send) did in the PACS, and why."""

    status: PacsStatus
    message: str
    study_uid: str = ""
    sr_sop_instance_uids: list[str] = Field(default_factory=list)
    pdf_sop_instance_uid: str | None = None
    warnings: list[str] = Field(default_factory=list)


@dataclass
class SignedOff:
    event: ReviewEvent
    pacs: PacsOutcome


@dataclass
class Pacs:
    """Where VERIFIED reports go: the PACS client and the verifying organisation they name."""

    orthanc: OrthancClient
    organization: str
    # where the VERIFIED objects are stored (the PACS file's writeback:); None: ``orthanc``
    destination: PacsClient | None = None
    # where a gateway run's objects not stored are kept (the pipeline's kept_dir); None:
    # nothing is kept, a failure is said and the case is sent again by hand
    kept_root: Path | None = None


def where_to(svc: ReviewService, cu: CaseUnderReview, pacs: Pacs) -> Destination:
    """Where signing the case off sends its VERIFIED report (the sign-off preview says it)."""
    return destination(pacs.orthanc, cu.run, cu.case_id, svc.folder(cu.report),
                       recorded=_recorded(svc, cu.report))  # fmt: skip


def _passed_note(cu: CaseUnderReview, passed: str) -> str:
    if not passed or cu.superseded is None:
        return ""
    return (
        f"Verified on report version {cu.superseded.version} (gateway run "
        f"{gateway_run_id(cu.report, cu.run)}) knowingly, although {passed} supersedes it"
    )


def _keeper(svc: ReviewService, who: Reviewer, cu: CaseUnderReview, pacs: Pacs,
            passed: str) -> Keeper | None:  # fmt: skip
    """Where the case's VERIFIED objects wait when the PACS does not take them: its gateway
    run's record (None: a report handed in, or no folder to keep them in)."""
    if pacs.kept_root is None or svc.runs is None or not svc.is_gateway_run(cu.report):
        return None
    by = VerifiedBy(review_run_id=cu.run.run_id, case_id=cu.case_id, reviewer=who.name,
                    person=who.person, passed_over=passed)  # fmt: skip
    return Keeper(svc.runs, cu.report, pacs.kept_root, by)


def stored_event(wb: WriteBack) -> ReviewEvent | None:
    """The review log's record of a VERIFIED object stored in the PACS (None: not one)."""
    v = wb.verified
    if v is None:
        return None
    return ReviewEvent(reviewer=v.reviewer, run_id=v.review_run_id, case_id=v.case_id,
                       action=Action.REISSUE, person=v.person, text=wb.sop_instance_uid,
                       passed_over=v.passed_over)  # fmt: skip


def record_stored(store: ReviewStore, wb: WriteBack) -> None:
    """Record in the review log a VERIFIED object the retry loop stored, as the sign-off's
    own send would have (the case then reads as in the PACS)."""
    event = stored_event(wb)
    if event is not None:
        store.append(event)


def _send(svc: ReviewService, who: Reviewer, cu: CaseUnderReview, pacs: Pacs,
          passed: str) -> Reissued:  # fmt: skip
    """Store the case's VERIFIED report through the write-back; each object stored is logged.
    A gateway run's objects the PACS does not take are kept in its record (``pending``)."""

    def stored(uid: str) -> None:  # logged as each object reaches PACS, not after all
        svc.store.append(_event(who, cu, Action.REISSUE, text=uid, passed_over=passed))

    # the report's bundle: a gateway run's holds the evidence recorded at write-back
    return reissue_case(pacs.orthanc, cu.run, cu.case_id, cu.verification, pacs.organization,
                        on_stored=stored, bundle=svc.folder(cu.report), to=pacs.destination,
                        recorded=_recorded(svc, cu.report), note=_passed_note(cu, passed),
                        keeper=_keeper(svc, who, cu, pacs, passed))  # fmt: skip


def _send_kept(svc: ReviewService, keeper: Keeper, dest: PacsClient) -> Reissued | None:
    """Try now the case's VERIFIED objects still kept from its sign-off (None: there are
    none): sending again sends what was signed, never a second copy."""
    if not any(keeper.mine(wb) for wb in keeper.runs.get(keeper.run_id).writebacks_pending):
        return None
    got, _ = retry_pending(keeper.runs, keeper.run_id, dest, math.inf, keeper.mine)
    out = Reissued(pending=got.pending)
    for wb in got.done:
        record_stored(svc.store, wb)
        if wb.kind == "verified-pdf":
            out.pdf_uid = wb.sop_instance_uid
        else:
            out.sr_uids.append(wb.sop_instance_uid)
    return out


def outcome(study: str, out: Reissued) -> PacsOutcome:
    """What sending the VERIFIED report did, said."""
    n = len(out.sr_uids) + (out.pdf_uid is not None)
    if out.pending:
        first = out.pending[0]
        return PacsOutcome(
            status=PacsStatus.KEPT, study_uid=study,
            message=f"The VERIFIED report is NOT in the PACS yet: {len(out.pending)} object(s) "
            f"not stored ({first.last_error or 'not stored'}); {n} stored. They are kept and "
            f"tried again automatically from {first.next_at}; the case reads as in the PACS "
            "once they are stored (or use Send to the PACS).",
            sr_sop_instance_uids=out.sr_uids, pdf_sop_instance_uid=out.pdf_uid,
            warnings=out.warnings,
        )  # fmt: skip
    return PacsOutcome(
        status=PacsStatus.SENT, study_uid=study,
        message=f"The VERIFIED report is in the PACS: {n} object(s) stored in study {study} "
        f"({len(out.sr_uids)} SR, {'the' if out.pdf_uid else 'no'} checklist PDF).",
        sr_sop_instance_uids=out.sr_uids, pdf_sop_instance_uid=out.pdf_uid,
        warnings=out.warnings,
    )  # fmt: skip


def study_of(cu: CaseUnderReview) -> str:
    """The study the case's VERIFIED report goes to ("" when it names none)."""
    uids = cu.run.case(cu.case_id).provenance.study_uids
    return uids[0] if uids else ""


def deliver(svc: ReviewService, who: Reviewer, cu: CaseUnderReview, pacs: Pacs,
            passed: str = "") -> PacsOutcome:  # fmt: skip
    """Send the case's VERIFIED report to the PACS once it is verified, saying what happened:
    never raises for the PACS (the review action it follows is recorded either way)."""
    v, study = cu.verification, study_of(cu)
    if not v.complete:
        return PacsOutcome(
            status=PacsStatus.PENDING, study_uid=study,
            message=f"Nothing was sent to the PACS yet: {v.why_not}.",
        )  # fmt: skip
    try:
        out = _send(svc, who, cu, pacs, passed)
    except NotInPacsError as exc:
        return PacsOutcome(
            status=PacsStatus.NOT_IN_PACS, study_uid=study,
            message=f"Nothing was sent to a PACS: {exc}. The review is recorded here only.",
        )  # fmt: skip
    except (ReissueError, OrthancError, WritebackError, PacsRequestError, ValueError) as exc:
        return PacsOutcome(
            status=PacsStatus.FAILED, study_uid=study,
            message=f"The VERIFIED report was NOT stored in the PACS: {exc}. Send it again "
            "once the PACS takes it (Send to the PACS, on the case page).",
        )  # fmt: skip
    return outcome(study, out)


def in_pacs(svc: ReviewService, cu: CaseUnderReview) -> bool:
    """Whether the case's VERIFIED report, as last signed or adjudicated, is in the PACS: an
    object was stored after the latest sign-off or ruling (else it is still to be sent)."""
    last_signed, last_stored = 0, 0
    for e in svc.store.events(cu.run.run_id, cu.case_id):
        if e.action in (Action.SIGNOFF, Action.ADJUDICATE):
            last_signed = max(last_signed, e.id or 0)
        elif e.action is Action.REISSUE:
            last_stored = max(last_stored, e.id or 0)
    return last_stored > last_signed


def sign_off(svc: ReviewService, who: Reviewer, cu: CaseUnderReview, confirm: str,
             pacs: Pacs, passed_over: str = "") -> SignedOff:  # fmt: skip
    """Step 2: sign off the content the reviewer was shown (``confirm``: its digest), then send
    the VERIFIED report to the PACS (:func:`deliver`). A superseded report version only with
    ``passed_over``, the newer version's gateway run id (:func:`knowingly`), checked before
    anything is recorded or sent; the sign-off and the report record that version."""
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
    cu.reviews = svc.store.reviews(cu.run.run_id, cu.case_id)  # with this sign-off
    return SignedOff(event=event, pacs=deliver(svc, who, cu, pacs, passed))


def adjudicate(svc: ReviewService, who: Reviewer, cu: CaseUnderReview,
               rulings: list[ItemVerdict], pacs: Pacs) -> PacsOutcome:  # fmt: skip
    """An admin's rulings on items the signed-off reviewers disagree on; the ruling that
    settles the last dispute sends the VERIFIED report to the PACS (:func:`deliver`)."""
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
    svc.store.append_many(events)
    cu.reviews = svc.store.reviews(cu.run.run_id, cu.case_id)  # with these rulings
    # a superseded version's signers confirmed it knowingly: the report says so again
    passed = next((r.passed_over for r in cu.reviews if r.passed_over), "")
    return deliver(svc, who, cu, pacs, passed)


def reissue(
    svc: ReviewService, who: Reviewer, cu: CaseUnderReview, pacs: Pacs, passed_over: str = ""
) -> Reissued:
    """Send the VERIFIED SRs and PDF of a verified case to the PACS again (a signer or an
    admin): after a sign-off whose sending failed, or to store a new copy. A superseded report
    version only with ``passed_over`` (:func:`knowingly`): each record of an object stored and
    the VERIFIED report name the newer version passed over."""
    if who.role is not Role.ADMIN and not cu.verification.signed_by(who.name):
        raise ReviewError("Sign the case off before sending it to the PACS.")
    passed = knowingly(cu, passed_over, "re-issue")
    keeper = _keeper(svc, who, cu, pacs, passed)
    if keeper is not None:  # what a sign-off kept is sent, not built again
        kept = _send_kept(svc, keeper, pacs.destination or local_pacs(pacs.orthanc))
        if kept is not None:
            return kept
    return _send(svc, who, cu, pacs, passed)


def _recorded(svc: ReviewService, report: str) -> Recorded:
    """Reads the SR's evidence the gateway recorded for the run ``report`` (None: a report
    handed in, not one of the gateway's runs)."""
    runs = svc.runs
    if runs is None or not svc.is_gateway_run(report):
        return None
    try:
        if not runs.get(report).evidence:  # recorded none (written back by hand, or before)
            return None
    except RunNotFoundError:
        return None
    return lambda: runs.evidence(report)
