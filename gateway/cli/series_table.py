"""Series tables for a terminal: `inspect`'s list and `render --series`'s choices.

The default table keeps every row within two lines at any width (80 columns included): UIDs in a
short form that stays unique within the table, long text cut with an ellipsis. ``wide`` prints
every value whole, one line per row, however long the lines get (for a pager or a file).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from dicom import ELLIPSIS, FileError, SeriesInfo

TAIL = 12  # characters of a UID kept at its end: where the UIDs of one study differ


def _common_suffix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


def _common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def short_uids(uids: Iterable[str], tail: int = TAIL) -> dict[str, str]:
    """A short form of each UID, unique among ``uids``: ``…`` and its last ``tail`` characters,
    more of the end when another UID ends the same way, or ``head…tail`` when two share a long
    end; a UID no longer than its short form stays whole. A short form names its UID for
    ``render --series`` (dicom.selection matches ``head…tail``)."""
    distinct = sorted({u for u in uids if u})
    forms: dict[str, str] = {}
    for u in distinct:
        others = [v for v in distinct if v != u]
        # the end must not also end another UID; a few more characters than TAIL at most
        need = max((_common_suffix(u, v) + 1 for v in others), default=0)
        t = max(tail, need)
        if t <= tail + 8:
            form = ELLIPSIS + u[-t:]
        else:  # another UID shares a long end: keep the start up to where they differ
            h = max(_common_prefix(u, v) + 1 for v in others if v.endswith(u[-tail:]))
            form = u[:h] + ELLIPSIS + u[-tail:]
        forms[u] = u if len(form) >= len(u) else form
    if len(set(forms.values())) < len(forms):  # hostile UIDs holding an ellipsis: show whole
        return {u: u for u in distinct}
    return forms


def _key(s: SeriesInfo, uids: dict[str, str]) -> str:
    if not s.series_uid:
        return "-"
    shown = uids.get(s.series_uid, s.series_uid)
    return shown if s.stack == 0 else f"{shown}#{s.stack}"


class Clamp:
    """Text cut to at most ``lines`` lines of its cell: wrapped (``wrap``) or line by line, the
    last line ending in an ellipsis when something was left out."""

    def __init__(self, parts: Sequence[str], lines: int = 2, wrap: bool = False) -> None:
        self.parts = [p for p in parts if p]
        self.lines = lines
        self.wrap = wrap

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        longest = max((len(p) for p in self.parts), default=1)
        return Measurement(min(longest, 8), longest).with_maximum(options.max_width)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = max(options.max_width, 1)
        if self.wrap:
            lines = list(Text(" ".join(self.parts)).wrap(console, width, overflow="fold"))
        else:
            lines = [Text(p) for p in self.parts]
        cut = len(lines) > self.lines
        lines = lines[: self.lines]
        for i, line in enumerate(lines):
            line.rstrip()
            if cut and i == len(lines) - 1:
                line.append(ELLIPSIS)
            line.truncate(width, overflow="ellipsis")
            line.end = "\n" if i < len(lines) - 1 else ""
            yield line


def _geometry(s: SeriesInfo, digits: int = 3) -> tuple[str, str]:
    shape = "x".join(str(v) for v in s.shape) or "-"
    spacing = "x".join(f"{v:.{digits}g}" for v in s.spacing)
    return (
        f"{s.plane.value if s.plane else '-'} {shape}",
        f"{spacing} mm" if spacing else "-",
    )


def _table(title: str | None = None, wide: bool = False) -> Table:
    return Table(
        title=title,
        box=box.SIMPLE_HEAD,
        show_lines=not wide,  # a blank line between rows of two lines
        show_edge=False,
        padding=0,  # one space between columns (the box's divider)
    )


def _widths(
    natural: dict[str, int], total: int, flexible: str, caps: dict[str, int]
) -> dict[str, int]:
    """Column widths within ``total`` characters: each column its natural width up to its cap,
    the ``flexible`` one what is left (at least 10)."""
    widths = {k: min(v, caps.get(k, v)) for k, v in natural.items()}
    rest = total - sum(w for k, w in widths.items() if k != flexible) - (len(widths) - 1)
    widths[flexible] = max(10, min(natural[flexible], rest))
    return widths


def series_table(
    stacks: Sequence[SeriesInfo], width: int, title: str | None = None, wide: bool = False
) -> Table:
    """`inspect`'s table: one row per stack (series, class, geometry, files, reason)."""
    uids = (
        {s.series_uid: s.series_uid for s in stacks}
        if wide
        else short_uids(s.series_uid for s in stacks)
    )
    table = _table(title, wide)
    rows = []
    for s in stacks:
        number = "" if s.series_number is None else str(s.series_number)
        name = f"{number} {s.description}".strip() or "-"
        label = f"[{s.stack_label}]" if s.stack_label else ""
        klass = f"{s.series_class.value} {s.confidence:.2f}"
        reason = [s.reason, *(f"! {w}" for w in s.warnings)]
        geometry = _geometry(s, digits=6 if wide else 3)
        rows.append((name, label, _key(s, uids), klass, s.detail, *geometry, reason, s))
    if wide:
        for col in ("series", "uid", "class", "geometry", "files", "reason"):
            table.add_column(col, no_wrap=True)
        for name, label, key, klass, detail, geo1, geo2, reason, s in rows:
            table.add_row(
                escape(f"{name} {label}".strip()),
                escape(key),
                escape(f"{klass} {detail}".strip()),
                escape(f"{geo1} {geo2}"),
                str(s.n_files),
                escape("; ".join(p for p in reason if p)),
            )
        return table
    natural = {
        "series": max([6, *(max(len(r[0]), len(r[2]) + 1 + len(r[1])) for r in rows)]),
        "class": max([5, *(max(len(r[3]), len(r[4])) for r in rows)]),
        "geometry": max([8, *(max(len(r[5]), len(r[6])) for r in rows)]),
        "files": max([5, *(len(str(r[8].n_files)) for r in rows)]),
        "reason": max([6, *(len("  ".join(r[7])) for r in rows)]),
    }
    # never cut: the short UID (series), the class and its confidence (class)
    uid_width = max([0, *(len(r[2]) for r in rows)])
    class_width = max([0, *(len(r[3]) for r in rows)])
    caps = {"series": max(uid_width, width // 5), "class": max(class_width, width // 6)}
    widths = _widths(natural, width, "reason", caps)
    for col in natural:
        table.add_column(col, width=widths[col], no_wrap=True)
    for name, label, key, klass, detail, geo1, geo2, reason, s in rows:
        table.add_row(
            Clamp([name, f"{key} {label}".strip()]),
            Clamp([klass, detail]),
            Clamp([geo1, geo2]),
            str(s.n_files),
            Clamp(reason, wrap=True),
        )
    return table


def choices_table(stacks: Sequence[SeriesInfo], width: int) -> Table:
    """The series a selector could have named: study, number, UID, description, class."""
    studies = short_uids(s.study_uid for s in stacks)
    uids = short_uids(s.series_uid for s in stacks)
    rows = [
        (
            studies.get(s.study_uid, s.study_uid) or "-",
            "-" if s.series_number is None else str(s.series_number),
            _key(s, uids) if s.series_uid else s.path,
            s.description or "-",
            s.series_class.value,
        )
        for s in stacks
    ]
    names = ("study", "number", "uid", "description", "class")
    natural = {n: max([len(n), *(len(r[i]) for r in rows)]) for i, n in enumerate(names)}
    widths = _widths(natural, width, "description", {})
    table = _table()
    for n in names:
        table.add_column(n, width=widths[n], no_wrap=True)
    for row in rows:
        table.add_row(*(Clamp([v]) for v in row))
    return table


def errors_table(errors: Sequence[FileError], root: str, width: int, wide: bool = False) -> Table:
    """The files not used: the file (relative to ``root``), the kind, the message."""
    prefix = root.rstrip("/") + "/"

    def rel(p: str) -> str:
        if p == root:  # PATH is the file itself
            return p.rsplit("/", 1)[-1]
        return p[len(prefix) :] if p.startswith(prefix) else p

    rows = []
    for e in errors:
        message = e.message
        if message.startswith(e.path + ": "):
            message = message[len(e.path) + 2 :]
        rows.append((rel(e.path), e.kind, message.replace(e.path, rel(e.path))))
    table = _table(f"{len(errors)} file(s) not used", wide)
    names = ("file", "kind", "message")
    if wide:
        for n in names:
            table.add_column(n, no_wrap=True)
        for row in rows:
            table.add_row(*(escape(v) for v in row))
        return table
    natural = {n: max([len(n), *(len(r[i]) for r in rows)]) for i, n in enumerate(names)}
    widths = _widths(natural, width, "message", {"file": max(12, width // 4)})
    for n in names:
        table.add_column(n, width=widths[n], no_wrap=True)
    for file, kind, message in rows:
        table.add_row(Clamp([file], wrap=True), Clamp([kind]), Clamp([message], wrap=True))
    return table
