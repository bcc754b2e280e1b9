"""What a clinician verified: the reviewed blocks of a case, as they go into the VERIFIED SR.

A reviewer's decision on a block item is the latest verdict on any of its sources (a verdict is
recorded for every source at once); an error item is also decided by an error-category
override. Sign-off needs a decision on every item (:func:`missing_items`). The verified content
keeps accepted items, carries corrected ones with the reviewer's text and drops rejected ones.

With two or more signed-off reviews, items on which their decisions differ are disputes; an
admin's adjudication decides each, and until every dispute is decided no VERIFIED report can be
issued (:func:`case_verification`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from enum import StrEnum

from pydantic import BaseModel, Field

from dicom import display_name
from evaluation.review.review_log import CaseReview, ItemState, Verdict
from evaluation.review.sr_content import BlockItem, ItemKind, ReportBlock, ReportContent, put_item
from evaluation.scores import ErrorCategory


class Outcome(StrEnum):
    KEPT = "kept"
    CORRECTED = "corrected"
    DROPPED = "dropped"


class Decision(BaseModel):
    verdict: Verdict
    text: str = ""  # the correction (a category for an error item)
    at: str = ""
    by: str = ""
    id: int = 0  # the log event it comes from

    def same(self, other: Decision) -> bool:
        if self.verdict is not other.verdict:
            return False
        if self.verdict is not Verdict.CORRECT:
            return True
        return " ".join(self.text.lower().split()) == " ".join(other.text.lower().split())


def _latest(states: Sequence[tuple[ItemState, str]]) -> Decision | None:
    if not states:
        return None
    st, by = max(states, key=lambda s: (s[0].id, s[0].at))
    return Decision(verdict=st.verdict, text=st.text, at=st.at, by=by, id=st.id)


def _valid(item: BlockItem, st: ItemState) -> bool:
    """A decision the VERIFIED report can carry: a correction with text (for an error item, a
    category; never for "no lesion reported"); else it counts as no decision."""
    if st.verdict is not Verdict.CORRECT:
        return True
    if not st.text.strip() or item.kind is ItemKind.NO_FINDING:
        return False
    return item.kind is not ItemKind.ERROR or st.text in {c.value for c in ErrorCategory}


def decision(item: BlockItem, review: CaseReview, adjudicated: bool = False) -> Decision | None:
    """The reviewer's decision on a block item (``adjudicated``: the admin's adjudication):
    the latest valid verdict on any of its sources (an error item also by an override)."""
    table = review.adjudicated if adjudicated else review.items
    states = [
        (st, review.reviewer)
        for src in item.sources
        if (st := table.get(src.answer_key, {}).get(src.item_id)) is not None
    ]
    if item.kind is ItemKind.ERROR and not adjudicated:
        states += [
            (st, review.reviewer)
            for src in item.sources
            if (st := review.error_states.get(src.answer_key)) is not None
        ]
    got = _latest([(st, by) for st, by in states if _valid(item, st)])
    corrected_to_same = (
        got is not None
        and item.kind is ItemKind.ERROR
        and got.verdict is Verdict.CORRECT
        and got.text == item.text
    )
    if got is not None and corrected_to_same:  # "corrected" to the category it had: accepted
        got = got.model_copy(update={"verdict": Verdict.ACCEPT, "text": ""})
    return got


def decisions(item: BlockItem, reviews: Sequence[CaseReview]) -> dict[str, Decision]:
    """Each reviewer's decision on a block item (reviewers without one are left out)."""
    return {r.reviewer: d for r in reviews if (d := decision(item, r)) is not None}


def missing_items(blocks: Sequence[ReportBlock], review: CaseReview | None) -> list[str]:
    """Items without a decision, as "model: item" (sign-off needs none)."""
    return [
        f"{b.model}: {it.label}"
        for b in blocks
        for it in b.items
        if review is None or decision(it, review) is None
    ]


class VerifiedItem(BaseModel):
    item_id: str
    kind: ItemKind
    label: str
    model_text: str  # what the model said
    outcome: Outcome
    text: str  # what the VERIFIED report says ("" when dropped)
    decided_by: str = ""


class VerifiedBlock(BaseModel):
    model: str
    items: list[VerifiedItem] = Field(default_factory=list)
    content: ReportContent = Field(default_factory=ReportContent)

    def outcome(self, outcome: Outcome) -> list[VerifiedItem]:
        return [it for it in self.items if it.outcome is outcome]


def verified_block(
    block: ReportBlock, decide: dict[str, Decision], comments: Sequence[str] = ()
) -> VerifiedBlock:
    """The block as decided (``decide``: item id -> decision; items without one are kept
    out of a signed report by the sign-off rule, and shown as dropped here)."""
    out = VerifiedBlock(model=block.model)
    for it in block.items:
        d = decide.get(it.item_id)
        if d is None or d.verdict is Verdict.REJECT:
            outcome, text = Outcome.DROPPED, ""
        elif d.verdict is Verdict.CORRECT and d.text.strip():
            outcome, text = Outcome.CORRECTED, d.text.strip()
        else:
            outcome, text = Outcome.KEPT, it.text
        out.items.append(
            VerifiedItem(
                item_id=it.item_id,
                kind=it.kind,
                label=it.label,
                model_text=it.text,
                outcome=outcome,
                text=text,
                decided_by=d.by if d else "",
            )
        )
        if outcome is not Outcome.DROPPED:
            put_item(out.content, it, text if outcome is Outcome.CORRECTED else None)
    out.content.comments = list(comments)
    return out


