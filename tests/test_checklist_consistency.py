"""The checklist never contradicts itself: its flags, its item marks and its error label come
from one place (the scored sample's effective label and the match's own rule for whether
omitted lesions count), and its truth says "normal control" only of a normal truth."""

from __future__ import annotations

import pytest
from scoring_cases import answer, case, f, ms_case, stroke_case
from test_scoring_conformance import ROWS
from test_scoring_taxonomy import GOLDEN

from evaluation.answers import Answer, ClassificationAnswer
from evaluation.case import Case, DiseaseGroup, TaskFamily
from evaluation.log.rundata import SampleResult
from evaluation.reports.checklist import build_checklist
from evaluation.reports.checklist_view import AnswerChecklist, FlagKind, Mark
from evaluation.scores import ParseStatus
from evaluation.scoring import make_scored_sample

# flag <-> the sub-label of the effective error label it stands for
FLAG_OF = {
    "missed_lesion": {FlagKind.MISSED_LESION},
    "hallucinated_finding": {FlagKind.SUSPECTED_HALLUCINATION, FlagKind.FINDINGS_ON_NORMAL_CONTROL},
    "fabricated_without_images": {FlagKind.FABRICATED_WITHOUT_IMAGES},
    "sequence_misidentification": {FlagKind.SEQUENCE_MISIDENTIFIED},
}


def _checklist(
    c: Case,
    parsed: Answer | ClassificationAnswer | None,
    family: TaskFamily,
    status: ParseStatus = ParseStatus.OK,
    images_shown: int | None = None,
) -> AnswerChecklist:
    scored = make_scored_sample(
        c, family, "m", status, parsed, "", bertscore=False, images_shown=images_shown
    )
    ablation = "text" if images_shown == 0 else "both"
    sample = SampleResult(scored=scored, answer=parsed, text="{}", ablation=ablation)
    [a] = build_checklist(c, [sample], run_id="run-1").answers
    return a


def _assert_consistent(a: AnswerChecklist, why: str) -> None:
    subs = set(a.error.sub_labels) if a.error else set()
    flags = {fl.kind for fl in a.flags}
    for sub, kinds in FLAG_OF.items():
        assert (sub in subs) == bool(flags & kinds), (why, sub, subs, flags)
    if a.error is None:
        assert not flags - {FlagKind.LOW_CONFIDENCE}, (why, flags)
    missed_marks = [x.id for x in a.lesions if x.mark is Mark.MISSED]
    if missed_marks:
        assert "missed_lesion" in subs, (why, missed_marks, a.error)
    hallucinated = [x.index for x in a.findings if x.mark is Mark.HALLUCINATED]
    if hallucinated:
        assert subs & {"hallucinated_finding", "fabricated_without_images"}, (why, a.error)


CASES = [(r.why, r.case, r.answer, r.family, ParseStatus.OK, r.images_shown) for r in ROWS] + [
    (g[0], g[1], g[2], g[3], g[4], None) for g in GOLDEN
]


@pytest.mark.parametrize(
    ("why", "c", "parsed", "family", "status", "shown"), CASES, ids=[x[0] for x in CASES]
)
def test_flags_marks_and_label_agree(why, c, parsed, family, status, shown) -> None:  # type: ignore[no-untyped-def]
    _assert_consistent(_checklist(c, parsed, family, status, shown), why)


def test_a_differential_without_findings_is_not_flagged_missed_when_the_label_is_clean() -> None:
    """The example: right diagnosis, no findings, a task that does not ask for lesions."""
    a = _checklist(ms_case(), answer("multiple sclerosis"), TaskFamily.DIFFERENTIAL)
    assert a.error is None
    assert FlagKind.MISSED_LESION not in {fl.kind for fl in a.flags}
    assert {x.mark for x in a.lesions} == {Mark.NOT_CHECKED}
    # the same answer to the lesion task does count its omissions, and says so everywhere
    b = _checklist(ms_case(), answer("multiple sclerosis"), TaskFamily.LESION)
    assert b.error is not None and "missed_lesion" in b.error.sub_labels
    assert FlagKind.MISSED_LESION in {fl.kind for fl in b.flags}
    assert {x.mark for x in b.lesions} == {Mark.MISSED}


def test_a_lesion_free_named_disease_is_not_shown_as_a_normal_control() -> None:
    c = case("todd-1", "Postictal Todd paresis", "G83.8", DiseaseGroup.OTHER, [])
    cl = build_checklist(c, [], run_id="run-1")
    assert cl.truth is not None and cl.truth.normal_control is False
    from evaluation.reports.html import render_checklist

    page = render_checklist(cl, lambda i: None)
    assert "Postictal Todd paresis" in page and "normal control" not in page


def test_a_normal_truth_without_a_group_is_a_normal_control_everywhere() -> None:
    c = case("norm-2", "Normal", "Z03.3", DiseaseGroup.NORMAL, [])
    c.ground_truth.final_diagnosis.group = None  # type: ignore[union-attr]
    a = _checklist(c, answer("normal study"), TaskFamily.DIFFERENTIAL)
    assert a.error is None and not a.flags
    cl = build_checklist(c, [], run_id="run-1")
    assert cl.truth is not None and cl.truth.normal_control is True
    b = _checklist(
        c, answer("normal", [f("left frontal FLAIR hyperintense focus")]), TaskFamily.LESION
    )
    assert b.error is not None and FlagKind.FINDINGS_ON_NORMAL_CONTROL in {
        fl.kind for fl in b.flags
    }


def test_text_only_answers_flag_fabrication_not_missed_lesions() -> None:
    a = _checklist(
        stroke_case(),
        answer("acute ischaemic stroke", [f("right occipital FLAIR hyperintense lesion")]),
        TaskFamily.LESION,
        images_shown=0,
    )
    kinds = {fl.kind for fl in a.flags}
    assert FlagKind.FABRICATED_WITHOUT_IMAGES in kinds
    assert not kinds & {FlagKind.MISSED_LESION, FlagKind.SUSPECTED_HALLUCINATION}
    assert {x.mark for x in a.lesions} == {Mark.NOT_CHECKED}
