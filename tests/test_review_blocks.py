"""The review block (what goes into a model's SR) and what a sign-off verifies: items several
answers carry are reviewed once; a verdict reaches every answer that carried the item; an item
without a verdict blocks sign-off; reviewers who disagree need an admin's adjudication."""

from __future__ import annotations

from pathlib import Path

import pytest
from scoring_cases import ms_case

from evaluation.answers import Answer, DifferentialItem, Finding
from evaluation.case import TaskFamily
from evaluation.log.rundata import SampleResult
from evaluation.review import (
    Action,
    ItemKind,
    Outcome,
    ReviewError,
    ReviewEvent,
    ReviewStore,
    Verdict,
    case_verification,
    decision,
    digest,
    missing_items,
    report_blocks,
    review_preview,
)
from evaluation.review.sr_content import ReportBlock, report_block
from evaluation.scores import ParseStatus
from evaluation.scoring import make_scored_sample
from gateway.auth import Role

MODEL = "vlm"


def _lesion() -> Answer:
    return Answer(
        findings=[
            Finding(description="FLAIR bright plaque by the left ventricle", sequence="FLAIR",
                    hemisphere="left", region="periventricular white matter", signal="hyperintense"),
            Finding(description="right occipital ring lesion", sequence="T1C", hemisphere="right",
                    region="occipital", signal="ring enhancing"),
        ],
        final_diagnosis="MS",
    )  # fmt: skip


def _differential() -> Answer:
    return Answer(
        findings=[
            # the lesion answer's first finding in other words: same side, region, sequence, signal
            Finding(description="periventricular T2-FLAIR hyperintensity", sequence="flair",
                    hemisphere="Left", region="periventricular WM", signal="high signal"),
            Finding(description="left cerebellar lesion", sequence="T2", hemisphere="left",
                    region="cerebellum", signal="hyperintense"),
        ],
        differential=[
            DifferentialItem(diagnosis="Multiple sclerosis", icd10="G35"),
            DifferentialItem(diagnosis="GBM"),
            DifferentialItem(diagnosis="glioblastoma multiforme"),  # the same concept again
        ],
        final_diagnosis="Glioblastoma",  # disagrees with the lesion answer's final diagnosis
    )  # fmt: skip


def _samples() -> list[SampleResult]:
    case = ms_case()
    out = []
    for task, ans in ((TaskFamily.LESION, _lesion()), (TaskFamily.DIFFERENTIAL, _differential())):
        text = ans.model_dump_json()
        scored = make_scored_sample(case, task, MODEL, ParseStatus.OK, ans, text, bertscore=False)
        out.append(SampleResult(scored=scored, answer=ans, text=text))
    return out


def _block() -> ReportBlock:
    (block,) = report_blocks(_samples())
    return block


def test_items_carried_by_several_answers_are_one_item() -> None:
    block = _block()
    findings = block.of(ItemKind.FINDING)
    assert len(findings) == 3  # 2 + 2 answer findings, one of them carried by both
    shared = findings[0]
    assert [(s.task, s.item_id) for s in shared.sources] == [
        ("lesion", "finding.1"),
        ("differential", "finding.1"),
    ]
    assert shared.text == "FLAIR bright plaque by the left ventricle"  # the lesion task speaks
    dx = block.of(ItemKind.DIFFERENTIAL)
    assert [d.text for d in dx] == ["Multiple sclerosis", "GBM"]  # GBM = glioblastoma multiforme
    assert len(dx[1].sources) == 2
    finals = block.of(ItemKind.FINAL)
    # The answers disagree on the final diagnosis: both are in the block, the differential
    # task's first; each is reviewed.
    assert [f.text for f in finals] == ["Glioblastoma", "MS"]
    assert {e.kind for e in block.items} >= {ItemKind.ERROR}
    ids = [it.item_id for it in block.items]
    assert len(ids) == len(set(ids))


def test_an_answer_without_findings_states_no_lesion_as_an_item() -> None:
    block = report_block(MODEL, [("k", TaskFamily.DIFFERENTIAL, Answer(final_diagnosis="Normal"))])
    assert [it.kind for it in block.items] == [ItemKind.NO_FINDING, ItemKind.FINAL]


def _events(block: ReportBlock, reviewer: str, verdicts: dict[str, tuple[Verdict, str]]) -> list[ReviewEvent]:  # fmt: skip
    out = []
    for it in block.items:
        if it.item_id not in verdicts:
            continue
        v, text = verdicts[it.item_id]
        out += [
            ReviewEvent(
                reviewer=reviewer,
                run_id="r",
                case_id="ms-1",
                action=Action.ITEM,
                answer_key=s.answer_key,
                item_id=s.item_id,
                verdict=v,
                text=text,
                person=f"{reviewer}^Test",
            )
            for s in it.sources
        ]
    return out


