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
# words clinicians use for one another's meaning, read as one word on both sides of a comparison
# ("a left thalamic bleed" is a thalamic haemorrhage); applied after spelling and plurals
_WORD_FORMS = {"bleed": "hemorrhage", "bleeding": "hemorrhage", "bled": "hemorrhage"}
_STOPWORDS = frozenset({"the", "a", "an"})
_NON_WORD = re.compile(r"[^a-z0-9*]+")


# typographic quotes, dashes and spaces -> ASCII, after NFKC (which folds the compatibility forms)
_PUNCT = str.maketrans(
    {
        **dict.fromkeys("\u2018\u2019\u201a\u201b\u2032\u00b4\u0060", "'"),
        **dict.fromkeys("\u201c\u201d\u201e\u201f\u2033\u00ab\u00bb", '"'),
        **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212\u00ad", "-"),
    }
)
_SPACE = re.compile(r"\s+")
# where a clause ends: negation ("no haemorrhage; ischaemic stroke") never crosses one
_CLAUSE = re.compile(
    r"[;,.:!?()\[\]]|\b(?:but|however|although|though|whereas|yet|instead)\b", re.I
)


def clean(text: str) -> str:
    """NFKC, typographic quotes and dashes made ASCII, whitespace collapsed: what every rule
    that reads model text matches against."""
    text = unicodedata.normalize("NFKC", text).translate(_PUNCT)
    return _SPACE.sub(" ", text).strip()


# singular words that end in "s"
_INVARIANT = frozenset({"pons", "herpes", "diabetes", "rabies", "meninges", "series", "lens"})


def _singular(token: str) -> str:
    if token in _INVARIANT:
        return token
    if token in _IRREGULAR_PLURALS:
        return _IRREGULAR_PLURALS[token]
    if len(token) > 3 and token.endswith("s") and not token.endswith(("ss", "us", "is", "ys")):
        return token[:-1]
    return token


def tokens(text: str) -> list[str]:
    """Lower-case, accent-free, spelling- and plural-normalised word tokens of ``text``."""
    return _tokens_of_clean(clean(text))


def _tokens_of_clean(text: str) -> list[str]:
    """``tokens`` of a text already through ``clean`` (a clause of one: not cleaned twice)."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c)).lower()
    text = text.replace("'s ", " ").replace("'s", " ")
    for pattern, repl in _SPELLING:
        text = pattern.sub(repl, text)
    words = (_singular(t) for t in _NON_WORD.split(text) if t and t not in _STOPWORDS)
    out = [_WORD_FORMS.get(w, w) for w in words]
    # "non-traumatic", "non haemorrhagic": a prefix of the next word, never a word of its own
    merged: list[str] = []
    for t in out:
        if merged and merged[-1] == "non":
            merged[-1] = "non" + t
        else:
            merged.append(t)
    return merged


def clause_tokens(text: str) -> tuple[list[str], list[int]]:
    """The tokens of ``text`` and, for each, the index of the clause it is in."""
    toks: list[str] = []
    clause: list[int] = []
    for n, part in enumerate(_CLAUSE.split(clean(text))):
        t = _tokens_of_clean(part)
        toks += t
        clause += [n] * len(t)
    return toks, clause


def normalise(text: str) -> str:
    """The comparison key of a phrase: its normalised tokens joined by single spaces."""
    return " ".join(tokens(text))
