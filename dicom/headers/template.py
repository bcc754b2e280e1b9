"""Scan templates: the element layout of a recently scanned file, to scan its siblings faster.

Files of one series share most of their header bytes. A template keeps the dataset bytes of
one file (up to Pixel Data), the offsets and tags of its top-level elements and its needed raw
elements. A sibling is scanned along the template in runs:

- a block of elements is compared byte for byte (one ``bytes.startswith``, in C): identical
  bytes from an element boundary parse identically, so the template's needed elements are
  taken as they are and the block is stepped over;
- an element whose value differs between files, or is big, is compared by its element header
  only (tag, VR, length): if the scan never reads its value it is stepped over, and if it is a
  needed element its value is taken from the sibling;
- an element whose length differs too (a UID, a position, a name) is compared by its tag and
  VR, and its length is read from the sibling's header, with the same two outcomes;
- anything else is walked by ``elements.step``, as a file without template would be.

What differs is learned from the first siblings. If a walked element has another tag than
the template's, the template is dropped and the rest of the file is walked element by element.
Templates are kept per process, by file size (siblings usually share it), with the last one
used as a second guess.
"""

from __future__ import annotations

from typing import cast

from pydicom.dataelem import RawDataElement, empty_value_for_VR
from pydicom.tag import BaseTag

from dicom.headers.elements import (
    FALLBACK_TAGS,
    NEEDED_TAGS,
    UNDEFINED,
    Fallback,
    Reader,
    header_size,
    step,
)

_BIG_VALUE = 4096  # values longer than this are compared by their element header only
_NOT_SKIPPED = NEEDED_TAGS | FALLBACK_TAGS | {0x7FE00010, 0x7FE00009, 0x7FE00008}
_MAX_TEMPLATES = 8
_MAX_HEADER = 4 << 20  # larger headers are not kept as templates
_BY_SIZE: dict[int, Template] = {}
_last: Template | None = None

# Run kinds.
_BLOCK, _HEADER, _VALUE, _STEP, _LENGTH = 0, 1, 2, 3, 4


class _Run:
    __slots__ = (
        "base_tag",
        "block",
        "end",
        "first",
        "hdr",
        "kind",
        "n",
        "needed",
        "prefix",
        "raws",
        "tag",
        "value_length",
        "vr",
    )

    def __init__(self, first: int, end: int, kind: int, tmpl: Template) -> None:
        self.first, self.end, self.kind = first, end, kind
        b = tmpl.bounds
        self.tag = tmpl.tags[first]
        self.hdr = tmpl.hdrs[first]
        self.value_length = tmpl.value_lengths[first]
        raw = tmpl.raws[first]
        self.vr = raw.VR if raw is not None else None
        cut = b[end] if kind == _BLOCK else b[first] + self.hdr
        self.block = memoryview(tmpl.data)[b[first] : cut]
        # Tag (and VR, when explicit): what a _LENGTH element must share with the template.
        self.prefix = bytes(self.block[: 4 if tmpl.implicit else 6])
        self.n = len(self.block)
        self.needed = raw is not None
        self.base_tag = BaseTag(self.tag)
        # The needed elements of a block, by tag (a template has each needed tag once).
        self.raws = {
            tmpl.tags[k]: raw for k in range(first, end) if (raw := tmpl.raws[k]) is not None
        }


