"""Readers of hostile FHIR JSON values: each returns a bounded value of one type, or an empty one.

Every field of a record from outside is hostile: wrong types, missing keys, huge strings and huge
lists are tolerated and bounded here, once, for every reader of the record.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

MAX_ITEM_CHARS = 160  # one condition, observation or medication
MAX_LIST = 500  # items of one list read
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def text(value: Any, limit: int = MAX_ITEM_CHARS) -> str:
    """A display string from a hostile value: only str/int/float, control chars removed, bounded."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return ""
    s = _CONTROL.sub(" ", str(value))
    s = " ".join(s.split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def word_set(words: str) -> frozenset[str]:
    """A list of words written as one space-separated text."""
    return frozenset(words.split())


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any, limit: int = MAX_LIST) -> list[Any]:
    return value[:limit] if isinstance(value, list) else []


def concept(value: Any) -> str:
    """Display text of a CodeableConcept: its text, else the first coding's display or code."""
    cc = as_dict(value)
    shown = text(cc.get("text"))
    if shown:
        return shown
    for coding in as_list(cc.get("coding")):
        c = as_dict(coding)
        shown = text(c.get("display")) or text(c.get("code"))
        if shown:
            return shown
    return ""


def codes(value: Any) -> list[str]:
    """The codes of a CodeableConcept's codings (each bounded)."""
    out = []
    for coding in as_list(as_dict(value).get("coding")):
        code = text(as_dict(coding).get("code"), 40)
        if code:
            out.append(code)
    return out


def codes_of_all(value: Any) -> list[str]:
    """The codes of a list of CodeableConcepts."""
    out: list[str] = []
    for cc in as_list(value):
        out.extend(codes(cc))
    return out


def date(value: Any) -> dt.date | None:
    """A FHIR date or dateTime's day (a year alone reads as its 1 July); None if it is not one."""
    s = text(value, 40)
    m = re.match(r"(\d{4})-(\d{2})-(\d{2})", s)
    if m:
        try:
            return dt.date(int(m[1]), int(m[2]), int(m[3]))
        except ValueError:
            return None
    m = re.match(r"(\d{4})$", s)
    return dt.date(int(m[1]), 7, 1) if m else None
