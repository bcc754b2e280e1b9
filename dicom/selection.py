"""Which series a user means (the one rule for a series selector), and which series a case
shows its model (``series_candidates``) with a record of every other one and why
(``SeriesNotShown``).

A selector is what ``inspect`` shows of a series: its SeriesInstanceUID, a stack key
(``UID#n``), its SeriesNumber (``401``), or a UID's short form (``…984937100005987`` or
``1.3.12…5987``; three dots stand for the ellipsis). A selector naming several series (vendors
reuse numbers, across studies and within one) or none is refused with the series to choose from.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from enum import StrEnum

from pydantic import BaseModel, Field

from dicom.errors import AmbiguousSeriesError, SeriesNotFoundError
from dicom.records import IndexResult, SequenceClass, SeriesInfo

__all__ = [
    "ELLIPSIS",
    "MAX_LISTED",
    "NotShownReason",
    "SeriesNotShown",
    "UnshownSeries",
    "find_series",
    "one_per_dwi_series",
    "series_candidates",
    "series_choices",
    "unshown",
]

ELLIPSIS = "…"  # what a short UID stands in for (`inspect` writes it, selectors may use it)


def _identity(s: SeriesInfo) -> tuple[str, str]:
    """What makes two stacks one series (a NIfTI file without a sidecar has no UID: its path)."""
    return (s.study_uid, s.series_uid or s.path)


def series_choices(stacks: list[SeriesInfo]) -> list[SeriesInfo]:
    """The first stack of each series among ``stacks``, in their order."""
    seen: dict[tuple[str, str], SeriesInfo] = {}
    for s in stacks:
        seen.setdefault(_identity(s), s)
    return list(seen.values())


def _matches(s: SeriesInfo, selector: str) -> bool:
    short = selector.replace("...", ELLIPSIS)
    if ELLIPSIS in short:
        head, _, tail = short.partition(ELLIPSIS)
        return bool(head or tail) and any(
            uid.startswith(head) and uid.endswith(tail) and len(uid) >= len(head) + len(tail)
            for uid in (s.key, s.series_uid)
            if uid
        )
    if selector.isdigit():
        return s.series_number is not None and s.series_number == int(selector)
    return False


def _describe(s: SeriesInfo) -> str:
    number = "?" if s.series_number is None else str(s.series_number)
    return f"{number} {s.series_uid or s.path} ({s.description!r}, {s.series_class.value})"


def find_series(index: IndexResult, selector: str) -> list[SeriesInfo]:
    """The stacks of the one series ``selector`` names (a stack key names that stack only).

    Raises SeriesNotFoundError (candidates: every series) when it names none, and
    AmbiguousSeriesError (candidates: the series it names) when it names several.
    """
    selector = selector.strip()
    hits = [s for s in index.series if selector in (s.key, s.series_uid)]
    if not hits:
        hits = [s for s in index.series if _matches(s, selector)]
    choices = series_choices(hits)
    if len(choices) > 1:
        listed = "; ".join(_describe(s) for s in choices)
        raise AmbiguousSeriesError(
            f"series {selector!r} names {len(choices)} series: {listed}; "
            "name one by its SeriesInstanceUID",
            selector,
            choices,
        )
    if not hits:
        every = series_choices(index.series)
        listed = "; ".join(_describe(s) for s in every[:10])
        more = f" and {len(every) - 10} more" if len(every) > 10 else ""
        raise SeriesNotFoundError(
            f"no series {selector!r} in this input (a SeriesInstanceUID or a series number); "
            f"there are: {listed or 'none'}{more}",
            selector,
            every,
        )
    return hits


# --------------------------------------------------------------------------- what a case shows

MAX_LISTED = 20_000  # series named one by one in a SeriesNotShown; beyond, counted only
_MAX_TEXT = 200


class NotShownReason(StrEnum):
    """Why a series of a study was not shown to the model."""

    NOT_ROUTED = "not_routed"  # its class is not among the classes the case shows
    LOCALIZER = "localizer"
    DERIVED = "derived"  # a derived map or mask
    NON_IMAGE = "non_image"  # no pixels (SR, PDF, presentation state...)
    UNREADABLE = "unreadable"  # no usable image: broken geometry, no frames, render failed
    OVER_LIMIT = "over_limit"  # the case already shows its limit of series
    NOT_SENT = "not_sent"  # rendered, but in no model's request (the prompt's image limit)


REASON_TEXT: dict[NotShownReason, str] = {
    NotShownReason.NOT_ROUTED: "not routed: its class is not one the routing rule shows",
    NotShownReason.LOCALIZER: "localizer",
    NotShownReason.DERIVED: "derived map or mask",
    NotShownReason.NON_IMAGE: "not an image",
    NotShownReason.UNREADABLE: "unreadable: no usable image",
    NotShownReason.OVER_LIMIT: "over the limit of series per case",
    NotShownReason.NOT_SENT: "rendered, but in no model's request",
}
_INTRINSIC = {
    SequenceClass.LOCALIZER: NotShownReason.LOCALIZER,
    SequenceClass.DERIVED_MAP: NotShownReason.DERIVED,
    SequenceClass.MASK: NotShownReason.DERIVED,
    SequenceClass.NON_IMAGE: NotShownReason.NON_IMAGE,
}


def _bounded(text: object, limit: int = _MAX_TEXT) -> str:
    """Header text is hostile: control characters out, length bounded."""
    s = "".join(ch if ch.isprintable() else " " for ch in str(text or "")[: limit * 2])
    return s[:limit] + ("…" if len(s) > limit else "")


class UnshownSeries(BaseModel):
    """One stack of a study's series that the model was not shown, and why."""

    series_uid: str
    stack: int = 0
    series_number: int | None = None
    description: str = ""  # SeriesDescription (and stack label), bounded
    series_class: str = ""
    modality: str = ""
    n_files: int = 0
    reason: NotShownReason
    detail: str = ""  # e.g. the render error, the limit

    @property
    def key(self) -> str:
        return self.series_uid if self.stack == 0 else f"{self.series_uid}#{self.stack}"


