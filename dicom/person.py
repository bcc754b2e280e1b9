"""DICOM person names (PN) as the project writes them: family^given, checked once here."""

from __future__ import annotations


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
