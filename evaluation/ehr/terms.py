"""The terms by which text may name someone the record names (for the PHI gate's scrub and case
sharing's): every person's names in their usual written forms, the Patient's identifiers and
birth date, every contact point, every part of every address.

Read from the typed record (``EHRContext``): the rule of who is a person is there, the rule of
how a person is written here.
"""

from __future__ import annotations

import re

from evaluation.ehr.record import Address, EHRContext, HumanName
from evaluation.ehr.values import text as _bounded
from evaluation.ehr.values import word_set


def _text(value: str, limit: int = 160) -> str:
    return _bounded(value, limit)


# Words that stand next to names without being one (titles, credentials, roles, departments,
# particles): never scrubbed on their own.
NOT_NAMES = word_set(
    """dr doctor prof professor mr mrs ms mx miss sir dame rev sister sr jr md phd mbbs mbchb
    frcp frcr frcs mrcp frcpath facp dm do rn np pa ba bsc msc dds consultant registrar sho
    resident fellow attending nurse matron radiographer technologist technician
    physician physio neurologist radiologist neuroradiologist surgeon neurosurgeon clinician
    gp neurology radiology neuroradiology stroke emergency department dept team
    clinic service ward unit hospital general practitioner practice medicine medical the and
    of for with at in on van von der den del della de da di du dos das bin ibn ben al el la
    le los las y e ophthalmology neurophysiology cardiology haematology oncology rheumatology
    psychiatry physiotherapy orthopaedics icu itu hdu ae"""
)
_FOLD = str.maketrans({"ß": "ss", "ø": "o", "Ø": "O", "æ": "ae", "Æ": "AE", "œ": "oe",
                       "Œ": "OE", "ł": "l", "Ł": "L", "đ": "d", "Đ": "D", "ı": "i", "þ": "th",
                       "Þ": "Th", "ð": "d", "Ð": "D"})  # fmt: skip
_WORDS = re.compile(r"[\s\-‐–]+")
_CJK = re.compile(r"[\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff]")


def ascii_fold(text: str) -> str:
    """``text`` without accents, as a note typed on an English keyboard writes a name."""
    import unicodedata

    decomposed = unicodedata.normalize("NFKD", text.translate(_FOLD))
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def person_terms(family: str, given: list[str], text: str = "") -> list[str]:
    """Every string by which a note may name this person: each name and each word of it (3
    letters or more, titles and particles excepted), the usual written forms ("Marta Alvarez",
    "Alvarez, Marta", "Alvarez^Marta", "M. Alvarez", "Alvarez M"...), and their spellings without
    accents."""
    family = _text(family, 200)
    givens = [g for g in (_text(x, 200) for x in given) if g]
    words = [w for n in [family, *givens] for w in [n, *_WORDS.split(n)] if w]
    terms = [w for w in words if w.lower().strip(".") not in NOT_NAMES]
    if text:
        terms.append(_text(text, 200))
    if family and givens:
        g1, all_given, i = givens[0], " ".join(givens), givens[0][0]
        terms += [
            f"{g1} {family}", f"{all_given} {family}", f"{family}, {g1}", f"{family}, {all_given}",
            f"{family} {g1}", f"{family}^{g1}", f"{family}^{'^'.join(givens)}", f"{i}. {family}",
            f"{i}.{family}", f"{i} {family}", f"{family}, {i}.", f"{family} {i}.",
        ]  # fmt: skip
        if _CJK.search(family + g1):  # written without a space
            terms += [f"{family}{g1}", f"{g1}{family}"]
    elif givens and _CJK.search(givens[0]):
        terms.append("".join(givens))
    terms += [ascii_fold(t) for t in terms]
    return [t for t in dict.fromkeys(terms) if long_enough(t)]


def display_terms(display: str) -> list[str]:
    """The terms of a name written as display text ("Dr Marta Alvarez (neurology)", "Alvarez,
    Marta", "Nicolás Barbero, MD"): its words, without titles, credentials and what is in
    brackets."""
    text = re.sub(r"\([^)]*\)|\[[^\]]*\]", " ", _text(display, 200))
    head, _, tail = text.partition(",")
    tail_words = [w for w in tail.split() if w.lower().strip(".") not in NOT_NAMES]
    if tail_words and len(head.split()) == 1:  # "Family, Given"
        family, given = head.strip(), tail_words
    else:
        words = [w for w in head.split() if w.lower().strip(".") not in NOT_NAMES]
        if not words:
            return []
        family, given = words[-1], words[:-1]
    shown = " ".join([*given, family])
    return person_terms(family, given, shown)


def name_terms(name: HumanName) -> list[str]:
    """The terms of one HumanName: its parts in each written form, and its text's words."""
    terms = person_terms(name.family, name.given, name.text) if name.family or name.given else []
    if name.text:
        terms += display_terms(name.text)
    return terms


_PLACE_PARTICLES = word_set("""on upon the le la les sur sous am an im der die das de del della di du en in by under
    saint st ste sankt san santa new north south east west upper lower great little old port
    fort mount lake city town bad village""")  # fmt: skip


def address_terms(addr: Address) -> list[str]:
    """Every part of an address: its text, each line with and without its house number, town,
    the words of a compound town name, district, state, postcode with and without its space.
    Not the country."""
    out: list[str] = [addr.text]
    for line in addr.lines:
        out.append(line)
        bare = re.sub(r"^\s*\d+[A-Za-z]?[,\s]+|[,\s]+\d+[A-Za-z]?\s*$", "", line)
        if bare != line and re.search(r"[^\W\d_]{3}", bare):
            out.append(bare)  # "Quarry Bank Road" of "14 Quarry Bank Road"
    for place in (addr.city, addr.district, addr.state):
        out.append(place)
        words = [w for w in re.split(r"[\s\-‐–]+", place) if w]
        if len(words) > 1:
            out += [w for w in words if w.lower() not in _PLACE_PARTICLES and len(w) >= 4]
    out += [addr.postal_code, addr.postal_code.replace(" ", "")]
    return [t for t in out if t]


def identifying_terms(record: EHRContext | None) -> list[str]:
    """Strings of the record that identify someone (for scrubbing free text), longest first:
    every person it names (``EHRContext.persons``: patients, practitioners, related persons,
    contacts, the display of every Reference to a person), in each written form; the Patient's
    identifiers and birth date; every contact point and every part of every address."""
    if record is None:
        return []
    terms: list[str] = []
    for person in record.persons:
        if person.name is not None:
            terms += name_terms(person.name)
        if person.display:
            terms += display_terms(person.display)
    for p in record.patients:
        for name in p.names:
            terms += [name.text, name.family, *name.given]
        terms += p.identifiers
        born = p.birth_date
        if born:
            terms += [
                born.isoformat(),
                born.strftime("%d/%m/%Y"),
                born.strftime("%m/%d/%Y"),
                born.strftime("%d.%m.%Y"),
                born.strftime("%Y%m%d"),
            ]
    terms += record.telecom
    for addr in record.addresses:
        terms += address_terms(addr)
    # Short fragments (initials) would scrub ordinary words; keep terms of 3+ characters (2 for
    # a name in Chinese, Japanese or Korean characters).
    return sorted({t for t in terms if long_enough(t)}, key=len, reverse=True)


def long_enough(term: str) -> bool:
    """Whether a term is long enough to scrub wherever it stands as a word."""
    return len(term) >= 3 or (len(term) == 2 and bool(_CJK.search(term)))
