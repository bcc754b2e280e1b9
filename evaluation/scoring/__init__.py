"""Scoring and error taxonomy: what the engine calls after a model has answered.

Per sample: ``score_sample`` (pure: case, family, status, parsed answer, raw text) and
``classify_error``; ``make_scored_sample`` does both and carries cost and tokens. Rubric grading
is async (``grade``); ``rubric_from_outputs`` rebuilds it from stored grader replies. Per run:
``summarise``, ``compare`` and ``subgroup_results`` (each figure by vendor, scanner, field
strength, age band and sex); across two runs of one dataset, ``compare_runs``, and the canary's
``drift_verdicts`` rule.
"""

from evaluation.scores import CalibrationDetails
from evaluation.scoring.compare import PairedComparison, ScoringVersionMismatch, compare
from evaluation.scoring.drift import DriftRule, ModelDrift, drift_verdicts
from evaluation.scoring.judge import EquivalenceJudge, unknown_pairs
from evaluation.scoring.judge_cache import JudgeCache
from evaluation.scoring.lexicon import Lexicon, MatchLevel, default_lexicon, match_diagnosis
from evaluation.scoring.passk import ranked_pass_at_k, sampled_pass_at_k
from evaluation.scoring.rubric import grade, grader_calibration, rubric_from_outputs
from evaluation.scoring.runcompare import (
    DatasetMismatch,
    ModelDelta,
    RunComparison,
    RunSide,
    SubgroupDelta,
    compare_runs,
)
from evaluation.scoring.sample import score_sample
from evaluation.scoring.scored import ScoredSample, make_scored_sample
from evaluation.scoring.subgroups import (
    CaseAttributes,
    SubgroupRow,
    SubgroupTable,
    case_attributes,
    subgroup_results,
    subgroup_table,
)
from evaluation.scoring.summary import RunSummary, summarise
from evaluation.scoring.taxonomy import classify_error, effective_error, override_error
from evaluation.scoring.version import SCORING_VERSION, version_name

__all__ = [
    "SCORING_VERSION",
    "CalibrationDetails",
    "CaseAttributes",
    "DatasetMismatch",
    "DriftRule",
    "EquivalenceJudge",
    "JudgeCache",
    "Lexicon",
    "MatchLevel",
    "ModelDelta",
    "ModelDrift",
    "PairedComparison",
    "RunComparison",
    "RunSide",
    "RunSummary",
    "ScoredSample",
    "ScoringVersionMismatch",
    "SubgroupDelta",
    "SubgroupRow",
    "SubgroupTable",
    "case_attributes",
    "classify_error",
    "compare",
    "compare_runs",
    "default_lexicon",
    "drift_verdicts",
    "effective_error",
    "grade",
    "grader_calibration",
    "make_scored_sample",
    "match_diagnosis",
    "override_error",
    "ranked_pass_at_k",
    "rubric_from_outputs",
    "sampled_pass_at_k",
    "score_sample",
    "subgroup_results",
    "subgroup_table",
    "summarise",
    "unknown_pairs",
    "version_name",
]
