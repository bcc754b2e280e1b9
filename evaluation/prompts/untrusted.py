"""Untrusted text in a prompt: made inert, then put in a container it cannot close.

Whatever a prompt shows that the benchmark did not write itself (the clinical note, the record's
text block, labels derived from DICOM headers, a multi-turn reveal, a model's answer in front of
a grader) goes through here, and the system prompt says that what is inside is data:

* :func:`inert` normalises it: control, invisible and bidi characters and smuggled Unicode tag
  characters dropped, line separators made newlines, look-alike quotes, angle brackets and bars
  (fullwidth, small forms, CJK brackets, double primes) folded to ASCII, chat control tokens
  (``<|im_start|>``, ``[INST]``, ``<<SYS>>``, ``<start_of_turn>``, ``</s>``...) and role labels
  that open a line (``SYSTEM:``, ``Assistant:``, ``### Instruction``...) replaced by a
  placeholder, whatever letters spell them (Cyrillic, Greek, fullwidth and mathematical
  look-alikes read as Latin), image markers defused. Ordinary clinical text is left as it is.
* :func:`data_block` puts it between a line ``<KIND-TOKEN>`` and a line ``</KIND-TOKEN>``,
  XML-escaped (``&``, ``<``, ``>``), so it holds no tag at all. TOKEN is 16 letters derived from
  the text: the same study gives the same prompt (requests are cached and reproduced by
  content), yet the text cannot contain it (a text holding a hash of itself); the rare text that
  does gets the next one. Letters only and lines of their own, so the PHI gate's scrubbing,
  which runs on the rendered prompt, leaves the boundaries alone.
* :func:`data_blocks` reads the containers back, :func:`outside_data` is the prompt with each
  container replaced by ``<KIND/>`` (what the benchmark itself wrote), :func:`map_data` rewrites
  a rendered prompt piece by piece (outside, and each container's text apart), so that a
  rewrite (the PHI gate's) cannot read across a boundary.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

ROLE_PLACEHOLDER = "[role label removed]"
CONTROL_PLACEHOLDER = "[control token removed]"
_TOKEN_LEN = 16
_KIND = re.compile(r"[a-z]+(?:-[a-z]+)*")

# Characters that are read as a quote, an angle bracket, a bar or a line break.
_FOLD = str.maketrans(
    {
        # (typographic quotes stay: “ ” „ « » are how notes are written)
        **dict.fromkeys("\u2033\u2036\u3003\u02dd\u02ba\u05f4\u275d\u275e\u301d\u301e\u301f", '"'),
        **dict.fromkeys("\u2039\u3008\u2329\u27e8\u1438\u02c2\u300a\u276e\u29fc", "<"),
        **dict.fromkeys("\u203a\u3009\u232a\u27e9\u1433\u02c3\u300b\u276f\u29fd", ">"),
        **dict.fromkeys("\u2223\u01c0\u2502\u23d0\u2758", "|"),
        **dict.fromkeys("\u2028\u2029\u0085\x0b\x0c", "\n"),
    }
)
# Latin look-alikes in other scripts, for finding role labels and control tokens (only there:
# the text itself keeps its Cyrillic or Greek).
_SKELETON = str.maketrans(
    "АВЕЅІЈКМНОРСТХУԁԛԝаеһіјорсѕхуԜԚΑΒΕΖΗΙΚΜΝΟΡΤΥΧαεικνορτυχ",
    "ABESIJKMHOPCTXYdqwaehijopcsxyWQABEZHIKMNOPTYXaeikvoptux",
)
_CONTROL = re.compile(
    r"<\|[^|<>\n]{0,64}\|>"  # ChatML, Llama 3, DeepSeek (after folding its fullwidth bars)
    r"|\[\s*/?\s*(?:inst|sys|system_prompt|tool_calls|available_tools|tool_results|img|"
    r"img_break|img_end)\s*\]"  # Llama 2, Mistral
    r"|<<\s*/?\s*sys\s*>>"
    r"|</?\s*(?:s|bos|eos|start_of_turn|end_of_turn|start_of_image|end_of_image|image|img|"
    r"system|user|assistant|human|developer|im_start|im_end)\s*>",
    re.I,
)
_ROLE = re.compile(
    r"^([^\w\n#]*)(?:(system|assistant|user|human|developer)[^\w\n:]{0,3}:"
    r"|#{1,6}[ \t]*(?:instructions?|response|input|system|assistant|user|human|developer)\b[ \t]*:?)",
    re.I | re.M,
)
_IMAGE_MARKER = re.compile(r"\[\s*\[|\]\s*\]")


def _drop(c: str) -> bool:
    """Characters that print nothing or steer the display: format (zero-width, bidi, tag
    characters), controls other than newline and tab, variation selectors, lone surrogates."""
    if c in "\n\t":
        return False
    cat = unicodedata.category(c)
    return cat in ("Cc", "Cf", "Cs") or "\ufe00" <= c <= "\ufe0f" or "\U000e0100" <= c <= "\U000e01ef"  # fmt: skip


def _fold(c: str) -> str:
    """Fullwidth, small-form and mathematical letters and signs as ASCII (what they read as)."""
    o = ord(c)
    if 0xFF01 <= o <= 0xFF5E or 0xFE50 <= o <= 0xFE6B or 0x1D400 <= o <= 0x1D7FF:
        return unicodedata.normalize("NFKC", c)
    return c


# What ``_drop`` drops of ASCII (controls other than newline and tab): plain text is made inert
# by str.translate, not a character at a time (tests/test_prompt_injection.py checks the two agree)
_ASCII_DROP = dict.fromkeys([*range(0x09), *range(0x0B, 0x20), 0x7F])


def _skeleton(text: str) -> tuple[str, list[int] | None]:
    """``text`` as a reader may take it (compatibility forms and look-alikes as Latin,
    accents off), with the index in ``text`` of each of its characters (None: the same
    indices, as for ASCII, which reads as itself)."""
    if text.isascii():
        return text, None
    chars: list[str] = []
    where: list[int] = []
    for i, c in enumerate(text):
        for d in unicodedata.normalize("NFKD", c).translate(_SKELETON):
            if not unicodedata.combining(d):
                chars.append(d)
                where.append(i)
    return "".join(chars), where


def _replace(text: str, pattern: re.Pattern[str], placeholder: str, group: int) -> str:
    skel, where = _skeleton(text)
    spans = []
    for m in pattern.finditer(skel):
        start = m.end(1) if group else m.start()
        if start >= m.end():
            continue
        if where is None:
            spans.append((start, m.end()))
        else:
            spans.append((where[start], where[m.end() - 1] + 1))
    for a, b in reversed(spans):
        text = text[:a] + placeholder + text[b:]
    return text


def inert(value: object) -> str:
    """Untrusted text made inert for a prompt (see the module's docstring); None is ""."""
    if value is None:
        return ""
    text = str(value).replace("\r\n", "\n").replace("\r", "\n").translate(_FOLD)
    if text.isascii():
        text = text.translate(_ASCII_DROP)
    else:
        text = "".join(_fold(c) for c in text if not _drop(c))
    text = _replace(text, _CONTROL, CONTROL_PLACEHOLDER, 0)
    text = _replace(text, _ROLE, ROLE_PLACEHOLDER, 1)
    return _IMAGE_MARKER.sub(lambda m: m.group()[0] + " " + m.group()[-1], text)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _unescape(text: str) -> str:
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def _token(kind: str, body: str) -> str:
    low = body.lower()
    for n in range(1000):
        digest = hashlib.sha256(f"{kind}\0{n}\0{body}".encode("utf-8", "replace")).digest()
        token = "".join(chr(97 + b % 26) for b in digest[:_TOKEN_LEN])
        if token not in low:
            return token
    raise AssertionError("no boundary token found")  # pragma: no cover: 1000 hash collisions


def data_block(value: object, kind: str) -> str:
    """``value`` made inert, escaped and fenced: ``<kind-TOKEN>`` / text / ``</kind-TOKEN>``."""
    if not _KIND.fullmatch(kind):
        raise ValueError(f"a container kind is lowercase words joined by '-', not {kind!r}")
    body = _escape(inert(value))
    tag = f"{kind}-{_token(kind, body)}"
    return f"<{tag}>\n{body}\n</{tag}>"


_BLOCK = re.compile(
    r"^<(?P<kind>[a-z]+(?:-[a-z]+)*)-(?P<token>[a-z]{" + str(_TOKEN_LEN) + r"})>\n"
    r"(?P<body>.*?)\n</(?P=kind)-(?P=token)>$",
    re.M | re.S,
)


@dataclass(frozen=True)
class DataBlock:
    """One container of a rendered prompt: its kind, boundary token and the text it holds."""

    kind: str
    token: str
    text: str
    start: int
    end: int


def data_blocks(text: str) -> list[DataBlock]:
    """The containers of a rendered prompt, in order, with their text unescaped."""
    return [
        DataBlock(m["kind"], m["token"], _unescape(m["body"]), m.start(), m.end())
        for m in _BLOCK.finditer(text)
    ]


def outside_data(text: str) -> str:
    """The prompt with each container replaced by ``<kind/>``: what the benchmark wrote."""
    return _BLOCK.sub(lambda m: f"<{m['kind']}/>", text)


def map_data(text: str, fn: Callable[[str], str]) -> str:
    """``fn`` applied to the text outside the containers and to each container's text apart,
    the containers kept: for a rewrite of a rendered prompt (the PHI gate's scrubbing) that must
    not read across a boundary, where a pattern running to the end of the next line would
    take a closing tag with it."""
    out: list[str] = []
    pos = 0
    for m in _BLOCK.finditer(text):
        out.append(fn(text[pos : m.start()]) if m.start() > pos else "")
        body = _escape(fn(_unescape(m["body"])))
        token = m["token"] if m["token"] not in body.lower() else _token(m["kind"], body)
        out.append(f"<{m['kind']}-{token}>\n{body}\n</{m['kind']}-{token}>")
        pos = m.end()
    out.append(fn(text[pos:]) if pos < len(text) else "")
    return "".join(out)


def check_blocks(text: str) -> None:
    """Raise ValueError when a rendered prompt opens a container it does not close (or the
    reverse): a template that fences by hand, or a fence broken on the way."""
    rest = outside_data(text)
    stray = re.search(rf"^</?[a-z]+(?:-[a-z]+)*-[a-z]{{{_TOKEN_LEN}}}>$", rest, re.M)
    if stray:
        raise ValueError(f"unbalanced data container {stray.group()!r} in a rendered prompt")
