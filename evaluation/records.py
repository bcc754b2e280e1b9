"""Typed records shared by the benchmark: cases, ground truth, answers, model calls, scores.

These are the contract between the phantom generator (``dicom.phantoms``), the dataset loaders,
the task families, the model adapters, the scorers, the run store and the reports. They are
versioned (``schema_version``) and validated at the boundary; inside, code trusts the types.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

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


# Regions of the coordinate atlas (dicom.phantoms builds it on MNI space); answers may use
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


# --------------------------------------------------------------------------- ground truth


class Diagnosis(BaseModel):
    name: str
    icd10: str | None = None
    group: DiseaseGroup | None = None


class LesionTruth(BaseModel):
    """One lesion of a case, as it truly is (phantom) or as an expert labelled it."""

    id: str
    type: str  # e.g. "demyelinating plaque", "acute infarct", "haematoma", "ring-enhancing mass"
    hemisphere: Hemisphere
    region: str  # one of REGIONS where possible
    lobe: str | None = None  # the lobe when region is finer (e.g. juxtacortical -> frontal)
    center_mm: tuple[float, float, float] | None = None  # RAS, scanner/MNI space
    size_mm: float | None = None  # largest diameter
    signal: dict[str, Signal] = Field(default_factory=dict)  # SequenceClass value -> signal
    enhancement: Enhancement = Enhancement.NONE
    diffusion_restriction: bool = False
    mask_label: int | None = None  # value in the case's lesion mask (NIfTI)

    @property
    def visible_on(self) -> list[str]:
        return [k for k, v in self.signal.items() if v not in (Signal.ISO, Signal.ISODENSE)]


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

    @property
    def is_normal(self) -> bool:
        return self.final_diagnosis.group is DiseaseGroup.NORMAL or not self.lesions


# --------------------------------------------------------------------------- cases


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


class Provenance(BaseModel):
    source: str  # "phantom", "orthanc", "folder", "neural-medbench", "neurovlm-bench"
    study_uids: list[str] = Field(default_factory=list)
    dataset: str | None = None
    generator: str | None = None  # e.g. "neurosandbox-phantoms 1" with seed
    seed: int | None = None
    extra: dict[str, Any] = Field(default_factory=dict)


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


# --------------------------------------------------------------------------- answers


class SequenceIdentified(BaseModel):
    image: str | None = None  # image label or index the model refers to
    sequence: str


class Finding(BaseModel):
    description: str = ""
    sequence: str | None = None
    hemisphere: str | None = None
    region: str | None = None
    signal: str | None = None
    size_mm: float | None = None
    enhancement: str | None = None


class DifferentialItem(BaseModel):
    diagnosis: str
    icd10: str | None = None
    likelihood: float | None = None
    evidence_for: list[str] = Field(default_factory=list)
    evidence_against: list[str] = Field(default_factory=list)


class Answer(BaseModel):
    """The answer every diagnostic task asks for; this schema IS the reviewed checklist."""

    sequences_identified: list[SequenceIdentified] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)
    differential: list[DifferentialItem] = Field(default_factory=list)
    final_diagnosis: str | None = None
    rationale: str = ""
    confidence: float | None = Field(default=None, ge=0, le=1)
    next_steps: list[str] = Field(default_factory=list)


class ClassificationAnswer(BaseModel):
    """NeuroVLM-Bench's strict JSON answer (null = abstain)."""

    modality: Literal["CT", "MRI"] | None = None
    specialized_sequence: Literal["FLAIR", "T1", "T2", "T1C+"] | None = None
    plane: Literal["axial", "sagittal", "coronal"] | None = None
    diagnosis_name: (
        Literal["tumor", "stroke", "multiple sclerosis", "normal", "other abnormalities"] | None
    ) = None
    diagnosis_detailed: str | None = None
    icd10_code: str | None = None
    severity_score: float | None = Field(default=None, ge=0, le=1)
    diagnosis_confidence: float | None = Field(default=None, ge=0, le=1)
    severity_confidence: float | None = Field(default=None, ge=0, le=1)


# --------------------------------------------------------------------------- model calls


class TextPart(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ImagePart(BaseModel):
    type: Literal["image"] = "image"
    png: bytes = Field(repr=False)
    sha256: str
    label: str = ""


class Message(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: list[TextPart | ImagePart]


class GenerateConfig(BaseModel):
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    json_mode: bool = False
    timeout_s: float = 120.0


class ModelOutput(BaseModel):
    """What a model returned for one call (one sample)."""

    text: str = ""
    finish_reason: str | None = None
    refusal: bool = False  # a refusal or safety block, recorded as such, never a wrong answer
    error: str | None = None  # transport/provider failure after retries
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None
    latency_s: float | None = None
    retries: int = 0
    raw: dict[str, Any] | None = None  # provider response (JSON) as received
    # What the adapter changed to fit the provider (images montaged, split, re-encoded or
    # downscaled; parameters not sent or clamped), each {"kind", ..., "reason"}; see
    # evaluation.models.fitting. Stored with the response, so the run records it.
    adjustments: list[dict[str, Any]] = Field(default_factory=list)


@runtime_checkable
class ModelAdapter(Protocol):
    """Anything that answers messages: litellm models, the reference models, replay."""

    name: str

    async def generate(self, messages: list[Message], config: GenerateConfig) -> ModelOutput: ...


# --------------------------------------------------------------------------- results


class ParseStatus(StrEnum):
    OK = "ok"
    FORMAT_FAILURE = "format_failure"  # no valid JSON for the schema: unscored, counted
    REFUSAL = "refusal"
    ERROR = "error"  # the call failed


class Score(BaseModel):
    scorer: str  # e.g. "diagnosis_match", "lesion_f1", "bertscore", "rubric"
    value: float | None  # None = unscored (never zero for "could not score")
    explanation: str = ""
    details: dict[str, Any] = Field(default_factory=dict)


class ErrorCategory(StrEnum):
    PERCEPTUAL = "perceptual"
    REASONING = "reasoning"
    KNOWLEDGE_GAP = "knowledge_gap"
    GROUNDING = "grounding"
    VISUAL_HALLUCINATION = "visual_hallucination"
    FORMAT_FAILURE = "format_failure"
    REFUSAL = "refusal"


class ErrorLabel(BaseModel):
    category: ErrorCategory
    sub_labels: list[str] = Field(default_factory=list)  # missed_lesion, hallucinated_finding...
    evidence: str
    assigned_by: str  # "rule", "grader:<model>", "clinician:<name>"
    assigned_at: str | None = None  # ISO 8601
