"""Text normalisation shared by the scorers: case, accents, punctuation, British/American
spelling and plurals, so that "Haemorrhages" and "hemorrhage" compare equal."""

from __future__ import annotations

import re
import unicodedata

# Spelling: rewrite to one (American) form; applied identically to both sides of a comparison.
_SPELLING: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), r)
    for p, r in (
        (r"haem", "hem"),
        (r"aem", "em"),  # ischaemic, anaemia, hypoglycaemia, leukaemia
        (r"paed", "ped"),
        (r"\baet", "et"),
        (r"\boe", "e"),  # oedema, oesophagus
        (r"oea\b", "ea"),  # diarrhoea
        (r"foet", "fet"),
        (r"coel", "cel"),
        (r"anaes", "anes"),
        (r"\b(tum|col|behavi|hum|fav)our", r"\1or"),
        (r"\b(cent|fib|met|lit|theat)re\b", r"\1er"),
        (r"\bgrey\b", "gray"),
        (r"\bageing\b", "aging"),
        (r"([a-z]{3,})is(e|ed|es|ing|ation)\b", r"\1iz\2"),  # localised -> localized
    )
)
_IRREGULAR_PLURALS = {
    "metastases": "metastasis",
    "abscesses": "abscess",
    "foci": "focus",
    "emboli": "embolus",
    "thrombi": "thrombus",
    "diagnoses": "diagnosis",
    "thalami": "thalamus",
    "nuclei": "nucleus",
    "gyri": "gyrus",
    "sulci": "sulcus",
}
_STOPWORDS = frozenset({"the", "a", "an"})
_NON_WORD = re.compile(r"[^a-z0-9*]+")


def _singular(token: str) -> str:
    if token in _IRREGULAR_PLURALS:
        return _IRREGULAR_PLURALS[token]
    if len(token) > 3 and token.endswith("s") and not token.endswith(("ss", "us", "is", "ys")):
        return token[:-1]
    return token


def tokens(text: str) -> list[str]:
    """Lower-case, accent-free, spelling- and plural-normalised word tokens of ``text``."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c)).lower()
    text = text.replace("’", "'").replace("'s ", " ").replace("'s", " ")
    for pattern, repl in _SPELLING:
        text = pattern.sub(repl, text)
    return [_singular(t) for t in _NON_WORD.split(text) if t and t not in _STOPWORDS]


def normalise(text: str) -> str:
    """The comparison key of a phrase: its normalised tokens joined by single spaces."""
    return " ".join(tokens(text))
