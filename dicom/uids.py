"""The one rule for a DICOM UID (PS3.5 9.1): what may name a file, a URL or a query.

At most 64 characters; components of digits separated by single periods; no empty component;
no leading zero in a component unless the component is "0". A peer's trailing NUL padding and
surrounding spaces are not part of the UID (``check_uid`` strips them).
"""

from __future__ import annotations

import re

MAX_UID_LENGTH = 64
_COMPONENT = r"(?:0|[1-9][0-9]*)"
_UID = re.compile(rf"{_COMPONENT}(?:\.{_COMPONENT})*")


class InvalidUIDError(ValueError):
    """A string from a peer that is not a DICOM UID (and so may not name a file or a query)."""


def valid_uid(text: str) -> bool:
    """True when ``text`` is a DICOM UID by PS3.5 9.1 (as is: no stripping)."""
    return 0 < len(text) <= MAX_UID_LENGTH and _UID.fullmatch(text) is not None


def check_uid(uid: str) -> str:
    """``uid`` without its padding (spaces, trailing NULs) when it is a valid DICOM UID, else
    ``InvalidUIDError`` naming it (cut to 80 characters: peers' strings are hostile)."""
    uid = uid.strip().rstrip("\0")
    if not valid_uid(uid):
        raise InvalidUIDError(f"not a DICOM UID (PS3.5 9.1): {uid[:80]!r}")
    return uid