class SeriesNotShown(BaseModel):
    """Every series of a study that a case does not show its model, and why: counted by
    reason in full, named one by one up to ``MAX_LISTED``."""

    n_series: int = 0  # the study's series stacks
    n_shown: int = 0  # the stacks the case shows
    limit: int | None = None  # the case's limit of series (RenderPlan.max_series)
    counts: dict[NotShownReason, int] = Field(default_factory=dict)
    series: list[UnshownSeries] = Field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def n_unlisted(self) -> int:
        return max(0, self.total - len(self.series))

    def add(self, item: UnshownSeries) -> None:
        """Count ``item`` and name it (while fewer than MAX_LISTED are named)."""
        self.counts[item.reason] = self.counts.get(item.reason, 0) + 1
        if len(self.series) < MAX_LISTED:
            self.series.append(item)

    def reason_text(self, reason: NotShownReason) -> str:
        if reason is NotShownReason.OVER_LIMIT and self.limit is not None:
            return f"over the limit of {self.limit} series per case"
        return REASON_TEXT[reason]

    def by_reason(self) -> list[tuple[NotShownReason, int, list[UnshownSeries]]]:
        """(reason, count, the series named) for each reason, most frequent first."""
        named: dict[NotShownReason, list[UnshownSeries]] = {r: [] for r in self.counts}
        for s in self.series:
            named.setdefault(s.reason, []).append(s)
        order = sorted(self.counts, key=lambda r: (-self.counts[r], r.value))
        return [(r, self.counts[r], named.get(r, [])) for r in order]

    def counts_text(self) -> str:
        """One line: "4992 not shown: 3744 over the limit of 8 series per case, 1248 localizer"."""
        parts = [f"{n} {self.reason_text(r)}" for r, n, _ in self.by_reason()]
        return f"{self.total} not shown: " + "; ".join(parts) if parts else "every series shown"


def unshown(s: SeriesInfo, reason: NotShownReason, detail: str = "") -> UnshownSeries:
    """The record of stack ``s`` not shown for ``reason``."""
    label = f"{s.description} ({s.stack_label})" if s.stack_label else s.description
    return UnshownSeries(
        series_uid=s.series_uid or s.path,
        stack=s.stack,
        series_number=s.series_number,
        description=_bounded(label, 64),
        series_class=s.series_class.value,
        modality=_bounded(s.modality, 16),
        n_files=s.n_files,
        reason=reason,
        detail=_bounded(detail),
    )


def one_per_dwi_series(stacks: list[SeriesInfo]) -> list[SeriesInfo]:
    """A DWI series renders once (its b-value stacks are combined by the diffusion choice)."""
    out: list[SeriesInfo] = []
    seen_dwi: set[str] = set()
    for s in stacks:
        if s.series_class is SequenceClass.DWI:
            if s.series_uid in seen_dwi:
                continue
            seen_dwi.add(s.series_uid)
        out.append(s)
    return out


def series_candidates(
    index: IndexResult,
    classes: Collection[SequenceClass],
    order: Sequence[str],
    record: SeriesNotShown,
) -> list[SeriesInfo]:
    """The stacks a case may show, best first (by ``order`` of class values, then as
    indexed); every other stack goes into ``record`` with its reason. A DWI series is one
    candidate (its other stacks are shown with it, never listed)."""
    rank = {c: k for k, c in enumerate(order)}
    out: list[SeriesInfo] = []
    shown_dwi: set[str] = set()
    for s in index.series:
        if s.series_class not in classes:
            why = _INTRINSIC.get(s.series_class, NotShownReason.NOT_ROUTED)
            record.add(unshown(s, why, f"class {s.series_class.value}"))
        elif not s.renderable:
            problems = "; ".join(e.message for e in s.errors[:2]) or "no image frames"
            record.add(unshown(s, NotShownReason.UNREADABLE, problems))
        elif s.series_class is SequenceClass.DWI and s.series_uid in shown_dwi:
            continue
        else:
            if s.series_class is SequenceClass.DWI:
                shown_dwi.add(s.series_uid)
            out.append(s)
    for s in index.not_fetched:  # in the study, never fetched: not shown, with the same why
        why = _INTRINSIC.get(s.series_class, NotShownReason.NOT_ROUTED)
        record.add(unshown(s, why, f"class {s.series_class.value}, not fetched from the PACS"))
    record.n_series = len(index.series) + len(index.not_fetched)
    return sorted(out, key=lambda s: rank.get(s.series_class.value, len(rank)))
