"""Scores of one sample (one model answer to one task of one case).

Pure: the scores depend only on (case, family, status, parsed answer, raw text), the lexicon,
the BERTScore model and, when given, the judge cache, so a run can be rescored from its store.
"""

from __future__ import annotations

from evaluation.answers import Answer, ClassificationAnswer
from evaluation.case import Case, TaskFamily
from evaluation.scores import (
    DiagnosisDetails,
    KnowledgeDetails,
    LesionDetails,
    ParseStatus,
    RankDetails,
    Score,
)
from evaluation.scoring.judge_cache import JudgeCache
from evaluation.scoring.lesions import count_missed, match_lesions
from evaluation.scoring.lexicon import Lexicon, default_lexicon, match_diagnosis
from evaluation.scoring.localisation import localise
from evaluation.scoring.neurovlm import classification_scores
from evaluation.scoring.passk import rank_of_truth
from evaluation.scoring.recognition import recognition_scores
from evaluation.scoring.truth import names_normal

ANSWER_SCORERS = (
    "diagnosis_match",
    "diagnosis_credit",
    "differential_rank",
    "lesion_f1",
    "lesion_precision",
    "lesion_recall",
    "hallucinated_finding_rate",
    "missed_lesion_rate",
    "normal_control_false_positive",
    "sequence_recognition",
    "modality_accuracy",
    "plane_accuracy",
    "knowledge_consistency",
)
BERTSCORE_FAMILIES = (TaskFamily.RATIONALE, TaskFamily.DIFFERENTIAL)


def images_shown_of(case: Case, images_shown: int | None) -> int:
    """The images a request carried: the run's record, else (None) every image of the case."""
    return len(case.images) if images_shown is None else images_shown


def final_diagnosis(answer: Answer) -> str | None:
    """The answer's final diagnosis, else the top of its differential."""
    if answer.final_diagnosis and answer.final_diagnosis.strip():
        return answer.final_diagnosis
    return answer.differential[0].diagnosis if answer.differential else None


def ranked_names(answer: Answer) -> list[str]:
    """The ranked differential (the final diagnosis alone when there is none)."""
    names = [d.diagnosis for d in answer.differential if d.diagnosis.strip()]
    final = final_diagnosis(answer)
    return names or ([final] if final else [])


def _unscored(names: tuple[str, ...], why: str) -> list[Score]:
    return [Score(scorer=n, value=None, explanation=why) for n in names]


def score_sample(
    case: Case,
    family: TaskFamily,
    status: ParseStatus,
    parsed: Answer | ClassificationAnswer | None,
    text: str,
    *,
    bertscore: bool = True,
    judge: JudgeCache | None = None,
    lexicon: Lexicon | None = None,
    bertscore_model: str | None = None,
    bertscore_layer: int | None = None,
    images_shown: int | None = None,
) -> list[Score]:
    """Every score of one sample; an unscored sample gets scores whose value is None.

    ``images_shown`` is the number of images the request carried (the run records it); None
    means every image of ``case``. With none shown (a text-only ablation) nothing visual is
    scored: no sequence recognition, and missed lesions do not count against the answer.
    """
    shown = images_shown_of(case, images_shown)
    if shown == 0 and case.images:
        case = case.model_copy(update={"images": []})
    if family is TaskFamily.CLASSIFICATION:
        cls = parsed if isinstance(parsed, ClassificationAnswer) else None
        return classification_scores(case, status if cls else _not_ok(status), cls, text)
    names = ANSWER_SCORERS + (("bertscore",) if bertscore and family in BERTSCORE_FAMILIES else ())
    if status is not ParseStatus.OK or not isinstance(parsed, Answer):
        return _unscored(names, f"unscored: {status.value}")
    lex = lexicon or default_lexicon()
    scores = _diagnosis_scores(case, parsed, lex, judge)
    scores += _lesion_scores(case, family, parsed, shown)
    scores += recognition_scores(case, parsed)
    scores.append(_knowledge(parsed, lex))
    if "bertscore" in names:
        scores.append(_bertscore(case, parsed, bertscore_model, bertscore_layer))
    return scores


def _not_ok(status: ParseStatus) -> ParseStatus:
    return ParseStatus.FORMAT_FAILURE if status is ParseStatus.OK else status


