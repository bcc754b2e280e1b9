"""The one side-word rule: how a text, a hemisphere and a truth read in the mirror.

A left-right flip of the images turns the patient's left into the right on what the model sees;
the variant's note, record and truth are mirrored with it so the case stays consistent. The
words swapped are ``left``/``right`` and their forms ``leftward(s)``/``rightward(s)``, as whole
words in any case (``Left``, ``RIGHT``; ``left-sided`` and ``right-handed`` too, the hyphen ends
the word). Abbreviations (``L``, ``R``, ``lt``, ``rt``) are not swapped: they are ambiguous in
free text (``R`` is also a reference, ``L`` a litre); a case that writes sides that way is
mirrored only where it spells them out.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any, Literal, overload

from evaluation.case import GroundTruth, Hemisphere

_SIDE = re.compile(r"\b(left|right)(wards?)?\b", re.IGNORECASE)
_SWAP = {"left": "right", "right": "left"}
# FHIR keys whose string value is a code, an id or an address, not prose
_NOT_PROSE = frozenset(
    {"system", "code", "data", "id", "reference", "url", "resourceType", "status", "fullUrl"}
)


def _same_case(word: str, like: str) -> str:
    if like.isupper() and len(like) > 1:
        return word.upper()
    if like[:1].isupper():
        return word[:1].upper() + word[1:]
    return word


def mirror_side_words(text: str) -> str:
    """``text`` with every spelled-out side word swapped (left <-> right), case kept."""

    def swap(m: re.Match[str]) -> str:
        side, tail = m.group(1), m.group(2) or ""
        return _same_case(_SWAP[side.lower()], side) + tail

    return _SIDE.sub(swap, text)


@overload
def mirror_hemisphere(side: Hemisphere) -> Hemisphere: ...
@overload
def mirror_hemisphere(side: None) -> None: ...
def mirror_hemisphere(side: Hemisphere | None) -> Hemisphere | None:
    """Left <-> right; bilateral, midline and unknown stay."""
    if side == Hemisphere.LEFT:
        return Hemisphere.RIGHT
    if side == Hemisphere.RIGHT:
        return Hemisphere.LEFT
    return side


def mirror_truth(truth: GroundTruth) -> GroundTruth:
    """The truth as the mirrored images show it: each lesion's hemisphere and the side words of
    its region, the key findings, the rationale and the diagnoses' names swapped; a lesion's
    centre's x (RAS: right-left) negated."""
    out = truth.model_copy(deep=True)
    for lesion in out.lesions:
        lesion.hemisphere = mirror_hemisphere(lesion.hemisphere)
        lesion.region = mirror_side_words(lesion.region)
        if lesion.center_mm is not None:
            x, y, z = lesion.center_mm
            lesion.center_mm = (-x, y, z)
    out.key_findings = [mirror_side_words(k) for k in out.key_findings]
    out.rationale = mirror_side_words(out.rationale)
    out.final_diagnosis.name = mirror_side_words(out.final_diagnosis.name)
    for d in out.differential:
        d.name = mirror_side_words(d.name)
    out.synonyms = [mirror_side_words(s) for s in out.synonyms]
    return out


def _mirror_attachment(node: dict[str, Any]) -> dict[str, Any]:
    """A FHIR attachment whose base64 text is mirrored (a text content type only)."""
    kind = node.get("contentType", "text/plain")
    data = node.get("data")
    if not (isinstance(kind, str) and kind.startswith("text/") and isinstance(data, str)):
        return node
    try:
        raw = base64.b64decode(data, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return node  # not base64 text: the reader skips it too
    out = dict(node)
    out["data"] = base64.b64encode(mirror_side_words(raw).encode("utf-8")).decode("ascii")
    return out


def mirror_record(node: Any) -> Any:
    """A FHIR bundle (any JSON) with the side words of every string mirrored, and of every text
    attachment's base64 body; keys and the structure stay. A string that is a code, id or
    address (``system``, ``code``, ``id``, ``reference``, ``url``...) is kept: it is not prose."""
    if isinstance(node, str):
        return mirror_side_words(node)
    if isinstance(node, list):
        return [mirror_record(v) for v in node]
    if isinstance(node, dict):
        if "data" in node and "contentType" in node:
            node = _mirror_attachment(node)
        return {
            k: (v if isinstance(v, str) and k in _NOT_PROSE else mirror_record(v))
            for k, v in node.items()
        }
    return node


def side_words(text: str) -> list[Literal["left", "right"]]:
    """The sides ``text`` spells out, in order (the words :func:`mirror_side_words` swaps)."""
    return ["left" if m.group(1).lower() == "left" else "right" for m in _SIDE.finditer(text)]
