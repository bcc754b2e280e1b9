"""Records of scored samples, and how to build one from a model's answer."""

from __future__ import annotations

from pydantic import BaseModel, Field

from evaluation.answers import Answer, ClassificationAnswer
from evaluation.case import Case, Difficulty, DiseaseGroup, TaskFamily
from evaluation.modelio import ModelOutput
from evaluation.scores import ErrorLabel, ParseStatus, Score
from evaluation.scoring.judge import JudgeCache
from evaluation.scoring.neurovlm import neurovlm_truth
from evaluation.scoring.sample import images_shown_of, ranked_names, score_sample
from evaluation.scoring.taxonomy import classify_error, effective_error
from evaluation.scoring.version import SCORING_VERSION


class ScoredSample(BaseModel):
    """One sample with its scores, error label and cost: the unit every summary counts."""

    run_id: str | None = None
    case_id: str
    patient_id: str  # clusters the bootstrap; the case id when the dataset has no patient id
    model: str
    family: TaskFamily
    task: str | None = None  # the question key ("differential", "differential#q2"); None: old run
    sample_index: int = 0
    difficulty: Difficulty | None = None
    disease_group: DiseaseGroup | None = None
    modality: str | None = None  # "MRI", "CT", "MRI+CT"
    status: ParseStatus
    scores: list[Score] = Field(default_factory=list)
    error: ErrorLabel | None = None  # rule (or grader-refined) label
    override: ErrorLabel | None = None  # a clinician's label, which wins
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None
    latency_s: float | None = None
    ranked_differential: list[str] = Field(default_factory=list)
    images_shown: int | None = None  # images the request carried (None: not recorded)
    scoring_version: str | None = None  # scoring.version.SCORING_VERSION; None: before 2
    # the case has a truth this sample's answer is graded against (None: scored before 4)
    gradable: bool | None = None

    def score(self, name: str) -> Score | None:
        return next((s for s in self.scores if s.scorer == name), None)

    def value(self, name: str) -> float | None:
        s = self.score(name)
        return s.value if s is not None else None

    @property
    def effective_error(self) -> ErrorLabel | None:
        return effective_error([self.error, self.override])

    @property
    def correct(self) -> float | None:
        """Diagnosis (or NeuroVLM class) right: 1.0 / 0.0, None when unscored."""
        name = (
            "classification_correct"
            if self.family is TaskFamily.CLASSIFICATION
            else "diagnosis_match"
        )
        return self.value(name)

    @property
    def outcome(self) -> float | None:
        """Right (1.0) or wrong (0.0) as pass@k counts it: an unusable answer (format failure,
        refusal) to a gradable question is wrong; a failed call (not the model's doing; a resume
        retries it) and a question with no truth are None."""
        if self.status in UNUSABLE and self.gradable:
            return 0.0
        return self.correct


# answers the model gave that cannot be used: wrong samples, never left out
UNUSABLE = frozenset({ParseStatus.FORMAT_FAILURE, ParseStatus.REFUSAL})


def gradable(case: Case, family: TaskFamily) -> bool:
    """Whether the case has a truth an answer of ``family`` is graded against."""
    if family is TaskFamily.CLASSIFICATION:
        return neurovlm_truth(case).cls is not None
    return case.ground_truth is not None


def case_modality(case: Case) -> str | None:
    mods = set()
    for img in case.images:
        m = (img.modality or "").upper()
        if m in ("MR", "MRI"):
            mods.add("MRI")
        elif m == "CT":
            mods.add("CT")
        elif img.series_class:
            mods.add("CT" if img.series_class == "CT" else "MRI")
    if not mods and case.ground_truth and case.ground_truth.modality:
        mods.add(case.ground_truth.modality)
    return "+".join(sorted(mods, reverse=True)) or None


def make_scored_sample(
    case: Case,
    family: TaskFamily,
    model: str,
    status: ParseStatus,
    parsed: Answer | ClassificationAnswer | None,
    text: str,
    *,
    sample_index: int = 0,
    output: ModelOutput | None = None,
    run_id: str | None = None,
    bertscore: bool = True,
    judge: JudgeCache | None = None,
    extra_scores: list[Score] | None = None,
    bertscore_model: str | None = None,
    bertscore_layer: int | None = None,
    images_shown: int | None = None,
    task: str | None = None,
) -> ScoredSample:
    """Score one sample and label its error (extra_scores, e.g. a rubric, refine the label).

    ``images_shown``: how many images the request carried (the run's record); None means every
    image of ``case``. ``task``: the question key the run planned (``TaskItem.key``); pass@k
    counts one unit per (case, question)."""
    shown = images_shown_of(case, images_shown)
    scores = score_sample(
        case,
        family,
        status,
        parsed,
        text,
        bertscore=bertscore,
        judge=judge,
        bertscore_model=bertscore_model,
        bertscore_layer=bertscore_layer,
        images_shown=shown,
    )
    scores += extra_scores or []
    gt = case.ground_truth
    return ScoredSample(
        run_id=run_id,
        case_id=case.case_id,
        patient_id=case.patient_id or case.case_id,
        model=model,
        family=family,
        task=task,
        sample_index=sample_index,
        difficulty=gt.difficulty if gt else None,
        disease_group=gt.final_diagnosis.group if gt else None,
        modality=case_modality(case),
        status=status,
        scores=scores,
        error=classify_error(case, family, status, parsed, scores, images_shown=shown),
        prompt_tokens=output.prompt_tokens if output else None,
        completion_tokens=output.completion_tokens if output else None,
        cost_usd=output.cost_usd if output else None,
        latency_s=output.latency_s if output else None,
        ranked_differential=ranked_names(parsed) if isinstance(parsed, Answer) else [],
        images_shown=shown,
        scoring_version=SCORING_VERSION,
        gradable=gradable(case, family),
    )
