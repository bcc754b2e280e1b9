"""DICOM person names (PN): as the project writes them (family^given, checked once here), and
every person a study's headers name (any PN attribute, sequences included), so that the PHI gate
can keep each of them from a model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import pydicom
from pydantic import BaseModel, Field
from pydicom.dataset import Dataset
from pydicom.multival import MultiValue

from dicom.records import IndexResult

_UNREADABLE = (OSError, ValueError, TypeError, EOFError, RecursionError,
               pydicom.errors.InvalidDicomError)  # fmt: skip


class PersonNameError(ValueError):
    """A person name that cannot go into a DICOM PN attribute as family^given."""


MAX_COMPONENT = 64


def person_name(value: str) -> str:
    """``value`` as a PN: at least family and given name (``Curie^Marie``; middle name, prefix
    and suffix may follow), printable, no ``\\`` or ``=``, no component over 64 characters."""
    value = (value or "").strip()
    parts = value.split("^")
    if len(parts) < 2 or len(parts) > 5 or not parts[0].strip() or not parts[1].strip():
        raise PersonNameError(
            f"person name {value!r} is not in family^given form (for example Curie^Marie)"
        )
    if not value.isprintable() or "\\" in value or "=" in value:
        raise PersonNameError(f"person name {value!r}: printable characters only, no '\\' or '='")
    if any(len(p) > MAX_COMPONENT for p in parts):
        raise PersonNameError(
            f"person name {value!r}: each part at most {MAX_COMPONENT} characters"
        )
    return "^".join(p.strip() for p in parts)


def display_name(value: str) -> str:
    """A PN as people read it: "Curie^Marie" -> "Marie Curie" (prefix and suffix kept)."""
    parts = [p.strip() for p in (value or "").split("^")] + [""] * 5
    family, given, middle, prefix, suffix = parts[:5]
    return " ".join(x for x in (prefix, given, middle, family, suffix) if x) or value


# --------------------------------------------------------------------------- who a header names

MAX_PERSONS = 512  # person names kept from one header (each PN value is one)
_MAX_ELEMENTS = 20_000  # elements visited in one header, sequences included
_MAX_DEPTH = 12  # sequence nesting followed
_MAX_SERIES = 256  # series whose header is read for the persons of a study
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class PersonName(BaseModel):
    """One component group of a PN value: family name, given and middle names, prefix, suffix."""

    family: str = ""
    given: list[str] = Field(default_factory=list)  # given name first, then middle names
    prefix: str = ""
    suffix: str = ""


class NamedPerson(BaseModel):
    """A person a DICOM header names: the attribute (its keyword, or its tag when private or
    unknown) and the PN value as written (``Family^Given^Middle^Prefix^Suffix``, with the
    ideographic and phonetic groups after ``=``)."""

    keyword: str
    name: str


def parse_person_name(value: str) -> list[PersonName]:
    """The names a PN value holds, one per non-empty component group (alphabetic, ideographic,
    phonetic). A value not in DICOM form ("Marta Alvarez") is one family component: callers
    that need words split it."""
    out = []
    for group in CONTROL_CHARS.sub(" ", value or "").split("=")[:3]:
        comps = [c.strip() for c in group.split("^")] + [""] * 5
        family, given, middle, prefix, suffix = comps[:5]
        if not (family or given or middle):
            continue
        out.append(
            PersonName(
                family=family,
                given=[g for g in (given, *middle.split()) if g],
                prefix=prefix,
                suffix=suffix,
            )
        )
    return out


def person_names(ds: Dataset) -> list[NamedPerson]:
    """Every person a header names: each value of every PN attribute (standard or private),
    inside sequences too, in the order they come; bounded in elements, depth and count. A value
    that cannot be decoded is skipped."""
    from pydicom.datadict import keyword_for_tag

    found: list[NamedPerson] = []
    seen: set[tuple[str, str]] = set()
    budget = [_MAX_ELEMENTS]

    def walk(d: Dataset, depth: int) -> None:
        for tag in list(d.keys()):
            budget[0] -= 1
            if budget[0] < 0 or len(found) >= MAX_PERSONS:
                return
            try:
                elem = d[tag]
                vr, value = elem.VR, elem.value
            except Exception:  # a hostile element: unreadable, not fatal
                continue
            if vr == "SQ" and depth < _MAX_DEPTH:
                for item in value or []:
                    if isinstance(item, Dataset):
                        walk(item, depth + 1)
            elif vr == "PN" and value not in (None, ""):
                name = keyword_for_tag(tag) if not tag.is_private else ""
                key = name or f"({tag.group:04X},{tag.element:04X})"
                values = value if isinstance(value, MultiValue | list | tuple) else [value]
                for v in values:
                    text = CONTROL_CHARS.sub(" ", str(v)).strip()[: 5 * 3 * MAX_COMPONENT]
                    if text and (key, text) not in seen:
                        seen.add((key, text))
                        found.append(NamedPerson(keyword=key, name=text))

    walk(ds, 0)
    return found


def series_headers(
    index: IndexResult, max_series: int = _MAX_SERIES
) -> Iterator[pydicom.Dataset | None]:
    """The header (pixels excepted) of the first file of each series, None where unreadable;
    the one the index kept (``keep_headers``) where it did, else read now."""
    from dicom.sources import HEADER_PREFIX, open_source

    firsts = {
        s.volumes[0][0].path: s.series_uid for s in index.series if s.volumes and s.volumes[0]
    }
    kept: set[str] = set()
    for path in list(firsts)[:max_series]:
        uid = firsts[path]
        if uid in index.series_headers:
            if uid not in kept:
                kept.add(uid)
                yield index.series_headers[uid]
            continue
        try:
            with open_source(path, prefix=HEADER_PREFIX) as fh:  # a header: no more inflated
                ds = pydicom.dcmread(fh, stop_before_pixels=True, defer_size="1 MB")
                yield ds  # still open: a deferred value is read from it
                continue
        except _UNREADABLE:
            pass
        yield None


def persons_of(headers: Iterable[pydicom.Dataset | None]) -> list[NamedPerson]:
    """Every person the headers name, each (attribute, name) once; an unreadable header (None)
    or one whose names cannot be walked adds no one."""
    found: list[NamedPerson] = []
    seen: set[tuple[str, str]] = set()
    for ds in headers:
        if ds is None:
            continue
        try:
            people = person_names(ds)
        except _UNREADABLE:
            continue
        for p in people:
            if (p.keyword, p.name) not in seen and len(found) < MAX_PERSONS:
                seen.add((p.keyword, p.name))
                found.append(p)
    return found
