"""The case vocabulary, the bottom of evaluation: cases, ground truth, lesions and their enums.

The contract between the dataset sources (the phantom generator included), the loaders, the
task families, the scorers and the run store. Versioned (``schema_version``) and validated at
the boundary; inside, code trusts the types. Imports nothing of the project but the imaging
core's record of the series a case leaves out (``dicom.SeriesNotShown``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal, Protocol

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_core.core_schema import SerializerFunctionWrapHandler

from dicom import SeriesNotShown, TilePlace

SCHEMA_VERSION = 1


# --------------------------------------------------------------------------- vocabulary


class DiseaseGroup(StrEnum):
    NORMAL = "normal"
    DEMYELINATING = "demyelinating"  # multiple sclerosis and mimics
    ISCHAEMIC_STROKE = "ischaemic_stroke"
    HAEMORRHAGIC_STROKE = "haemorrhagic_stroke"
    TUMOUR = "tumour"
    INFECTION = "infection"
    OTHER = "other"


class Difficulty(StrEnum):
    L1 = "L1"  # direct: classic picture, one sequence suffices
    L2 = "L2"  # complex: imaging ambiguous, the record decides
    L3 = "L3"  # iterative: multi-turn, information arrives over turns


class TaskFamily(StrEnum):
    DIFFERENTIAL = "differential"  # ranked differential diagnosis with evidence
    LESION = "lesion"  # lesion recognition: findings with location and signal
    RATIONALE = "rationale"  # justify the conclusion
    CLASSIFICATION = "classification"  # NeuroVLM-Bench structured JSON
    MULTITURN = "multiturn"  # L3 iterative diagnosis


class Hemisphere(StrEnum):
    LEFT = "left"
    RIGHT = "right"
    BILATERAL = "bilateral"
    MIDLINE = "midline"


class Signal(StrEnum):
    """Signal on MR or density on CT, relative to normal surrounding tissue."""

    HYPER = "hyperintense"
    HYPO = "hypointense"
    ISO = "isointense"
    MIXED = "mixed"
    HYPERDENSE = "hyperdense"
    HYPODENSE = "hypodense"
    ISODENSE = "isodense"


class Enhancement(StrEnum):
    NONE = "none"
    RING = "ring"
    HOMOGENEOUS = "homogeneous"
    NODULAR = "nodular"
    HETEROGENEOUS = "heterogeneous"


# Regions of the coordinate atlas (evaluation.datasets.phantoms builds it on MNI space); answers may use
# other words, which scoring normalises to these.
REGIONS: tuple[str, ...] = (
    "frontal",
    "parietal",
    "temporal",
    "occipital",
    "insula",
    "basal ganglia",
    "thalamus",
    "internal capsule",
    "corpus callosum",
    "periventricular white matter",
    "juxtacortical",
    "brainstem",
    "cerebellum",
    "extra-axial",
)


# --------------------------------------------------------------------------- the truth's words

# The validation context key under which a loader passes the vocabulary the truth is read
# through (``evaluation.scoring.vocabulary.TRUTH_VOCABULARY``: the one the answers are read
# through). A manifest is validated with it; records built in code are taken as written.
VOCABULARY_CONTEXT = "truth_vocabulary"


class TruthVocabulary(Protocol):
    """Reads a controlled field of the truth as a canonical value; ValueError (naming the
    allowed values and the nearest one) when the words name none."""

    def region(self, value: str) -> str: ...
    def hemisphere(self, value: str) -> str: ...
    def sequence(self, value: str) -> str: ...
    def signal(self, value: str, sequence: str) -> str: ...
    def enhancement(self, value: str) -> str: ...
    def group(self, value: str) -> str: ...


def _vocabulary(info: ValidationInfo) -> TruthVocabulary | None:
    context = info.context
    return context.get(VOCABULARY_CONTEXT) if isinstance(context, dict) else None


def _refused(exc: ValueError) -> PydanticCustomError:
    return PydanticCustomError("truth_vocabulary", "{reason}", {"reason": str(exc)})


def _read_as(field: str) -> Any:
    """A before-validator reading a text value of ``field`` through the context's vocabulary."""

    def read(value: Any, info: ValidationInfo) -> Any:
        vocab = _vocabulary(info)
        if vocab is None or not isinstance(value, str):
            return value
        try:
            return getattr(vocab, field)(value)
        except ValueError as exc:
            raise _refused(exc) from None

    return read