class Template:
    __slots__ = (
        "bounds",
        "data",
        "hdrs",
        "implicit",
        "kinds",
        "raws",
        "read_hint",
        "runs",
        "tags",
        "value_lengths",
    )

    def __init__(
        self,
        implicit: bool,
        data: bytes,
        bounds: list[int],
        tags: list[int],
        raws: list[RawDataElement | None],
        start: int,
    ) -> None:
        self.implicit = implicit
        self.data = data  # dataset bytes, from the first element to Pixel Data
        self.bounds = bounds  # element starts in ``data``, then len(data)
        self.tags = tags
        self.raws = raws  # the needed raw element starting at each bound, or None
        self.hdrs: list[int] = []
        self.value_lengths: list[int] = []  # -1: not a plain defined-length element
        for k, p in enumerate(bounds[:-1]):
            hdr = 8 if implicit else header_size(data[p + 4 : p + 6])
            width = 2 if hdr == 8 and not implicit else 4  # explicit short VRs: 16-bit length
            length = int.from_bytes(data[p + hdr - width : p + hdr], "little")
            plain = hdr > 0 and length != UNDEFINED and hdr + length == bounds[k + 1] - p
            self.hdrs.append(hdr)
            self.value_lengths.append(length if plain else -1)
        self.kinds: dict[int, int] = {
            k: _HEADER for k in range(len(tags)) if self._header_only(k, _BIG_VALUE)
        }
        first_big = min((bounds[k] for k in self.kinds), default=bounds[-1])
        self.read_hint = min(start + first_big + 2048, 1 << 20)  # the first read of a sibling
        self.runs: list[_Run] = []
        self._plan()

    def _length_only(self, k: int) -> bool:
        """Whether element k can be scanned by its tag and VR, reading its length (a plain
        element whose value the scan skips or takes whole)."""
        return self.value_lengths[k] >= 0 and (
            self.raws[k] is not None or self.tags[k] not in _NOT_SKIPPED
        )

    def _header_only(self, k: int, minimum: int = 0) -> bool:
        """Whether only the header of element k matters to the scan (and its value is long)."""
        return (
            self.raws[k] is None
            and self.tags[k] not in _NOT_SKIPPED
            and self.value_lengths[k] >= max(minimum, 0)
        )

    def _plan(self) -> None:
        runs: list[_Run] = []
        first = 0
        for k in [*sorted(self.kinds), len(self.tags)]:
            if k > first:
                runs.append(_Run(first, k, _BLOCK, self))
            if k < len(self.tags):
                runs.append(_Run(k, k + 1, self.kinds[k], self))
            first = k + 1
        self.runs = runs

    def follow(self, rd: Reader, pos: int, elements: dict[int, RawDataElement]) -> tuple[int, bool]:
        """Scan a sibling from ``pos`` (its first dataset element) along this template.

        Returns (the offset reached, True) when every template element was matched, else
        (where to go on walking, False); the offset is -stop-1 if the header pass stopped.
        """
        # One pass per file of the series: the per-run work is kept to a comparison in C and
        # a few local operations (values inside the buffer read are sliced here, not viewed).
        implicit, size = self.implicit, rd.size
        learned = False
        data, base = rd.data, rd.base
        end = base + len(data)
        for run in self.runs:
            kind = run.kind
            if kind != _STEP:
                n = run.n
                if pos + n <= size:
                    if pos < base or pos + n > end:
                        data, _ = rd.view(pos, n)
                        base = rd.base
                        end = base + len(data)
                    off = pos - base
                    if kind == _BLOCK:
                        if data.startswith(run.block, off):
                            raws = run.raws
                            if raws:
                                if not elements.keys().isdisjoint(raws):
                                    raise Fallback("a needed tag appears twice")
                                elements.update(raws)
                            pos += n  # within the file: pos + n <= size
                            continue
                    elif kind == _HEADER:
                        if data.startswith(run.block, off):
                            pos += n + run.value_length
                            if pos > size:
                                raise Fallback("an element runs past the end of the file")
                            continue
                    else:
                        if kind == _LENGTH:
                            length = _length(data, off, run.hdr, implicit)
                            same = length != UNDEFINED and data.startswith(run.prefix, off)
                        else:  # _VALUE
                            length = run.value_length
                            same = data.startswith(run.block, off)
                        if same:
                            if run.needed:
                                if run.tag in elements:
                                    raise Fallback("a needed tag appears twice")
                                start = pos + run.hdr
                                pos = start + length
                                if pos > size:
                                    raise Fallback("a needed element runs past the end of the file")
                                if length == 0:
                                    value = cast(
                                        "bytes | None", empty_value_for_VR(run.vr, raw=True)
                                    )
                                elif start >= base and pos <= end:
                                    value = data[start - base : pos - base]
                                else:
                                    vdata, voff = rd.view(start, length)
                                    value = vdata[voff : voff + length]
                                    data, base = rd.data, rd.base
                                    end = base + len(data)
                                elements[run.tag] = RawDataElement(
                                    run.base_tag, run.vr, length, value, start, implicit, True
                                )
                            else:
                                pos += n + length
                                if pos > size:
                                    raise Fallback("an element runs past the end of the file")
                            continue
                learned = True
                if kind == _BLOCK:
                    pos, ok = self._walk(rd, pos, run, elements)
                    data, base = rd.data, rd.base
                    end = base + len(data)
                    if not ok:
                        return pos, False
                    continue
                # Its header changed: from now on compare its tag only, or walk it.
                first = run.first
                eligible = kind != _LENGTH and self._length_only(first)
                self.kinds[first] = _LENGTH if eligible else _STEP
            tag, nxt = step(rd, pos, implicit, elements)
            data, base = rd.data, rd.base
            end = base + len(data)
            if tag != run.tag or nxt < 0:
                return nxt, False
            pos = nxt
        if learned:
            self._plan()
        return pos, True

    def _walk(
        self, rd: Reader, pos: int, run: _Run, elements: dict[int, RawDataElement]
    ) -> tuple[int, bool]:
        """Compare a block element by element; learn how to scan the ones that differ."""
        b, mv = self.bounds, memoryview(self.data)
        for k in range(run.first, run.end):
            n = b[k + 1] - b[k]
            hdr = self.hdrs[k]
            same_header = False
            if pos + n <= rd.size:
                data, off = rd.view(pos, n)
                if data.startswith(mv[b[k] : b[k + 1]], off):
                    raw = self.raws[k]
                    if raw is not None:
                        if self.tags[k] in elements:
                            raise Fallback("a needed tag appears twice")
                        elements[self.tags[k]] = raw
                    pos += n
                    continue
                same_header = hdr > 0 and data.startswith(mv[b[k] : b[k] + hdr], off)
            if same_header and self._header_only(k):
                self.kinds[k] = _HEADER
            elif same_header and self.raws[k] is not None and self.value_lengths[k] >= 0:
                self.kinds[k] = _VALUE
            elif hdr > 0 and self._length_only(k):
                self.kinds[k] = _LENGTH  # checked against the tag at each use
            else:
                self.kinds[k] = _STEP
            tag, nxt = step(rd, pos, self.implicit, elements)
            if tag != self.tags[k] or nxt < 0:
                return nxt, False
            pos = nxt
        return pos, True


