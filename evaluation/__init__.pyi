# The public face: at most 35 names, the vocabulary of a run (tests/test_faces.py counts them),
# each imported on first use (lazy_loader); type checkers read this stub. The concept packages
# have faces of their own: evaluation.log (the run log), evaluation.review (review rules, SR
# content), evaluation.reports, evaluation.datasets, evaluation.models, evaluation.scoring.
# Nothing outside the package imports past these faces (pyproject.toml's import-linter contracts).
from .answers import Answer as Answer
from .answers import ClassificationAnswer as ClassificationAnswer
from .answers import DifferentialItem as DifferentialItem
from .answers import Finding as Finding
from .case import Case as Case
from .case import ImageRef as ImageRef
from .case import Provenance as Provenance
from .case import TaskFamily as TaskFamily
from .coverage import CaseCoverage as CaseCoverage
from .coverage import SkippedCase as SkippedCase
from .datasets import Dataset as Dataset
from .datasets import DatasetSpec as DatasetSpec
from .datasets import dataset_hash as dataset_hash
from .engine import rescore as rescore
from .engine import resume_run as resume_run
from .engine import start_run as start_run
from .errors import DatasetError as DatasetError
from .errors import EvaluationError as EvaluationError
from .errors import ModelConfigError as ModelConfigError
from .errors import first_error as first_error
from .export import export_run as export_run
from .judging import judge_run as judge_run
from .modelio import GenerateConfig as GenerateConfig
from .parsing import answer_schema as answer_schema
from .parsing import format_reason as format_reason
from .phi import PHIPolicy as PHIPolicy
from .runconfig import RunConfig as RunConfig
from .scores import ErrorCategory as ErrorCategory
from .scores import ParseStatus as ParseStatus
from .scores import Score as Score
from .scoring_bridge import ScoringUnavailable as ScoringUnavailable
from .scoring_bridge import compare as compare
from .scoring_bridge import summary as summary
from .tasks import Ablation as Ablation
from .units import RunStats as RunStats
