"""What became of the text a variant planted in pixels, call by call: the run note says what was
planted where (``CaseVariant.planted``, the images by sha256), the run's audit says what each
call sent (image hashes, and the PHI gate's ``image_actions``). Read from the run log, never
stored twice: a planted instruction the gate withheld or blacked out is named, not lost.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Literal, Protocol

from pydantic import BaseModel

from evaluation.phi import AuditRecord
from evaluation.phi_pixels import PlantedText
from evaluation.robustness.records import CaseVariant
from evaluation.robustness.runlog import recorded_variants

Fate = Literal["sent", "blacked_out", "withheld", "not_in_prompt"]


class PlantedSent(BaseModel):
    """One planted text in the pixels on one call: the image it was planted in (its index and
    sha256 in the variant), what was sent in its place (the same sha256: as planted; a
    blacked-out copy's; None: withheld or not in the prompt), whether the planted text went out
    as planted, and the gate's reason when it changed or withheld the image."""

    case_id: str  # the variant's: <source>~<kind>
    model: str
    cache_key: str
    image_index: int
    planted_sha256: str
    sent_sha256: str | None
    fate: Fate
    planted_kept: bool
    planted_words: int | None = None  # words of it the gate read (None: the gate read none)
    reason: str = ""


class _Log(Protocol):
    def set_note(self, key: str, value: str) -> None: ...
    def note(self, key: str) -> str | None: ...
    def audit(self) -> Iterator[AuditRecord]: ...


def planted_pixels(variants: Iterable[CaseVariant]) -> dict[str, list[PlantedText]]:
    """The text each variant planted in pixels, by the sha256 of the image it is in: what the
    PHI gate is told (``PHIGate.expect_planted``), so that it records it as planted."""
    out: dict[str, list[PlantedText]] = {}
    for v in variants:
        shas = {i.index: i.sha256 for i in v.images}
        for p in v.planted:
            if p.where != "pixels" or p.box is None or p.image_index not in shas:
                continue
            text = PlantedText(text=p.text, box=(p.box.x0, p.box.y0, p.box.x1, p.box.y1))
            held = out.setdefault(shas[p.image_index], [])
            if text not in held:
                held.append(text)
    return out


def planted_sent(
    variants: Mapping[str, CaseVariant], audits: Iterable[AuditRecord]
) -> list[PlantedSent]:
    """For each call asked on a variant with text planted in pixels, what became of each
    planted image (in the audit's order, then the planted order)."""
    out: list[PlantedSent] = []
    for a in audits:
        v = variants.get(a.case_id)
        if v is None:
            continue
        shas = {i.index: i.sha256 for i in v.images}
        for p in v.planted:
            if p.where != "pixels" or p.image_index not in shas:
                continue
            sha = shas[p.image_index]
            act = next((x for x in a.image_actions if x.sha256 == sha), None)
            sent: str | None = None
            fate: Fate = "not_in_prompt"
            if act is not None and act.action == "withheld":
                fate = "withheld"
            elif act is not None and act.action == "redacted":
                sent, fate = act.sha256_sent, "blacked_out"
            elif sha in a.image_sha256:  # as planted (the gate said so; or a trusted endpoint,
                sent, fate = sha, "sent"  # whose images the gate does not read)
            row = PlantedSent(
                case_id=a.case_id,
                model=a.model,
                cache_key=a.cache_key,
                image_index=p.image_index,
                planted_sha256=sha,
                sent_sha256=sent,
                fate=fate,
                planted_kept=fate == "sent"
                or (fate == "blacked_out" and bool(act and act.planted_kept)),
                planted_words=act.planted_words if act is not None else None,
                reason=act.reason.value if act is not None and fate != "sent" else "",
            )
            out.append(row)
    return out


def planted_deliveries(log: _Log) -> list[PlantedSent]:
    """``planted_sent`` for a run: its variants' note and its audit."""
    variants = recorded_variants(log)
    if not any(p.where == "pixels" for v in variants.values() for p in v.planted):
        return []
    return planted_sent(variants, log.audit())
