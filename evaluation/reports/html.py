"""HTML pages of the reports: checklists, the run summary, the review pages (Jinja2).

Autoescaping is on for every template and every string: case ids, DICOM labels, the record, the
note and model output are hostile. Pages carry a Content-Security-Policy that allows no script
at all (the image viewer is CSS ``:target``), only this page's own stylesheet (by hash) and
inline ``data:`` images, so the page works the same from a file, from the gateway and in print.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from PIL import Image

from dicom import display_name, side_marks
from evaluation.answers import Finding
from evaluation.log.rundata import RunData
from evaluation.models.cost import cost_text
from evaluation.reports.checklist_view import FLAG_TITLES, SERIOUS_FLAGS, CaseChecklist, ImageItem
from evaluation.reports.print_view import print_view
from evaluation.reports.summary import OUTCOME_LEGEND, SummaryReport
from evaluation.review.review_log import CaseReview, Superseded
from evaluation.review.sr_content import BlockItem, ItemKind
from evaluation.review.verify import Decision, Verification, VerifiedBlock, decision, decisions
from evaluation.scores import ErrorCategory
from evaluation.scoring.anatomy import sequence_class
from evaluation.scoring.subgroups import ATTRIBUTE_TITLES, METRIC_TITLES
from evaluation.scoring.taxonomy import RULE_LEGEND

TEMPLATES = Path(__file__).with_name("templates")
THUMB_PX = 320
PRINT_PX = 800  # a key image on paper: half the page wide, its side marks legible
# series not shown listed per reason on a checklist page (all are in the run's record)
MAX_NOT_SHOWN_ROWS = 1000
MAX_PIXELS = 40_000_000
ImageLoader = Callable[[int], bytes | None]  # checklist image index (1-based) -> PNG bytes


@lru_cache(maxsize=1)
def env() -> Environment:
    e = Environment(
        loader=FileSystemLoader(str(TEMPLATES)),
        autoescape=True,  # every template, whatever its name
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    e.filters["person"] = display_name
    e.filters["when"] = _local_time
    e.filters["cost"] = cost_text  # "unknown" when no price is known, never $0
    e.globals["rule_legend"] = RULE_LEGEND  # what R1..R10 in an error's evidence mean
    e.globals["serious_flags"] = SERIOUS_FLAGS
    e.globals["side_marks"] = side_marks  # R/L (A/P) at an image's edges, by its plane
    e.globals["outcome_legend"] = OUTCOME_LEGEND  # the case matrix: symbol, word, meaning
    e.globals["subgroup_titles"] = ATTRIBUTE_TITLES
    e.globals["metric_titles"] = METRIC_TITLES
    return e


@lru_cache(maxsize=1)
def css() -> str:
    return (TEMPLATES / "style.css").read_text()


def csp(form_action: str = "'self'") -> str:
    """No scripts, no fetches, no frames; this page's stylesheet and data: images only."""
    digest = base64.b64encode(hashlib.sha256(css().encode()).digest()).decode()
    return (
        "default-src 'none'; script-src 'none'; object-src 'none'; base-uri 'none'; "
        f"style-src 'sha256-{digest}'; img-src data:; form-action {form_action}"
    )


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def thumbnail(png: bytes, px: int = THUMB_PX) -> bytes | None:
    """A small PNG of an image (None when it cannot be decoded or is absurdly large).

    Memoised by content: a report renders each image several times (page, print page, every
    sample of every model shows the same images).
    """
    key = (hashlib.sha256(png).hexdigest(), px)
    with _THUMBS_LOCK:
        if key in _THUMBS:
            return _THUMBS[key]
    small = _thumbnail(png, px)
    with _THUMBS_LOCK:
        _THUMBS[key] = small
        if len(_THUMBS) > 512:
            _THUMBS.pop(next(iter(_THUMBS)))
    return small


_THUMBS: dict[tuple[str, int], bytes | None] = {}
_THUMBS_LOCK = threading.Lock()


def _thumbnail(png: bytes, px: int) -> bytes | None:
    try:
        with Image.open(io.BytesIO(png)) as im:
            if im.width * im.height > MAX_PIXELS:
                return None
            im.thumbnail((px, px), reducing_gap=3.0)
            buf = io.BytesIO()
            im.save(buf, format="PNG", compress_level=1)  # a preview: speed over bytes
            return buf.getvalue()
    except (OSError, ValueError, Image.DecompressionBombError):
        return None


