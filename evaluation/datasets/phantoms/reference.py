"""The reference answer of a case: what a reader who knows the truth would answer.

Built from the case's ground truth alone (diagnosis, reference differential with its codes, one
finding per lesion on a sequence the case has and shows it on, the sequence of every image), so
it is the answer the sandbox's own scoring must give full credit with no error label: a
phantom whose reference answer is marked wrong has a truth the scorers disagree with.
"""

from __future__ import annotations

from evaluation.answers import Answer, DifferentialItem, Finding, SequenceIdentified
from evaluation.case import Case, Enhancement, LesionTruth, Signal
from evaluation.datasets.phantoms.truth import where

_SIGNAL_WORDS = {
    Signal.HYPER: "hyperintense",
    Signal.HYPO: "hypointense",
    Signal.ISO: "isointense",
    Signal.MIXED: "mixed signal",
    Signal.HYPERDENSE: "hyperdense",
    Signal.HYPODENSE: "hypodense",
    Signal.ISODENSE: "isodense",
}


def _finding(lesion: LesionTruth, shown: list[str]) -> Finding:
    visible = [s for s in shown if s in lesion.visible_on]
    seq = visible[0] if visible else None
    signal = _SIGNAL_WORDS[lesion.signal[seq]] if seq else None
    enh = lesion.enhancement
    return Finding(
        description=f"{where(lesion)} {lesion.type}",
        sequence=seq,
        hemisphere=lesion.hemisphere.value,
        region=where(lesion),
        signal=signal,
        size_mm=lesion.size_mm,
        enhancement=None if enh is Enhancement.NONE and "T1C" not in shown else enh.value,
    )


def reference_answer(case: Case) -> Answer:
    """The answer that states the truth of ``case``; ValueError when it has none."""
    gt = case.ground_truth
    if gt is None:
        raise ValueError(f"case {case.case_id} has no ground truth")
    shown = list(dict.fromkeys(i.series_class for i in case.images if i.series_class))
    return Answer(
        sequences_identified=[
            SequenceIdentified(image=str(n), sequence=i.series_class)
            for n, i in enumerate(case.images, start=1)
            if i.series_class
        ],
        findings=[_finding(les, shown) for les in gt.lesions]
        or [Finding(description="No acute intracranial abnormality")],
        differential=[
            DifferentialItem(diagnosis=d.name, icd10=d.icd10)
            for d in (gt.differential or [gt.final_diagnosis])
        ],
        final_diagnosis=gt.final_diagnosis.name,
        rationale=gt.rationale,
        confidence=0.9,
    )
