"""The part of pydicom's Dataset interface that dicom.headers uses, over a fast scan.

Values are converted by pydicom's own ``convert_raw_data_element`` with the character set
pydicom would use, so ``get`` returns what ``pydicom.Dataset.get`` returns for the same
bytes. Conversions are memoised on (tag, VR, raw bytes, character set): most values repeat
across the files of a series.
"""

from __future__ import annotations

import re
from typing import Any

from pydicom import config
from pydicom.charset import convert_encodings, default_encoding
from pydicom.dataelem import DataElement, RawDataElement, convert_raw_data_element
from pydicom.hooks import hooks
from pydicom.hooks import raw_element_value as default_raw_element_value
from pydicom.hooks import raw_element_vr as default_raw_element_vr

from dicom.headers.elements import (
    CHARSET_TAG,
    FALLBACK_KEYWORDS,
    KEYWORD_TAGS,
    MEDIA_SOP_CLASS_TAG,
    PRIVATE_TAGS,
    TS_TAG,
    Fallback,
    ScannedHeader,
    keyword_tag,
)

_MEMO: dict[tuple[Any, ...], DataElement] = {}
_MEMO_LIMIT = 50_000  # entries; cleared when full


class _FileMeta:
    __slots__ = ("MediaStorageSOPClassUID", "TransferSyntaxUID")

    def __init__(self, ts: Any, sop_class: Any) -> None:
        self.TransferSyntaxUID = ts
        self.MediaStorageSOPClassUID = sop_class


class ScannedDataset:
    """``get(keyword)`` gives the converted value, ``get((group, element))`` the element.

    ``hidden`` tags raise Fallback when asked for (dicom.headers uses it to prove that its
    series fields do not depend on per-file elements).
    """

    def __init__(self, scan: ScannedHeader, hidden: frozenset[int] = frozenset()) -> None:
        self._hidden = hidden
        self._raw = scan.elements
        self._plain = _plain_config()  # once per file, not once per value read
        charset = scan.elements.get(CHARSET_TAG)
        self._charset_key = charset.value if charset is not None else None
        self._encoding: Any = None
        ts = scan.meta.get(TS_TAG)
        sop_class = scan.meta.get(MEDIA_SOP_CLASS_TAG)
        self.file_meta = _FileMeta(
            _converted(TS_TAG, ts, default_encoding, None).value if ts is not None else None,
            _converted(MEDIA_SOP_CLASS_TAG, sop_class, default_encoding, None).value
            if sop_class is not None
            else "",
        )

    def _element(self, tag: int) -> DataElement | None:
        if tag in self._hidden:
            raise Fallback(f"({tag >> 16:04X},{tag & 0xFFFF:04X}) is hidden from this reader")
        raw = self._raw.get(tag)
        if raw is None:
            return None
        if tag == CHARSET_TAG:  # pydicom decodes the character set itself with the default
            return _converted(tag, raw, default_encoding, None)
        if self._encoding is None:
            self._encoding = self._character_set()
        return _converted(tag, raw, self._encoding, self._charset_key)

    def _character_set(self) -> Any:
        # As pydicom's Dataset: the default encoding unless (0008,0005) is present at all.
        charset = self._element(CHARSET_TAG)
        if charset is None:
            return default_encoding
        return convert_encodings(charset.value)

    def __contains__(self, keyword: str) -> bool:
        tag = _keyword_tag(keyword)
        if tag in self._hidden:
            raise Fallback(f"{keyword} is hidden from this reader")
        return tag in self._raw

    def get(self, key: str | tuple[int, int], default: Any = None) -> Any:
        if isinstance(key, tuple):
            tag = key[0] << 16 | key[1]
            if tag not in PRIVATE_TAGS:
                raise Fallback(f"{key} is not scanned")
            elem = self._element(tag)
            return default if elem is None else elem
        tag = _keyword_tag(key)
        kind = _PLAIN_NUMBERS.get(tag)
        if kind is not None and self._plain and tag not in self._hidden:
            value = _plain_value(kind, self._raw.get(tag))
            if value is not None:
                return value
        elem = self._element(tag)
        return default if elem is None else elem.value


def _keyword_tag(keyword: str) -> int:
    tag = KEYWORD_TAGS.get(keyword)
    if tag is None:
        if keyword in FALLBACK_KEYWORDS:
            return keyword_tag(keyword)  # never present: the scan fell back if it was
        raise Fallback(f"{keyword} is not scanned")
    return tag


def _converted(tag: int, raw: RawDataElement, encoding: Any, charset_key: Any) -> DataElement:
    key = (tag, raw.VR, raw.value, charset_key)  # a plain int tag: BaseTag compares slowly
    elem = _MEMO.get(key)
    if elem is None:
        elem = convert_raw_data_element(raw, encoding=encoding, ds=None)
        if len(_MEMO) >= _MEMO_LIMIT:
            _MEMO.clear()
        _MEMO[key] = elem
    return elem


def clear_memo() -> None:
    _MEMO.clear()


# Per-file values (unique in every file, so the memo cannot help) that are read as plain
# numbers or UIDs. For the strict forms below, which is what scanners write, Python's own
# float()/int()/str give exactly the numbers pydicom's DSfloat/IS/UID hold, and dicom.headers
# only reads them through float(), int() and str(). Anything else goes through pydicom.
_PLAIN_NUMBERS = {
    keyword_tag("SOPInstanceUID"): "UI",
    keyword_tag("ImagePositionPatient"): "DS",
    keyword_tag("InstanceNumber"): "IS",
    keyword_tag("AcquisitionNumber"): "IS",
    keyword_tag("TemporalPositionIdentifier"): "IS",
    keyword_tag("WindowCenter"): "DS",
    keyword_tag("WindowWidth"): "DS",
    keyword_tag("RescaleSlope"): "DS",
    keyword_tag("RescaleIntercept"): "DS",
}
_DS = rb" *[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d{1,3})? *"
_IS = rb" *[-+]?\d{1,12} *"
_PATTERNS = {
    "DS": re.compile(rb"(?:%s)(?:\\(?:%s))*\x00?" % (_DS, _DS)),
    "IS": re.compile(rb"(?:%s)(?:\\(?:%s))*\x00?" % (_IS, _IS)),
    "UI": re.compile(rb"[0-9.]{1,64}[\x00 ]?"),
}


def _plain_value(kind: str, raw: RawDataElement | None) -> Any:
    """The value pydicom would give (as a plain float, int, str or list), or None (pydicom's
    defaults must be in effect: ``_plain_config``)."""
    if raw is None or raw.VR not in (kind, None) or not raw.value:
        return None
    if _PATTERNS[kind].fullmatch(raw.value) is None:
        return None
    text = raw.value.decode("ascii").rstrip("\x00 " if kind == "UI" else "\x00")
    if kind == "UI":
        return text
    convert = float if kind == "DS" else int
    parts = [convert(part) for part in text.split("\\")]
    return parts[0] if len(parts) == 1 else parts


def _plain_config() -> bool:
    """pydicom's defaults are in effect (no numpy/Decimal values, no conversion hooks)."""
    return not (
        config.use_DS_numpy
        or config.use_DS_decimal
        or config.use_IS_numpy
        or config.data_element_callback
        or hooks.raw_element_value is not default_raw_element_value
        or hooks.raw_element_vr is not default_raw_element_vr
    )
