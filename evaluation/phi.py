"""The PHI gate: what may leave for a model endpoint, and the audit of every outbound payload.

An endpoint is *trusted* when its host is on the allow-list (by default only loopback: the
reference models, a vLLM/Ollama server on this machine). Anything else is remote and receives
only de-identified content:

* text parts are scrubbed of the patient's own identifiers (names, MRN and other identifiers,
  telecom, address, birth date, taken from the FHIR Patient resource and the study's headers), of
  every other person the record names, in any role and any written form ("Marta Alvarez",
  "M. Alvarez", "Alvarez, Marta", "Alvarez^Marta"): each PN attribute of the study (referring,
  performing, reading physicians, operators, physicians of record, requesting physician...) and
  each person of the FHIR record (practitioners, participants, the note's author, family
  contacts...), of the names on signature lines whoever signs ("Signed: ...", "Dictated by ...",
  "— M. Alvarez (neurology)", a titled name, a name after a role or relation word), and of
  identifier shapes (dates, phone numbers, e-mail, URL, IP and MAC addresses, IBANs, licence
  plates, digits in groups, serial and tax codes, "MRN: ..." fields, firms, ages over 89);
* images must be PNGs without text chunks (re-encoded otherwise) and must not come from a series
  flagged as carrying burned-in annotation (dropped, and the drop is recorded); text burned into
  their pixels, whatever the flag says, is read with tesseract (``evaluation.phi_pixels``): an
  image whose text identifies someone is sent with that text blacked out, or withheld, and an
  image that could not be read is withheld (each recorded in ``image_actions``);
* rendered labels and the EHR block carry no identifiers by construction, and are scrubbed too.

A rendered prompt is scrubbed piece by piece (``evaluation.prompts.map_data``): the text outside
its data containers, and each container's text apart, so that no pattern reads across a
boundary (a note ending on "Name:" would otherwise take the container's closing line with it,
and the sandbox's own text after it would read as data).

Every payload, trusted or not, is summarised in an :class:`AuditRecord` (model, endpoint, case,
image hashes and sizes, characters of text, what was redacted) before it is sent.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import ipaddress
import re
import struct
from collections.abc import Iterable, Mapping
from functools import lru_cache, partial
from urllib.parse import urlparse

from pydantic import BaseModel, Field

from evaluation.case import Case, StudyPerson
from evaluation.ehr import (
    NOT_NAMES,
    EHRContext,
    display_terms,
    identifying_terms,
    long_enough,
    person_terms,
    word_set,
)
from evaluation.errors import PHIError
from evaluation.modelio import ImagePart, Message, TextPart
from evaluation.phi_pixels import (
    ImageAction,
    PixelReason,
    PixelScreen,
    PlantedText,
    TextMatcher,
    pixel_terms,
)
from evaluation.phi_text import (
    is_first_name,
    normalise,
    scrub_addresses,
    scrub_dates,
    scrub_identifiers,
)
from evaluation.prompts import map_data

LOOPBACK = "loopback"
REDACTED = "[REDACTED]"
_PNG_SIG = b"\x89PNG\r\n\x1a\n"
_TEXT_CHUNKS = {b"tEXt", b"zTXt", b"iTXt", b"eXIf", b"tIME"}

_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("email", re.compile(r"\b[\w.+-]+@[\w-]+(\.[\w-]+)+\b")),
    ("url", re.compile(r"\bhttps?://\S+", re.I)),
    (
        "labelled_id",
        re.compile(
            r"\b(MRN|NHS(\s+no\.?|\s+number)?|hospital\s+no\.?|patient\s+id|SSN|ID)\s*[:#]?\s*[A-Z0-9][\w -]{2,20}\d",
            re.I,
        ),
    ),
    # a name never starts with a digit: the record block's "Patient: 35 years, male" stays
    (
        "labelled_name",
        re.compile(r"\b(Patient|Name|Pt)\s*:\s*+(?!\d)[^\n]*?(?=\s{2,}|\t|$)", re.I | re.M),
    ),
    (
        "labelled_address",
        re.compile(
            r"\b(Address|Addr|Anschrift|Adresse|Wohnort|Wohnhaft|Domicile|Dirección|Direccion|"
            r"Domicilio|Indirizzo|Residenza|Adres)\s*:\s*[^\n]*?(?=\s{2,}|\t|$)",
            re.I | re.M,
        ),
    ),
    ("date", re.compile(r"(?<![\d.])\d{1,2}[/.-]\d{1,2}[/.-]\d{2,4}\b(?![.,]\d)")),
    ("date", re.compile(r"\b(19|20)\d{2}-\d{2}-\d{2}(T[\d:.+Z-]+)?\b")),
    (
        "date",
        re.compile(
            r"\b\d{1,2}(st|nd|rd|th)?\s+(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.?\s+(19|20)\d{2}\b",
            re.I,
        ),
    ),
    ("phone", re.compile(r"(?<![\w/])\+?\(?\d{2,5}\)?[ -]\d{3,4}[ -]?\d{3,4}\b")),
    ("digits", re.compile(r"\b\d{7,}\b")),
    # a firm named after a person, or with its legal form: an employer ("Kessler & Söhne",
    # "Smith and Sons Ltd", "Müller Logistik GmbH")
    (
        "organisation",
        re.compile(
            r"(?:[A-ZÀ-Þ][\w'’.-]*[ \t]+){0,3}[A-ZÀ-Þ][\w'’.-]*[ \t]*(?:&|\+|und|and|et|e|y)[ \t]*"
            r"(?:Söhne|Sohn|Sons?|Co\.|Cie\.?|Partners?|Fils|Hijos|Figli|Associates|Töchter)"
            r"(?:[ \t]+(?:GmbH|Ltd\.?|LLC|Inc\.?|KG|OHG|SARL|S\.A\.|S\.r\.l\.|S\.p\.A\.))?(?!\w)|"
            r"(?:[A-ZÀ-Þ][\w'’.&-]*[ \t]+){1,3}(?:GmbH|OHG|GbR|Ltd\.?|Limited|LLC|Inc\.|plc|"
            r"SARL|S\.A\.|S\.r\.l\.|S\.p\.A\.|B\.V\.|N\.V\.)(?!\w)"
        ),
    ),
    # with the town written before it ("Bristol BS6 5QT")
    (
        "uk_postcode",
        re.compile(
            r"\b(?:[A-Z][a-z'’-]+[ \t]+(?=[A-Z]{1,2}\d))?"
            r"[A-Z]{1,2}\d[A-Z\d]?\s+\d[A-Z]{2}\b"
        ),
    ),
]
# An age over 89 (Safe Harbor: "90+"): a number of 90 to 149, or one spelled ("ninety-three",
# "a hundred and two"), before a word for years in the languages notes are written in or after
# "aged" and its like.
_SPELLED_OLD = (
    r"(?:ninety(?:[- ](?:one|two|three|four|five|six|seven|eight|nine))?|"
    r"(?:a|one)[ \t]+hundred(?:[ \t]+and[ \t]+[a-z]+(?:-[a-z]+)?)?)"
)
_OLD_NUMBER = rf"(?:9\d|1[0-4]\d|{_SPELLED_OLD})"
_YEARS_WORD = (
    r"(?:-?\s*(?:years?|y/?o\b|yo\b|yrs?\b|años|anos\b|ans\b|anni\b|jaar\b|jarige?\b|"
    r"Jahre?n?\b|jährig|J\.(?!\w)|lat\b))"
)
_OLD_AGE = re.compile(rf"(?i)\b{_OLD_NUMBER}(?={_YEARS_WORD})")
_OLD_AGE_AFTER = re.compile(
    rf"(?i)\b((?:aged|age|âgée?|edad|età|im[ \t]+Alter)[ \t]+(?:(?:of|de|di|von)[ \t]+)?){_OLD_NUMBER}\b"
)


class PHIPolicy(BaseModel):
    """Which endpoints may receive identified content. Entries: "loopback", host, IP or CIDR."""

    trusted: list[str] = Field(default_factory=lambda: [LOOPBACK])


class GateResult(BaseModel):
    remote: bool
    deidentified: bool
    redactions: dict[str, int] = Field(default_factory=dict)
    dropped_images: list[str] = Field(default_factory=list)  # sha256 of images not sent
    reencoded_images: int = 0
    # each image withheld or blacked out, and why (text burned into its pixels, its series' flag)
    image_actions: list[ImageAction] = Field(default_factory=list)


class AuditRecord(BaseModel):
    """Summary of one outbound payload (written before it is sent)."""

    time: str
    model: str
    endpoint: str
    case_id: str
    cache_key: str
    remote: bool
    deidentified: bool
    image_sha256: list[str]
    image_bytes: list[int]
    text_chars: int
    redactions: dict[str, int] = Field(default_factory=dict)
    dropped_images: list[str] = Field(default_factory=list)
    image_actions: list[ImageAction] = Field(default_factory=list)


def endpoint_host(api_base: str | None) -> str | None:
    if not api_base:
        return None
    parsed = urlparse(api_base if "//" in api_base else f"http://{api_base}")
    return (parsed.hostname or "").lower() or None


def is_trusted(api_base: str | None, policy: PHIPolicy, *, local: bool = False) -> bool:
    """True when content may go to this endpoint as it is (in-process models are local)."""
    if local:
        return True
    host = endpoint_host(api_base)
    if host is None:  # the provider's public endpoint
        return False
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    for entry in policy.trusted:
        e = entry.strip().lower()
        if e == LOOPBACK:
            if host == "localhost" or (ip is not None and ip.is_loopback):
                return True
        elif "/" in e and ip is not None:
            try:
                if ip in ipaddress.ip_network(e, strict=False):
                    return True
            except ValueError:
                continue
        elif e == host:
            return True
    return False


# --------------------------------------------------------------------------- names by their shape

# A name as people write one: capitalised words (any alphabet: Alvarez, O'Brien, Okonkwo-Hartigan,
# ALVAREZ, Ибрагимова), initials (M., J), a name already redacted; after a title or not.
_UPPER = "".join(re.escape(chr(c)) for c in range(0x41, 0x2C00) if chr(c).isupper())
_LETTER = r"[^\W\d_]"
_TOKEN = rf"(?:\[REDACTED\]|[{_UPPER}]{_LETTER}*(?:['’-]{_LETTER}+)*\.?)"
# Titles in the languages notes are written in; a title may be followed by more titles and by
# the academic qualifiers that go with them ("Prof. Dr. med. habil.", "Dr. rer. nat.").
_TITLES = (
    "Professor", "Prof", "Dr.ssa", "Dr.in", "Dra", "Dr", "Mrs", "Mr", "Ms", "Mx", "Miss", "Rev",
    "Herr", "Hr", "Frau", "Mme", "Mlle", "Mevr", "Dhr", "Sra", "Srta", "Sr", "Dña", "Dott.ssa",
    "Dott", "Sig.ra", "Sig.na", "Sig", "Pan", "Pani", "Doz", "Dipl.-Med", "Dipl.-Psych",
    "Univ.-Prof",
)  # fmt: skip
_QUALIFIERS = r"(?:med|dent|vet|rer|nat|phil|habil|univ|sc|h\.c|nat\.|pol|oec|jur|ès|en)\.?"
_TITLE1 = r"(?:" + "|".join(re.escape(t) for t in _TITLES) + r")\.?"
_TITLE = rf"{_TITLE1}(?:[ \t]+(?:{_TITLE1}|{_QUALIFIERS}))*"
# particles inside a name: "Joaquín de la Fuente Ortiz", "J. van der Meulen", "Vidal i Puig"
_PARTICLE = (
    r"(?:van|von|vom|zu|zur|der|den|ter|de|del|della|dei|di|du|da|dos|das|do|le|la|i|y|e|v\.)"
)
_NEXT = rf"(?:,[ \t]*|[ \t]+(?:{_PARTICLE}[ \t]+){{0,3}})"
_SPAN = rf"(?:{_TITLE}[ \t]+)?{_TOKEN}(?:{_NEXT}{_TOKEN}){{0,4}}"
_TOKEN_RE = re.compile(_TOKEN)
_SPAN_RE = re.compile(_SPAN)
_CUE_END = re.compile(r"(?i)(?:\bby|:)[ \t]*$")
# Capitalised words that start clinical lines, never a name.
_CLINICAL = word_set(
    """mri ct mr pet brain head spine scan contrast flair dwi adc swi axial sagittal coronal
    image images plan pc hpc pmh dh o/e obs nkda nihss gcs edss mrs bp hr rr spo2 crp icd
    who no nil normal left right bilateral multiple sclerosis glasgow coma scale acute
    chronic history impression findings report conclusion diagnosis differential imaging
    clinical note letter admission discharge summary date time patient address tel dob mrn
    nhs ge siemens philips toshiba canon hitachi signa"""
)
# Eponyms a note names after "mother", "father: ..." (a family history) or on a line of its own:
# a disease, never the relative's name.
_EPONYMS = word_set(
    """parkinson alzheimer huntington creutzfeldt jakob guillain barré barre charcot
    friedreich devic lewy binswanger wernicke korsakoff tourette duchenne menière meniere
    horner sjögren sjogren behçet behcet lyme tolosa susac chiari moyamoya cadasil hashimoto
    krabbe canavan fabry gaucher niemann batten rett kearns sayre erb klumpke babinski
    romberg kernig brudzinski dandy sturge hippel lindau bell todd pick broca sylvius sylvian
    willis virchow lhermitte uhthoff monro magendie luschka rolando heschl meynert purkinje
    betz schwann ranvier nissl tinel phalen lasègue lasegue gerstmann balint capgras foville
    millard gubler benedikt parinaud wallenberg dejerine roussy séquard sequard adamkiewicz
    hounsfield rankin barthel folstein addenbrooke gunn bonnet ramsay adie argyll marchiafava
    bignami leigh alexander dravet lennox gastaut rasmussen west landau kleffner"""
)
_DISEASE_AFTER = re.compile(
    r"[ \t]*(?:disease|syndrome|palsy|ataxia|chorea|dementia|dystrophy|sign|phenomenon|"
    r"malformation|encephalopathy|encephalitis|aneurysm|paralysis|neuropathy|tumou?r|pupil|"
    r"tremor|paresis|area|aphasia|fissure|spaces?|circle|scale|score|test|reflex|criteria|"
    r"classification|grade|bod(?:y|ies)|nucleus|cyst|canal|foramen|gyrus|law|effect|"
    r"manoeuvre|maneuver|procedure|operation|line|angle|triangle|disorder|cells?|arteritis|"
    r"anomaly|lesion|units?|index|questionnaire|exam(?:ination)?|variant|complex|stage|"
    r"hypothesis|ratio|rule|method|technique|protocol|and[ \t]+[A-Z]\w+[ \t]+(?:scale|grade|"
    r"score|classification|syndrome|disease))\b",
    re.I,
)
# Words that say the words before them were a person's name (a signature's department or role).
_ROLE_WORDS = word_set(
    """neurology radiology neuroradiology registrar consultant sho resident fellow md phd mbbs
    mbchb frcp frcr mrcp nurse physician neurologist radiologist neuroradiologist gp
    clinician doctor attending surgeon neurosurgeon neurosurgery stroke team department dept
    ed a&e medicine st1 st2 st3 st4 st5 st6 st7 st8 fy1 fy2 ct1 ct2 spr sr"""
)
# (the cue ignores case; the name after a bare cue must be capitalised: "Signed consent" is not)
_STRONG_CUE = re.compile(
    r"(?m)^([ \t>*•·-]*(?i:(?:(?:electronically|digitally|e-)[ \t]*)?"
    r"(?:signed|co-?signed|countersigned|authenticated|dictated|transcribed|typed|"
    r"authori[sz]ed|verified|approved|signature|sig\.|e-?signature)\b"
    r"(?:[^\n:]{0,40}?\bby\b[ \t]*:?|[ \t]*:))|"
    r"(?i:(?:(?:electronically|digitally|e-)[ \t]*)?(?:signed|co-?signed|countersigned|"
    r"authenticated|dictated|transcribed|verified|approved)\b)(?=[ \t]+(?:"
    + _TITLE
    + r"[ \t]+)?["
    + _UPPER
    + r"]"
    + _LETTER
    + r"*[ \t]+["
    + _UPPER
    + r"]))[ \t]*(\S[^\n]*)$"
)
_WEAK_CUE = re.compile(
    r"(?i:\b(?:(?:seen|reviewed|reported|examined|assessed|referred|requested|ordered|"
    r"performed|read|scanned|interpreted|written|prepared|admitted|clerked|checked|verified|"
    r"approved|signed|dictated|transcribed|typed|authored|supervised|triaged|accompanied|"
    r"escorted|witnessed|covered|accepted|booked|scheduled|vetted|protocolled|operated|"
    r"acquired|done|note|assault|assaulted|attacked|hit|punched|kicked|pushed|stabbed|struck|"
    r"bitten|threatened|abused|injured|hurt|found|brought|driven|collected|visited|called|"
    r"phoned|rang|described|observed|given|administered|reminded|helped|supported|looked|cared|"
    r"raised|adopted|fostered)[ \t]+(?:[a-z]+[ \t]+)?by|(?:discussed|d/w|spoke|spoken|liaised|"
    r"handed[ \t]+over)[ \t]+(?:with|to)|under[ \t]+(?:the[ \t]+)?care[ \t]+of|"
    r"(?:referring|requesting|reporting|attending|treating|admitting|responsible|supervising)"
    r"(?:[ \t]+(?:physician|doctor|clinician|consultant|neurologist|radiologist|surgeon))?|"
    r"consultant|registrar|radiologists?|radiographers?|operators?|technologists?|"
    r"next[ \t]+of[ \t]+kin|nok|wife|husband|partner|spouse|son|daughter|mother|father|"
    r"brother|sister|carer|guardian|friend|relative|niece|nephew|aunt|uncle|grandson|"
    r"granddaughter|emergency[ \t]+contact|girl-?friend|boy-?friend|fianc[ée]e?|flat-?mate|"
    r"house-?mate|room-?mate|neighbou?r|colleague|co-?worker|workmate|employer|boss|manager|"
    r"landlord|landlady|lodger|tenant|cousin|step-?(?:mother|father|son|daughter)|"
    r"grand(?:mother|father|child|ma|pa)|mum|mom|dad|in-law|god(?:mother|father|son|daughter)|"
    r"caregiver|care[ \t]+worker|key[ \t]+worker|support[ \t]+worker|social[ \t]+worker|"
    r"paramedic|physiotherapist|physio|therapist|pharmacist|nurse|midwife|teacher|coach|pastor|"
    r"priest|vicar|imam|rabbi|solicitor|lawyer|interpreter|witness|ex-?(?:wife|husband|partner)|"
    r"Nachbarin|Nachbar|Freundin|Freund|Ehemann|Ehefrau|Lebensgefährtin|Lebensgefährte|"
    r"Tochter|Sohn|Bruder|Schwester|Kollegin|Kollege|voisine|voisin|amie|ami|mari|femme|fille|"
    r"fils|copine|copain|vecina|vecino|amiga|amigo|esposa|esposo|novia|novio|hija|hijo|vicina|"
    r"vicino|amica|amico|marito|moglie|figlia|figlio|collega)\b[ \t]*[:–—-]?[ \t]*,?|"
    r"\b(?:cc|attn|author|reporter|from|to|gp|signed)[ \t]*:)[ \t]*(" + _SPAN + ")"
)
_TITLED = re.compile(
    rf"(?<!\w)({_TITLE})[ \t]+((?:{_PARTICLE}[ \t]+){{0,3}}{_TOKEN}(?:{_NEXT}{_TOKEN}){{0,4}})"
)
_DASH_LINE = re.compile(rf"(?m)^[ \t]*(?:—|–|--|~)[ \t]*({_SPAN})")
_NAME_LINE = re.compile(
    rf"(?m)^[ \t]*((?:[-—–~]+[ \t]*)?)({_SPAN})[ \t]*(\([^)\n]*\)|,[^\n]*)?[ \t]*\.?[ \t]*$"
)
_SIGN_OFF = re.compile(
    r"(?im)^[ \t]*(?:yours[ \t]+(?:sincerely|faithfully|truly)|(?:kind|best|warm|warmest|"
    r"with[ \t]+best)[ \t]+regards|regards|best[ \t]+wishes|many[ \t]+thanks|with[ \t]+thanks|"
    r"thanks)[ \t]*[,.!]?[ \t]*\n(?:[ \t]*\n)*[ \t]*"
)
_INITIALS_BEFORE = re.compile(rf"(?<![\w.])(?:[{_UPPER}]\.[ \t]?|[{_UPPER}][ \t])+(?=\[REDACTED\])")
_INITIALS_AFTER = re.compile(rf"(?<=\[REDACTED\])(?:,?[ \t]+[{_UPPER}]\.)+")


_TITLE_WORDS = frozenset(t.lower() for t in _TITLES) | word_set(
    "med dent vet rer nat phil habil univ sc h.c pol oec jur"
)
_NOT_TRAILING = NOT_NAMES | _ROLE_WORDS  # words that end a name span, not part of it
_NOT_IN_NAME = NOT_NAMES | _CLINICAL  # words that make a span not a name


def _bare(word: str) -> str:
    return word.lower().strip(".,")


def _name_in(span: str, *, marker: bool = True) -> tuple[int, int] | None:
    """Where the name is in a name-shaped ``span`` (titles before it and role words after it
    left out), or None when the words are not a name: a clinical or role word among them, only
    initials, or (without ``marker``) nothing that marks a signature (a title, an initial)."""
    toks = [(m.start(), m.end(), m.group()) for m in _TOKEN_RE.finditer(span)]
    titled = False
    while toks and _bare(toks[0][2]) in _TITLE_WORDS:
        toks.pop(0)
        titled = True
    while toks and toks[-1][2] != REDACTED and _bare(toks[-1][2]) in _NOT_TRAILING:
        toks.pop()
    words = [t for _, _, t in toks if t != REDACTED and len(t.rstrip(".")) > 1]
    if not toks or any(_bare(w) in _NOT_IN_NAME for w in words):
        return None
    if not words and REDACTED not in (t for _, _, t in toks):
        return None  # initials only
    initial = any(t != REDACTED and len(t.rstrip(".")) == 1 for _, _, t in toks)
    if not (marker or titled or initial):
        return None
    return toks[0][0], toks[-1][1]


def _eponym(span: str, after: str) -> bool:
    """Whether the words are a disease named after someone ("Parkinson's", "Guillain-Barré
    syndrome"), not a person: a possessive, a known eponym, or a disease word right after."""
    words = [w for w in re.split(r"[\s,]+", span) if w]
    return (
        any(re.search(r"['’]s$", w) for w in words)
        or any(_bare(part) in _EPONYMS for w in words for part in w.split("-"))
        or bool(_DISEASE_AFTER.match(after))
    )


def _redact_span(
    text: str, start: int, span: str, *, marker: bool = True, eponyms: bool = True
) -> tuple[str, bool]:
    where = _name_in(span, marker=marker)
    if where is None or span[where[0] : where[1]] == REDACTED:
        return text, False
    if eponyms and _eponym(span[where[0] : where[1]], text[start + where[1] :][:40]):
        return text, False
    a, b = start + where[0], start + where[1]
    return text[:a] + REDACTED + text[b:], True


def _sub_spans(
    pattern: re.Pattern[str], text: str, group: int, *, eponyms: bool
) -> tuple[str, int]:
    """Redact the name in ``group`` of every match of ``pattern`` (right to left, so offsets hold)."""
    n = 0
    for m in reversed(list(pattern.finditer(text))):
        text, done = _redact_span(text, m.start(group), m.group(group), eponyms=eponyms)
        n += done
    return text, n


# A name after a preposition or conjunction, in the languages notes are written in: redacted
# only when it is a name by its own evidence (a given name, see ``scrub_given_names``).
_AGENT_CUE = re.compile(
    r"(?i:\b(?:by|with|from|per|and|to|for|von|mit|durch|bei|und|par|avec|et|por|con|y|da|dal|"
    r"door|met|en)\b)[ \t]+(" + _SPAN + ")"
)
_NAME_PARTICLES = word_set("van von der den de del della di du da dos das le la bin ibn al el")
_CAPITALISED = re.compile(rf"[{_UPPER}]{_LETTER}*(?:['’-]{_LETTER}+)*")


def _title_case(word: str) -> bool:
    return word[:1].isupper() and any(c.islower() for c in word[1:])


def _given_name(word: str) -> bool:
    """A word that is a given name by itself: title case, in the name list, not a word that
    stands next to names or in clinical text."""
    bare = _bare(word)
    if "-" in word.strip("-"):  # "Hans-Peter", "Jean-Luc": each part a given name
        parts = word.strip("-").split("-")
        return all(_title_case(p) and _given_name(p) for p in parts)
    return (
        _title_case(word)
        and is_first_name(word)
        and bare not in _NOT_IN_NAME
        and bare not in _ROLE_WORDS
        and bare not in _TITLE_WORDS
        and bare not in _EPONYMS
    )


def _names_a_disease(text: str, end: int) -> bool:
    """Whether the words ending at ``end`` name a disease, sign or structure after a person
    ("Marcus Gunn pupil", "Addison's disease", "Charles Bonnet syndrome")."""
    after = re.sub(r"^['’]s\b", "", text[end : end + 60])
    return bool(_DISEASE_AFTER.match(after))


def scrub_given_names(text: str) -> tuple[str, int]:
    """Redact every person named in free text by a given name, wherever it stands: the given
    name (of the bundled name list, many countries, common words left out) and the capitalised
    words that follow it (the family name, with its particles), unless they name a disease, sign
    or structure; and a name after a preposition or conjunction ("with Rashid", "from Agnieszka
    Kowalczyk", "durch ..."), which is one when it starts with a given name."""
    n = 0
    spans: list[tuple[int, int]] = []
    for m in _CAPITALISED.finditer(text):
        if not _given_name(m.group()):
            continue
        end, pos, taken = m.end(), m.end(), 0
        while taken < 3:
            nxt = re.match(r"[ \t]+(\S+)", text[pos:])
            if nxt is None:
                break
            word = nxt.group(1).rstrip(".,;:)")
            if word.lower() in _NAME_PARTICLES:
                pos += nxt.end()
                continue
            if not (_CAPITALISED.fullmatch(word) and _title_case(word)):
                break
            if _bare(word) in _NOT_IN_NAME or _bare(word) in _ROLE_WORDS:
                break
            pos += nxt.start(1) + len(word)
            end = pos
            taken += 1
        if _names_a_disease(text, end) or any(
            _bare(w) in _EPONYMS for w in re.split(r"[\s-]+", text[m.start() : end])
        ):
            continue
        spans.append((m.start(), end))
    for a, b in reversed(_merged(spans)):
        text = text[:a] + REDACTED + text[b:]
        n += 1
    return text, n


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(b, out[-1][1]))
        else:
            out.append((a, b))
    return out


