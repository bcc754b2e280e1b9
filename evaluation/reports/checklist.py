"""Build the per-case checklist from a case, its samples, their parsed answers and raw text."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from dicom import NotShownReason, SeriesNotShown, UnshownSeries
from evaluation.answers import Answer, ClassificationAnswer
from evaluation.case import Case
from evaluation.log.rundata import FULL_INPUT, RunData, SampleResult, SentRequest
from evaluation.reports.checklist_view import (
    AnswerChecklist,
    CaseChecklist,
    DifferentialRow,
    ErrorItem,
    FindingItem,
    Flag,
    FlagKind,
    GraderRow,
    ImageItem,
    LesionItem,
    Mark,
    SamplesOutcome,
    ScoreRow,
    SentItem,
    SequenceItem,
    TextItem,
    TruthSummary,
    UsageRow,
)
from evaluation.reports.flags import answer_flags
from evaluation.review.sr_content import answer_key, report_blocks, reviewed_samples
from evaluation.robustness import VariantPair, as_received
from evaluation.scores import LesionDetails, LesionMatchResult, RankDetails, RubricDetails, Score
from evaluation.scoring import anatomy as A
from evaluation.scoring.recognition import resolve_image
from evaluation.scoring.rubric import grader_counted
from evaluation.scoring.sample import final_diagnosis
from evaluation.scoring.scored import case_modality
from evaluation.scoring.taxonomy import (
    FOLLOWED_PLANTED_INSTRUCTION,
    SAME_WITHOUT_IMAGES,
    SIDE_NOT_MIRRORED,
)
from evaluation.scoring.truth import is_normal_control
from evaluation.scoring.version import version_name

LOW_CONFIDENCE = 0.5
MAX_RAW_CHARS = 20_000
MAX_IMAGE_BYTES = 64 * 1024 * 1024
_ZERO_REF = re.compile(r"^\s*(image\s*#?\s*)?0\s*$", re.I)
_FINDING_MARKS = {
    "matched": Mark.MATCHED,
    "redundant": Mark.MATCHED,
    "near": Mark.NEAR,
    "hallucinated": Mark.HALLUCINATED,
    "unlocalised": Mark.UNLOCALISED,
    "negative": Mark.NEGATIVE,
}
_LESION_MARKS = {"detected": Mark.MATCHED, "near": Mark.NEAR, "missed": Mark.MISSED}


def answer_label(a: AnswerChecklist) -> str:
    """How a page names an answer: model (family[, ablation])."""
    extra = "" if a.ablation == FULL_INPUT else f", {a.ablation} only"
    return f"{a.model} ({a.family}{extra})"


def image_path(case: Case, path: str, case_root: str | Path | None) -> Path:
    p = Path(path)
    if p.is_absolute():
        return p
    root = case_root or case.root
    return Path(root) / p if root else p


def _file_sha256(path: Path) -> str | None:
    try:
        if not path.is_file() or path.stat().st_size > MAX_IMAGE_BYTES:
            return None
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _images(case: Case, root: str | Path | None, sent: set[str] | None) -> list[ImageItem]:
    out = []
    for i, ref in enumerate(case.images, start=1):
        found = _file_sha256(image_path(case, ref.path, root))
        out.append(
            ImageItem(
                index=i,
                path=ref.path,
                label=ref.label,
                sha256=ref.sha256,
                file_sha256=found,
                verified=None if found is None else found == ref.sha256,
                series_class=ref.series_class,
                modality=ref.modality,
                plane=ref.plane,
                kind=ref.kind,
                window=ref.window,
                sent=None if sent is None else ref.sha256 in sent,
                series_uid=ref.series_uid,
                slice_positions_mm=ref.slice_positions_mm,
            )
        )
    return out


def _not_shown(case: Case, sent: set[str] | None) -> SeriesNotShown | None:
    """The case's record of the series left out, with the series whose images were rendered
    but sent in no reviewed answer's request (the prompt's image limit) added."""
    recorded = case.provenance.series_not_shown
    out = recorded.model_copy(deep=True) if recorded is not None else None
    if sent is None:
        return out
    shown = {i.series_uid for i in case.images if i.sha256 in sent and i.series_uid}
    left = {i.series_uid: i for i in case.images if i.series_uid and i.series_uid not in shown}
    if left and out is None:
        out = SeriesNotShown(n_series=len({i.series_uid for i in case.images}))
    for uid, ref in left.items():
        assert out is not None
        out.add(
            UnshownSeries(
                series_uid=uid,
                description=ref.label[:64],
                series_class=ref.series_class or "",
                reason=NotShownReason.NOT_SENT,
                detail="its image was in no request of the answers reviewed here",
            )
        )
        out.n_shown = max(0, out.n_shown - 1)
    return out


def _truth(case: Case) -> TruthSummary | None:
    gt = case.ground_truth
    if gt is None:
        return None
    return TruthSummary(
        diagnosis=gt.final_diagnosis.name,
        icd10=gt.final_diagnosis.icd10,
        group=gt.final_diagnosis.group.value if gt.final_diagnosis.group else None,
        difficulty=gt.difficulty.value,
        synonyms=gt.synonyms,
        differential=[d.name for d in gt.differential],
        key_findings=gt.key_findings,
        rationale=gt.rationale,
        normal_control=is_normal_control(gt),
    )


def _sequences(case: Case, s: SampleResult) -> list[SequenceItem]:
    ans = s.answer
    score = s.scored.score("sequence_recognition")
    checked = score is not None and score.value is not None
    if isinstance(ans, ClassificationAnswer):
        if ans.specialized_sequence is None:
            return []
        mark = Mark.NOT_CHECKED if not checked else (Mark.CORRECT if score.value else Mark.WRONG)  # type: ignore[union-attr]
        headers = sorted({i.series_class for i in case.images if i.series_class})
        return [
            SequenceItem(
                item_id="seq.1",
                stated=ans.specialized_sequence,
                header_class=", ".join(headers) or None,
                mark=mark,
            )
        ]
    if not isinstance(ans, Answer):
        return []
    zero = any(x.image is not None and _ZERO_REF.match(x.image) for x in ans.sequences_identified)
    header_set = {A.EQUIVALENT_SEQUENCES.get(c, c) for i in case.images if (c := i.series_class)}
    items = []
    for n, x in enumerate(ans.sequences_identified, start=1):
        img = resolve_image(x.image, case.images, zero)
        stated = A.sequence_class(x.sequence)
        if not checked:
            mark = Mark.NOT_CHECKED
        elif img is not None and img.series_class:
            mark = Mark.CORRECT if A.same_sequence(stated, img.series_class) else Mark.WRONG
        else:
            known = stated is not None and A.EQUIVALENT_SEQUENCES.get(stated, stated) in header_set
            mark = Mark.CORRECT if known else Mark.WRONG
        items.append(
            SequenceItem(
                item_id=f"seq.{n}",
                stated=x.sequence,
                image_ref=x.image,
                image_label=img.label if img else None,
                header_class=img.series_class if img else None,
                mark=mark,
            )
        )
    return items


def _lesion_match(s: SampleResult) -> LesionMatchResult | None:
    sc = s.scored.score("lesion_f1")
    d = sc.details_as(LesionDetails) if sc is not None else None
    return d.match if d is not None else None


def _findings(case: Case, ans: Answer, match: LesionMatchResult | None) -> list[FindingItem]:
    by_index = {f.index: f for f in match.findings} if match else {}
    items = []
    for i, f in enumerate(ans.findings):
        m = by_index.get(i)
        notes = [f"{lid}: {', '.join(kinds)}" for lid, kinds in (m.near.items() if m else [])]
        if m and m.status == "redundant":
            notes.insert(0, f"restates {', '.join(m.lesions)}")
        notes += m.description_errors if m else []
        items.append(
            FindingItem(
                item_id=f"finding.{i + 1}",
                index=i + 1,
                description=f.description,
                sequence=f.sequence,
                hemisphere=f.hemisphere,
                region=f.region,
                signal=f.signal,
                size_mm=f.size_mm,
                enhancement=f.enhancement,
                mark=_FINDING_MARKS.get(m.status, Mark.NOT_CHECKED) if m else Mark.NOT_CHECKED,
                lesion_ids=m.lesions if m else [],
                note="; ".join(notes),
            )
        )
    return items


def _lesions(case: Case, match: LesionMatchResult | None) -> list[LesionItem]:
    gt = case.ground_truth
    if gt is None:
        return []
    outcomes = {o.lesion_id: o for o in match.lesions} if match else {}
    items = []
    uncounted = match.missed_not_counted if match else ""
    for lesion in gt.lesions:
        o = outcomes.get(lesion.id)
        note = ", ".join(o.near_kinds + o.description_errors) if o else ""
        mark = _LESION_MARKS.get(o.status, Mark.NOT_CHECKED) if o else Mark.NOT_CHECKED
        if mark is Mark.MISSED and uncounted:
            mark, note = Mark.NOT_CHECKED, f"not named; not counted: {uncounted}"
        items.append(
            LesionItem(
                item_id=f"lesion.{lesion.id}",
                id=lesion.id,
                type=lesion.type,
                hemisphere=lesion.hemisphere.value,
                region=lesion.region,
                lobe=lesion.lobe,
                size_mm=lesion.size_mm,
                visible_on=lesion.visible_on,
                mark=mark,
                findings=[n + 1 for n in o.findings] if o else [],
                note=note,
            )
        )
    return items


def _differential(s: SampleResult, ans: Answer) -> list[DifferentialRow]:
    sc = s.scored.score("differential_rank")
    ranked = sc.details_as(RankDetails) if sc is not None else None
    rank = ranked.rank if ranked is not None else None
    levels: list[str] = list(ranked.levels) if ranked is not None else []
    rows, n = [], 0
    for i, d in enumerate(ans.differential, start=1):
        level = None
        if d.diagnosis.strip():
            level = levels[n] if n < len(levels) else None
            n += 1
        rows.append(
            DifferentialRow(
                item_id=f"dx.{i}",
                rank=i,
                diagnosis=d.diagnosis,
                icd10=d.icd10,
                likelihood=d.likelihood,
                evidence_for=d.evidence_for,
                evidence_against=d.evidence_against,
                mark=Mark.CORRECT if rank is not None and n == rank and level else Mark.NOT_CHECKED,
                level=level,
            )
        )
    return rows


def _verdict(value: float | None) -> Mark:
    if value is None:
        return Mark.NOT_CHECKED
    return Mark.CORRECT if value >= 1 else Mark.WRONG


def _graders(rubric: Score | None) -> list[GraderRow]:
    """Each rubric grader's verdict (the jury's median is the rubric score)."""
    jury = rubric.details_as(RubricDetails) if rubric is not None else None
    if jury is None:
        return []
    rows = []
    for name, entry in sorted(jury.graders.items()):
        rows.append(
            GraderRow(
                grader=name,
                mean=entry.mean,
                scores=dict(entry.scores),
                counted=grader_counted(entry),
                canary=entry.canary.passed if entry.canary is not None else None,
                note=entry.why or "",
            )
        )
    return rows


def _answer(case: Case, s: SampleResult, others: list[SampleResult], low: float) -> AnswerChecklist:
    sc = s.scored
    raw = s.text or ""
    a = AnswerChecklist(
        key=answer_key(s),
        model=sc.model,
        family=sc.family.value,
        sample_index=sc.sample_index,
        ablation=s.ablation,
        status=sc.status,
        raw_text=raw[:MAX_RAW_CHARS],
        raw_truncated=len(raw) > MAX_RAW_CHARS,
        scoring_version=version_name(sc.scoring_version),
        scores=[
            ScoreRow(scorer=x.scorer, value=x.value, explanation=x.explanation) for x in sc.scores
        ],
        usage=UsageRow(
            prompt_tokens=sc.prompt_tokens,
            completion_tokens=sc.completion_tokens,
            cost_usd=sc.cost_usd,
            latency_s=sc.latency_s,
        ),
    )
    a.graders = _graders(sc.score("rubric"))
    a.sequences = _sequences(case, s)
    ans = s.answer
    if isinstance(ans, Answer):
        match = _lesion_match(s)
        a.findings = _findings(case, ans, match)
        a.lesions = _lesions(case, match)
        a.differential = _differential(s, ans)
        dm = sc.score("diagnosis_match")
        a.final_diagnosis = TextItem(
            item_id="final",
            label="Final diagnosis",
            text=final_diagnosis(ans) or "",
            mark=_verdict(dm.value if dm else None),
            note=dm.explanation if dm else "",
        )
        a.confidence = TextItem(item_id="confidence", label="Confidence", value=ans.confidence)
        bs = sc.score("bertscore")
        a.rationale = TextItem(
            item_id="rationale",
            label="Rationale",
            text=ans.rationale,
            value=bs.value if bs else None,
            note=bs.explanation if bs else "",
        )
        a.next_steps = ans.next_steps
    elif isinstance(ans, ClassificationAnswer):
        a.fields = {k: v for k, v in ans.model_dump(mode="json").items()}
        cc = sc.score("classification_correct")
        stated = " / ".join(x for x in (ans.diagnosis_name, ans.diagnosis_detailed) if x)
        a.final_diagnosis = TextItem(
            item_id="final",
            label="Diagnosis class",
            text=stated,
            mark=_verdict(cc.value if cc else None),
            note=cc.explanation if cc else "",
        )
        a.confidence = TextItem(
            item_id="confidence", label="Confidence", value=ans.diagnosis_confidence
        )
    else:
        a.lesions = _lesions(case, None)
    err = sc.effective_error
    if err is not None:
        a.error = ErrorItem(
            category=err.category,
            sub_labels=err.sub_labels,
            evidence=err.evidence,
            assigned_by=err.assigned_by,
        )
    if others:
        a.samples = SamplesOutcome(
            n=len(others),
            n_correct=sum(o.scored.correct == 1.0 for o in others),
            n_unscored=sum(o.scored.correct is None for o in others),
            final_diagnoses=[(o.scored.ranked_differential or ["(none)"])[0] for o in others][:20],
        )
    a.flags = answer_flags(case, a, s, low)
    return a


def _model_saw(
    chosen: list[tuple[SampleResult, list[SampleResult]]], requests: dict[str, SentRequest]
) -> list[SentItem]:
    """Each distinct request of the reviewed answers, with the answers it was sent for."""
    items: dict[str, SentItem] = {}
    for s, _ in chosen:
        sent = requests.get(s.request) if s.request else None
        if sent is None:
            continue
        item = items.setdefault(s.request or "", SentItem(messages=sent.messages))
        label = f"{s.scored.model} ({s.scored.family.value}"
        label += ")" if s.ablation == FULL_INPUT else f", {s.ablation} only)"
        if label not in item.answers:
            item.answers.append(label)
    return list(items.values())


def _said(text: str | None) -> str:
    return repr(" ".join((text or "(none)").split())[:120])


def audit_flags(case_id: str, pairs: Sequence[VariantPair]) -> list[tuple[FlagKind, str]]:
    """The grounding audit's flags of a case, each with its evidence: which model, question and
    variant, what was planted (the text and where) and what the model answered."""
    out: list[tuple[FlagKind, str]] = []
    for p in pairs:
        if p.source_case_id != case_id:
            continue
        who = f"{p.model} ({p.task or 'answer'}, {p.kind.value})"
        for sub in p.sub_labels:
            if sub == SAME_WITHOUT_IMAGES:
                detail = f"{who}: answered {_said(p.variant.diagnosis)} as with the images"
            elif sub == FOLLOWED_PLANTED_INSTRUCTION:
                detail = (
                    f"{who}: planted in the {p.planted_where}: {_said(p.planted_text)}; "
                    f"answered {_said(p.variant.diagnosis)} (with the study as received: "
                    f"{_said(p.source.diagnosis)})"
                )
            elif sub == SIDE_NOT_MIRRORED:
                detail = f"{who}: {p.sides_stayed} of its sides stayed on the mirrored images"
            else:
                continue
            out.append((FlagKind(sub), detail))
    return out


def run_checklists(run: RunData, audit: Sequence[VariantPair] | None = None) -> list[CaseChecklist]:
    """The checklists of ``run``'s cases as received, in its order. The grounding audit's
    variants (``<case>~<kind>``) are not cases to review: what they showed flags their source
    case (``audit``: the run's variant pairs, for a run whose variants were already set apart;
    None: read from ``run``)."""
    received = as_received(run)  # its variants' pairs in ``audit`` (computed once, there)
    if audit is None:
        audit = received.audit
    return [
        build_checklist(
            c,
            run.samples_of(c.case_id),
            run_id=run.run_id,
            case_root=run.case_roots.get(c.case_id),
            requests=run.requests,
            audit=audit,
        )
        for c in received.cases
    ]


def build_checklist(
    case: Case,
    samples: list[SampleResult],
    *,
    run_id: str,
    case_root: str | Path | None = None,
    low_confidence: float = LOW_CONFIDENCE,
    now: datetime | None = None,
    requests: dict[str, SentRequest] | None = None,
    audit: Sequence[VariantPair] = (),
) -> CaseChecklist:
    """The checklist of one case: images, what was sent (``requests``: the run's recorded
    requests, ``RunData.requests``), truth and one section per reviewed answer. ``audit``: the
    run's variant pairs (``robustness.variant_pairs``); those of this case flag it with their
    evidence (answered the same without the images, followed a planted instruction...)."""
    chosen = reviewed_samples(samples)
    sent_lists = [s.images_sent for s, _ in chosen if s.images_sent is not None]
    sent = {h for lst in sent_lists for h in lst} if sent_lists else None
    answers = [_answer(case, s, group, low_confidence) for s, group in chosen]
    saw = _model_saw(chosen, requests or {})
    seen: dict[FlagKind, list[str]] = {}
    for a in answers:
        for f in a.flags:
            seen.setdefault(f.kind, []).append(f"{answer_label(a)}: {f.detail}")
    for kind, detail in audit_flags(case.case_id, audit):
        seen.setdefault(kind, []).append(detail)
    return CaseChecklist(
        run_id=run_id,
        case_id=case.case_id,
        patient_id=case.patient_id,
        hospital=case.provenance.identity,
        generated_at=(now or datetime.now(UTC)).isoformat(timespec="seconds"),
        source=case.provenance.source,
        dataset=case.provenance.dataset,
        study_uids=case.provenance.study_uids,
        modality=case_modality(case),
        images=_images(case, case_root, sent),
        series_not_shown=_not_shown(case, sent),
        model_saw=saw,
        model_saw_recorded=bool(saw),
        truth=_truth(case),
        answers=answers,
        blocks=report_blocks(samples),
        flags=[Flag(kind=k, detail="; ".join(v)[:600]) for k, v in seen.items()],
    )
