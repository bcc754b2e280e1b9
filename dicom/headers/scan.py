"""Scan one file's header: the element walk (dicom.headers.elements) along the layout of a
recently scanned sibling (dicom.headers.template) where there is one."""

from __future__ import annotations

from typing import Any

from pydicom.dataelem import RawDataElement

from dicom.headers import template
from dicom.headers.elements import (
    CHUNK,
    EXPLICIT_LE_SYNTAXES,
    IMPLICIT_LE,
    TS_TAG,
    Fallback,
    Reader,
    ScannedHeader,
    scan_dataset,
    scan_meta,
)


def scan_file(fp: Any, size: int, templates: bool = True, tail: bool = False) -> ScannedHeader:
    """Scan an open plain file of ``size`` bytes; raise Fallback when pydicom must parse it.

    ``templates=False`` walks every element (no comparison with earlier files). ``tail=True``
    reads on to the end of the file when the header ends less than two chunks before it, and
    returns the bytes read from the header's end on as the result's ``tail``.
    """
    tmpl = template.find(size) if templates else None
    rd = Reader(fp, size, tmpl.read_hint if tmpl is not None else CHUNK, tail)
    head = rd.data
    if len(head) < 140 or head[128:132] != b"DICM":
        raise Fallback("no DICM preamble")
    meta, pos = scan_meta(rd, 132)
    ts_raw = meta.get(TS_TAG)
    if ts_raw is None or not ts_raw.value:
        raise Fallback("no transfer syntax in the file meta")
    ts = ts_raw.value.decode("ascii", "replace").rstrip("\x00 ")
    if ts == IMPLICIT_LE:
        implicit = True
    elif ts in EXPLICIT_LE_SYNTAXES:
        implicit = False
    else:
        raise Fallback(f"transfer syntax {ts!r} is not scanned")
    if pos >= size:
        raise Fallback("no dataset after the file meta")
    data, off = rd.view(pos, min(8, size - pos))
    if len(data) - off >= 6:
        if data[off] == 0 and data[off + 1] == 0:
            raise Fallback("command set group present")
        vr0, vr1 = data[off + 4], data[off + 5]
        looks_explicit = 0x40 < vr0 < 0x5B and 0x40 < vr1 < 0x5B
        if looks_explicit == implicit:
            raise Fallback("dataset VR encoding differs from its transfer syntax")
    elements: dict[int, RawDataElement] = {}
    start = pos
    stop = -1
    if tmpl is not None and tmpl.implicit == implicit:
        pos, matched = tmpl.follow(rd, pos, elements)
        if pos < 0:
            stop = -pos - 1
        if not matched:
            template.forget(tmpl)
    if stop < 0:
        bounds: list[int] | None = [] if templates and tmpl is None else None
        stop = scan_dataset(rd, pos, implicit, elements, bounds)
        if bounds is not None:
            template.remember(rd, implicit, start, bounds, stop, elements)
    after = b""
    if stop < size:
        n = min(12, size - stop)
        data, off = rd.view(stop, n)
        after = bytes(data[off : off + n])
    kept = None
    if tail and rd.base <= stop and rd.base + len(rd.data) == size:
        kept = (stop, rd.data[stop - rd.base :])
    return ScannedHeader(meta, elements, implicit, stop, after, size, kept)
