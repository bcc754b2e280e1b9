"""The PHI gate: what may leave for a model endpoint, and the audit of every outbound payload.

An endpoint is *trusted* when its host is on the allow-list (by default only loopback: the
reference models, a vLLM/Ollama server on this machine). Anything else is remote and receives
only de-identified content:

* text parts are scrubbed of the patient's own identifiers (names, MRN and other identifiers,
  telecom, address, birth date, taken from the FHIR Patient resource) and of identifier shapes
  (dates, phone numbers, e-mail addresses, long digit runs, "MRN: ..." fields, ages over 89);
* images must be PNGs without text chunks (re-encoded otherwise) and must not come from a series
  flagged as carrying burned-in annotation (dropped, and the drop is recorded);
* rendered labels and the EHR block carry no identifiers by construction, and are scrubbed too.

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
from urllib.parse import urlparse

from pydantic import BaseModel, Field

from evaluation.case import Case
from evaluation.ehr import identifying_terms
from evaluation.errors import PHIError
from evaluation.modelio import ImagePart, Message, TextPart

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
    ("labelled_name", re.compile(r"\b(Patient|Name|Pt)\s*:\s*[^\n]*?(?=\s{2,}|\t|$)", re.I | re.M)),
    ("labelled_address", re.compile(r"\b(Address|Addr)\s*:\s*[^\n]*?(?=\s{2,}|\t|$)", re.I | re.M)),
    ("date", re.compile(r"\b\d{1,2}[/.-]\d{1,2}[/.-]\d{2,4}\b")),
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
    ("uk_postcode", re.compile(r"\b[A-Z]{1,2}\d[A-Z\d]?\s+\d[A-Z]{2}\b")),
    ("title_name", re.compile(r"\b(Mr|Mrs|Ms|Miss|Dr)\.?\s+[A-Z][A-Za-z'-]+")),
]
_OLD_AGE = re.compile(r"\b(9\d|1[0-4]\d)(?=\s*(-?\s*year|y/?o\b|yo\b|yrs?\b))", re.I)


class PHIPolicy(BaseModel):
    """Which endpoints may receive identified content. Entries: "loopback", host, IP or CIDR."""

    trusted: list[str] = Field(default_factory=lambda: [LOOPBACK])


class GateResult(BaseModel):
    remote: bool
    deidentified: bool
    redactions: dict[str, int] = Field(default_factory=dict)
    dropped_images: list[str] = Field(default_factory=list)  # sha256 of images not sent
    reencoded_images: int = 0


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


def scrub_text(text: str, terms: list[str]) -> tuple[str, dict[str, int]]:
    """Replace the patient's identifiers and identifier-shaped strings; count what was replaced."""
    counts: dict[str, int] = {}
    for term in terms:
        pattern = re.compile(r"(?<!\w)" + re.escape(term) + r"(?!\w)", re.I)
        text, n = pattern.subn(REDACTED, text)
        if n:
            counts["identifier"] = counts.get("identifier", 0) + n
    for name, pattern in _PATTERNS:
        text, n = pattern.subn(_keep_label(name), text)
        if n:
            counts[name] = counts.get(name, 0) + n
    text, n = _OLD_AGE.subn("90+", text)
    if n:
        counts["age_over_89"] = n
    return text, counts


def _keep_label(name: str) -> str | re._ReplacementFn:  # type: ignore[name-defined]
    """For 'Label: value' patterns keep the label and redact the value."""
    if name in ("labelled_name", "labelled_address", "labelled_id"):
        return lambda m: f"{m.group(1)}: {REDACTED}"
    if name == "title_name":
        return lambda m: f"{m.group(1)} {REDACTED}"
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


class PHIGate:
    """Applies a :class:`PHIPolicy` to the messages of one request."""

    def __init__(self, policy: PHIPolicy | None = None) -> None:
        self.policy = policy or PHIPolicy()
        self._terms: dict[str, list[str]] = {}

    def terms_for(self, case: Case) -> list[str]:
        if case.case_id not in self._terms:
            terms = identifying_terms(case.ehr) if case.ehr else []
            if case.patient_id and len(case.patient_id) >= 3:
                terms.append(case.patient_id)
            self._terms[case.case_id] = terms
        return self._terms[case.case_id]

    def prepare(
        self, messages: list[Message], case: Case, api_base: str | None, *, local: bool = False
    ) -> tuple[list[Message], GateResult]:
        """The messages as they may be sent to this endpoint, and what was changed."""
        if is_trusted(api_base, self.policy, local=local):
            return messages, GateResult(remote=False, deidentified=False)
        terms = self.terms_for(case)
        burned = set(case.provenance.burned_in_series)
        burned_hashes = {
            img.sha256 for img in case.images if img.series_uid and img.series_uid in burned
        }
        result = GateResult(remote=True, deidentified=True)
        out: list[Message] = []
        for msg in messages:
            parts: list[TextPart | ImagePart] = []
            for part in msg.content:
                if isinstance(part, TextPart):
                    if msg.role == "assistant":
                        parts.append(part)  # the model's own words, already scrubbed going out
                        continue
                    text, counts = scrub_text(part.text, terms)
                    for k, v in counts.items():
                        result.redactions[k] = result.redactions.get(k, 0) + v
                    parts.append(TextPart(text=text))
                    continue
                if part.sha256 in burned_hashes:
                    result.dropped_images.append(part.sha256)
                    parts.append(
                        TextPart(text="[image withheld: its series may carry burned-in text]")
                    )
                    continue
                png = part.png
                if png_text_chunks(png):
                    png = strip_png(png)
                    result.reencoded_images += 1
                label, counts = scrub_text(part.label, terms)
                for k, v in counts.items():
                    result.redactions[k] = result.redactions.get(k, 0) + v
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
    )