@dataclass
class ReviewView:
    """What the review controls of a page need to know about the signed-in reviewer."""

    me: str
    csrf: str
    post_url: str  # the case's POST prefix
    queue_url: str
    summary_url: str
    logout_url: str
    mine: CaseReview | None = None
    others: list[CaseReview] = field(default_factory=list)
    can_reissue: bool = False
    is_admin: bool = False
    missing: list[str] = field(default_factory=list)  # block items without my verdict
    verification: Verification | None = None  # signed reviews combined (disputes, outcome)
    # a link into the DICOM viewer: (study UID, series UID or None, slice position mm or None,
    # the plane that position is along or None); "" when there is none to give
    viewer: Callable[[str, str | None, float | None, str | None], str] | None = None
    superseded: Superseded | None = None  # a newer report version of the study supersedes this

    def image_link(self, image: ImageItem, checklist: CaseChecklist) -> str | None:
        """The viewer at the series and slice an image shows (a montage: its middle tile)."""
        if self.viewer is None or not image.series_uid or not checklist.study_uids:
            return None
        pos = image.slice_positions_mm
        middle = pos[len(pos) // 2] if pos else None
        return self.viewer(checklist.study_uids[0], image.series_uid, middle, image.plane) or None

    def finding_link(self, finding: Finding, checklist: CaseChecklist) -> str | None:
        """The viewer at the series of the finding's sequence, at the slice the model was shown
        of it (the middle tile of its montage): a finding names no slice of its own."""
        wanted = sequence_class(finding.sequence)
        if wanted is None:
            return None
        for image in checklist.images:
            if image.series_class == wanted and image.series_uid:
                return self.image_link(image, checklist)
        return None

    def decided(self, item: BlockItem) -> Decision | None:
        """My decision on a review-block item."""
        return decision(item, self.mine) if self.mine else None

    def others_decided(self, item: BlockItem) -> list[tuple[str, Decision]]:
        return list(decisions(item, self.others).items())

    @property
    def can_adjudicate(self) -> bool:
        v = self.verification
        return bool(self.is_admin and v and v.disputes and not v.signed_by(self.me))

    @property
    def editable(self) -> bool:
        return self.mine is None or self.mine.signed_off_at is None

    def shows(self, answer_key: str, item_id: str) -> bool:
        """Whether an item has review controls or verdicts to show."""
        return self.editable or any(
            r.verdict(answer_key, item_id) for r in [self.mine, *self.others] if r
        )

    @property
    def signed_by(self) -> list[str]:
        return [r.reviewer for r in [self.mine, *self.others] if r and r.signed_off_at]


def _base(rv: ReviewView | None, print_mode: bool, message: str, error: bool) -> dict[str, Any]:
    return {
        "css": css(),
        "csp": csp(),
        "rv": rv,
        "print": print_mode,
        "message": message,
        "message_error": error,
    }


def render_checklist(
    checklist: CaseChecklist,
    images: ImageLoader,
    *,
    review: ReviewView | None = None,
    print_mode: bool = False,
    summary_href: str | None = None,
    message: str = "",
    message_error: bool = False,
) -> str:
    """The checklist page of a case; ``print_mode``: its paper copy (2 to 4 pages, the detail
    left to the page: ``print_view``)."""
    if print_mode:
        return _render_print(checklist, images, review)
    thumbs: dict[int, dict[str, str]] = {}
    for img in checklist.images:
        png = images(img.index)
        small = thumbnail(png) if png else None
        if png and small:
            thumbs[img.index] = {"thumb": data_uri(small), "full": data_uri(png)}
    return (
        env()
        .get_template("checklist.html.j2")
        .render(
            c=checklist,
            thumbs=thumbs,
            flag_titles={k.value: v for k, v in FLAG_TITLES.items()},
            categories=[c.value for c in ErrorCategory],
            summary_href=summary_href,
            block_keys={k for b in checklist.blocks for k in b.answer_keys},
            kinds=ItemKind,
            max_not_shown_rows=MAX_NOT_SHOWN_ROWS,
            **_base(review, print_mode, message, message_error),
        )
    )


def _render_print(checklist: CaseChecklist, images: ImageLoader, review: ReviewView | None) -> str:
    view = print_view(checklist)
    pictures: dict[int, str] = {}
    for key in view.key_images:
        png = images(key.index)
        small = thumbnail(png, PRINT_PX) if png else None
        if small:
            pictures[key.index] = data_uri(small)
    return (
        env()
        .get_template("checklist_print.html.j2")
        .render(
            c=checklist,
            view=view,
            pictures=pictures,
            **_base(review, True, "", False),
        )
    )


def render_signoff(
    checklist: CaseChecklist,
    blocks: list[VerifiedBlock],
    missing: list[str],
    digest: str,
    *,
    review: ReviewView,
    message: str = "",
    message_error: bool = False,
) -> str:
    """The second step of sign-off: the VERIFIED content (kept, corrected, dropped) to confirm."""
    return (
        env()
        .get_template("signoff.html.j2")
        .render(
            c=checklist,
            blocks=blocks,
            missing=missing,
            digest=digest,
            **_base(review, False, message, message_error),
        )
    )


def render_verified(
    run: RunData, case_id: str, verification: Verification, organization: str
) -> str:
    """The VERIFIED report of a case, as printed into the VERIFIED Encapsulated PDF."""
    return (
        env()
        .get_template("verified.html.j2")
        .render(
            case_id=case_id,
            run_id=run.run_id,
            v=verification,
            people=verification.verifiers,
            organization=organization,
            **_base(None, True, "", False),
        )
    )


def _local_time(iso: str | None) -> str:
    """An ISO time (the review log, a run, a checklist) as readable local time in the server's
    time zone, with the zone's name ("2026-11-24 16:05 CET"); a time without a zone is UTC."""
    from datetime import UTC, datetime

    if not iso:
        return "–"
    try:
        t = datetime.fromisoformat(str(iso))
    except ValueError:
        return str(iso)
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.astimezone().strftime("%Y-%m-%d %H:%M %Z")


def render_summary(
    report: SummaryReport,
    plots: dict[str, bytes],
    *,
    case_href: Callable[[str], str] = lambda slug: f"cases/{slug}.html",
    review: ReviewView | None = None,
    print_mode: bool = False,
) -> str:
    from evaluation.reports.plots import plot_gaps  # here: matplotlib only where a summary is

    return (
        env()
        .get_template("summary.html.j2")
        .render(
            r=report,
            plots={k: data_uri(v) for k, v in plots.items()},
            gaps=plot_gaps(report),  # where a plot would be empty: the sentence saying why
            case_href=case_href,
            config_json=json.dumps(report.config, indent=2, default=str)[:20000],
            **_base(review, print_mode, "", False),
        )
    )


def render_page(
    template: str,
    *,
    review: ReviewView | None = None,
    message: str = "",
    message_error: bool = False,
    **context: Any,
) -> str:
    """Any other page (login, run list, queue)."""
    return (
        env()
        .get_template(template)
        .render(**context, **_base(review, False, message, message_error))
    )