def _read_signal(value: Any, info: ValidationInfo) -> Any:
    """A lesion's signal map: each series class and each signal through the vocabulary."""
    vocab = _vocabulary(info)
    if vocab is None or not isinstance(value, dict):
        return value
    out: dict[Any, Any] = {}
    for key, sig in value.items():
        try:
            seq = vocab.sequence(key) if isinstance(key, str) else key
            out[seq] = vocab.signal(sig, seq) if isinstance(sig, str) else sig
        except ValueError as exc:
            raise _refused(exc) from None
    return out


# --------------------------------------------------------------------------- ground truth


class Diagnosis(BaseModel):
    name: str
    icd10: str | None = None
    group: Annotated[
        DiseaseGroup | None,
        BeforeValidator(_read_as("group"), json_schema_input_type=DiseaseGroup | str | None),
    ] = None


class LesionTruth(BaseModel):
    """One lesion of a case, as it truly is (phantom) or as an expert labelled it."""

    id: str
    # free text for the reviewer and the rubric grader (no scorer matches it), e.g.
    # "demyelinating plaque", "acute infarct", "haematoma", "ring-enhancing mass"
    type: str
    hemisphere: Annotated[
        Hemisphere, BeforeValidator(_read_as("hemisphere"), json_schema_input_type=Hemisphere | str)
    ]
    # one of REGIONS (a manifest's words are read through the vocabulary)
    region: Annotated[str, BeforeValidator(_read_as("region"), json_schema_input_type=str)]
    # the lobe when region is finer (e.g. juxtacortical -> frontal)
    lobe: Annotated[
        str | None, BeforeValidator(_read_as("region"), json_schema_input_type=str | None)
    ] = None
    center_mm: tuple[float, float, float] | None = None  # RAS, scanner/MNI space
    size_mm: float | None = None  # largest diameter
    # SequenceClass value -> signal
    signal: Annotated[
        dict[str, Signal],
        BeforeValidator(_read_signal, json_schema_input_type=dict[str, Signal | str]),
    ] = Field(default_factory=dict)
    enhancement: Annotated[
        Enhancement,
        BeforeValidator(_read_as("enhancement"), json_schema_input_type=Enhancement | str),
    ] = Enhancement.NONE
    diffusion_restriction: bool = False
    mask_label: int | None = None  # value in the case's lesion mask (NIfTI)
    # a series of the case's own study holding this lesion's mask (non-zero inside), e.g.
    # BRAINIX's tumour ROI "FLAIR_ROI": named by its SeriesInstanceUID or SeriesDescription
    # (names_series). It is truth: never shown to a model (the renderer leaves it out).
    mask_series: str | None = Field(
        default=None,
        exclude_if=lambda v: v is None,  # a truth without it is written as before it existed
        max_length=128,
        description="a series of the case's study that is this lesion's mask (non-zero inside), "
        "by SeriesInstanceUID or SeriesDescription; never shown to a model",
    )

    @property
    def visible_on(self) -> list[str]:
        return [k for k, v in self.signal.items() if v not in (Signal.ISO, Signal.ISODENSE)]


def names_series(name: str, series_uid: str, description: str | None) -> bool:
    """Whether a lesion's ``mask_series`` names this series: its UID, or its description
    (spaces at the ends and case ignored). The one rule of the renderer and the scorer."""
    want = name.strip()
    return bool(want) and (
        want == series_uid or want.casefold() == (description or "").strip().casefold()
    )


class PlantedPHI(BaseModel):
    """A fake identifier deliberately planted in a case, so de-identification can be tested."""

    where: str  # "dicom:PatientName", "note", "ehr:Patient.name", ...
    value: str


class GroundTruth(BaseModel):
    final_diagnosis: Diagnosis
    synonyms: list[str] = Field(default_factory=list)
    differential: list[Diagnosis] = Field(default_factory=list)  # reference, most likely first
    lesions: list[LesionTruth] = Field(default_factory=list)
    key_findings: list[str] = Field(default_factory=list)
    rationale: str = ""
    difficulty: Difficulty = Difficulty.L1
    # NeuroVLM-Bench label fields, when known
    modality: Literal["CT", "MRI"] | None = None
    plane: Literal["axial", "sagittal", "coronal"] | None = None
    phi: list[PlantedPHI] = Field(default_factory=list)


