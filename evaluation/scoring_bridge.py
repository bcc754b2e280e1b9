"""How the engine calls ``evaluation.scoring`` (imported lazily: it loads BERTScore and lexicons).

``ScoringBridge.score`` turns one parsed sample into (scores, error label, ScoredSample JSON);
``scoring_snapshot`` is the part of a case the scorers read, which the run store keeps;
``rescore_run`` re-parses every stored response and scores it again, never calling a model;
``summary`` builds the scoring package's RunSummary from the stored scored samples.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from evaluation.case import Case, RecordPatient, TaskFamily
from evaluation.log.store import RunStore, sample_id
from evaluation.modelio import ModelOutput
from evaluation.parsing import ParsedAnswer, parse_answer
from evaluation.prompts import PromptSet, default_prompts
from evaluation.robustness.records import variant_of
from evaluation.scores import ErrorLabel, ParseStatus, Score
from evaluation.units import shown_case

log = logging.getLogger(__name__)


class ScoringUnavailable(RuntimeError):
    """evaluation.scoring is not installed or failed to import."""


def _scoring() -> Any:
    try:
        import evaluation.scoring as scoring
    except Exception as exc:  # the scoring package is optional at import time
        raise ScoringUnavailable(f"evaluation.scoring cannot be imported: {exc}") from exc
    return scoring


def warm() -> None:
    """Import the scoring package (in a scoring worker process, before the timed part)."""
    _scoring()


@dataclass(frozen=True)
class ScoreRecord:
    """What scoring one sample gives the store: scores, label, the ScoredSample JSON and the
    scoring version they were made with."""

    scores: list[Score]
    label: ErrorLabel | None
    scored_json: str
    scoring_version: str | None


class ScoringBridge:
    def __init__(
        self,
        bertscore: bool = True,
        judge: Any = None,
        bertscore_model: str | None = None,
        bertscore_layer: int | None = None,
    ) -> None:
        self.bertscore = bertscore
        self.bertscore_model = bertscore_model
        self.bertscore_layer = bertscore_layer
        self.judge = judge  # a scoring.JudgeCache of LLM equivalence verdicts, or None

    def score(
        self,
        case: Case,
        family: TaskFamily,
        model: str,
        parsed: ParsedAnswer,
        output: ModelOutput,
        sample: int,
        run_id: str | None,
        extra_scores: list[Score] | None = None,
        images_shown: int | None = None,
        task: str | None = None,
    ) -> ScoreRecord:
        """``images_shown``: how many images the requests carried (what the run recorded);
        ``task``: the question key of the sample (pass@k units are per question)."""
        scoring = _scoring()
        scored = scoring.make_scored_sample(
            case,
            family,
            model,
            parsed.status,
            parsed.answer,
            output.text,
            sample_index=sample,
            output=output,
            run_id=run_id,
            bertscore=self.bertscore,
            judge=self.judge,
            extra_scores=extra_scores,
            bertscore_model=self.bertscore_model,
            bertscore_layer=self.bertscore_layer,
            images_shown=images_shown,
            task=task,
        )
        return ScoreRecord(
            list(scored.scores), scored.error, scored.model_dump_json(), scored.scoring_version
        )


def scoring_snapshot(case: Case) -> Case:
    """The case as the scorers need it: ground truth, image metadata and hashes, provenance.

    The note, the EHR and the multi-turn reveals are left out, and so are the planted
    identifiers of a phantom's truth: the store keeps only what went through the PHI gate, and
    no scorer reads them.
    """
    gt = case.ground_truth
    return case.model_copy(
        update={
            "note": "",
            "ehr": None,
            "turns": [],
            "ground_truth": gt.model_copy(update={"phi": []}) if gt is not None else None,
            # the record's age and sex stay (results by subgroup read them), nothing else of it
            "provenance": case.provenance.model_copy(update={"patient": record_patient(case)}),
        }
    )


def record_patient(case: Case) -> RecordPatient | None:
    """The age (capped at 90) and sex the case's record gives, None when it gives neither."""
    from evaluation.ehr import EHRContext

    if not case.ehr:
        return case.provenance.patient
    patient = EHRContext.from_bundle(case.ehr).patient
    if patient is None or (patient.age is None and not patient.sex):
        return None
    age = min(patient.age, 90) if patient.age is not None else None
    return RecordPatient(age=age, sex=patient.sex[:20])


def total_output(outputs: list[ModelOutput]) -> ModelOutput:
    """One output for a whole conversation: the last text, summed tokens, cost and latency."""
    last = outputs[-1]

    def total(name: str) -> Any:
        values = [getattr(o, name) for o in outputs if getattr(o, name) is not None]
        return sum(values) if values else None

    return last.model_copy(
        update={
            "prompt_tokens": total("prompt_tokens"),
            "completion_tokens": total("completion_tokens"),
            "cost_usd": total("cost_usd"),
            "latency_s": total("latency_s"),
            "retries": sum(o.retries for o in outputs),
        }
    )