def _diagnosis_scores(
    case: Case, ans: Answer, lex: Lexicon, judge: JudgeCache | None
) -> list[Score]:
    gt = case.ground_truth
    if gt is None:
        return _unscored(
            ("diagnosis_match", "diagnosis_credit", "differential_rank"), "no ground truth"
        )
    final = final_diagnosis(ans)
    codes = {d.diagnosis: d.icd10 for d in ans.differential}

    def match(name: str):  # type: ignore[no-untyped-def]
        return match_diagnosis(
            name,
            gt.final_diagnosis,
            accepted=gt.synonyms,
            answer_icd10=codes.get(name),
            lexicon=lex,
            judge=judge,
        )

    if final is None:
        main = Score(
            scorer="diagnosis_match",
            value=0.0,
            explanation="the answer gives no diagnosis",
            details=DiagnosisDetails(
                abstained=True, truth=gt.final_diagnosis.name, confidence=ans.confidence
            ),
        )
        credit = Score(scorer="diagnosis_credit", value=0.0, explanation="no diagnosis")
    else:
        m = match(final)
        verdict = "correct" if m.correct else "wrong"
        main = Score(
            scorer="diagnosis_match",
            value=float(m.correct),
            explanation=f"{final!r} vs {gt.final_diagnosis.name!r}: {m.level.value} ({verdict})",
            details=DiagnosisDetails(
                abstained=False, confidence=ans.confidence, **m.model_dump(mode="json")
            ),
        )
        credit = Score(scorer="diagnosis_credit", value=m.credit, explanation=m.level.value)
    ranked = ranked_names(ans)
    matches = [match(n) for n in ranked]
    rank = rank_of_truth([m.correct for m in matches])
    diff = Score(
        scorer="differential_rank",
        value=1.0 / rank if rank else 0.0,
        explanation=f"truth at rank {rank} of {len(ranked)}"
        if rank
        else "truth not in the differential",
        details=RankDetails(
            rank=rank,
            length=len(ranked),
            ranked=ranked,
            levels=[m.level.value for m in matches],
            judge_used=any(m.judge for m in matches),
        ),
    )
    return [main, credit, diff]


def _lesion_scores(case: Case, family: TaskFamily, ans: Answer, shown: int) -> list[Score]:
    res = match_lesions(case, ans.findings)
    names = ANSWER_SCORERS[3:9]
    if res is None:
        return _unscored(names, "no lesion ground truth for this case")
    res = count_missed(res, family, names_normal(final_diagnosis(ans)), shown)
    if family is not TaskFamily.MULTITURN:  # a turn numbers its own images from 1
        res = localise(case, ans.findings, res)
    detail = LesionDetails(match=res)
    summary = (
        f"{res.n_detected}/{len(res.lesions)} lesions found, {res.n_near} misplaced, "
        f"{res.n_missed} missed; {res.n_matched}/{res.n_positive} findings matched, "
        f"{res.n_hallucinated} hallucinated"
    )
    uncounted = f"{summary} ({res.missed_not_counted})" if res.missed_not_counted else summary
    normal = res.normal_control
    nfp = (
        Score(
            scorer="normal_control_false_positive",
            value=float(bool(res.normal_false_positive)),
            explanation=f"{res.n_positive} positive findings on a normal control",
        )
        if normal and res.normal_false_positive is not None
        else Score(
            scorer="normal_control_false_positive", value=None, explanation="not a normal control"
        )
    )
    return [
        Score(scorer="lesion_f1", value=res.f1, explanation=uncounted, details=detail),
        Score(scorer="lesion_precision", value=res.precision, explanation=summary),
        Score(scorer="lesion_recall", value=res.recall, explanation=uncounted),
        Score(
            scorer="hallucinated_finding_rate", value=res.hallucination_rate, explanation=summary
        ),
        Score(scorer="missed_lesion_rate", value=res.missed_rate, explanation=uncounted),
        nfp,
    ]


def _knowledge(ans: Answer, lex: Lexicon) -> Score:
    """ICD-10 codes the answer states, checked against the lexicon's codes for the diagnosis."""
    checked, wrong = 0, []
    for item in ans.differential:
        if not item.icd10:
            continue
        found = lex.lookup(item.diagnosis)
        if found.concept_id is None or found.alternatives:
            continue
        checked += 1
        if not lex.icd10_consistent(found.concept_id, item.icd10):
            c = lex[found.concept_id]
            wrong.append(
                f"{item.diagnosis!r} given ICD-10 {item.icd10}; the lexicon codes "
                f"{c.name} as {c.icd10} (categories {sorted(c.icd10_categories)})"
            )
    if not checked:
        return Score(scorer="knowledge_consistency", value=None, explanation="no checkable codes")
    return Score(
        scorer="knowledge_consistency",
        value=0.0 if wrong else 1.0,
        explanation="; ".join(wrong) or f"{checked} stated codes consistent",
        details=KnowledgeDetails(contradictions=wrong, checked=checked),
    )


def _bertscore(
    case: Case, ans: Answer, model: str | None = None, layer: int | None = None
) -> Score:
    ref = case.ground_truth.rationale if case.ground_truth else ""
    if not ref.strip():
        return Score(scorer="bertscore", value=None, explanation="no reference rationale")
    from evaluation.scoring.bertscore import BertScoreUnavailable, bertscore

    try:
        return bertscore(ans.rationale, ref, model_path=model, num_layers=layer)
    except (BertScoreUnavailable, OSError) as exc:
        return Score(scorer="bertscore", value=None, explanation=f"BERTScore unavailable: {exc}")
