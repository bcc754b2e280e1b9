# The public face: the one list of its names, each imported on first use (lazy_loader);
# type checkers read this stub. Nothing outside the package imports past it.
from .answers import (
    Answer as Answer,
)
from .answers import (
    ClassificationAnswer as ClassificationAnswer,
)
from .answers import (
    DifferentialItem as DifferentialItem,
)
from .answers import (
    Finding as Finding,
)
from .case import (
    Case as Case,
)
from .case import (
    ImageRef as ImageRef,
)
from .case import (
    Provenance as Provenance,
)
from .case import (
    TaskFamily as TaskFamily,
)
from .coverage import CaseCoverage as CaseCoverage
from .coverage import SkippedCase as SkippedCase
from .datasets import Dataset as Dataset
from .datasets import DatasetSpec as DatasetSpec
from .datasets import dataset_hash as dataset_hash
from .datasets.manifest import ManifestProblem as ManifestProblem
from .datasets.manifest import manifest_schema as manifest_schema
from .datasets.phantoms.anatomy import AnatomyError as AnatomyError
from .datasets.phantoms.series import GENERATOR_VERSION as GENERATOR_VERSION
from .datasets.phantoms.suite import (
    SuiteManifest as SuiteManifest,
)
from .datasets.phantoms.suite import (
    generate_suite as generate_suite,
)
from .datasets.registry import case_registry as case_registry
from .datasets.registry import registered_case as registered_case
from .datasets.rendering import RenderPlan as RenderPlan
from .datasets.rendering import render_study as render_study
from .datasets.suite import ManifestCheck as ManifestCheck
from .datasets.suite import check_manifest as check_manifest
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
from .models import BUILTIN as BUILTIN
from .models import REPLAY as REPLAY
from .models import load_models_file as load_models_file
from .models import resolve_specs as resolve_specs
from .models.check import check_model as check_model
from .models.cost import cost_text as cost_text
from .parsing import answer_schema as answer_schema
from .parsing import format_reason as format_reason
from .phi import PHIPolicy as PHIPolicy
from .reports.agreement import review_stats as review_stats
from .reports.block import BlockItem as BlockItem
from .reports.block import ItemKind as ItemKind
from .reports.block import ReportBlock as ReportBlock
from .reports.block import ReportContent as ReportContent
from .reports.block import answer_key as answer_key
from .reports.block import report_blocks as report_blocks
from .reports.block import unverified_content as unverified_content
from .reports.bundle import (
    ReportIndex as ReportIndex,
)
from .reports.bundle import (
    bundle_images as bundle_images,
)
from .reports.bundle import (
    load_checklist as load_checklist,
)
from .reports.bundle import (
    load_checklists as load_checklists,
)
from .reports.bundle import (
    write_report as write_report,
)
from .reports.checklist import reviewed_samples as reviewed_samples
from .reports.coding import CodedDiagnosis as CodedDiagnosis
from .reports.coding import Site as Site
from .reports.coding import diagnosis_concept as diagnosis_concept
from .reports.coding import site_of as site_of
from .reports.html import (
    ImageLoader as ImageLoader,
)
from .reports.html import (
    ReviewView as ReviewView,
)
from .reports.html import (
    csp as csp,
)
from .reports.html import (
    render_checklist as render_checklist,
)
from .reports.html import (
    render_page as render_page,
)
from .reports.html import (
    render_signoff as render_signoff,
)
from .reports.html import (
    render_summary as render_summary,
)
from .reports.html import (
    render_verified as render_verified,
)
from .reports.loader import (
    RUNDATA_FILE as RUNDATA_FILE,
)
from .reports.loader import (
    RunLoadError as RunLoadError,
)
from .reports.loader import (
    load_run as load_run,
)
from .reports.loader import (
    save_run as save_run,
)
from .reports.model import CaseChecklist as CaseChecklist
from .reports.pdf import PdfError as PdfError
from .reports.pdf import Printer as Printer
from .reports.pdf import pdf_bytes as pdf_bytes
from .reports.plots import all_plots as all_plots
from .reports.reviews import (
    Action as Action,
)
from .reports.reviews import (
    CaseReview as CaseReview,
)
from .reports.reviews import (
    ReviewError as ReviewError,
)
from .reports.reviews import (
    ReviewEvent as ReviewEvent,
)
from .reports.reviews import (
    ReviewStore as ReviewStore,
)
from .reports.reviews import (
    Superseded as Superseded,
)
from .reports.reviews import (
    Verdict as Verdict,
)
from .reports.reviews import (
    export_csv as export_csv,
)
from .reports.reviews import (
    export_json as export_json,
)
from .reports.rundata import (
    FULL_INPUT as FULL_INPUT,
)
from .reports.rundata import (
    RunData as RunData,
)
from .reports.rundata import (
    SampleResult as SampleResult,
)
from .reports.storeread import run_from_store as run_from_store
from .reports.summary import (
    SummaryReport as SummaryReport,
)
from .reports.summary import (
    build_summary as build_summary,
)
from .reports.summary import (
    case_slug as case_slug,
)
from .reports.verify import Decision as Decision
from .reports.verify import Outcome as Outcome
from .reports.verify import Verification as Verification
from .reports.verify import VerifiedBlock as VerifiedBlock
from .reports.verify import case_verification as case_verification
from .reports.verify import decision as decision
from .reports.verify import decisions as decisions
from .reports.verify import digest as digest
from .reports.verify import may_adjudicate as may_adjudicate
from .reports.verify import missing_items as missing_items
from .reports.verify import review_preview as review_preview
from .runconfig import RunConfig as RunConfig
from .scores import ErrorCategory as ErrorCategory
from .scores import ParseStatus as ParseStatus
from .scores import Score as Score
from .scoring.version import SCORING_VERSION as SCORING_VERSION
from .scoring.version import version_name as version_name
from .scoring_bridge import (
    ScoringUnavailable as ScoringUnavailable,
)
from .scoring_bridge import (
    compare as compare,
)
from .scoring_bridge import (
    summary as summary,
)
from .sharing import SharedCase as SharedCase
from .sharing import find_case as find_case
from .sharing import load_shared_case as load_shared_case
from .sharing import share_case as share_case
from .sharing import write_case_manifest as write_case_manifest
from .log import STORE_FILE as STORE_FILE
from .log import RunStore as RunStore
from .log import CallErrors as CallErrors
from .tasks import Ablation as Ablation
from .units import RunStats as RunStats
from .warmup import warm_up as warm_up
