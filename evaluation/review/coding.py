"""How an SR codes what a report states, read through the benchmark's own vocabulary: a
finding's site (side and atlas regions, as ``scoring.anatomy`` reads the answers), a diagnosis's
ICD-10 code (the lexicon's concept, as ``scoring.lexicon`` reads the answers), and what a
clinician's correction of a finding keeps of the model's site. The DICOM codes for these
(SNOMED CT, the coding scheme designators) are the SR writer's (``gateway.sr``)."""

from __future__ import annotations

from pydantic import BaseModel

from evaluation.answers import Finding
from evaluation.scoring import anatomy as A
from evaluation.scoring.lexicon import default_lexicon


class Site(BaseModel):
    """Where a finding is, in the vocabulary: its side and atlas regions (``case.REGIONS``)."""

    side: str | None = None  # left, right, bilateral, midline
    regions: list[str] = []  # sorted; empty when the text names none


class CodedDiagnosis(BaseModel):
    """The lexicon concept a diagnosis names, with the concept's ICD-10 code."""

    concept_id: str
    name: str  # the concept's name (the code's meaning)
    icd10: str
    cm: bool = False  # the code is ICD-10-CM (WHO's ICD-10 has no specific one)


def site_of(f: Finding) -> Site:
    """A finding's site as the vocabulary reads its hemisphere and region fields."""
    return Site(side=A.side_in(f.hemisphere), regions=sorted(A.regions_in(f.region)))


def corrected_finding(model: Finding, text: str) -> Finding:
    """A finding as a clinician corrected it: the clinician's text, nothing else the model gave
    (sequence, signal, size may be what was wrong), and its site: the side and regions the
    correction names, each else the model's (a correction of the size keeps the place)."""
    side = A.side_in(text)
    regions = sorted(A.regions_in(text))
    return Finding(
        description=text,
        hemisphere=side or model.hemisphere,
        region=", ".join(regions) if regions else model.region,
    )


def diagnosis_concept(text: str) -> CodedDiagnosis | None:
    """The lexicon concept a diagnosis names, or None: none named, only named to be ruled out,
    or a hedge between unrelated concepts ("MS or NMOSD"), which no one code states."""
    if not text.strip():
        return None
    lex = default_lexicon()
    hit = lex.lookup(text)
    if hit.concept_id is None or hit.alternatives:
        return None
    c = lex[hit.concept_id]
    return CodedDiagnosis(concept_id=c.id, name=c.name, icd10=c.icd10, cm=c.cm)