# --------------------------------------------------------------------------- cases


class StudyPerson(BaseModel):
    """A person the study's headers name: the PN attribute (``ReferringPhysicianName``,
    ``OperatorsName``...; a tag for a private one) and its value as written
    (``Family^Given^Middle^Prefix^Suffix``, ideographic and phonetic groups after ``=``)."""

    role: str
    name: str


class StudyScanner(BaseModel):
    """A scanner the study's series name (``dicom.ScannerHeader``): header text as written,
    bounded; the field strength as written (the subgroups read it in tesla, by their rule)."""

    manufacturer: str = ""
    model_name: str = ""
    field_strength: float | None = None
    n_series: int = 0


class StudyIdentity(BaseModel):
    """The hospital's identifiers of the study a case comes from (shown to reviewers apart from
    the de-identified record; never sent to a model). Filled from ``dicom.HeaderIdentity``, and
    ``persons`` from ``dicom.study_identity_and_persons``: the PHI gate scrubs each of them."""

    patient_name: str = ""  # display form: "Given Family"
    patient_id: str = ""
    birth_date: str = ""  # ISO (YYYY-MM-DD) or empty
    sex: str = ""  # M, F, O or empty
    accession_number: str = ""
    study_date: str = ""  # ISO (YYYY-MM-DD) or empty
    study_description: str = ""
    institution: str = ""
    modalities: list[str] = Field(default_factory=list)
    n_series: int = 0
    age: str = ""  # PatientAge as written, a valid AS value ("045Y") or empty
    # the scanners the series' headers name, most series first (empty: none named, or a case
    # recorded before they were kept)
    scanners: list[StudyScanner] = Field(default_factory=list)
    # every person any PN attribute of the study names (patient, referring, performing, reading
    # physicians, operators, physicians of record, requesting physician, nested ones...)
    persons: list[StudyPerson] = Field(default_factory=list)


class ImageRef(BaseModel):
    """One image a model is shown, with what the imaging core recorded about it."""

    path: str  # relative to the case folder, or absolute
    sha256: str
    label: str  # e.g. "FLAIR axial, z=+24 mm" (what the prompt says next to the image)
    series_class: str | None = None  # SequenceClass value
    modality: str | None = None
    plane: str | None = None
    slice_positions_mm: list[float] = Field(default_factory=list)
    kind: str = "slice"  # slice | montage
    window: str | None = None
    series_uid: str | None = None
    # each slice's box on the image and its pixel -> patient (and source instance) maps, as
    # rendered: what a point a model gives on the image refers to (empty: not recorded)
    tiles: list[TilePlace] = Field(default_factory=list)

    def tile_at(self, x: float, y: float) -> TilePlace | None:
        """The slice under image pixel (x, y), or None (the bar, the margin, not recorded)."""
        return next((t for t in self.tiles if t.contains(x, y)), None)


class Turn(BaseModel):
    """One turn of a multi-turn (L3) case: what is revealed, then what is asked."""

    reveal_text: str = ""
    reveal_series: list[str] = Field(default_factory=list)  # SequenceClass values shown now
    question: str


class Question(BaseModel):
    """A benchmark question as the dataset words it (Neural-MedBench keeps its own wording)."""

    number: int
    text: str
    family: TaskFamily | None = None


# NeuroVLM-Bench's subtypes as its answer schema spells them (diagnosis_detailed), per class
NEUROVLM_SUBTYPES: dict[str, tuple[str, ...]] = {
    "stroke": ("ischemic", "hemorrhagic"),
    "tumor": (
        "glioma", "meningioma", "pituitary_tumor", "carcinoma", "germinoma", "granuloma",
        "medulloblastoma", "neurocytoma", "papilloma", "schwannoma", "tuberculoma",
    ),
}  # fmt: skip
# other spellings of them: the label table's source data, British spelling, adenoma
_NEUROVLM_SPELLINGS = {
    "neurocitoma": "neurocytoma", "papiloma": "papilloma", "meduloblastoma": "medulloblastoma",
    "pituitary_tumour": "pituitary_tumor", "pituitary": "pituitary_tumor",
    "pituitary_adenoma": "pituitary_tumor", "ischaemic": "ischemic", "haemorrhagic": "hemorrhagic",
    "hemorrhage": "hemorrhagic", "haemorrhage": "hemorrhagic", "ischemia": "ischemic",
}  # fmt: skip
_ALL_SUBTYPES = frozenset(t for ts in NEUROVLM_SUBTYPES.values() for t in ts)