def _sign(store: ReviewStore, block: ReportBlock, who: str) -> None:
    """Sign off what the reviewer's preview shows (its digest), as the sign-off action does."""
    (mine,) = [r for r in store.reviews("r", "ms-1") if r.reviewer == who]
    shown = digest(review_preview([block], mine))
    store.append(ReviewEvent(reviewer=who, run_id="r", case_id="ms-1", action=Action.SIGNOFF,
                             person=mine.person, text=shown))  # fmt: skip


def test_a_verdict_reaches_every_answer_and_the_verified_content_follows(tmp_path: Path) -> None:
    block = _block()
    store = ReviewStore(tmp_path / "reviews.sqlite")
    store.append_many(
        _events(block, "ada", {
            "finding.1": (Verdict.REJECT, ""),
            "finding.2": (Verdict.CORRECT, "right occipital abscess"),
        })
    )  # fmt: skip
    (review,) = store.reviews("r", "ms-1")
    # the rejection was recorded for both answers that carried the finding
    assert review.verdict(block.answer_keys[0], "finding.1") is not None
    assert review.verdict(block.answer_keys[1], "finding.1") is not None
    missing = missing_items([block], review)
    assert missing and "vlm: finding 1" not in missing and "vlm: finding 3" in missing
    (verified,) = review_preview([block], review)
    assert [it.outcome for it in verified.items[:3]] == [
        Outcome.DROPPED,
        Outcome.CORRECTED,
        Outcome.DROPPED,  # no verdict yet: not in a verified report
    ]
    assert [f.description for f in verified.content.findings] == ["right occipital abscess"]


def test_signed_reviews_that_disagree_need_an_adjudication(tmp_path: Path) -> None:
    block = _block()
    store = ReviewStore(tmp_path / "reviews.sqlite")
    accept_all = {it.item_id: (Verdict.ACCEPT, "") for it in block.items}
    for who, verdicts in (
        ("ada", accept_all),
        ("bo", {**accept_all, "dx.2": (Verdict.REJECT, "")}),
    ):
        store.append_many(_events(block, who, verdicts))
        _sign(store, block, who)
    v = case_verification("ms-1", [block], store.reviews("r", "ms-1"))
    assert not v.complete and [d.item_id for d in v.open_disputes] == ["dx.2"]
    assert "adjudicate" in v.why_not
    with pytest.raises(ReviewError, match="final"):  # a signed review cannot change
        store.append_many(_events(block, "bo", {"dx.2": (Verdict.ACCEPT, "")}))
    ruling = [
        ReviewEvent(
            reviewer="admin",
            run_id="r",
            case_id="ms-1",
            action=Action.ADJUDICATE,
            answer_key=s.answer_key,
            item_id=s.item_id,
            verdict=Verdict.REJECT,
            person="Admin^Test",
        )
        for s in block.item("dx.2").sources
    ]
    store.append_many(ruling)
    v = case_verification("ms-1", [block], store.reviews("r", "ms-1"))
    assert v.complete and [a.person for a in v.adjudicators] == ["Admin^Test"]
    (verified,) = v.blocks
    assert "GBM" not in [d.diagnosis for d in verified.content.differential]
    assert [s.person for s in v.signers] == ["ada^Test", "bo^Test"]


# --------------------------------------------------------------- review mend (found in review)


def test_findings_never_merge_within_one_answer_or_without_a_full_location() -> None:
    vague = Finding(description="ring-enhancing mass")
    also_vague = Finding(description="acute haemorrhage in the pons")
    small = Finding(description="3 mm plaque", hemisphere="left", region="frontal",
                    sequence="FLAIR", signal="hyperintense", size_mm=3)  # fmt: skip
    big = small.model_copy(update={"description": "40 mm mass", "size_mm": 40})
    twin = small.model_copy(update={"description": "another 3 mm plaque"})
    lesion = Answer(findings=[vague, also_vague, small, twin])
    differential = Answer(findings=[also_vague, big, small])
    block = report_block(
        MODEL, [("a", TaskFamily.LESION, lesion), ("b", TaskFamily.DIFFERENTIAL, differential)]
    )
    texts = [(it.text, len(it.sources)) for it in block.of(ItemKind.FINDING)]
    assert texts == [
        ("ring-enhancing mass", 1),
        ("acute haemorrhage in the pons", 1),  # stated without a place: never merged
        ("3 mm plaque", 2),  # the differential's 3 mm plaque
        ("another 3 mm plaque", 1),  # one answer's two plaques stay two
        ("acute haemorrhage in the pons", 1),
        ("40 mm mass", 1),  # same place and signal, another size
    ]


