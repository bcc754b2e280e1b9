"""FHIR R4 Bundle in, compact clinical text block out (what a prompt shows of the record).

The block carries what a neurologist reads first: age and sex, the reason for the encounter,
active conditions, vital signs, laboratory values and scores (NIHSS, EDSS, GCS...), current
medication. It never carries names, identifiers, addresses, telecom or absolute dates: age is
computed at the encounter, so the block is safe to show a remote model as it is.

Every field is hostile: wrong types, missing keys, huge strings and huge lists are tolerated and
bounded; a malformed resource is skipped, never fatal.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

MAX_ITEM_CHARS = 160  # one condition, observation or medication
MAX_ITEMS = 40  # per section
MAX_BLOCK_CHARS = 4000
_SCORE_WORDS = ("nihss", "edss", "gcs", "glasgow", "mrs", "rankin", "moca", "mmse")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _text(value: Any, limit: int = MAX_ITEM_CHARS) -> str:
    """A display string from a hostile value: only str/int/float, control chars removed, bounded."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return ""
    s = _CONTROL.sub(" ", str(value))
    s = " ".join(s.split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value[:500] if isinstance(value, list) else []


def _concept(value: Any) -> str:
    """Display text of a CodeableConcept: its text, else the first coding's display or code."""
    cc = _dict(value)
    text = _text(cc.get("text"))
    if text:
        return text
    for coding in _list(cc.get("coding")):
        c = _dict(coding)
        shown = _text(c.get("display")) or _text(c.get("code"))
        if shown:
            return shown
    return ""


def _codes(value: Any) -> list[str]:
    out = []
    for coding in _list(_dict(value).get("coding")):
        code = _text(_dict(coding).get("code"), 40)
        if code:
            out.append(code)
    return out


def _date(value: Any) -> dt.date | None:
    s = _text(value, 40)
    m = re.match(r"(\d{4})-(\d{2})-(\d{2})", s)
    if m:
        try:
            return dt.date(int(m[1]), int(m[2]), int(m[3]))
        except ValueError:
            return None
    m = re.match(r"(\d{4})$", s)
    return dt.date(int(m[1]), 7, 1) if m else None


def resources(bundle: Any) -> list[dict[str, Any]]:
    """The resources of a Bundle (or a bare list of resources), skipping anything malformed."""
    if isinstance(bundle, list):
        entries = [{"resource": r} for r in bundle]
    else:
        entries = _list(_dict(bundle).get("entry"))
    out = []
    for e in entries:
        r = _dict(_dict(e).get("resource"))
        if isinstance(r.get("resourceType"), str):
            out.append(r)
    return out


def _of(res: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in res if r.get("resourceType") == kind]


def patient_age(bundle: Any) -> int | None:
    """Age in whole years at the encounter start (else the Bundle timestamp)."""
    res = resources(bundle)
    patients = _of(res, "Patient")
    if not patients:
        return None
    born = _date(patients[0].get("birthDate"))
    ref = None
    for enc in _of(res, "Encounter"):
        ref = _date(_dict(enc.get("period")).get("start"))
        if ref:
            break
    ref = ref or _date(_dict(bundle).get("timestamp") if isinstance(bundle, dict) else None)
    if born is None or ref is None:
        return None
    years = ref.year - born.year - ((ref.month, ref.day) < (born.month, born.day))
    return years if 0 <= years < 130 else None


def _observation(r: dict[str, Any]) -> tuple[str, str] | None:
    name = _concept(r.get("code"))
    if not name:
        return None
    q = _dict(r.get("valueQuantity"))
    if isinstance(q.get("value"), (int, float)) and not isinstance(q.get("value"), bool):
        unit = _text(q.get("unit"), 20) or _text(q.get("code"), 20)
        value = f"{q['value']:g}" + (f" {unit}" if unit else "")
    elif "valueString" in r:
        value = _text(r.get("valueString"))
    elif "valueCodeableConcept" in r:
        value = _concept(r.get("valueCodeableConcept"))
    elif isinstance(r.get("valueInteger"), int) and not isinstance(r.get("valueInteger"), bool):
        value = str(r["valueInteger"])
    elif "component" in r:  # blood pressure: systolic/diastolic components
        parts = []
        for comp in _list(r.get("component"))[:4]:
            cq = _dict(_dict(comp).get("valueQuantity"))
            if isinstance(cq.get("value"), (int, float)) and not isinstance(cq.get("value"), bool):
                parts.append(f"{cq['value']:g}")
        value = "/".join(parts)
    else:
        return None
    if not value:
        return None
    flags = [_text(c, 10) for c in _codes_list(r.get("interpretation"))]
    flag = f" ({', '.join(f for f in flags if f)})" if any(flags) else ""
    categories = " ".join(
        c for cat in _list(r.get("category")) for c in [*_codes(cat), _concept(cat)]
    ).lower()
    lname = name.lower()
    if any(w in lname for w in _SCORE_WORDS) or "survey" in categories:
        section = "Scores"
    elif "vital" in categories:
        section = "Vital signs"
    elif "laboratory" in categories:
        section = "Laboratory"
    else:
        section = "Other findings"
    return section, _text(f"{name}: {value}{flag}")


def _codes_list(value: Any) -> list[str]:
    out: list[str] = []
    for cc in _list(value):
        out.extend(_codes(cc))
    return out


def ehr_text(bundle: Any, max_chars: int = MAX_BLOCK_CHARS) -> str:
    """The compact text block of a FHIR R4 Bundle; empty string when there is nothing to show."""
    if bundle is None:
        return ""
    res = resources(bundle)
    lines: list[str] = []
    patients = _of(res, "Patient")
    if patients:
        age = patient_age(bundle)
        sex = _text(patients[0].get("gender"), 20)
        bits = []
        if age is not None:
            bits.append(f"{age} years" if age < 90 else "90 years or older")
        if sex:
            bits.append(sex)
        if bits:
            lines.append("Patient: " + ", ".join(bits))
    reasons = []
    for enc in _of(res, "Encounter"):
        cls = _text(_dict(enc.get("class")).get("code"), 20)
        for rc in _list(enc.get("reasonCode"))[:MAX_ITEMS]:
            text = _concept(rc)
            if text:
                reasons.append(text + (f" ({_encounter_class(cls)})" if cls else ""))
    if reasons:
        lines.append("Encounter reason: " + "; ".join(reasons[:5]))
    sections: dict[str, list[str]] = {}
    for cond in _of(res, "Condition"):
        status = _codes(cond.get("clinicalStatus"))
        if status and status[0] not in ("active", "recurrence", "relapse"):
            continue
        name = _concept(cond.get("code"))
        icd = [c for c in _codes(cond.get("code")) if c != name]
        if name:
            sections.setdefault("Conditions", []).append(name + (f" [{icd[0]}]" if icd else ""))
    for obs in _of(res, "Observation"):
        if _text(obs.get("status"), 20) in ("entered-in-error", "cancelled"):
            continue
        item = _observation(obs)
        if item:
            sections.setdefault(item[0], []).append(item[1])
    for med in _of(res, "MedicationStatement"):
        if _text(med.get("status"), 20) in ("entered-in-error", "not-taken", "stopped"):
            continue
        name = _concept(med.get("medicationCodeableConcept"))
        if name:
            sections.setdefault("Medication", []).append(name)
    order = ("Conditions", "Vital signs", "Scores", "Laboratory", "Other findings", "Medication")
    for key in order:
        items = list(dict.fromkeys(sections.get(key, [])))
        if not items:
            continue
        shown = items[:MAX_ITEMS]
        more = f"; and {len(items) - len(shown)} more" if len(items) > len(shown) else ""
        lines.append(f"{key}: " + "; ".join(shown) + more)
    block = "\n".join(lines)
    if len(block) > max_chars:
        block = block[: max_chars - 24].rsplit("\n", 1)[0] + "\n[record truncated]"
    return block


def _encounter_class(code: str) -> str:
    return {"EMER": "emergency", "AMB": "outpatient", "IMP": "inpatient"}.get(code, code.lower())


def note_from_bundle(bundle: Any, max_chars: int = 20000) -> str:
    """Text of the first plain-text DocumentReference attachment (a clinical note), if any."""
    import base64
    import binascii

    for doc in _of(resources(bundle), "DocumentReference"):
        for content in _list(doc.get("content")):
            att = _dict(_dict(content).get("attachment"))
            if not str(att.get("contentType", "text/plain")).startswith("text/"):
                continue
            data = att.get("data")
            if isinstance(data, str) and len(data) < max_chars * 2:
                try:
                    return base64.b64decode(data, validate=True).decode("utf-8", "replace")[
                        :max_chars
                    ]
                except (binascii.Error, ValueError):
                    continue
    return ""


# --------------------------------------------------------------------------- who the record names


def word_set(text: str) -> frozenset[str]:
    """A list of words written as one space-separated text."""
    return frozenset(text.split())


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
# FHIR resources that are people, and Reference keys that point at one
PERSON_RESOURCES = frozenset({"Patient", "Practitioner", "PractitionerRole", "RelatedPerson", "Person"})  # fmt: skip
_PERSON_KEYS = word_set(
    """author authenticator attester party performer participant individual actor requester
    recorder asserter informant enterer who onBehalfOf generalPractitioner verifier sender
    recipient interpreter resultsInterpreter referrer orderer agent collector practitioner
    attender consultant responsible responsibleParty careManager reporter witness contact
    signer custodianPerson"""
)
_FOLD = str.maketrans({"ß": "ss", "ø": "o", "Ø": "O", "æ": "ae", "Æ": "AE", "œ": "oe",
                       "Œ": "OE", "ł": "l", "Ł": "L", "đ": "d", "Đ": "D", "ı": "i", "þ": "th",
                       "Þ": "Th", "ð": "d", "Ð": "D"})  # fmt: skip
_WORDS = re.compile(r"[\s\-‐–]+")
_CJK = re.compile(r"[\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_MAX_NODES = 50_000
_MAX_DEPTH = 24


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


def _human_name(n: dict[str, Any]) -> list[str]:
    given = [g for g in _list(n.get("given")) if isinstance(g, str)]
    family = n["family"] if isinstance(n.get("family"), str) else ""
    terms = person_terms(family, given, _text(n.get("text"))) if family or given else []
    if isinstance(n.get("text"), str):
        terms += display_terms(n["text"])
    return terms


def _reference_type(ref: dict[str, Any]) -> str:
    kind = ref.get("type")
    if isinstance(kind, str):
        return kind.rstrip("/").rsplit("/", 1)[-1]
    target = ref.get("reference")
    if isinstance(target, str) and not target.startswith(("urn:", "#")):
        parts = target.split("?")[0].rstrip("/").split("/")
        return parts[-2] if len(parts) >= 2 else ""
    return ""


def person_name_terms(bundle: Any) -> list[str]:
    """Terms of every person the record names, whatever their role: every HumanName anywhere
    (patients, practitioners, related persons, contacts, contained resources), the display of
    every Reference to a person (an encounter's participants, a note's author and
    authenticator, a general practitioner...), and the telecom and address of each."""
    terms: list[str] = []
    budget = [_MAX_NODES]

    def walk(node: Any, key: str, depth: int) -> None:
        budget[0] -= 1
        if budget[0] < 0 or depth > _MAX_DEPTH:
            return
        if isinstance(node, list):
            for item in node[:500]:
                walk(item, key, depth + 1)
            return
        if not isinstance(node, dict):
            return
        if (key == "name" or "family" in node or "given" in node) and "coding" not in node:
            terms.extend(_human_name(node))
        if isinstance(node.get("display"), str) and "coding" not in node and "code" not in node:
            kind = _reference_type(node)
            if kind in PERSON_RESOURCES or (not kind and key in _PERSON_KEYS):
                terms.extend(display_terms(node["display"]))
        if key == "telecom" and isinstance(node.get("value"), str):
            terms.append(_text(node["value"]))
        if key == "address":
            terms.append(_text(node.get("text")))
            terms.extend(_text(line) for line in _list(node.get("line")))
            terms.extend(_text(node.get(k)) for k in ("city", "postalCode"))
        for k, v in node.items():
            if isinstance(v, dict | list):
                walk(v, k, depth + 1)

    walk(resources(bundle), "", 0)
    return terms


def identifying_terms(bundle: Any) -> list[str]:
    """Strings of the record that identify a person (for scrubbing free text): the patient's
    names, identifiers, telecom, address and birth date, and every other person the record
    names (``person_name_terms``), longest first."""
    terms: list[str] = person_name_terms(bundle)
    for p in _of(resources(bundle), "Patient"):
        for name in _list(p.get("name")):
            n = _dict(name)
            terms.append(_text(n.get("text")))
            terms.append(_text(n.get("family")))
            terms.extend(_text(g) for g in _list(n.get("given")))
        for ident in _list(p.get("identifier")):
            terms.append(_text(_dict(ident).get("value")))
        for tel in _list(p.get("telecom")):
            terms.append(_text(_dict(tel).get("value")))
        for addr in _list(p.get("address")):
            a = _dict(addr)
            terms.append(_text(a.get("text")))
            terms.extend(_text(line) for line in _list(a.get("line")))
            terms.extend(_text(a.get(k)) for k in ("city", "postalCode"))
        born = _date(p.get("birthDate"))
        if born:
            terms.extend(
                [
                    born.isoformat(),
                    born.strftime("%d/%m/%Y"),
                    born.strftime("%m/%d/%Y"),
                    born.strftime("%d.%m.%Y"),
                    born.strftime("%Y%m%d"),
                ]
            )
    # Short fragments (initials) would scrub ordinary words; keep terms of 3+ characters (2 for
    # a name in Chinese, Japanese or Korean characters).
    return sorted({t for t in terms if long_enough(t)}, key=len, reverse=True)


def long_enough(term: str) -> bool:
    """Whether a term is long enough to scrub wherever it stands as a word."""
    return len(term) >= 3 or (len(term) == 2 and bool(_CJK.search(term)))
