"""The scoring version: recorded with every score, shown in every report.

Bump ``SCORING_VERSION`` with any change that can change a score or an error label: a scorer,
the lesion matcher, the taxonomy, the lexicon (``data/*.yaml``). ``tests/test_scoring_version.py``
pins a fingerprint of what the scorers give on a fixed battery of hand-written answers, per
version, so a change that moves a score without a bump fails there. Scores of two versions are
not comparable: ``compare`` refuses to mix them, the run summary lists the versions it holds,
and ``runs rescore`` brings a run to the current version and says what changed.

History
  1  (unrecorded) everything scored before versions were recorded.
  2  lesions matched one-to-one (Hungarian, cost over location, sequence, signal, size,
     enhancement); invented findings beside real lesions are hallucinated, restatements
     redundant; text-only requests: no visual labels, omitted lesions not counted, invented
     findings reasoning/fabricated_without_images; one rule for a normal control; the lexicon
     reads "non-" as a prefix, scopes negation to its clause and lets a subtype qualifier
     ("ischemic CVA") select the subtype.
  3  synonym families: "bleed" is haemorrhage, a site after the term selects the subtype
     ("bleed in the left thalamus"), a bleed into a lesion is that lesion ("bleed into a
     tumour"), CVA variants and the Oxford stroke classes, bare and possessive eponyms;
     NeuroVLM-Bench subclass spellings read as the benchmark's subtypes, "undetermined" an
     abstention; pass@k units are (case, question); the rubric is the jury's median of
     verdicts carrying the call's nonce, without graders that failed the canary.
  4  an unusable answer (format failure, refusal) to a gradable question is a wrong sample in
     sampled and ranked pass@k (before, a unit with one was left out of pass@k, which favoured
     a model failing the format on its hardest questions); failed calls stay out; samples
     record whether their question is gradable; a manifest's truth is read through the
     answers' vocabulary (region "frontal lobe" is the frontal region).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

SCORING_VERSION = "4"
UNRECORDED = "1 (unrecorded)"  # how samples scored before versions were recorded are named


def version_name(version: str | None) -> str:
    return version if version else UNRECORDED


class _Versioned(Protocol):
    @property
    def scoring_version(self) -> str | None: ...


def versions_of(samples: Iterable[_Versioned]) -> dict[str, int]:
    """Samples per scoring version, by name ("1 (unrecorded)" for samples scored before)."""
    out: dict[str, int] = {}
    for s in samples:
        name = version_name(s.scoring_version)
        out[name] = out.get(name, 0) + 1
    return dict(sorted(out.items()))
