"""``reference/text-prior``: a baseline that reads only the text (record, note), never the images.

It is NOT a vision-language model: keyword rules on the clinical text give a ranked
differential. It shows how far the record alone gets a case, which is the floor a VLM must beat
with the images (and exactly what the images-only / text-only ablations compare).
"""

from __future__ import annotations

import re

from evaluation.answers import Answer
from evaluation.case import TaskFamily
from evaluation.modelio import GenerateConfig, Message, ModelOutput
from evaluation.models.reference_common import (
    DX,
    Hypothesis,
    classification,
    clinical_text,
    differential,
    ranked,
    reply,
    task_of,
)

# (diagnosis, [(pattern, weight)]): patterns on lower-cased clinical text.
RULES: list[tuple[str, list[tuple[str, float]]]] = [
    (
        "acute ischaemic stroke",
        [
            (r"\bnihss\b", 2.0),
            (r"sudden(?:ly)?(?: onset)?", 1.0),
            (r"hemiparesis|weakness of the (?:left|right)|(?:left|right)[- ]sided weakness", 1.5),
            (r"facial droop|aphasi|dysarthri|neglect|hemianopi", 1.5),
            (r"atrial fibrillation|\baf\b", 1.0),
            (r"last (?:known|seen) well|thromboly|thrombectom", 1.5),
        ],
    ),
    (
        "intracerebral haemorrhage",
        [
            (r"anticoagul|warfarin|apixaban|rivaroxaban|\binr\b", 2.0),
            (r"thunderclap|worst headache|sudden severe headache", 1.5),
            (r"vomit", 0.7),
            (r"hypertensi|\bbp\b.*1[89]\d|blood pressure 1[89]\d", 0.5),
            (r"reduced (?:gcs|consciousness)|drowsy|\bgcs\b", 0.8),
        ],
    ),
    (
        "multiple sclerosis",
        [
            (r"optic neuritis|blurred vision|painful (?:eye|vision)", 2.0),
            (r"\bedss\b|relaps|remitt", 2.0),
            (r"paraesthesi|paresthesi|numbness|tingling|lhermitte", 1.2),
            (r"internuclear|diplopia|vertigo", 0.8),
            (r"oligoclonal|\bcsf\b", 1.0),
        ],
    ),
    (
        "glioblastoma",
        [
            (r"seizure|fit\b", 1.0),
            (r"progressive|over (?:several|the last) weeks|worsening over", 1.0),
            (r"personality change|confusion|cognitive", 1.0),
            (r"morning headache|headache.*worse.*morning", 1.0),
        ],
    ),
    (
        "brain metastases",
        [
            (r"carcinoma|cancer|melanoma|malignan|oncolog", 2.0),
            (r"weight loss|smok", 1.0),
        ],
    ),
    (
        "cerebral abscess",
        [
            (r"fever|pyrexi|febrile|temperature 3[89]", 1.5),
            (r"\bcrp\b|white cell|\bwcc\b|leukocyt|neutrophil", 1.0),
            (r"dental|sinusitis|endocarditis|otitis|immunosuppress|\bhiv\b", 1.5),
        ],
    ),
    (
        "meningioma",
        [
            (r"incidental|slowly progressive|years", 0.8),
            (r"anosmia|visual field", 0.8),
        ],
    ),
]


def hypotheses(text: str) -> list[Hypothesis]:
    """Every rule's weight on this text, with the phrases that matched."""
    low = text.lower()
    out = []
    for name, patterns in RULES:
        weight, evidence = 0.0, []
        for pattern, w in patterns:
            m = re.search(pattern, low)
            if m:
                weight += w
                evidence.append(f"record mentions '{m.group(0)[:40]}'")
        out.append(Hypothesis(DX[name], weight, evidence))
    if not any(h.weight for h in out):
        out.append(Hypothesis(DX["normal study"], 1.0, ["nothing in the record points to disease"]))
    return [h for h in out if h.weight > 0]


def answer_for(text: str, family: TaskFamily) -> str:
    hyps = ranked(hypotheses(text))
    best = hyps[0]
    if family is TaskFamily.CLASSIFICATION:
        return reply(classification(best, modality="MRI", sequence=None, plane="axial"))
    rationale = (
        f"Text-only baseline (images not read): the record favours {best.dx.name} because "
        + ("; ".join(best.evidence) or "no specific clue")
        + "."
    )
    return reply(
        Answer(
            findings=[],  # it cannot see lesions: an honest baseline reports none
            differential=differential(hyps),
            final_diagnosis=best.dx.name,
            rationale=rationale,
            confidence=round(min(0.9, 0.2 + 0.1 * best.weight), 2),
            next_steps=["review the imaging"],
        )
    )


class TextPriorModel:
    """Keyword rules on the record and note; ignores every image."""

    name = "reference/text-prior"

    def __init__(self, name: str | None = None) -> None:
        self.name = name or TextPriorModel.name

    async def generate(self, messages: list[Message], config: GenerateConfig) -> ModelOutput:
        text = clinical_text(messages)
        family = task_of(messages)
        out = answer_for(text, family)
        return ModelOutput(
            text=out,
            finish_reason="stop",
            prompt_tokens=len(text) // 4,
            completion_tokens=len(out) // 4,
            cost_usd=0.0,
            latency_s=0.0,
        )