def _length(data: bytes, off: int, hdr: int, implicit: bool) -> int:
    """The value length in the element header at ``off`` (8 or 12 bytes, all in ``data``)."""
    if implicit or hdr == 12:
        return int.from_bytes(data[off + hdr - 4 : off + hdr], "little")
    return int.from_bytes(data[off + 6 : off + 8], "little")


def find(size: int) -> Template | None:
    """The template to try for a file of ``size`` bytes, if any."""
    return _BY_SIZE.get(size) or _last


def forget(tmpl: Template) -> None:
    """Drop a template that did not match (its file size then gets a new one)."""
    global _last
    for size, t in list(_BY_SIZE.items()):
        if t is tmpl:
            del _BY_SIZE[size]
    if _last is tmpl:
        _last = None


def remember(
    rd: Reader,
    implicit: bool,
    start: int,
    bounds: list[int],
    stop: int,
    elements: dict[int, RawDataElement],
) -> None:
    """Keep the file just walked (elements at ``bounds``, up to ``stop``) as a template."""
    global _last
    if not bounds or stop - start > _MAX_HEADER:
        return
    data, off = rd.view(start, stop - start)
    data = bytes(data[off : off + stop - start])
    rel = [p - start for p in bounds]
    tags = [
        int.from_bytes(data[p : p + 2], "little") << 16
        | int.from_bytes(data[p + 2 : p + 4], "little")
        for p in rel
    ]
    # A needed element's value starts 8 or 12 bytes after its element start.
    by_value = {raw.value_tell: raw for raw in elements.values()}
    raws: list[RawDataElement | None] = []
    for p, tag in zip(bounds, tags, strict=True):
        raw = by_value.get(p + 8) or by_value.get(p + 12)
        raws.append(raw if raw is not None and raw.tag == tag else None)
    if sum(r is not None for r in raws) != len(elements):
        return  # a needed element outside the walked layout: do not use this file
    tmpl = Template(implicit, data, [*rel, stop - start], tags, raws, start)
    if len(_BY_SIZE) >= _MAX_TEMPLATES:
        _BY_SIZE.pop(next(iter(_BY_SIZE)))
    _BY_SIZE[rd.size] = _last = tmpl


def clear() -> None:
    global _last
    _BY_SIZE.clear()
    _last = None
