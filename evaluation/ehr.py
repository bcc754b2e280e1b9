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


def identifying_terms(bundle: Any) -> list[str]:
    """Strings of the Patient resource that identify the person (for scrubbing free text)."""
    terms: list[str] = []
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
    # Short fragments (initials) would scrub ordinary words; keep terms of 3+ characters.
    return sorted({t for t in terms if len(t) >= 3}, key=len, reverse=True)