class RescoreCounts(dict[str, int]):
    """What a rescore did: the counts (rescored, unscored, missing_case, errors) as a dict, and
    what changed: the scoring versions the samples had before and the one they have now, and
    how many samples' scores and error labels moved."""

    def __init__(self, **counts: int) -> None:
        super().__init__(**counts)
        self.version: str | None = None
        self.versions_before: dict[str | None, int] = {}
        self.scores_changed = 0
        self.labels_changed = 0

    def compare(
        self,
        was_scored: bool,
        old_version: str | None,
        old_scores: list[Score],
        old_label: ErrorLabel | None,
        new: ScoreRecord,
    ) -> None:
        self.version = new.scoring_version
        if was_scored:
            self.versions_before[old_version] = self.versions_before.get(old_version, 0) + 1

        def values(scores: list[Score]) -> dict[str, float | None]:
            return {x.scorer: None if x.value is None else round(x.value, 9) for x in scores}

        if was_scored and values(old_scores) != values(new.scores):
            self.scores_changed += 1

        def key(label: ErrorLabel | None) -> tuple[str, list[str]] | None:
            return (label.category.value, label.sub_labels) if label else None

        if was_scored and key(old_label) != key(new.label):
            self.labels_changed += 1

    def message(self) -> str:
        """One sentence for the user: which version, whether it changed, what moved."""
        from evaluation.scoring.version import version_name

        now = version_name(self.version)
        old = {version_name(v): n for v, n in self.versions_before.items() if v != self.version}
        if old:
            was = ", ".join(f"{v} ({n} samples)" for v, n in sorted(old.items()))
            head = f"scoring version changed: {was} -> {now}"
        else:
            head = f"scoring version {now} (unchanged)"
        return (
            f"{head}; scores changed on {self.scores_changed} samples, "
            f"error labels on {self.labels_changed}"
        )


def rescore_run(
    store: RunStore,
    cases: Mapping[str, Case],
    *,
    bertscore: bool = True,
    prompts: PromptSet | None = None,
    judge: Any = None,
    bertscore_model: str | None = None,
    bertscore_layer: int | None = None,
) -> RescoreCounts:
    """Parse every stored final response again and score it against ``cases`` (by case id);
    no model is ever called.

    ``judge`` is the run's cache of LLM equivalence verdicts (``runs judge``), read only.
    """
    prompts = prompts or default_prompts()
    bridge = ScoringBridge(
        bertscore=bertscore,
        judge=judge,
        bertscore_model=bertscore_model,
        bertscore_layer=bertscore_layer,
    )
    run_id = store.run_log().run_id
    counts = RescoreCounts(rescored=0, unscored=0, missing_case=0, errors=0)
    for row in store.samples():
        if row.status == ParseStatus.ERROR.value:
            counts["errors"] += 1
            continue
        case = cases.get(row.case_id)
        if case is None:
            counts["missing_case"] += 1
            continue
        family = TaskFamily(row.family)
        turns = row.turns
        replies, checks = row.grader_replies()
        outputs = [t.output for t in turns if t.output is not None and not t.output.error]
        if len(outputs) != len(turns) or not outputs:
            counts["errors"] += 1
            continue
        final = outputs[-1]
        parsed = parse_answer(final.text, family, refusal=final.refusal, prompts=prompts)
        sid = store.record_sample(
            case_id=row.case_id,
            task=row.task,
            family=row.family,
            model=row.model,
            sample=row.sample,
            status=parsed.status.value,
            turns=[*row.turns, *row.graders],
            parsed=parsed_record(parsed),
            parse_error=parsed.error,
            image_hashes=row.image_hashes,
        )
        assert sid == sample_id(row.case_id, row.task, row.model, row.sample)
        if case.ground_truth is None:
            counts["unscored"] += 1
            continue
        extra = []
        if replies and parsed.status is ParseStatus.OK:
            from evaluation.scoring.rubric import rubric_from_outputs

            extra.append(rubric_from_outputs(replies, final.text, checks))
        record = bridge.score(
            shown_case(case, row.image_hashes),
            family,
            row.model,
            parsed,
            total_output(outputs),
            row.sample,
            run_id,
            extra,
            len(row.image_hashes),
            row.task,
        )
        store.record_scores(
            sid, record.scores, record.label, record.scored_json, record.scoring_version
        )
        counts["rescored"] += 1
        counts.compare(
            bool(row.scores),
            row.scoring_version,
            row.scores,
            row.error_label,
            record,
        )
    return counts


def parsed_record(parsed: ParsedAnswer) -> dict[str, Any]:
    out = parsed.model_dump(mode="json", exclude={"answer"})
    out["answer"] = parsed.answer.model_dump(mode="json") if parsed.answer else None
    return out


def scored_samples(store: RunStore) -> list[Any]:
    """Every stored ScoredSample of a run."""
    scoring = _scoring()
    return [scoring.ScoredSample.model_validate_json(j) for j in store.scored_samples()]


def received_samples(store: RunStore) -> list[Any]:
    """The stored ScoredSamples of the run's cases as received: the grounding audit's variants
    (``<case>~<kind>``) are not cases of its figures (their answers are read by the audit's
    measures)."""
    return [s for s in scored_samples(store) if variant_of(s.case_id)[1] is None]


def summary(store: RunStore) -> Any:
    """The scoring package's RunSummary of a run's cases as received (None when nothing is
    scored)."""
    samples = received_samples(store)
    if not samples:
        return None
    return _scoring().summarise(samples)


def compare(
    store: RunStore,
    model_a: str,
    model_b: str,
    *,
    family: TaskFamily | None = None,
    n_boot: int | None = None,
) -> Any:
    """The scoring package's PairedComparison of two models of a run on their shared units.

    Raises ValueError when the two models share no scored case/task.
    """
    scoring = _scoring()
    boot = {"n_boot": n_boot} if n_boot else {}
    return scoring.compare(received_samples(store), model_a, model_b, family=family, **boot)