def _one_edit(a: str, b: str) -> bool:
    """Whether a and b differ by at most one inserted, deleted or replaced letter."""
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) > len(b):
        a, b = b, a
    i = 0
    while i < len(a) and a[i] == b[i]:
        i += 1
    return a[i + (len(a) == len(b)) :] == b[i + 1 :]


def _subtype_word(word: str) -> str:
    """One word in the answer spelling: a known other spelling, else a one-letter slip in a
    word of 7 letters or more."""
    word = _NEUROVLM_SPELLINGS.get(word, word)
    if word in _ALL_SUBTYPES or len(word) < 7:
        return word
    near = [t for t in _ALL_SUBTYPES if _one_edit(word, t)]
    return near[0] if len(near) == 1 else word


def neurovlm_subtype(value: str | None) -> str | None:
    """A subtype as NeuroVLM-Bench's answer schema spells it: the label table's own spellings
    ("neurocitoma", "pituitary tumor"), British spellings, a one-letter slip in a long word
    ("schwanoma"), and a longer name holding exactly one subtype ("central neurocytoma",
    "vestibular schwannoma") read as the subtype; None for empty; anything else is returned
    normalised (not a subtype)."""
    if value is None:
        return None
    key = "_".join(value.strip().lower().replace("-", " ").split())
    if not key:
        return None
    whole = _subtype_word(key)
    if whole in _ALL_SUBTYPES:
        return whole
    words = "_" + "_".join(_subtype_word(w) for w in key.split("_")) + "_"
    hits = [t for t in _ALL_SUBTYPES if f"_{t}_" in words]
    return hits[0] if len(hits) == 1 else key


def is_neurovlm_subtype(value: str | None) -> bool:
    return value in _ALL_SUBTYPES


class NeuroVLMLabels(BaseModel):
    """One row of NeuroVLM-Bench's image_mapping.csv, as its columns name the labels."""

    model_config = ConfigDict(populate_by_name=True)

    @property
    def subtype(self) -> str | None:
        """The row's subclass in the benchmark's answer spelling (see ``neurovlm_subtype``);
        None when empty or not one of the benchmark's subtypes (then it is not scored)."""
        sub = neurovlm_subtype(self.subclass)
        return sub if is_neurovlm_subtype(sub) else None

    dataset: str = ""
    file_path: str = ""
    class_: str = Field(default="", alias="class")
    original_class: str = ""
    subclass: str = ""
    modality: str = ""
    modality_subtype: str = ""
    plane: str = ""