def scrub_signatures(text: str) -> tuple[str, int]:
    """Redact the names on signature lines and next to a title, role or relation word, whoever
    they are: the rest of a line that starts with a signature cue ("Signed:", "Electronically
    signed by", "Dictated by", "Verified by"...), the name after a role or relation cue
    ("reported by", "discussed with", "cc:", "registrar", "wife"...), after a title (Dr, Prof,
    Mr...), after a dash that opens a line ("— M. Alvarez"), on a line that is only a name with
    a department or role ("M. Alvarez (neurology)"), and after a sign-off ("Kind regards,")."""
    n = 0
    out = []
    last = 0
    for m in _STRONG_CUE.finditer(text):
        rest = m.group(2)
        if rest.strip() == REDACTED:
            continue
        if not _CUE_END.search(m.group(1)):  # a bare cue: only a name after it counts
            head = _SPAN_RE.match(rest)
            if head is None or _name_in(head.group()) is None:
                continue
        out.append(text[last : m.start(2)] + REDACTED)
        last = m.end(2)
        n += 1
    text = "".join(out) + text[last:]
    for pattern, group, eponyms in (
        (_WEAK_CUE, 1, True),
        (_TITLED, 2, False),  # "Dr Parkinson's clinic" is a person
        (_DASH_LINE, 1, True),
    ):
        text, k = _sub_spans(pattern, text, group, eponyms=eponyms)
        n += k
    for m in reversed(list(_NAME_LINE.finditer(text))):
        dash, span, tail = m.group(1), m.group(2), m.group(3) or ""
        role = any(_bare(w) in _ROLE_WORDS for w in re.split(r"[\s(),/]+", tail) if w)
        text, done = _redact_span(text, m.start(2), span, marker=bool(dash) or role)
        n += done
    for m in reversed(list(_SIGN_OFF.finditer(text))):
        line = _SPAN_RE.match(text, m.end())
        if line:
            text, done = _redact_span(text, m.end(), line.group(), marker=True)
            n += done
    return text, n


