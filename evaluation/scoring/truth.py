"""What a case's truth is, for every scorer, flag and page: one place for the rule.

A *normal control* is a case whose truth is a normal study: its diagnosis is in the normal
group, or (a dataset that gives no group) the diagnosis is what the lexicon calls normal, and no
lesion is labelled. A lesion-free truth that names a disease (epilepsy, a Todd paresis) is not
a normal control: nothing visible is expected, yet "normal" is the wrong answer.
"""

from __future__ import annotations

from evaluation.case import DiseaseGroup, GroundTruth
from evaluation.scoring.lexicon import default_lexicon


def names_normal(text: str | None) -> bool:
    """True when a diagnosis string names a normal study ("normal", "unremarkable MRI")."""
    if not text or not text.strip():
        return False
    found = default_lexicon().lookup(text)
    return found.concept_id == "normal" and not found.alternatives


def is_normal_control(gt: GroundTruth) -> bool:
    if gt.lesions:
        return False
    group = gt.final_diagnosis.group
    if group is not None:
        return group is DiseaseGroup.NORMAL
    return names_normal(gt.final_diagnosis.name)
