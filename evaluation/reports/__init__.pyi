# The public face: the one list of its names, each imported on first use (lazy_loader);
# type checkers read this stub. Nothing outside the package imports past it.
from .block import answer_key as answer_key
from .bundle import ReportIndex as ReportIndex
from .bundle import write_report as write_report
from .checklist import build_checklist as build_checklist
from .loader import RunLoadError as RunLoadError
from .loader import load_run as load_run
from .loader import save_run as save_run
from .model import CaseChecklist as CaseChecklist
from .model import checklist_schema as checklist_schema
from .pdf import PdfError as PdfError
from .pdf import html_to_pdf as html_to_pdf
from .reviews import ReviewEvent as ReviewEvent
from .reviews import ReviewStore as ReviewStore
from .rundata import RunData as RunData
from .rundata import SampleResult as SampleResult
from .summary import SummaryReport as SummaryReport
from .summary import build_summary as build_summary