@lru_cache(maxsize=256)
def _terms_pattern(terms: tuple[str, ...]) -> re.Pattern[str] | None:
    """One pattern for all the terms, longest first (so a full name wins over its parts)."""
    ordered = sorted({t for t in terms if t}, key=len, reverse=True)
    if not ordered:
        return None
    return re.compile(r"(?<!\w)(?:" + "|".join(map(re.escape, ordered)) + r")(?!\w)", re.I)


def scrub_text(text: str, terms: list[str]) -> tuple[str, dict[str, int]]:
    """Replace the identifiers of the record's persons, the names on signature lines and
    identifier-shaped strings; count what was replaced."""
    text, counts = normalise(text)
    text, found = scrub_identifiers(text)
    for kind, n in found.items():
        counts[kind] = counts.get(kind, 0) + n
    known = _terms_pattern(tuple(terms))
    if known is not None:
        text, n = known.subn(REDACTED, text)
        if n:
            counts["identifier"] = n
    text, n = scrub_signatures(text)
    text, k = scrub_given_names(text)
    if n + k:
        counts["person_name"] = n + k
    # "M. [REDACTED]" and "[REDACTED], M." say no more than "[REDACTED]"
    text = _INITIALS_AFTER.sub("", _INITIALS_BEFORE.sub("", text))
    for kind, scrub in (("address", scrub_addresses), ("date", scrub_dates)):
        text, n = scrub(text)
        if n:
            counts[kind] = counts.get(kind, 0) + n
    for name, pattern in _PATTERNS:
        text, n = pattern.subn(_keep_label(name), text)
        if n:
            counts[name] = counts.get(name, 0) + n
    text, n = _OLD_AGE.subn("90+", text)
    text, k = _OLD_AGE_AFTER.subn(lambda m: m.group(1) + "90+", text)
    n += k
    if n:
        counts["age_over_89"] = n
    return text, counts


