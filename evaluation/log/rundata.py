"""What a report is built from: the cases of a run and every sample with its parsed answer.

``RunData`` is the narrow input of the reports: the engine's run store is read into it by
``evaluation.reports.loader.load_run``, and tests build one by hand. It is also what a report
bundle keeps (``rundata.json``), so the review pages never need the store itself.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from evaluation.answers import Answer, ClassificationAnswer
from evaluation.case import Case, ImageRef
from evaluation.coverage import CaseCoverage
from evaluation.log.passport import ModelPassport
from evaluation.log.records import SentMessage as SentMessage  # re-exported
from evaluation.log.records import SentPart as SentPart  # re-exported
from evaluation.log.records import SentRequest as SentRequest  # re-exported
from evaluation.robustness.measures import VariantPair
from evaluation.robustness.records import CaseVariant
from evaluation.scoring.scored import ScoredSample

RUNDATA_VERSION = 1
FULL_INPUT = "both"  # evaluation.tasks.Ablation.BOTH: images and text, the unablated condition


class SampleResult(BaseModel):
    """One model answer to one task of one case: parsed, raw, scored."""

    scored: ScoredSample
    answer: Answer | ClassificationAnswer | None = None
    text: str = ""  # the raw model output, exactly as stored
    ablation: str = FULL_INPUT  # "both", "images" (no text), "text" (no images)
    images_sent: list[str] | None = None  # sha256 of the images in the prompt, when recorded
    turn: int | None = None  # multi-turn: the turn this answer closes
    # the request of its last turn (the whole conversation), a key of RunData.requests
    request: str | None = None
    parse_error: str | None = None  # why the answer failed its format, as parsing recorded it


class RunData(BaseModel):
    """The cases and samples of one run, with where each case's image files live."""

    version: int = RUNDATA_VERSION
    run_id: str
    title: str = ""
    created_at: str | None = None
    dataset_name: str = ""  # the dataset the run read ("" in bundles written before)
    dataset_hash: str = ""  # its content hash (runs of one dataset a week apart differ)
    config: dict[str, Any] = Field(default_factory=dict)  # models, tasks, decoding, seeds
    code_version: str | None = None
    cases: list[Case] = Field(default_factory=list)
    case_roots: dict[str, str] = Field(default_factory=dict)  # case id -> folder of its images
    samples: list[SampleResult] = Field(default_factory=list)
    # the cases evaluated out of the dataset's, and the skipped ones with why (None: not known)
    coverage: CaseCoverage | None = None
    # what each answer's last call sent, once per distinct request (SampleResult.request)
    requests: dict[str, SentRequest] = Field(default_factory=dict)
    # each model's passport (RunStore.passports; empty in bundles written before)
    passports: dict[str, ModelPassport] = Field(default_factory=dict)
    # the grounding audit's variants the run asked on (its run note ``robustness_variants``):
    # what each planted and where, by the variant's case id ``<source>~<kind>``
    variants: list[CaseVariant] = Field(default_factory=list)
    # a run set apart from its variants (``robustness.as_received``: the gateway's study as
    # received): what they showed, each variant's answer beside its source's
    audit: list[VariantPair] = Field(default_factory=list)

    def case(self, case_id: str) -> Case:
        for c in self.cases:
            if c.case_id == case_id:
                return c
        raise KeyError(case_id)

    def samples_of(self, case_id: str) -> list[SampleResult]:
        return [s for s in self.samples if s.scored.case_id == case_id]

    @property
    def images(self) -> dict[str, ImageRef]:
        """Every case's images by sha256: what a sample's ``images_sent`` names, and what a
        finding's place is read on (``evaluation.review.report_blocks(samples, images)``)."""
        return {i.sha256: i for c in self.cases for i in c.images}

    @property
    def models(self) -> list[str]:
        return sorted({s.scored.model for s in self.samples})

    @property
    def ablations(self) -> list[str]:
        return sorted({s.ablation for s in self.samples})
