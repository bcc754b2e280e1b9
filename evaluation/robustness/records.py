"""The audit's contract: the kinds of variant, what each one planted, and the record a sample
carries of the variant it was asked on."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# the run log's value for a sample asked on the case as it is (no variant)
ORIGINAL = "original"


class VariantKind(StrEnum):
    """What a variant changes. Image ablations: the images gone, blank, another patient's, or
    mirrored (with the text, or the text kept as it was); planted instructions: in one slice's
    pixels (small and low-contrast in a corner; large), in the note, as a prior report in the
    record; a benign distractor caption."""

    NO_IMAGES = "no_images"
    BLANK_IMAGES = "blank_images"
    OTHER_PATIENT = "other_patient"
    MIRRORED = "mirrored"
    MIRRORED_IMAGE_ONLY = "mirrored_image_only"
    PLANTED_PIXELS_SMALL = "planted_pixels_small"
    PLANTED_PIXELS_LARGE = "planted_pixels_large"
    PLANTED_NOTE = "planted_note"
    PLANTED_PRIOR_REPORT = "planted_prior_report"
    DISTRACTOR_CAPTION = "distractor_caption"


IMAGE_ABLATIONS = frozenset(
    {VariantKind.NO_IMAGES, VariantKind.BLANK_IMAGES, VariantKind.OTHER_PATIENT}
)
MIRRORS = frozenset({VariantKind.MIRRORED, VariantKind.MIRRORED_IMAGE_ONLY})
ATTACKS = frozenset(
    {
        VariantKind.PLANTED_PIXELS_SMALL,
        VariantKind.PLANTED_PIXELS_LARGE,
        VariantKind.PLANTED_NOTE,
        VariantKind.PLANTED_PRIOR_REPORT,
    }
)


class TruthTransform(StrEnum):
    """What an answer unaffected by the variant is, against the source case's truth.

    - ``same``: the source truth (planted instructions and distractors must not move it);
    - ``mirrored``: the truth's sides swapped, as the variant's truth holds them (a model that
      reads the image follows the flip; ``mirrored_image_only`` keeps the text unmirrored and
      measures which of the two the model believes);
    - ``no_image_evidence``: the images carry nothing of the case (none, blank); the truth is the
      source's, and a model that reads the images should lose score and confidence;
    - ``other_patient``: the images are another patient's (``CaseVariant.other_case_id``); the
      truth is the source's, which the images no longer show."""

    SAME = "same"
    MIRRORED = "mirrored"
    NO_IMAGE_EVIDENCE = "no_image_evidence"
    OTHER_PATIENT = "other_patient"


TRUTH_OF: dict[VariantKind, TruthTransform] = {
    VariantKind.NO_IMAGES: TruthTransform.NO_IMAGE_EVIDENCE,
    VariantKind.BLANK_IMAGES: TruthTransform.NO_IMAGE_EVIDENCE,
    VariantKind.OTHER_PATIENT: TruthTransform.OTHER_PATIENT,
    VariantKind.MIRRORED: TruthTransform.MIRRORED,
    VariantKind.MIRRORED_IMAGE_ONLY: TruthTransform.MIRRORED,
    VariantKind.PLANTED_PIXELS_SMALL: TruthTransform.SAME,
    VariantKind.PLANTED_PIXELS_LARGE: TruthTransform.SAME,
    VariantKind.PLANTED_NOTE: TruthTransform.SAME,
    VariantKind.PLANTED_PRIOR_REPORT: TruthTransform.SAME,
    VariantKind.DISTRACTOR_CAPTION: TruthTransform.SAME,
}


class PixelBox(BaseModel):
    """A box on an image, in pixels: columns x0..x1 and rows y0..y1, end exclusive."""

    model_config = ConfigDict(frozen=True)

    x0: int = Field(ge=0)
    y0: int = Field(ge=0)
    x1: int = Field(ge=0)
    y1: int = Field(ge=0)


class Planted(BaseModel):
    """One thing a variant put into the case: the text, where (``pixels`` of an image, the
    ``note``, the ``record``), and for pixels the image's index and the box the text was drawn
    in (every changed pixel is inside it)."""

    model_config = ConfigDict(frozen=True)

    text: str = Field(max_length=2000)
    where: Literal["pixels", "note", "record"]
    image_index: int | None = Field(default=None, ge=0)
    box: PixelBox | None = None
    instruction: bool = True  # False: a benign distractor
    # the answer the instruction pushes toward (a diagnosis name, "normal study"); None: benign
    target_diagnosis: str | None = Field(default=None, max_length=200)


class SentImage(BaseModel):
    """One image of the variant as it is sent: its index, path and the sha256 of its bytes."""

    model_config = ConfigDict(frozen=True)

    index: int = Field(ge=0)
    path: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class CaseVariant(BaseModel):
    """The record of one variant of a case: what was done, from which case with which seed,
    what was planted and where, what an unaffected answer is, and every image sent by hash. The
    variant's case id is ``<source>~<kind>`` (:func:`variant_case_id`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: VariantKind
    source_case_id: str
    seed: int
    truth: TruthTransform
    planted: tuple[Planted, ...] = ()
    images: tuple[SentImage, ...] = ()
    other_case_id: str | None = None  # other_patient: whose images were sent
    text_mirrored: bool = False  # mirrored: the note and record read in the mirror too

    @property
    def case_id(self) -> str:
        return variant_case_id(self.source_case_id, self.kind)


def variant_case_id(source_case_id: str, kind: VariantKind | str) -> str:
    """The case id a variant is logged under: the source's, ``~`` and the kind."""
    return f"{source_case_id}~{VariantKind(kind).value}"


def variant_of(case_id: str) -> tuple[str, VariantKind | None]:
    """The source case id and the variant kind of a logged case id (``None``: the case as it
    is). A sample's variant is read from its case id, the one place it is written
    (:func:`variant_case_id`); a ``~`` followed by anything but a kind is part of the id."""
    source, sep, kind = case_id.rpartition("~")
    if sep and source and kind in VariantKind.__members__.values():
        return source, VariantKind(kind)
    return case_id, None