def _keep_label(name: str) -> str | re._ReplacementFn:  # type: ignore[name-defined]
    """For 'Label: value' patterns keep the label and redact the value."""
    if name in ("labelled_name", "labelled_address", "labelled_id"):
        return lambda m: f"{m.group(1)}: {REDACTED}"
    return REDACTED


def png_text_chunks(png: bytes) -> list[str]:
    """Names of ancillary chunks that can carry text or identifiers; raises on a non-PNG."""
    if not png.startswith(_PNG_SIG):
        raise PHIError("image is not a PNG: it cannot be checked for embedded text")
    found, pos = [], len(_PNG_SIG)
    while pos + 8 <= len(png):
        length, kind = struct.unpack(">I4s", png[pos : pos + 8])
        if kind in _TEXT_CHUNKS:
            found.append(kind.decode("ascii"))
        if kind == b"IEND":
            break
        pos += 12 + length
    return found


def strip_png(png: bytes) -> bytes:
    """Re-encode a PNG with pixels only (no text, time or EXIF chunks)."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        im.load()
        clean = Image.frombytes(im.mode, im.size, im.tobytes())
        palette = im.getpalette() if im.mode == "P" else None
        if palette:
            clean.putpalette(palette)
        buf = io.BytesIO()
        clean.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def study_terms(persons: list[StudyPerson]) -> list[str]:
    """The terms of every person a study's headers name: each component group of the PN value
    (alphabetic, ideographic, phonetic) in each written form, and the words of a value that is
    not in DICOM form."""
    from dicom import parse_person_name

    terms: list[str] = []
    for person in persons:
        for pn in parse_person_name(person.name):
            family, given = pn.family, pn.given
            if not given and " " in family.strip():  # "Marta Alvarez" in a PN attribute
                *given, family = family.split()
            terms += person_terms(family, given)
    return terms


class PHIGate:
    """Applies a :class:`PHIPolicy` to the messages of one request."""

    def __init__(self, policy: PHIPolicy | None = None) -> None:
        self.policy = policy or PHIPolicy()
        self._terms: dict[str, list[str]] = {}
        self.pixels = PixelScreen()  # text in images, read once per image for the gate's life
        self._pixel_matchers: dict[str, TextMatcher] = {}
        self._planted: dict[str, list[PlantedText]] = {}  # by the image's sha256

    def expect_planted(self, planted: Mapping[str, Iterable[PlantedText]]) -> None:
        """Text the robustness audit drew into images, by the image's sha256
        (``evaluation.robustness.planted_pixels``): read there, it is recorded as planted
        (``ImageAction.planted_words``/``planted_kept``), not taken for a person's data."""
        for sha, texts in planted.items():
            held = self._planted.setdefault(sha, [])
            held += [t for t in texts if t not in held]

    def pixel_matcher(self, case: Case) -> TextMatcher:
        """What identifies someone in text read from this case's pixels: ``terms_for`` and the
        text rules of ``scrub_text``."""
        if case.case_id not in self._pixel_matchers:
            terms = pixel_terms(case, self.terms_for(case))
            rules = partial(scrub_text, terms=[])
            self._pixel_matchers[case.case_id] = TextMatcher(terms, rules)
        return self._pixel_matchers[case.case_id]

    def terms_for(self, case: Case, record: EHRContext | None = None) -> list[str]:
        """What identifies a person in this case: what its record names (``identifying_terms``:
        every person, in any element, contact points, addresses, the patient's identifiers),
        every person the study's headers name, in each of their written forms, and the study's
        identifiers (patient ID, accession number, institution). ``record``: the case's record
        when the caller has read it already."""
        if case.case_id not in self._terms:
            if record is None and case.ehr is not None:
                record = EHRContext.from_bundle(case.ehr)
            terms = identifying_terms(record)
            if case.patient_id:
                terms.append(case.patient_id)
            ident = case.provenance.identity
            if ident is not None:
                terms += study_terms(ident.persons)
                terms += [ident.patient_id, ident.accession_number, ident.institution]
                terms += display_terms(ident.patient_name)
            self._terms[case.case_id] = sorted(
                {t for t in terms if long_enough(t)}, key=len, reverse=True
            )
        return self._terms[case.case_id]

    def trusts(self, api_base: str | None, *, local: bool = False) -> bool:
        """Whether content goes to this endpoint as it is (``prepare`` then reads nothing)."""
        return is_trusted(api_base, self.policy, local=local)

    def prepare(
        self, messages: list[Message], case: Case, api_base: str | None, *, local: bool = False
    ) -> tuple[list[Message], GateResult]:
        """The messages as they may be sent to this endpoint, and what was changed."""
        if self.trusts(api_base, local=local):
            return messages, GateResult(remote=False, deidentified=False)
        terms = self.terms_for(case)
        burned = set(case.provenance.burned_in_series)
        burned_hashes = {
            img.sha256 for img in case.images if img.series_uid and img.series_uid in burned
        }
        result = GateResult(remote=True, deidentified=True)

        def scrub(piece: str) -> str:
            text, counts = scrub_text(piece, terms)
            for k, v in counts.items():
                result.redactions[k] = result.redactions.get(k, 0) + v
            return text

        out: list[Message] = []
        for msg in messages:
            parts: list[TextPart | ImagePart] = []
            for part in msg.content:
                if isinstance(part, TextPart):
                    if msg.role == "assistant":
                        parts.append(part)  # the model's own words, already scrubbed going out
                        continue
                    parts.append(TextPart(text=map_data(part.text, scrub)))
                    continue
                planted = self._planted.get(part.sha256, [])
                if part.sha256 in burned_hashes:
                    result.dropped_images.append(part.sha256)
                    result.image_actions.append(
                        ImageAction(
                            sha256=part.sha256,
                            action="withheld",
                            reason=PixelReason.BURNED_IN_FLAG,
                            planted_words=0 if planted else None,
                            planted_kept=False if planted else None,
                        )
                    )
                    parts.append(
                        TextPart(text="[image withheld: its series may carry burned-in text]")
                    )
                    continue
                png, action = self.pixels.screen(part.png, self.pixel_matcher(case), planted)
                if action is not None:
                    result.image_actions.append(action)
                if png is None:
                    result.dropped_images.append(part.sha256)
                    parts.append(TextPart(text="[image withheld: text in its pixels]"))
                    continue
                if png_text_chunks(png):
                    png = strip_png(png)
                    result.reencoded_images += 1
                label = scrub(part.label)
                if action is not None and action.action == "redacted":
                    label += " (text in the image blacked out)"
                parts.append(
                    ImagePart(png=png, sha256=hashlib.sha256(png).hexdigest(), label=label)
                )
            out.append(Message(role=msg.role, content=parts))
        return out, result


def audit_record(
    messages: list[Message],
    gate: GateResult,
    *,
    model: str,
    endpoint: str,
    case_id: str,
    cache_key: str,
) -> AuditRecord:
    images = [p for m in messages for p in m.content if isinstance(p, ImagePart)]
    chars = sum(len(p.text) for m in messages for p in m.content if isinstance(p, TextPart))
    return AuditRecord(
        time=dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
        model=model,
        endpoint=endpoint,
        case_id=case_id,
        cache_key=cache_key,
        remote=gate.remote,
        deidentified=gate.deidentified,
        image_sha256=[p.sha256 for p in images],
        image_bytes=[len(p.png) for p in images],
        text_chars=chars,
        redactions=gate.redactions,
        dropped_images=gate.dropped_images,
        image_actions=gate.image_actions,
    )
