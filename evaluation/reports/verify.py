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
from evaluation.reports.block import BlockItem, ItemKind, ReportBlock, ReportContent, _put
from evaluation.reports.reviews import CaseReview, ItemState, Verdict


class Outcome(StrEnum):
    KEPT = "kept"
    CORRECTED = "corrected"
    DROPPED = "dropped"


class Decision(BaseModel):
    verdict: Verdict
    text: str = ""  # the correction (a category for an error item)
    at: str = ""
    by: str = ""

    def same(self, other: Decision) -> bool:
        if self.verdict is not other.verdict:
            return False
        if self.verdict is not Verdict.CORRECT:
            return True
        return " ".join(self.text.lower().split()) == " ".join(other.text.lower().split())


def _latest(states: Sequence[tuple[ItemState, str]]) -> Decision | None:
    if not states:
        return None
    st, by = max(states, key=lambda s: s[0].at)
    return Decision(verdict=st.verdict, text=st.text, at=st.at, by=by)


def decision(item: BlockItem, review: CaseReview, adjudicated: bool = False) -> Decision | None:
    """The reviewer's decision on a block item (``adjudicated``: the admin's adjudication)."""
    table = review.adjudicated if adjudicated else review.items
    states = [
        (st, review.reviewer)
        for src in item.sources
        if (st := table.get(src.answer_key, {}).get(src.item_id)) is not None
    ]
    if item.kind is ItemKind.ERROR and not adjudicated:
        for src in item.sources:
            label = review.errors.get(src.answer_key)
            if label is not None:
                at = label.assigned_at or ""
                override = ItemState(verdict=Verdict.CORRECT, text=label.category.value, at=at)
                states.append((override, review.reviewer))
    got = _latest(states)
    corrected_to_same = (
        got is not None
        and item.kind is ItemKind.ERROR
        and got.verdict is Verdict.CORRECT
        and got.text == item.text
    )
    if got is not None and corrected_to_same:  # "corrected" to the category it had: accepted
        got = got.model_copy(update={"verdict": Verdict.ACCEPT, "text": ""})
    return got


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
            _put(out.content, it, text if outcome is Outcome.CORRECTED else None)
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
    adjudicator: Signer | None = None
    disputes: list[Dispute] = Field(default_factory=list)
    blocks: list[VerifiedBlock] = Field(default_factory=list)

    @property
    def open_disputes(self) -> list[Dispute]:
        return [d for d in self.disputes if d.adjudicated is None]

    @property
    def complete(self) -> bool:
        return bool(self.signers) and not self.open_disputes

    @property
    def why_not(self) -> str:
        if not self.signers:
            return "no reviewer has signed the case off"
        if self.open_disputes:
            items = ", ".join(f"{d.model}: {d.label}" for d in self.open_disputes[:10])
            return f"the reviewers disagree on {len(self.open_disputes)} item(s) ({items}); an admin must adjudicate"
        return ""


def case_verification(
    case_id: str, blocks: Sequence[ReportBlock], reviews: Sequence[CaseReview]
) -> Verification:
    """Combine the signed-off reviews of a case (and an admin's adjudication) into what the
    VERIFIED report says."""
    signed = sorted((r for r in reviews if r.signed_off_at), key=lambda r: r.signed_off_at or "")
    adjudicators = [r for r in reviews if r.adjudicated and r not in signed]
    out = Verification(
        case_id=case_id,
        signers=[
            Signer(reviewer=r.reviewer, person=r.person, at=r.signed_off_at or "") for r in signed
        ],
    )
    if not signed:
        return out
    adjudicator = max(adjudicators, key=lambda r: r.n_events, default=None)
    if adjudicator is not None:
        last = max(st.at for items in adjudicator.adjudicated.values() for st in items.values())
        out.adjudicator = Signer(reviewer=adjudicator.reviewer, person=adjudicator.person, at=last)
    for b in blocks:
        decide: dict[str, Decision] = {}
        for it in b.items:
            per = {r.reviewer: d for r in signed if (d := decision(it, r)) is not None}
            first = next(iter(per.values()), None)
            if (
                first is not None
                and all(d.same(first) for d in per.values())
                and len(per) == len(signed)
            ):
                decide[it.item_id] = first
                continue
            ruling = decision(it, adjudicator, adjudicated=True) if adjudicator else None
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
        comments = review_comments([*signed, *([adjudicator] if adjudicator else [])])
        out.blocks.append(verified_block(b, decide, comments))
    return out