class _PhantomRecord(BaseModel):
    """A part of a phantom's provenance. The generator's keys are fields; a key this version
    does not know (a case.json written by another version) is kept in ``extra``, not lost."""

    model_config = ConfigDict(extra="forbid")

    extra: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _keep_unknown(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        known = set(cls.model_fields) - {"extra"}
        unknown = {k: v for k, v in data.items() if k not in known and k != "extra"}
        if not unknown:
            return data
        given = data.get("extra")
        kept = given if isinstance(given, dict) else {}
        return {k: v for k, v in data.items() if k in known} | {"extra": {**kept, **unknown}}

    @model_serializer(mode="wrap")
    def _as_drawn(self, handler: SerializerFunctionWrapHandler) -> Any:
        """The JSON the generator always wrote: the drawn keys only, the kept ones beside."""
        out = handler(self)
        if isinstance(out, dict):
            extra = out.pop("extra", None) or {}
            out = {k: v for k, v in out.items() if v is not None}
            for k, v in extra.items():
                out.setdefault(k, v)
        return out


class PhantomSeries(_PhantomRecord):
    """One series the generator acquired: its role in the protocol and what it is."""

    role: str  # the protocol's name for it, e.g. "t2_flair"
    modality: str  # "MR" or "CT"
    series_class: str  # the sequence class scoring compares with, e.g. "FLAIR"
    series_uid: str
    description: str = ""


class PhantomFacts(_PhantomRecord):
    """What the generator drew for the case (the fields its disease group draws; None else)."""

    side: Literal["left", "right"] | None = None
    territory: str | None = None  # stroke: "MCA", "ACA", "PCA"
    branch: str | None = None
    onset_hours: float | None = None
    site: str | None = None  # haemorrhage or meningioma site
    volume_ml: float | None = None
    primary: str | None = None  # metastases: the primary tumour
    n_lesions: int | None = None
    n_active: int | None = None


class PhantomLesionFacts(_PhantomRecord):
    """What the generator drew for one lesion (the fields its kind draws; None else)."""

    placement: str | None = None  # MS plaque: "periventricular", ...
    active: bool | None = None
    black_hole: bool | None = None
    radius_mm: float | None = None
    intratumoural_haemorrhage: bool | None = None
    calcified: bool | None = None
    oedema: bool | None = None
    site: str | None = None
    territory: str | None = None
    branch: str | None = None
    onset_hours: float | None = None
    volume_ml: float | None = None


class PhantomProvenance(BaseModel):
    """How the phantom generator made a case: its schedule entry, series and drawn facts."""

    group: str
    difficulty: str
    case_index: int
    field_strength_t: float
    series: list[PhantomSeries] = Field(default_factory=list)
    facts: PhantomFacts = Field(default_factory=PhantomFacts)
    lesion_facts: list[PhantomLesionFacts] = Field(default_factory=list)


class RecordPatient(BaseModel):
    """The patient's age and sex as the record gives them, kept with a run's case snapshot (which
    keeps no record): what results by subgroup read. Not identifying: whole years, 90 and over
    written as 90."""

    age: int | None = Field(default=None, ge=0, le=90)
    sex: str = Field(default="", max_length=20)


class Provenance(BaseModel):
    source: str  # "phantom", "orthanc", "folder", "neural-medbench", "neurovlm-bench"
    study_uids: list[str] = Field(default_factory=list)
    dataset: str | None = None
    generator: str | None = None  # e.g. "neurosandbox-phantoms 1" with seed
    seed: int | None = None
    # Series whose pixels carry burned-in text: the PHI gate drops their images for remote models.
    burned_in_series: list[str] = Field(default_factory=list)
    neurovlm: NeuroVLMLabels | None = None  # the labels of a NeuroVLM-Bench row
    answers_by_question: dict[str, Any] = Field(default_factory=dict)  # Neural-MedBench answers
    phantom: PhantomProvenance | None = None  # how the phantom generator made the case
    # the hospital's identifiers of the study (reviewers see them; never sent to a model)
    identity: StudyIdentity | None = None
    # the study's series its images leave out, and why (dicom.SeriesNotShown; None: not recorded)
    series_not_shown: SeriesNotShown | None = None
    # the record's age and sex, on a run's case snapshot only (None: not recorded)
    patient: RecordPatient | None = None

    @model_validator(mode="before")
    @classmethod
    def _untyped_extra(cls, data: Any) -> Any:
        """Cases stored before these fields were typed kept them in a dict named ``extra``."""
        if isinstance(data, dict) and isinstance(data.get("extra"), dict):
            data = dict(data)
            extra = dict(data.pop("extra"))
            for key in ("burned_in_series", "neurovlm", "answers_by_question"):
                if key in extra:
                    data.setdefault(key, extra.pop(key))
            if extra and data.get("source") == "phantom":
                data.setdefault("phantom", extra)
        return data


class Case(BaseModel):
    """Everything a model is asked about one patient, and what the right answer is."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    case_id: str
    patient_id: str | None = None  # pseudonymous; clusters bootstrap intervals by patient
    images: list[ImageRef] = Field(default_factory=list)
    study_path: str | None = None  # DICOM folder, relative to the case folder, when rendered here
    ehr: dict[str, Any] | None = None  # FHIR R4 Bundle (raw JSON)
    note: str = ""
    ground_truth: GroundTruth | None = None
    tasks: list[TaskFamily] = Field(default_factory=list)
    questions: list[Question] = Field(default_factory=list)
    turns: list[Turn] = Field(default_factory=list)
    provenance: Provenance
    root: str | None = Field(default=None, exclude=True)  # folder the case was loaded from

    def is_of_patient(self, patient_id: str) -> bool:
        """The one rule for a registered case and an arriving study: the case names no
        patient, or this PatientID (a UID is not an identity)."""
        return not self.patient_id or self.patient_id == patient_id
