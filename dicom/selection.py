"""Which series a user means: the one rule for a series selector.

A selector is what ``inspect`` shows of a series: its SeriesInstanceUID, a stack key
(``UID#n``), its SeriesNumber (``401``), or a UID's short form (``…984937100005987`` or
``1.3.12…5987``; three dots stand for the ellipsis). A selector naming several series (vendors
reuse numbers, across studies and within one) or none is refused with the series to choose from.
"""

from __future__ import annotations

from dicom.errors import AmbiguousSeriesError, SeriesNotFoundError
from dicom.records import IndexResult, SeriesInfo

__all__ = ["ELLIPSIS", "find_series", "series_choices"]

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