def review_comments(reviews: Sequence[CaseReview]) -> list[str]:
    """Reviewers' diagnoses and comments as the VERIFIED report carries them (attributed)."""
    out = []
    for r in reviews:
        who = display_name(r.person) if r.person else r.reviewer
        if r.diagnosis:
            out.append(f"Diagnosis by {who}: {r.diagnosis}")
        out += [f"Comment by {who}: {text}" for _, text in r.comments]
    return out


def review_preview(blocks: Sequence[ReportBlock], review: CaseReview) -> list[VerifiedBlock]:
    """What one reviewer's sign-off would verify (the second step of sign-off)."""
    comments = review_comments([review])
    return [
        verified_block(
            b, {it.item_id: d for it in b.items if (d := decision(it, review))}, comments
        )
        for b in blocks
    ]


def digest(blocks: Sequence[VerifiedBlock]) -> str:
    """A fingerprint of verified content: sign-off confirms exactly the content it was shown."""
    data = [
        b.model_dump(mode="json", exclude={"items": {"__all__": {"decided_by"}}}) for b in blocks
    ]
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:32]


class Signer(BaseModel):
    reviewer: str
    person: str = ""  # DICOM person name, family^given
    at: str = ""


class Dispute(BaseModel):
    model: str
    item_id: str
    label: str
    model_text: str
    decisions: dict[str, Decision]  # reviewer -> decision
    adjudicated: Decision | None = None


class Verification(BaseModel):
    """The state of a case's verification: who signed, disputes, and (when complete) what the
    VERIFIED report says."""

    case_id: str
    signers: list[Signer] = Field(default_factory=list)
    adjudicators: list[Signer] = Field(default_factory=list)
    disputes: list[Dispute] = Field(default_factory=list)
    blocks: list[VerifiedBlock] = Field(default_factory=list)
    # signers whose sign-off confirmed other content than the case shows now (re-scored run)
    stale: list[str] = Field(default_factory=list)

    def signed_by(self, reviewer: str) -> bool:
        return any(s.reviewer == reviewer for s in self.signers)

    @property
    def verifiers(self) -> list[Signer]:
        """Everyone a VERIFIED report names as verifying observer, in order."""
        return [*self.signers, *self.adjudicators]

    @property
    def open_disputes(self) -> list[Dispute]:
        return [d for d in self.disputes if d.adjudicated is None]

    @property
    def complete(self) -> bool:
        return bool(self.signers) and not self.open_disputes and not self.stale

    @property
    def why_not(self) -> str:
        if not self.signers:
            return "no reviewer has signed the case off"
        if self.stale:
            return (
                f"what {', '.join(self.stale)} signed off is not what the case shows now (the "
                "run was re-scored or re-written since): nothing VERIFIED can be issued from it"
            )
        if self.open_disputes:
            items = ", ".join(f"{d.model}: {d.label}" for d in self.open_disputes[:10])
            return f"the reviewers disagree on {len(self.open_disputes)} item(s) ({items}); an admin must adjudicate"
        return ""


def may_adjudicate(reviewer: CaseReview, signed: Sequence[CaseReview]) -> bool:
    """An adjudicator is nobody who reviewed the case (by token name or by person)."""
    people = {r.person for r in signed if r.person}
    names = {r.reviewer for r in signed}
    return (
        reviewer.reviewer not in names
        and (not reviewer.person or reviewer.person not in people)
        and not reviewer.items
        and reviewer.signed_off_at is None
    )


def case_verification(
    case_id: str, blocks: Sequence[ReportBlock], reviews: Sequence[CaseReview]
) -> Verification:
    """Combine the signed-off reviews of a case (and admins' adjudication) into what the
    VERIFIED report says."""
    signed = sorted((r for r in reviews if r.signed_off_at), key=lambda r: r.signed_off_at or "")
    judges = [r for r in reviews if r.adjudicated and may_adjudicate(r, signed)]
    out = Verification(
        case_id=case_id,
        signers=[
            Signer(reviewer=r.reviewer, person=r.person, at=r.signed_off_at or "") for r in signed
        ],
    )
    if not signed:
        return out
    out.stale = [r.reviewer for r in signed if r.signed_digest != digest(review_preview(blocks, r))]
    used: dict[str, Signer] = {}
    for b in blocks:
        decide: dict[str, Decision] = {}
        for it in b.items:
            per = decisions(it, signed)
            first = next(iter(per.values()), None)
            agreed = first is not None and len(per) == len(signed)
            if agreed and all(d.same(first) for d in per.values()):  # type: ignore[arg-type]
                decide[it.item_id] = first  # type: ignore[assignment]
                continue
            rulings = [(j, d) for j in judges if (d := decision(it, j, adjudicated=True))]
            ruling = max(rulings, key=lambda x: x[1].id)[1] if rulings else None
            if len(signed) > 1 or ruling is not None:
                out.disputes.append(
                    Dispute(
                        model=b.model,
                        item_id=it.item_id,
                        label=it.label,
                        model_text=it.text,
                        decisions=per,
                        adjudicated=ruling,
                    )
                )
            if ruling is not None:
                decide[it.item_id] = ruling
                judge = next(j for j, d in rulings if d is ruling)
                used.setdefault(judge.reviewer, Signer(reviewer=judge.reviewer, person=judge.person, at=ruling.at))  # fmt: skip
        comments = review_comments([*signed, *[j for j in judges if j.reviewer in used]])
        out.blocks.append(verified_block(b, decide, comments))
    out.adjudicators = list(used.values())
    return out
