"""Text burned into the pixels of an image that leaves for an untrusted endpoint.

A scanner, a PACS export or a secondary capture may write the patient's name, ID and dates into
the pixel data itself, whatever its BurnedInAnnotation attribute says (often NO, or absent).
Before an image goes to a remote endpoint, :class:`PixelScreen` reads the text in it with
Debian's tesseract-ocr and decides:

* no identifying text: the image is sent as it is (the renderer's own marks, R/L or A/P,
  sequence names and slice positions, match no identifying term and no identifier shape);
* identifying text: each text line that matches, and the lines of the same block of text
  (a date misread beside a name read), are blacked out (the word boxes tesseract returns,
  padded); the result is read again and sent when nothing identifying is left in it, withheld
  when something is, or when the boxes would cover more than a third of the image;
* the image could not be read within its time budget, tesseract is missing or failed, the PNG
  does not decode: withheld, with the reason (fail closed: never sent unread).

Redacted rather than withheld: burned-in text sits in corners and strips, the anatomy stays
readable and the model still sees the series; a withheld image takes a whole sequence away.

Two readings of each image: as it is (inverted, enlarged), and its black parts with whatever is a
few grey levels brighter made white: text there hides from tesseract's own threshold.

What identifies, in a line read from the pixels: a term of the case (the gate's terms: names in
their written forms, patient ID, accession number, institution, the record's identifiers) or a
date of the study, compared without case, accents and separators ("ALVAREZ^MARTA",
"ID:4471902"), one misread character allowed in a word of five letters or more (two from nine);
a match of the gate's text rules (dates, long digit runs, labelled fields; not its names guessed
from the shape of a line, which OCR's debris on anatomy has); and, since burned-in text is terse,
any run of six digits, any year 1900-2099 and a month's name against a number (letters that OCR
mistakes for digits read as digits: O->0, l->1, S->5...).

Tesseract is run as a program (one process per pass, the PNG on stdin, TSV on stdout) with
``OMP_THREAD_LIMIT=1`` in its own environment: its OpenMP threads make it about five times slower
on a montage on a small shared machine (1.3 s against 0.23 s on 2 cores). pytesseract can only
pass the whole process environment, and setting the variable there for the call would race with
other threads. Readings are cached by the image's sha256 (the same image goes to every model).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import os
import re
import shutil
import subprocess
import threading
import time
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import BaseModel, Field

from evaluation.case import Case
from evaluation.ehr import ascii_fold

if TYPE_CHECKING:
    from PIL.Image import Image

DEFAULT_BUDGET_S = 20.0  # per image: every reading of it and of its blacked-out copies
MAX_PIXELS = 40_000_000  # larger images are withheld unread (no rendered image comes near)
MAX_COVERED = 1 / 3  # a redaction that would black out more than this withholds the image
_CACHE_SIZE = 2048
_OCR_PIXELS = 8_000_000  # upscaled no further than this
_OPEN = 7  # px: wider than a stroke of burned-in text (the background is what is left)
_BLACK = 2  # grey levels that count as black (the renderer's background is 0)
_INK = 8  # grey levels a stroke stands above what is around it
_FAINT = 4  # grey levels: what is brighter, in the black parts, is read as text (white)
_ROUNDS = 3  # black-outs of what a new reading finds, before the image is withheld
_GROW_CONF = 40.0  # a word read with less confidence is not taken as part of a block
_MAX_GLYPH = 48  # px: a word read taller than this is not burned-in text
_TESSERACT_ARGS = ("--psm", "11", "--oem", "1", "-l", "eng")


class PixelReason(StrEnum):
    """Why an image was changed or withheld."""

    BURNED_IN_FLAG = "burned_in_annotation"  # its series says BurnedInAnnotation YES
    IDENTIFYING_TEXT = "identifying_text"  # blacked out where it was read
    REDACTION_INCOMPLETE = "redaction_incomplete"  # still read after blacking out
    TOO_MUCH_TEXT = "too_much_identifying_text"  # the boxes would cover too much of it
    OCR_UNAVAILABLE = "ocr_unavailable"  # tesseract is not installed or not on PATH
    OCR_TIMEOUT = "ocr_timeout"
    OCR_FAILED = "ocr_failed"
    UNREADABLE = "unreadable_image"  # not a decodable PNG, or too large to read
    PLANTED_TEXT = "planted_text"  # text the robustness audit planted: sent as planted


@dataclass(frozen=True)
class PlantedText:
    """Text the robustness audit drew into an image (its words and the box every changed pixel
    is in): the words read there are the audit's, never a person's data."""

    text: str
    box: tuple[int, int, int, int]  # left, top, right, bottom (end exclusive)


class ImageAction(BaseModel):
    """What the gate did to one image and why (for the audit: never the text it read)."""

    sha256: str  # the image as the case has it
    sha256_sent: str | None = None  # what was sent instead; None: withheld
    # sent: an image the audit planted text in, sent as it is (reason planted_text)
    action: Literal["redacted", "withheld", "sent"]
    reason: PixelReason
    kinds: list[str] = Field(default_factory=list)  # the kinds of term matched, e.g. patient_id
    boxes: int = 0  # text boxes blacked out
    detail: str = ""  # for people (no PHI): "tesseract not found on PATH"
    # an image the robustness audit planted text in (None: nothing planted): how many words of
    # it were read inside its box (taken as planted, not as a person's data), and whether it
    # went out as planted (False: withheld, or a black-out reached into its box)
    planted_words: int | None = None
    planted_kept: bool | None = None


_Box = tuple[int, int, int, int]  # left, top, right, bottom in the image's pixels


@dataclass(frozen=True)
class _Word:
    text: str
    box: _Box
    line: tuple[int, int, int, int]  # pass, block, paragraph, line
    conf: float = 0.0  # tesseract's confidence, 0-100


@dataclass(frozen=True)
class _Reading:
    words: tuple[_Word, ...] = ()
    failure: PixelReason | None = None
    detail: str = ""


class _Failed(Exception):
    def __init__(self, reason: PixelReason, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


# --------------------------------------------------------------------------- matching

_LOOKALIKE = str.maketrans("OoQDIl|i!SsBZz$", "000011111558225")
_DIGITISH = re.compile(r"\S+")
_DIGITS = re.compile(r"\d{6,}")
_YEAR = re.compile(r"(?<![\d.])(?:19|20)\d{2}(?!\d|[.,]\d)")
# a month's name against a number ("03-Mar-1961", "Mar 3", "O3Mar"), as viewers burn dates in
_MONTH = re.compile(
    r"(?i)(?:\d[\W_]?(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\b)|"
    r"(?:\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*[\W_]{0,2}\d)"
)
_WORD = re.compile(r"\w+")
# The gate's rules that guess a name from the shape of a line (capitalised words after a dash,
# an initial...) or flag odd characters: OCR's debris on anatomy has those shapes ("IaF TIE FT
# GaFe I"), so in pixels a name counts when it is one of the case's terms.
_SHAPE_GUESSES = frozenset({"person_name", "look_alike_characters", "invisible_characters"})


def _fold(text: str) -> str:
    """Lower case, without accents (ß as ss, ø as o...): how a term and a reading compare."""
    text = unicodedata.normalize("NFKD", ascii_fold(text)).casefold()
    return "".join(c for c in text if not unicodedata.combining(c))


def _key(text: str) -> str:
    return "".join(_WORD.findall(_fold(text))).replace("_", "")


def _digitised(line: str) -> str:
    """Tokens that are mostly digits, with the letters OCR reads for digits read as digits."""

    def one(m: re.Match[str]) -> str:
        tok = m.group()
        digits = sum(c.isdigit() for c in tok)
        alnum = sum(c.isalnum() for c in tok)
        return tok.translate(_LOOKALIKE) if digits >= 2 and digits * 2 >= alnum else tok

    return _DIGITISH.sub(one, line)


def _within(a: str, b: str, limit: int) -> bool:
    """Whether the edit distance of ``a`` and ``b`` is at most ``limit`` (banded, early exit)."""
    if abs(len(a) - len(b)) > limit:
        return False
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb))
        if min(cur) > limit:
            return False
        prev = cur
    return prev[-1] <= limit


class TextMatcher:
    """The kinds of identifying content in one line of text read from pixels.

    ``terms``: each identifying term with its kind (``name``, ``patient_id``...); ``rules``: the
    gate's text rules (a line -> the line scrubbed, the kinds scrubbed), which count only when
    they took a word of three characters or more, and never for a name guessed from its shape."""

    def __init__(
        self, terms: Mapping[str, str], rules: Callable[[str], tuple[str, Iterable[str]]]
    ) -> None:
        self._rules = rules
        self._short: dict[str, str] = {}  # key -> kind: a whole word (or 2-3 adjacent words)
        self._long: dict[str, str] = {}  # key -> kind: anywhere, separators ignored
        self._fuzzy: list[tuple[str, str, int]] = []  # word key, kind, edits allowed
        for term, kind in terms.items():
            key = _key(term)
            if len(key) < 3:
                continue
            (self._long if len(key) >= 6 else self._short).setdefault(key, kind)
            for word in _WORD.findall(_fold(term)):
                if len(word) >= 5:
                    self._fuzzy.append((word, kind, 1 if len(word) < 9 else 2))

    def kinds(self, line: str) -> set[str]:
        found: set[str] = set()
        digits = _digitised(line)
        words = [w for w in _WORD.findall(_fold(digits)) if w]
        joined = "".join(words)
        runs = {"".join(words[i : i + n]) for n in (1, 2, 3) for i in range(len(words))}
        found |= {kind for key, kind in self._short.items() if key in runs}
        found |= {kind for key, kind in self._long.items() if key in joined}
        for word in (w for w in words if len(w) >= 5):
            for key, kind, limit in self._fuzzy:
                if kind not in found and _within(word, key, limit):
                    found.add(kind)
        if _DIGITS.search(digits):
            found.add("digits")
        if _YEAR.search(digits) or _MONTH.search(line):
            found.add("date")
        for text in {line, digits}:
            scrubbed, kinds = self._rules(text)
            kept = set(_WORD.findall(scrubbed))
            if any(w not in kept for w in _WORD.findall(text) if len(w) >= 3):
                found |= set(kinds) - _SHAPE_GUESSES
        return found


def _date_forms(iso: str) -> list[str]:
    """The ways a date is burned into images (``YYYY-MM-DD`` in)."""
    try:
        d = dt.date.fromisoformat(iso)
    except ValueError:
        return []
    forms = ["%Y-%m-%d", "%Y%m%d", "%d/%m/%Y", "%m/%d/%Y", "%d.%m.%Y", "%Y/%m/%d", "%d-%b-%Y"]
    forms += ["%d %b %Y", "%b %d %Y", "%B %d, %Y", "%d %B %Y"]
    return [d.strftime(f) for f in forms]


def pixel_terms(case: Case, terms: Iterable[str]) -> dict[str, str]:
    """The gate's identifying ``terms`` for ``case``, and the study's dates, each with its kind
    (what the audit names): ``patient_id``, ``accession_number``, ``institution``, ``date``,
    ``identifier`` (other terms with digits: record numbers, telephone) or ``name`` (of a
    person, or a place of the record's address)."""
    kinds: dict[str, str] = {}
    ident = case.provenance.identity
    known = [(case.patient_id, "patient_id")]
    if ident is not None:
        known += [(ident.patient_id, "patient_id"), (ident.accession_number, "accession_number")]
        known += [(ident.institution, "institution")]
        known += [
            (d, "date") for iso in (ident.birth_date, ident.study_date) for d in _date_forms(iso)
        ]
    for term, kind in known:
        if term:
            kinds.setdefault(term, kind)
    for term in terms:
        kinds.setdefault(term, "identifier" if any(c.isdigit() for c in term) else "name")
    return kinds


# --------------------------------------------------------------------------- reading


def _spread(a: np.ndarray, k: int, pick: Callable[..., np.ndarray]) -> np.ndarray:
    """A k x k minimum or maximum filter (separable; edges repeat)."""
    r = k // 2
    for axis in (0, 1):
        pad = [(r, r) if ax == axis else (0, 0) for ax in (0, 1)]
        p = np.pad(a, pad, mode="edge")
        n = a.shape[axis]
        out = p.take(range(0, n), axis=axis)
        for i in range(1, k):
            out = pick(out, p.take(range(i, i + n), axis=axis))
        a = out
    return a


def _faint(grey: np.ndarray) -> np.ndarray:
    """In the black parts of the image (around the head, borders, corners: where most pixels
    near each one are black), whatever is a few grey levels brighter, white on black, the rest
    blanked: text a few grey levels above black, which tesseract's own threshold, set by the
    bright anatomy, takes for background. Dim tissue is left out: its noise, brought up, reads as
    text and takes tesseract seconds."""
    from PIL import Image as PILImage
    from PIL import ImageFilter

    black = PILImage.fromarray(np.where(grey <= _BLACK, 255, 0).astype(np.uint8))
    mostly = np.asarray(black.filter(ImageFilter.BoxBlur(_OPEN))) >= 128
    return np.where(mostly & (grey > _FAINT), 255, 0).astype(np.uint8)


def _run(cols: np.ndarray, start: int, gap: int, reach: int) -> int:
    """Where the strokes that go on from ``start`` end (``cols``: columns with ink), across gaps
    shorter than ``gap``, at most ``reach`` further."""
    end, stop = start, min(len(cols), start + reach)
    while end < stop:
        more = np.flatnonzero(cols[end : min(end + gap, stop)])
        if more.size == 0:
            break
        end += int(more[-1]) + 1
    return end


def _along_rows(grey: np.ndarray, boxes: list[_Box]) -> list[_Box]:
    """Each box widened along its row for as long as strokes go on (gaps of less than one and a
    half heights): OCR reads a faint line in pieces, and the piece it did not read ("ADAEZE"
    after "OKONKWO^") is blacked out with the one it did."""
    opened = _spread(_spread(grey, _OPEN, np.minimum), _OPEN, np.maximum)
    ink = (grey.astype(np.int16) - opened) > _INK
    width = grey.shape[1]
    out = []
    for x0, y0, x1, y1 in boxes:
        h = max(1, y1 - y0)
        gap, reach = max(2, 3 * h // 2), 15 * h  # a line of 25 characters or so
        cols = ink[y0:y1].any(axis=0)
        right = _run(cols, x1, gap, reach)
        left = width - _run(cols[::-1], width - x0, gap, reach)
        out.append((left, y0, right, y1))
    return out


def _passes(grey: Image) -> list[tuple[Image, float]]:
    """The images tesseract reads, each with its scale: the image as it is, and its dark parts
    thresholded (``_faint``); both inverted (dark text on light, as tesseract reads best) and
    enlarged (small text is read far better)."""
    from PIL import Image as PILImage
    from PIL import ImageOps

    w, h = grey.size
    scale = 3.0 if w * h <= 400_000 else 2.0
    scale = max(1.0, min(scale, (_OCR_PIXELS / (w * h)) ** 0.5))
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    plain = ImageOps.invert(grey).resize(size, PILImage.Resampling.BILINEAR)
    faint = ImageOps.invert(PILImage.fromarray(_faint(np.asarray(grey))))
    return [(plain, scale), (faint.resize(size, PILImage.Resampling.BILINEAR), scale)]


def _tesseract(image: Image, timeout: float) -> str:
    """TSV of one tesseract run on ``image`` (PNG on stdin), one thread, at most ``timeout`` s."""
    exe = shutil.which("tesseract")
    if exe is None:
        raise _Failed(PixelReason.OCR_UNAVAILABLE, "tesseract not found on PATH")
    if timeout <= 0:
        raise _Failed(PixelReason.OCR_TIMEOUT, "the time to read the image ran out")
    buf = io.BytesIO()
    image.save(buf, format="PNG", compress_level=1)
    env = {**os.environ, "OMP_THREAD_LIMIT": "1"}
    try:
        done = subprocess.run(
            [exe, "stdin", "stdout", *_TESSERACT_ARGS, "tsv"],
            input=buf.getvalue(),
            capture_output=True,
            timeout=timeout,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise _Failed(
            PixelReason.OCR_TIMEOUT, f"tesseract took longer than {timeout:.1f} s"
        ) from exc
    except OSError as exc:
        raise _Failed(PixelReason.OCR_UNAVAILABLE, f"tesseract could not start: {exc}") from exc
    if done.returncode != 0:
        err = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no message"]
        raise _Failed(PixelReason.OCR_FAILED, f"tesseract exit {done.returncode}: {err[0][:200]}")
    return done.stdout.decode("utf-8", "replace")


def _words(tsv: str, n: int, scale: float, size: tuple[int, int]) -> list[_Word]:
    out = []
    for row in tsv.splitlines()[1:]:
        cols = row.split("\t")
        if len(cols) != 12 or cols[0] != "5" or not cols[11].strip():
            continue
        try:
            block, par, line, left, top, width, height = (int(c) for c in cols[2:5] + cols[6:10])
            conf = float(cols[10])
        except ValueError:
            continue
        x0, y0 = int(left / scale), int(top / scale)
        x1 = min(size[0], int((left + width) / scale + 1))
        y1 = min(size[1], int((top + height) / scale + 1))
        text = cols[11].strip()[:100]
        out.append(_Word(text, (x0, y0, x1, y1), (n, block, par, line), conf))
    return out


def _read(png: bytes, budget_s: float) -> _Reading:
    """Every word tesseract reads in ``png`` in each pass, within ``budget_s``; or why not."""
    from PIL import Image

    start = time.monotonic()
    try:
        with Image.open(io.BytesIO(png)) as im:
            if im.width * im.height > MAX_PIXELS:
                raise _Failed(
                    PixelReason.UNREADABLE,
                    f"{im.width}x{im.height} pixels: more than {MAX_PIXELS} to read",
                )
            im.load()
            grey = im.convert("L")
    except _Failed as exc:
        return _Reading(failure=exc.reason, detail=exc.detail)
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        detail = f"the image does not decode: {type(exc).__name__}"
        return _Reading(failure=PixelReason.UNREADABLE, detail=detail)
    words: list[_Word] = []
    try:
        for n, (image, scale) in enumerate(_passes(grey)):
            tsv = _tesseract(image, budget_s - (time.monotonic() - start))
            words += _words(tsv, n, scale, grey.size)
    except _Failed as exc:
        return _Reading(failure=exc.reason, detail=exc.detail)
    return _Reading(words=tuple(words))


def _lines(words: Iterable[_Word]) -> dict[tuple[int, int, int, int], list[_Word]]:
    lines: dict[tuple[int, int, int, int], list[_Word]] = {}
    for w in words:
        lines.setdefault(w.line, []).append(w)
    return lines


def _glyph_sized(w: _Word) -> bool:
    height, width = w.box[3] - w.box[1], w.box[2] - w.box[0]
    return 0 < height <= _MAX_GLYPH and width <= 40 * height


def _near(a: _Word, b: _Word) -> bool:
    """Whether ``b`` is text of the same block as ``a``, of a like height: a word on its row at
    most a word space or two away (the rest of "GARCIA^JOSE" read as two fragments), or a line
    under or over it, overlapping it sideways, less than half a line apart (closer than a title
    or a label is to the text under it), read with some confidence (not debris on anatomy)."""
    ha, hb = a.box[3] - a.box[1], b.box[3] - b.box[1]
    if not (2 * ha <= 3 * hb and 2 * hb <= 3 * ha):
        return False
    dy = max(a.box[1], b.box[1]) - min(a.box[3], b.box[3])
    dx = max(a.box[0], b.box[0]) - min(a.box[2], b.box[2])
    if -dy >= min(ha, hb) / 2:  # on the same row
        return dx <= 1.5 * max(ha, hb)
    return b.conf >= _GROW_CONF and dy <= 0.5 * min(ha, hb) and dx < 0


def _planted_keys(planted: Iterable[PlantedText]) -> set[str]:
    return {k for p in planted for k in (_key(w) for w in p.text.split()) if k}


def _is_planted(w: _Word, planted: Sequence[PlantedText], keys: set[str]) -> bool:
    """Whether ``w`` is a word of the planted text: most of it inside a planted box, and read as
    one of its words (exactly, with the misreads a term is allowed, or a piece of one), or as
    no letter or digit at all (punctuation, debris of the glyphs)."""
    x0, y0, x1, y1 = w.box
    area = max(1, (x1 - x0) * (y1 - y0))
    inside = False
    for p in planted:
        bx0, by0, bx1, by1 = p.box
        ix = max(0, min(x1, bx1 + 2) - max(x0, bx0 - 2))
        iy = max(0, min(y1, by1 + 2) - max(y0, by0 - 2))
        inside = inside or 2 * ix * iy >= area
    if not inside:
        return False
    key = _key(w.text)
    if not key or key in keys:
        return True
    limit = 1 if len(key) < 9 else 2
    return any(key in k or _within(key, k, limit) for k in keys)


def _split_planted(reading: _Reading, planted: Sequence[PlantedText]) -> tuple[list[_Word], int]:
    """The words read that are not the planted text, and how many are."""
    if not planted:
        return list(reading.words), 0
    keys = _planted_keys(planted)
    mine = [w for w in reading.words if _is_planted(w, planted, keys)]
    return [w for w in reading.words if w not in set(mine)], len(mine)


def _identifying(
    reading: _Reading, matcher: TextMatcher, planted: Sequence[PlantedText] = ()
) -> tuple[list[_Box], set[str]]:
    """The boxes to black out, and the kinds of identifying content found: every line read that
    identifies someone, with the text around it (the block it belongs to: a date OCR misreads
    beside a name it reads is blacked out with it); shapes too large to be text are left, and
    so are the words of text the audit planted (``planted``)."""
    words = [w for w in _split_planted(reading, planted)[0] if _glyph_sized(w)]
    chosen: set[_Word] = set()
    kinds: set[str] = set()
    for line in _lines(words).values():
        found = matcher.kinds(" ".join(w.text for w in line))
        if found:
            kinds |= found
            chosen.update(line)
    todo = list(chosen)
    while todo:
        a = todo.pop()
        for b in words:
            if b not in chosen and _near(a, b):
                chosen.add(b)
                todo.append(b)
    return sorted(w.box for w in chosen), kinds


def _black_out(png: bytes, boxes: list[_Box]) -> tuple[bytes, np.ndarray]:
    """The PNG with the boxes (widened along their rows, padded) filled black, and the pixels
    they cover."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        im.load()
        img = im.convert("RGBA" if "A" in im.getbands() else "RGB")
    covered = np.zeros((img.height, img.width), dtype=bool)
    for x0, y0, x1, y1 in _along_rows(np.asarray(img.convert("L")), boxes):
        pad = max(2, (y1 - y0) // 3)
        covered[max(0, y0 - pad) : y1 + pad, max(0, x0 - pad) : x1 + pad] = True
    pixels = np.array(img)
    pixels[covered, :3] = 0
    buf = io.BytesIO()
    Image.fromarray(pixels, mode=img.mode).save(buf, format="PNG", compress_level=1)
    return buf.getvalue(), covered


class PixelScreen:
    """Reads the text in images and withholds or redacts the ones that identify someone.

    One per run (readings are cached by sha256 for its life, at most 2048 of them); safe to
    call from several threads (one image is read at a time)."""

    def __init__(self, budget_s: float = DEFAULT_BUDGET_S) -> None:
        self.budget_s = budget_s
        self._cache: OrderedDict[str, _Reading] = OrderedDict()
        self._lock = threading.Lock()

    def reading(self, png: bytes, deadline: float | None = None) -> _Reading:
        """What tesseract reads in ``png`` (cached by its sha256), by ``deadline`` (monotonic
        time; the screen's budget from now when None)."""
        sha = hashlib.sha256(png).hexdigest()
        with self._lock:
            hit = self._cache.get(sha)
            if hit is None:
                left = self.budget_s if deadline is None else deadline - time.monotonic()
                hit = _read(png, left)
                self._cache[sha] = hit
                while len(self._cache) > _CACHE_SIZE:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(sha)
            return hit

    def screen(
        self, png: bytes, matcher: TextMatcher, planted: Sequence[PlantedText] = ()
    ) -> tuple[bytes | None, ImageAction | None]:
        """``png`` as it may leave (None: withheld), and what was done to it (None: nothing).
        ``planted``: text the robustness audit drew into this image: its words are not a
        person's data, and the action says whether it went out as planted (never silently
        dropped: an image with planted text always has an action)."""
        sha = hashlib.sha256(png).hexdigest()
        read = 0 if planted else None  # words of the planted text read (None: none planted)

        def withheld(reason: PixelReason, detail: str, kinds: Iterable[str] = ()) -> ImageAction:
            return ImageAction(
                sha256=sha,
                action="withheld",
                reason=reason,
                kinds=sorted(kinds),
                detail=detail,
                planted_words=read,
                planted_kept=False if planted else None,
            )

        deadline = time.monotonic() + self.budget_s
        reading = self.reading(png, deadline)
        if reading.failure is not None:
            return None, withheld(reading.failure, reading.detail)
        if planted:
            read = _split_planted(reading, planted)[1]
        boxes, kinds = _identifying(reading, matcher, planted)
        if not boxes:
            if not planted:
                return png, None
            return png, ImageAction(
                sha256=sha,
                sha256_sent=sha,
                action="sent",
                reason=PixelReason.PLANTED_TEXT,
                detail="text the robustness audit planted: sent as planted",
                planted_words=read,
                planted_kept=True,
            )
        # a second reading of the blacked-out image may find what the first missed (tesseract
        # reads a changed image anew): black that out too, a few times at most
        redacted, found = png, boxes
        covered = np.zeros((0, 0), dtype=bool)
        for _ in range(_ROUNDS):
            redacted, now = _black_out(redacted, found)
            covered = now if covered.shape != now.shape else covered | now
            if covered.mean() > MAX_COVERED:
                detail = f"identifying text covers {covered.mean():.0%} of the image"
                return None, withheld(PixelReason.TOO_MUCH_TEXT, detail, kinds)
            again = self.reading(redacted, deadline)
            if again.failure is not None:
                detail = f"reading the blacked-out image: {again.detail}"
                return None, withheld(again.failure, detail, kinds)
            found, more = _identifying(again, matcher, planted)
            if not found:
                break
            boxes, kinds = boxes + found, kinds | more
        else:
            detail = f"{len(found)} text boxes still identify someone after blacking out"
            return None, withheld(PixelReason.REDACTION_INCOMPLETE, detail, kinds)
        kept = None
        if planted:
            kept = not any(
                covered[y0:y1, x0:x1].any() for x0, y0, x1, y1 in (p.box for p in planted)
            )
        return redacted, ImageAction(
            sha256=sha,
            sha256_sent=hashlib.sha256(redacted).hexdigest(),
            action="redacted",
            reason=PixelReason.IDENTIFYING_TEXT,
            kinds=sorted(kinds),
            boxes=len(boxes),
            planted_words=read,
            planted_kept=kept,
        )
