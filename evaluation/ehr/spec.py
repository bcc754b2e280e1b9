"""What the FHIR R4B definitions say about a record, read from ``fhir.resources`` (the kept Python
FHIR models): whether a resource validates, and which resource types an element may reference.

The record is read tolerantly (``evaluation.ehr.record``); these answers only add to it: a
resource that does not validate is still read and the problem is noted, and an element whose
definition is unknown (a resource type R4B does not define, a path past its elements) gets None.
"""

from __future__ import annotations

import hashlib
import typing
from functools import lru_cache
from typing import Any

from pydantic import ValidationError

MAX_PROBLEM_CHARS = 300
MAX_VALIDATED_CHARS = 200_000  # a larger resource is read, not validated (said in the notes)


def _model(resource_type: str) -> Any | None:
    """The R4B model class of a resource type; None when R4B does not define it (or when
    fhir.resources is missing: then nothing validates and every element is unknown)."""
    try:
        from fhir.resources.R4B import get_fhir_model_class

        return get_fhir_model_class(resource_type)
    except (ValueError, KeyError, AttributeError, ImportError):
        return None


def _fields(cls: Any) -> dict[str, Any]:
    return {(f.alias or name): f for name, f in getattr(cls, "model_fields", {}).items()}


def _inner(annotation: Any) -> Any:
    """The model class of a field: through Optional[...] and List[...] to the element type."""
    while typing.get_args(annotation):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if not args:
            return None
        annotation = args[0]
    klass = getattr(annotation, "get_model_klass", None)
    return klass() if callable(klass) else annotation


@lru_cache(maxsize=8192)
def reference_types(resource_type: str, path: tuple[str, ...]) -> frozenset[str] | None:
    """The resource types the R4B element ``resource_type.path`` may reference (a Reference
    element's target profiles); None when the element or its targets are not defined."""
    cls = _model(resource_type)
    field = None
    for key in path:
        if cls is None:
            return None
        field = _fields(cls).get(key)
        if field is None:
            return None
        cls = _inner(field.annotation)
    extra = field.json_schema_extra if field is not None else None
    types = extra.get("enum_reference_types") if isinstance(extra, dict) else None
    if not isinstance(types, list) or not types or "Resource" in types:
        return None
    return frozenset(str(t) for t in types)


_CHECKED: dict[bytes, str | None] = {}  # sha256 of a resource's JSON -> its problem
_MAX_CHECKED = 4096


def validation_problem(resource: dict[str, Any], dumped: str) -> str | None:
    """Why ``resource`` (``dumped``: its JSON) is not a valid R4B resource (its first errors), or
    None when it is. A resource seen before is not validated again (a case's record is read for
    each of its prompts)."""
    key = hashlib.sha256(dumped.encode("utf-8", "surrogatepass")).digest()
    if key not in _CHECKED:
        if len(_CHECKED) >= _MAX_CHECKED:
            _CHECKED.clear()
        _CHECKED[key] = _problem(resource, len(dumped))
    return _CHECKED[key]


def _problem(resource: dict[str, Any], size: int) -> str | None:
    kind = resource.get("resourceType")
    cls = _model(kind) if isinstance(kind, str) else None
    if cls is None:
        return f"{str(kind)[:40]!r} is not a FHIR R4B resource type"
    if size > MAX_VALIDATED_CHARS:
        return f"not validated: larger than {MAX_VALIDATED_CHARS} characters"
    try:
        cls.model_validate(resource)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        shown = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))[:60]}: {str(e.get('msg', ''))[:80]}"
            for e in errors[:2]
        )
        more = f" (and {len(errors) - 2} more)" if len(errors) > 2 else ""
        return f"not valid FHIR R4B: {shown}{more}"[:MAX_PROBLEM_CHARS]
    except (ValueError, TypeError, RecursionError) as exc:
        return f"not valid FHIR R4B: {type(exc).__name__}"
    return None
