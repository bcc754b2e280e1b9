"""Free-text PHI shapes for the PHI gate (:mod:`evaluation.phi`): text normalised before matching,
dates in any written form, addresses, first names (the parts of the record's own addresses are
``evaluation.ehr.address_terms``).

* :func:`normalise` reads text as a person reads it: compatibility forms folded (NFKC: full-width
  and mathematical letters become plain ones), invisible characters removed (zero-width spaces and
  joiners, soft hyphens, bidirectional controls, fillers) and Cyrillic or Greek letters that look
  Latin read as Latin inside a Latin word ("Vаndersloot" with a Cyrillic а), capitals spaced
  out ("O R T E G A") read as the word they spell. The gate matches and
  sends the normalised text: what leaves is what was checked.
* :func:`scrub_dates` redacts every date that names a day (numeric, ISO, written with a month
  name in English, German, French, Spanish, Italian, Portuguese or Dutch, ordinal or not, "the
  7th of November 1958", "05MAR2023") and every month with its year; a year alone, a duration
  ("3 days ago") and an age stay.
* :func:`scrub_identifiers` redacts what has the shape of an identifier, before other rules
  could break it apart: e-mail (also "name [at] host [dot] org"), URLs with or without their
  scheme, IP and MAC addresses, IBANs (check digits verified), telephone numbers as countries
  write them, licence plates, digits in groups (nine or more), codes of capitals and digits.
* :func:`scrub_addresses` redacts what has the shape of an address (house number and street of
  any common street word, continental "Hauptstraße 12" and "via Roma 12", flat numbers, the town
  and postcode written after a street, a US state with its ZIP code) and a place after "lives in".
* :func:`is_first_name` says whether a word is a given name (the name list of ``gender-guesser``,
  about 48,000 names of many countries, without the names that are also common English words).
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

from evaluation.ehr import word_set

REDACTED = "[REDACTED]"

# --------------------------------------------------------------------------- normalisation

# Letters that are invisible or blank though not of category Cf (Hangul fillers, braille blank).
_BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")
# Cyrillic and Greek letters drawn like Latin ones (Unicode confusables, the common subset).
_LOOK_ALIKE = str.maketrans(
    "аеорсухіјԁԛѕԝһӏАВЕКМНОРСТХІЈЅԌԚԜοαιϳνκτρχυΑΒΕΖΗΙΚΜΝΟΡΤΥΧ",
    "aeopcyxijdqswhlABEKMHOPCTXIJSGQWoaijvktpxuABEZHIKMNOPTYX",
)
_LOOK_ALIKE_CHARS = frozenset(chr(c) for c in _LOOK_ALIKE)
_WORD = re.compile(r"[^\W\d_]+")


# Four or more single capital letters, each followed by one space (a letter-spaced word).
_SPACED = re.compile(r"(?<!\S)(?:[^\W\d_] ){3,}[^\W\d_](?!\S)")


def _join_spaced(m: re.Match[str]) -> str:
    """The word spelled (title case: a name in it is then read as one), or the text as it was."""
    word = m.group().replace(" ", "")
    return word.capitalize() if word.isupper() else m.group()


def _latin(c: str) -> bool:
    return "LATIN" in unicodedata.name(c, "")


def normalise(text: str) -> tuple[str, dict[str, int]]:
    """The text as read (see the module's docstring), and how many invisible and look-alike
    characters were removed or read as Latin."""
    counts: dict[str, int] = {}
    out = []
    for c in text:
        folded = unicodedata.normalize("NFKC", c) if not c.isascii() else c
        # only letters and digits drawn in another form (full-width, mathematical, ligatures):
        # "…", "²" and "½" stay as written
        letter = unicodedata.category(c)[0] == "L" or unicodedata.category(c) == "Nd"
        if letter and folded != c and folded.isascii() and folded.isalnum():
            counts["look_alike_characters"] = counts.get("look_alike_characters", 0) + 1
            c = folded
        out.append(c)
    text = "".join(out)
    kept = "".join(c for c in text if unicodedata.category(c) != "Cf" and c not in _BLANK_LETTERS)
    if len(kept) != len(text):
        counts["invisible_characters"] = len(text) - len(kept)
    text = unicodedata.normalize("NFC", kept)
    # "O R T E G A   B R A N D S T Ä T T E R": capitals spaced out read as the word they spell
    text = _SPACED.sub(_join_spaced, text)
    if any(c in _LOOK_ALIKE_CHARS for c in text):
        n = 0

        def latin_word(m: re.Match[str]) -> str:
            nonlocal n
            word = m.group()
            spoof = [c for c in word if c in _LOOK_ALIKE_CHARS]
            if spoof and any(_latin(c) for c in word):
                n += len(spoof)
                return word.translate(_LOOK_ALIKE)
            return word

        text = _WORD.sub(latin_word, text)
        if n:
            counts["look_alike_characters"] = counts.get("look_alike_characters", 0) + n
    return text, counts


# --------------------------------------------------------------------------- dates

_MONTH_NAMES = """january february march april may june july august september october november
    december jan feb mar apr jun jul aug sep sept oct nov dec januar jänner februar märz maerz
    mrz mai juni juli oktober okt dezember dez janvier janv février fevrier févr fevr mars avril
    avr juin juillet juil août aout septembre octobre novembre décembre decembre déc enero
    febrero marzo abril mayo junio julio agosto septiembre setiembre octubre noviembre diciembre
    ene abr ago dic gennaio febbraio aprile maggio giugno luglio settembre ottobre dicembre gen
    giu lug set ott janeiro fevereiro março marco maio junho julho setembro outubro novembro
    dezembro januari februari maart mei augustus"""
_MONTH = (
    r"(?:"
    + "|".join(sorted({re.escape(m) for m in _MONTH_NAMES.split()}, key=len, reverse=True))
    + r")"
)
_ORD = r"(?:st|nd|rd|th|er|e|º|°|ª)?"
_DAY = r"(?:0?[1-9]|[12]\d|3[01])"
_YEAR = r"(?:1[89]\d{2}|2[01]\d{2}|'\d{2}|\d{2}(?!\d))"
_SEP = r"(?:[ \t]*[.,/-][ \t]*|[ \t]+)"
_ORD_WORDS = """first second third fourth fifth sixth seventh eighth ninth tenth eleventh
    twelfth thirteenth fourteenth fifteenth sixteenth seventeenth eighteenth nineteenth
    twentieth thirtieth"""
_ORD_WORD = (
    r"(?:(?:twenty|thirty)[- ]?(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth)|"
    + "|".join(_ORD_WORDS.split())
    + r")"
)
_NOT_A_COUNT = (
    r"(?![ \t]*(?:mg|mcg|µg|g|mm|cm|ml|l|x|times|weeks?|days?|hours?|h|min|months?|years?|%))"
)
_DATES = [
    # 7 November 1958, 7. November 1958, the 7th of November 1958, 20 de marzo de 2023,
    # 07-Nov-2022, 7 Nov '58, 14 February (a day without its year is still a person's date)
    re.compile(
        rf"(?i)\b(?:the[ \t]+)?{_DAY}{_ORD}\.?(?:[ \t]+(?:of|de|di|del))?{_SEP}{_MONTH}\b\.?"
        rf"(?:(?:{_SEP}(?:(?:de|of|del)[ \t]+)?){_YEAR}\b)?"
    ),
    # 05MAR2023, 7nov58
    re.compile(rf"(?i)\b{_DAY}{_MONTH}{_YEAR}\b"),
    # November 7, 1958; Mar 20th, 2023; March 20th (the month capitalised when no year follows)
    re.compile(rf"(?i)\b{_MONTH}\.?[ \t]+{_DAY}{_ORD}\b(?:,?[ \t]+{_YEAR}\b)"),
    re.compile(rf"\b(?=[A-ZÀ-Þ])(?i:{_MONTH})\.?[ \t]+{_DAY}{_ORD}\b{_NOT_A_COUNT}"),
    # March 2023, Nov. 1958, marzo de 2021, mois d'avril 1970 (a month with its year)
    re.compile(
        rf"(?i)\b{_MONTH}\.?,?[ \t]+(?:(?:de|del|of|di)[ \t]+)?(?:1[89]\d{{2}}|2[01]\d{{2}})\b"
    ),
    # the fourth of October, fourth October 2024, October the fourth (a day written in words)
    re.compile(
        rf"(?i)\b(?:the[ \t]+)?{_ORD_WORD}[ \t]+(?:of[ \t]+)?{_MONTH}\b\.?(?:,?[ \t]+{_YEAR}\b)?"
    ),
    re.compile(rf"(?i)\b{_MONTH}[ \t]+the[ \t]+{_ORD_WORD}\b(?:,?[ \t]+{_YEAR}\b)?"),
    # 30.IX.2024, 3. XI. 58 (a month in Roman numerals)
    re.compile(
        rf"\b{_DAY}\.[ \t]?(?:XII|XI|X|IX|VIII|VII|VI|V|IV|III|II|I)\.[ \t]?(?:\d{{4}}|\d{{2}})\b"
    ),
    # 29.09., 1.10. (a German day and month without the year; the month in two digits, so that
    # "INR 1.1." stays)
    re.compile(r"(?<![\d.])(?:0?[1-9]|[12]\d|3[01])\.(?:0[1-9]|1[0-2])\.(?![\d])"),
    # born 1931, geb. 1931, née en 1931, nacida en 1931 (a year of birth: with the age it tells
    # an age over 89)
    re.compile(
        r"(?i:\b(?:born|b\.|geb\.|geboren|n[ée]e?|nacid[oa]|nat[oa]|Jahrgang)[ \t]+"
        r"(?:(?:in|en|nel|im|em)[ \t]+)?(?:(?:the[ \t]+)?year[ \t]+|Jahr[ \t]+)?)"
        r"((?:1[89]|20)\d{2})\b"
    ),
    # numeric: 1958-11-07, 2021/06/14, 20.03.2023, 11/07/1958, 7.11.58
    re.compile(r"\b(?:1[89]|20)\d{2}[-/.](?:0?[1-9]|1[0-2])[-/.](?:0?[1-9]|[12]\d|3[01])\b"),
    # (not inside a decimal range: "CI 0.88-0.95")
    re.compile(r"(?<![\d.])\d{1,2}[/.-]\d{1,2}[/.-](?:\d{4}|\d{2})\b(?![.,]\d)"),
]


def scrub_dates(text: str) -> tuple[str, int]:
    """Redact every date that names a day, every month with its year, and a year of birth."""
    n = 0
    for pattern in _DATES:
        text, k = _redact(pattern, text)
        n += k
    return text, n


def _redact(pattern: re.Pattern[str], text: str) -> tuple[str, int]:
    """Redact each match of ``pattern`` (its group 1 when it has one)."""
    if not pattern.groups:
        return pattern.subn(REDACTED, text)
    spans = [m.span(1) for m in pattern.finditer(text)]
    for a, b in reversed(spans):
        text = text[:a] + REDACTED + text[b:]
    return text, len(spans)


# --------------------------------------------------------------------------- identifier shapes

_TLDS = """com org net edu gov int mil info biz io co me tv app dev online health care de fr es it
    ch at nl be lu uk ie eu pl pt se dk no fi us ca au nz jp cn in br mx ar ru tr gr cz sk hu ro
    example"""
_HEX = r"[0-9A-Fa-f]"
_IDENTIFIER_SHAPES: list[tuple[str, re.Pattern[str]]] = [
    # written so that a program does not read it: name [at] host [dot] org, name (at) host.org
    (
        "email",
        re.compile(
            r"[\w.+-]+[ \t]*[\[({<][ \t]*(?i:at|ät|arroba|chiocciola)[ \t]*[\])}>][ \t]*[\w-]+"
            r"(?:[ \t]*(?:[\[({<][ \t]*(?i:dot|punto|point|punkt)[ \t]*[\])}>]|\.)[ \t]*[\w-]+)+"
        ),
    ),
    ("email", re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")),
    ("url", re.compile(r"\b(?:https?|ftp)://[^\s<>\"»]+", re.I)),
    # a host name without its scheme: instagram.com/name, www.example.org
    (
        "url",
        re.compile(
            r"(?i)\b(?:www\.)?(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+(?:"
            + "|".join(_TLDS.split())
            + r")\b(?:/[^\s<>\"»)]*[^\s<>\"»).,;:])?"
        ),
    ),
    # IPv6 (with "::" or seven colons) and MAC addresses; IPv4 with each part up to 255
    (
        "ip",
        re.compile(
            rf"(?<![\w:]){_HEX}{{0,4}}(?:::?{_HEX}{{1,4}}){{1,7}}::?(?![\w:])|"
            rf"(?<![\w:]){_HEX}{{0,4}}(?:::?{_HEX}{{1,4}}){{2,7}}(?![\w:])"
        ),
    ),
    (
        "device",
        re.compile(rf"(?<![\w:-]){_HEX}{{2}}(?:([:-]){_HEX}{{2}})(?:\1{_HEX}{{2}}){{4}}(?![\w:-])"),
    ),
    (
        "ip",
        re.compile(
            r"(?<![\w.])(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)(?![\w.])"
        ),
    ),
    # IBAN: country, check digits, then the account in groups (the check digits verified)
    ("account", re.compile(r"\b[A-Z]{2}\d{2}(?:[ ]?[A-Z0-9]{4}){2,7}(?:[ ]?[A-Z0-9]{1,3})?\b")),
    # +33 (0)3 89 64 70 12, +34 963 12 45 78, 07621/416203 (telephone numbers as countries write them)
    (
        "phone",
        re.compile(r"(?<![\w+])\+\d{1,3}(?:[ \t.-]*\(0\))?(?:[ \t./-]*\(?\d{1,5}\)?){2,7}(?!\w)"),
    ),
    ("phone", re.compile(r"(?<![\w/])0\d{2,5}[ \t]?/[ \t]?\d{3,9}(?![\w/])")),
    # a licence plate: LÖ-MB 412 (DE), AB-123-CD (FR), AB12 CDE (UK)
    (
        "vehicle",
        re.compile(
            r"\b(?:[A-ZÄÖÜ]{1,3}-[A-Z]{1,2}[ \t]?\d{1,4}[EH]?|[A-Z]{2}-\d{3}-[A-Z]{2}|"
            r"[A-Z]{2}\d{2}[ \t][A-Z]{3})\b"
        ),
    ),
    # digits in groups (756.4471.9203.88, 2 70 04 99 134 052 71): nine digits or more
    ("digits", re.compile(r"(?<![\w.,/])\d{1,4}(?:[ .-]\d{1,4}){2,}(?![\w]|[.,]\d)")),
    # a code of capitals and digits with four digits or more: serial numbers, tax codes
    ("identifier_code", re.compile(r"\b(?=[A-Z0-9]*[A-Z])(?=(?:[A-Z]*\d){4})[A-Z0-9]{8,}\b")),
]
_GROUPED_MIN_DIGITS = 9
_DATE_FIRST = re.compile(r"\d{1,2}[./-]\d{1,2}[./-](?:\d{4}|\d{2})(?!\d)")
_PHONE_MIN_DIGITS = 8


def _iban_valid(text: str) -> bool:
    s = text.replace(" ", "")
    if not 15 <= len(s) <= 34:
        return False
    moved = s[4:] + s[:4]
    digits = "".join(str(int(c, 36)) for c in moved)
    return int(digits) % 97 == 1


def _keeps(kind: str, found: str) -> bool:
    """Whether a shape's match is not the identifier it looks like (too few digits, a failed
    check digit)."""
    digits = sum(c.isdigit() for c in found)
    if kind == "digits" and _DATE_FIRST.match(found):
        return True  # a date and a time ("01.10.2024 22:30"): the date rule takes the date
    if kind == "account":
        return not _iban_valid(found)
    if kind == "phone":
        return digits < _PHONE_MIN_DIGITS
    if kind == "digits":
        return digits < _GROUPED_MIN_DIGITS
    return False


def scrub_identifiers(text: str) -> tuple[str, dict[str, int]]:
    """Redact what has the shape of an identifier, before any other rule can break it up:
    e-mail addresses (also written "name [at] host [dot] org"), URLs with or without their
    scheme, IP and MAC addresses, IBANs (check digits verified), telephone numbers in the
    international and the national-with-slash forms, licence plates, digits in groups (nine or
    more) and codes of capitals and digits (four digits or more: serial numbers, tax codes)."""
    counts: dict[str, int] = {}
    for kind, pattern in _IDENTIFIER_SHAPES:
        spans = []
        for m in pattern.finditer(text):
            if _keeps(kind, m.group()):
                continue
            end = m.end()
            if m.group().endswith(")") and m.group().count(")") > m.group().count("("):
                end -= 1  # the parenthesis the number was written in: "(tel. +34 ...)"
            spans.append((m.start(), end))
        for a, b in reversed(spans):
            text = text[:a] + REDACTED + text[b:]
        if spans:
            counts[kind] = counts.get(kind, 0) + len(spans)
    return text, counts


# --------------------------------------------------------------------------- addresses

_STREET_WORDS = """Street St Road Rd Lane Ln Avenue Ave Av Drive Dr Close Crescent Cres Court Ct
    Way Place Pl Square Sq Terrace Tce Gardens Gdns Grove Hill Park Row Walk Mews Boulevard Blvd
    Highway Hwy Parkway Pkwy Circle Cir View Rise Green Parade Wynd Gate Yard Passage Alley Quay
    Wharf Croft Fold Chase Vale Meadow Meadows Heights Estate Cottages Villas"""
_STREET = r"(?:" + "|".join(_STREET_WORDS.split()) + r")"
_CAP = r"[A-ZÀ-ÖØ-Þ][\w'’.-]*"
_CONTINENTAL = r"(?:straße|strasse|str\.|weg|gasse|allee|platz|ring|damm|ufer|pfad|chaussee|markt|straat|laan|gracht|plein|kade|vej|gade|gatan|vägen|veien)"
_ROMANCE = r"(?:rue|avenue|boulevard|bd|chemin|allée|impasse|quai|route|via|viale|piazza|piazzale|corso|vicolo|calle|avenida|plaza|paseo|carrer|camino|rua|praça|travessa|ul\.|ulica|aleja)"
# what may follow a street: ", Yarm", ", 53111 Bonn", ", Springfield, IL 62704", ", TS17 6BX"
_PLACE_TAIL = (
    r"(?:,?[ \t]*(?:[A-Z]{1,2}\d[A-Z\d]?[ \t]*\d[A-Z]{2}\b|[A-Z]{2}[ \t]+\d{5}(?:-\d{4})?\b|"
    r"(?:[A-Z]{1,2}-)?\d{4,5}(?:[ \t]+" + _CAP + r")?|" + _CAP + r"(?:[ \t-]+" + _CAP + r"){0,2}"
    r"(?:[ \t]+[A-Z]{2}[ \t]+\d{5}(?:-\d{4})?)?)){0,3}"
)
_ADDRESSES = [
    # 14 Quarry Bank Road, 27 Larkspur Crescent, Yarm; 1042 Elm Street, Springfield, IL 62704
    re.compile(
        rf"\b\d{{1,5}}[A-Za-z]?,?[ \t]+(?:{_CAP}[ \t]+){{0,3}}{_STREET}\b\.?(?:{_PLACE_TAIL})"
    ),
    # Hauptstraße 12, 53111 Bonn; Kerkstraat 4
    re.compile(rf"\b[A-ZÄÖÜ][\w-]*{_CONTINENTAL}[ \t]+\d{{1,4}}[a-zA-Z]?\b(?:{_PLACE_TAIL})", re.I),
    # 12 rue de la Paix; via Roma 12; Calle Mayor 5, 28013 Madrid
    re.compile(
        rf"(?i)\b(?:\d{{1,4}}(?:[ \t]*(?:bis|ter))?,?[ \t]+{_ROMANCE}\b[^\n,;.()]{{1,40}}|"
        rf"{_ROMANCE}[ \t]+[^\n,;.()\d]{{1,40}}?[ \t]+\d{{1,4}}[a-zA-Z]?\b)(?-i:{_PLACE_TAIL})"
    ),
    re.compile(
        r"\b(?:Flat|Apt|Apartment|Suite|Wohnung|Appartement|Piso)\.?[ \t]*\d{1,4}[A-Za-z]?\b"
    ),
    # a postcode and its town after a comma, whatever was before it: ", 80331 München"
    # (the postcode alone when the town is already redacted)
    re.compile(rf"(?<=,[ \t])(?:[A-Z]{{1,2}}-)?\d{{4,5}}(?:[ \t]+{_CAP}|(?=[ \t]+\[REDACTED\]))"),
    # a US state and ZIP code wherever they stand
    re.compile(
        r"\b(?:A[KLRZ]|C[AOT]|D[CE]|FL|GA|HI|I[ADLN]|K[SY]|LA|M[ADEINOST]|N[CDEHJMVY]|O[HKR]|PA|"
        r"RI|S[CD]|T[NX]|UT|V[AT]|W[AIVY])[ \t]+\d{5}(?:-\d{4})?\b"
    ),
    # lives in Yarm, living near Great Ayton, wohnhaft in Bonn, domiciliée à Lyon
    re.compile(
        r"(?i:\b(?:lives|living|lived|resides|residing|resident|moved|relocated|wohnhaft|wohnt|"
        r"domicilié|domiciliée|habite|vive|reside|abita)[ \t]+(?:alone[ \t]+|locally[ \t]+)?"
        r"(?:in|at|near|to|of|à|en|a|am|bei)[ \t]+)(?:the[ \t]+)?("
        + _CAP
        + r"(?:[ \t-]+(?:on|upon|le|la|sur|am|an|der|de|en|[A-ZÀ-Þ][\w'’.-]*)){0,3})"
    ),
]


def scrub_addresses(text: str) -> tuple[str, int]:
    """Redact what has the shape of an address, or of a place someone lives in."""
    n = 0
    for pattern in _ADDRESSES:
        if pattern.groups:
            spans = [m.span(1) for m in pattern.finditer(text)]
            for a, b in reversed(spans):
                text = text[:a] + REDACTED + text[b:]
            n += len(spans)
        else:
            text, k = pattern.subn(REDACTED, text)
            n += k
    return text, n


# --------------------------------------------------------------------------- first names

# Names of the list that are also common English words or clinical terms: never a name alone.
_WORD_NAMES = word_set("""will mark marks may june april august summer autumn winter dawn eve grace hope faith
    joy joyce charity patience prudence constance verity trinity destiny harmony melody
    serenity precious happy lucky sunny sunshine iris rose rosemary lily daisy poppy holly ivy
    heather hazel olive ginger honey candy amber pearl ruby crystal diamond ivory coral violet
    sage jasmine cherry berry brook river rain storm stone cliff glen dale wood field forest
    hunter mason carter cook baker young long rich frank earnest noble bright justice liberty
    golden silver white black brown green gray grey red major general judge king prince queen
    duke earl bishop lady baby angel star sky moon sun sunday monday friday art bill pat max
    guy drew chase miles page lane ray gene jack rod dean don sue sam tim jim bob joe ben dot
    else even done free save floor edit made fine tell carry grant trees price brain ideal
    soon chance haven five lies alter spring revert bell said thin okay brand valve blossom
    till mine ward unity sake honor honour arise harm lone beat fair merit mate love novel rail
    hung march nine german chip vice hang nest lion lean octave terra luna line take skip just
    core deep merge trace side here than tiny flip file constant alpha meta aria aura cord
    corona germ lobar pica vessel vital night wing emer young price mercy clement clay reed
    ash bay north south west east ocean sterling victor christian noel early rush wells hall
    marsh gale lake bliss neat penny sandy rusty dusty misty stormy doll tiger bear wolf fox
    jewel gem lucky rocky rock crane swan robin wren finch jay lark dove raven hawk""")
# ... and those that are common words in lowercase English prose (names that a large corpus of
# documentation writes mostly in lowercase: "you", "will", "grace", "brain"...)
_PROSE_NAMES = word_set("""aad aalt abd addi ade age ago alen alfa alibi alo alp alpha alter amber amet anat ang annot
    ans ansi anti anu are aren ares aria arise arn art ary asset astra ats aud autumn bac ban
    barb bas beat bee beer bei bell ber bert besti bet bill bin bing blas blossom bon boo brain
    brand buzz cadence cal cam can candela carr carry cat chal chance che cherry chi chip cho
    coco coll con cong conn constant coord cor coral core coro cos crystal cui dac dag dat dawn
    dax deep del dell della des desire diamond dico din dino dip doc dok dolly don donate done
    door dory dot due ear ece edit ele elif els else ende era essence eta even fair faith fan
    fee file fine fini five flip floor forest free funs gan gees gelu gen geo ger giga goo grace
    grad grant gray greet grit gui gun gust hack hal halide hang har harm harmony haven here
    herm hero his hoc honor hope hue hung iana ica ice ico ide ideal ids ing ini ino ints ion
    iris iso ita ite ito jac jet jit job joke joy judge just kama kern key kick kit kron lam
    lane lang lap lean len lex lie lies lieu lil lim line lion lite loc lon lone long lora lot
    loup love luna lyric made mai maj major mako mal man mark marks maroon mat mate mats max may
    mel mels merge merit meta mile miles min mine miny mitre moo moon mort nadir nan nat nest
    neval night nil nim nine ninja nis non nonce novel odd ode okay olive one ott pace pan pat
    patience peer peg pen per pere phi pie pii pil pile pin ping pip pol prem price prune puk
    radian rail ram ran rand red redo reg rela rem res rex robin ruby run sad saga sage said
    sake salmon sas save sha shim sid side sig sim sin sine sinh skip sky slim sol solo sols
    soon sop spring stone sub sue summer sunny sup suse tab take tan tea tell terra tex than the
    thin tie ties tilde till timm tiny ton tone trace tre trees tri ufo unity uri val valve van
    vessel vice violet walker ward way will win won you""")


@lru_cache(maxsize=1)
def _first_names() -> frozenset[str]:
    import gender_guesser.detector as detector  # a name list with no model: loads in ~0.1 s

    names = detector.Detector(case_sensitive=False).names
    return frozenset(
        n for n in names if len(n) >= 3 and n not in _WORD_NAMES and n not in _PROSE_NAMES
    )


def is_first_name(word: str) -> bool:
    """Whether ``word`` (any case, accents kept) is a given name that is not also a word."""
    return word.lower() in _first_names()