def test_a_correction_keeps_the_clinicians_text_the_site_it_does_not_change_and_no_lesion_cannot_be_corrected(
    tmp_path: Path,
) -> None:
    """Issue 35: the model's site stays coded unless the correction names another; nothing
    else the model gave (sequence, signal, size) is kept."""
    from types import SimpleNamespace

    from gateway.review.actions import CaseUnderReview, ItemVerdict, record_verdicts
    from gateway.review.auth import Reviewer

    block = _block()
    store = ReviewStore(tmp_path / "reviews.sqlite")
    store.append_many(
        _events(block, "ada", {"finding.1": (Verdict.CORRECT, "no plaque: artefact")})
    )
    (review,) = store.reviews("r", "ms-1")
    (verified,) = review_preview([block], review)
    (f,) = verified.content.findings
    model = block.item("finding.1").finding
    assert model is not None and model.hemisphere and model.region
    assert f.description == "no plaque: artefact"
    assert (f.hemisphere, f.region) == (model.hemisphere, model.region)
    assert (f.sequence, f.signal, f.size_mm) == (None, None, None)
    store.append_many(_events(block, "bo", {"finding.1": (Verdict.CORRECT, "right pontine focus")}))
    (verified,) = review_preview([block], store.reviews("r", "ms-1")[1])
    (f,) = verified.content.findings
    assert (f.hemisphere, f.region) == ("right", "brainstem")
    empty = report_block(MODEL, [("k", TaskFamily.DIFFERENTIAL, Answer(final_diagnosis="Normal"))])
    cu = CaseUnderReview("rep", "ms-1", SimpleNamespace(run_id="r"), "ms-1", [empty])  # type: ignore[arg-type]
    who = Reviewer("ada", "t1", Role.REVIEWER, person="Ada^Test")
    with pytest.raises(ReviewError, match="cannot be corrected"):
        record_verdicts(SimpleNamespace(store=store), who, cu,  # type: ignore[arg-type]
                        [ItemVerdict(MODEL, "finding.none", Verdict.CORRECT, "left mass")])  # fmt: skip


def test_the_latest_decision_is_the_later_event_even_within_one_second(tmp_path: Path) -> None:
    block = _block()
    err = block.of(ItemKind.ERROR)[0]
    store = ReviewStore(tmp_path / "reviews.sqlite")
    at = "2026-11-24T10:00:00.900000+00:00"  # the accept is later in the second than the override
    store.append_many([e.model_copy(update={"at": at}) for e in _events(block, "ada", {err.item_id: (Verdict.ACCEPT, "")})])  # fmt: skip
    store.append(ReviewEvent(reviewer="ada", run_id="r", case_id="ms-1", action=Action.ERROR,
                             answer_key=err.sources[0].answer_key, category="reasoning",
                             text="wrong", at="2026-11-24T10:00:00.950000+00:00"))  # fmt: skip
    (review,) = store.reviews("r", "ms-1")
    d = decision(err, review)
    assert d is not None and d.verdict is Verdict.CORRECT and d.text == "reasoning"


def test_what_was_signed_must_be_what_the_case_shows(tmp_path: Path) -> None:
    block = _block()
    store = ReviewStore(tmp_path / "reviews.sqlite")
    store.append_many(_events(block, "ada", {it.item_id: (Verdict.ACCEPT, "") for it in block.items}))  # fmt: skip
    _sign(store, block, "ada")
    assert case_verification("ms-1", [block], store.reviews("r", "ms-1")).complete
    # the run re-written since (a re-scored error category, say): the sign-off does not cover it
    changed = block.model_copy(update={"items": block.items[:-1]})
    v = case_verification("ms-1", [changed], store.reviews("r", "ms-1"))
    assert not v.complete and v.stale == ["ada"] and "not what the case shows" in v.why_not


def test_a_signer_cannot_adjudicate_and_a_stale_preview_cannot_be_signed(tmp_path: Path) -> None:
    block = _block()
    store = ReviewStore(tmp_path / "reviews.sqlite")
    store.append_many(_events(block, "ada", {"dx.1": (Verdict.ACCEPT, "")}))
    (review,) = store.reviews("r", "ms-1")
    store.append_many(_events(block, "ada", {"dx.2": (Verdict.REJECT, "")}))  # another tab
    signoff = ReviewEvent(reviewer="ada", run_id="r", case_id="ms-1", action=Action.SIGNOFF)
    with pytest.raises(ReviewError, match="changed"):
        store.append_many([signoff], expect_last=review.last_id)
    store.append(signoff)
    ruling = ReviewEvent(reviewer="ada", run_id="r", case_id="ms-1", action=Action.ADJUDICATE,
                         answer_key="k", item_id="dx.1", verdict=Verdict.ACCEPT)  # fmt: skip
    with pytest.raises(ReviewError, match="final"):
        store.append(ruling)
