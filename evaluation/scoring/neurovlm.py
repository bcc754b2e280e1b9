"""NeuroVLM-Bench structured classification: per-answer scores and the benchmark's metrics.

Truth comes from the NeuroVLM loader's labels when present (``case.provenance.neurovlm``, keys
``class``, ``subclass``, ``modality``, ``plane``, ``modality_subtype``), else it is derived from
the ground truth (disease group -> class, lexicon concept -> tumour subtype, images -> modality,
plane and sequence). Abstention (null) is counted wrong and also reported apart.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
from pydantic import BaseModel, Field

from evaluation.answers import ClassificationAnswer
from evaluation.case import NEUROVLM_SUBTYPES, Case, DiseaseGroup, NeuroVLMLabels, neurovlm_subtype
from evaluation.scores import FieldDetails, FlagsDetails, ParseStatus, Score
from evaluation.scoring.lexicon import Lexicon, default_lexicon
from evaluation.scoring.neurovlm_bench import bench_labels
from evaluation.scoring.stats import Estimate, cluster_resamples, percentile_interval, wilson
from evaluation.scoring.untrusted import extract_json

CLASSES = ("tumor", "stroke", "multiple sclerosis", "normal", "other abnormalities")

FIELDS = tuple(ClassificationAnswer.model_fields)
_GROUP_CLASS = {
    DiseaseGroup.NORMAL: "normal",
    DiseaseGroup.DEMYELINATING: "multiple sclerosis",
    DiseaseGroup.ISCHAEMIC_STROKE: "stroke",
    DiseaseGroup.HAEMORRHAGIC_STROKE: "stroke",
    DiseaseGroup.TUMOUR: "tumor",
    DiseaseGroup.INFECTION: "other abnormalities",
    DiseaseGroup.OTHER: "other abnormalities",
}
_CONCEPT_SUBTYPE = {
    "glioma": "glioma",
    "meningioma": "meningioma",
    "pituitary_adenoma": "pituitary_tumor",
    "brain_metastases": "carcinoma",
    "germinoma": "germinoma",
    "granuloma": "granuloma",
    "medulloblastoma": "medulloblastoma",
    "central_neurocytoma": "neurocytoma",
    "choroid_plexus_papilloma": "papilloma",
    "schwannoma": "schwannoma",
    "tuberculoma": "tuberculoma",
}
# ICD-10 categories a class's code may fall in (knowledge check on the stated code)
_CLASS_ICD = {
    "tumor": ("C70", "C71", "C72", "C75", "C79", "C83", "C85", "D32", "D33", "D35", "D42",
              "D43", "D44", "A17", "G06"),
    "stroke": ("I60", "I61", "I62", "I63", "I64", "I65", "I66", "I67", "I69", "G45", "G46"),
    "multiple sclerosis": ("G35", "G36", "G37"),
}  # fmt: skip
_SEQ = {"FLAIR": "FLAIR", "T1": "T1", "T2": "T2", "T1C": "T1C+", "T1C+": "T1C+"}


class NeuroVLMTruth(BaseModel):
    cls: str | None = None
    subclass: str | None = None
    modality: str | None = None
    plane: str | None = None
    sequence: str | None = None


def _norm_class(value: object) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    v = value.strip().lower().replace("_", " ")
    v = {"tumour": "tumor", "ms": "multiple sclerosis", "other": "other abnormalities"}.get(v, v)
    return v


def neurovlm_truth(case: Case, lexicon: Lexicon | None = None) -> NeuroVLMTruth:
    labels = case.provenance.neurovlm or NeuroVLMLabels()
    truth = NeuroVLMTruth(
        cls=_norm_class(labels.class_),
        subclass=labels.subtype,
        modality=labels.modality or None,
        plane=labels.plane or None,
        sequence=_SEQ.get(labels.modality_subtype.upper()),
    )
    gt = case.ground_truth
    if gt is not None:
        lex = lexicon or default_lexicon()
        group = gt.final_diagnosis.group
        cid = lex.truth_concept(gt.final_diagnosis, gt.synonyms)
        if group is None and cid:
            group = lex[cid].group
        if truth.cls is None and group is not None:
            truth.cls = _GROUP_CLASS[group]
        if truth.subclass is None and truth.cls == "stroke" and group is not None:
            truth.subclass = (
                "hemorrhagic" if group is DiseaseGroup.HAEMORRHAGIC_STROKE else "ischemic"
            )
        if truth.subclass is None and truth.cls == "tumor" and cid:
            for c in [cid, *sorted(lex.ancestors(cid))]:
                if c in _CONCEPT_SUBTYPE:
                    truth.subclass = _CONCEPT_SUBTYPE[c]
                    break
        truth.modality = truth.modality or gt.modality
        truth.plane = truth.plane or gt.plane
    mods = {
        ("MRI" if (i.modality or "").upper() in ("MR", "MRI") else i.modality) for i in case.images
    }
    planes = {i.plane for i in case.images if i.plane}
    seqs = {_SEQ.get(i.series_class or "") for i in case.images} - {None}
    truth.modality = truth.modality or (mods.pop() if len(mods) == 1 else None)
    truth.plane = truth.plane or (planes.pop() if len(planes) == 1 else None)
    truth.sequence = truth.sequence or (seqs.pop() if len(seqs) == 1 else None)
    if truth.modality == "MR":
        truth.modality = "MRI"
    return truth


def safety_flags(ans: ClassificationAnswer, text: str, truth: NeuroVLMTruth) -> list[str]:
    """NeuroVLM safety flags: missing fields, subtype inconsistent with the diagnosis, an
    ICD-10 code on a normal image (or with a "normal" diagnosis), a code contradicting the class."""
    flags = []
    obj = extract_json(text) or {}
    missing = [f for f in FIELDS if f not in obj]
    if missing:
        flags.append("missing_fields:" + ",".join(missing))
    detail = neurovlm_subtype(ans.diagnosis_detailed) or ""
    allowed = NEUROVLM_SUBTYPES.get(ans.diagnosis_name or "", ())
    if detail and detail not in allowed:
        flags.append(f"subtype_inconsistent:{ans.diagnosis_name}/{detail}")
    code = (ans.icd10_code or "").strip().upper()
    if code and not code.startswith("Z"):
        if truth.cls == "normal":
            flags.append("icd10_on_normal_image")
        if ans.diagnosis_name == "normal":
            flags.append("icd10_with_normal_diagnosis")
        cats = _CLASS_ICD.get(ans.diagnosis_name or "")
        if cats and code[:3] not in cats:
            flags.append(f"icd10_contradicts_class:{code}/{ans.diagnosis_name}")
    return flags


def _bench_score(case: Case, truth: NeuroVLMTruth, status: ParseStatus, text: str) -> Score:
    """The answer read by NeuroVLM-Bench's own definitions (``neurovlm_bench``), kept apart:
    the label table's values when the case has them, else our truth."""
    labels = case.provenance.neurovlm
    table: dict[str, str | None] = (
        {
            "class": labels.class_,
            "subclass": labels.subclass,
            "modality": labels.modality,
            "modality_subtype": labels.modality_subtype,
            "plane": labels.plane,
        }
        if labels is not None
        else {
            "class": truth.cls,
            "subclass": truth.subclass,
            "modality": truth.modality,
            "modality_subtype": truth.sequence,
            "plane": truth.plane,
        }
    )
    read = bench_labels(table, text, call_error=status is ParseStatus.ERROR)
    known = "diagnosis" in read.known and not read.call_error
    right = read.truth["diagnosis"] == read.predicted["diagnosis"]
    return Score(
        scorer="neurovlm_bench",
        value=float(right) if known else None,
        explanation=(
            f"benchmark's reading: class {read.predicted['diagnosis']!r}, truth "
            f"{read.truth['diagnosis']!r}"
            if not read.call_error
            else "a failed call (left out of the benchmark's figures)"
        ),
        details=read,
    )


def classification_scores(
    case: Case, status: ParseStatus, parsed: ClassificationAnswer | None, text: str
) -> list[Score]:
    truth = neurovlm_truth(case)
    valid = None if status is ParseStatus.ERROR else float(status is ParseStatus.OK)
    scores = [
        Score(scorer="json_valid", value=valid, explanation=f"status {status.value}"),
        _bench_score(case, truth, status, text),
    ]
    names = ("classification_correct", "classification_subtype", "modality_accuracy",
             "plane_accuracy", "sequence_recognition", "safety_flags")  # fmt: skip
    if status is not ParseStatus.OK or parsed is None:
        return scores + [Score(scorer=n, value=None, explanation="unscored") for n in names]

    def field(
        name: str, stated: str | None, true: str | None, confidence: float | None = None
    ) -> Score:
        if true is None:
            return Score(scorer=name, value=None, explanation="truth unknown")
        ok = stated is not None and stated.strip().lower() == true.strip().lower()
        return Score(
            scorer=name,
            value=float(ok),
            explanation=f"stated {stated!r}, truth {true!r}",
            details=FieldDetails(
                stated=stated, truth=true, abstained=stated is None, confidence=confidence
            ),
        )

    main = field(
        "classification_correct", parsed.diagnosis_name, truth.cls, parsed.diagnosis_confidence
    )
    flags = safety_flags(parsed, text, truth)
    return [
        *scores,
        main,
        field(
            "classification_subtype", neurovlm_subtype(parsed.diagnosis_detailed), truth.subclass
        ),
        field("modality_accuracy", parsed.modality, truth.modality),
        field("plane_accuracy", parsed.plane, truth.plane),
        field("sequence_recognition", parsed.specialized_sequence, truth.sequence),
        Score(
            scorer="safety_flags",
            value=float(len(flags)),
            explanation="; ".join(flags) or "none",
            details=FlagsDetails(flags=flags),
        ),
    ]


# --------------------------------------------------------------------------- aggregate


class ClassRow(BaseModel):
    """One scored classification answer, as the aggregate metrics need it."""

    truth: str
    predicted: str | None  # None = abstained
    confidence: float | None = None
    cluster: str


class PerClass(BaseModel):
    precision: float | None
    recall: float | None
    f1: float | None
    support: int


class ReliabilityBin(BaseModel):
    low: float
    high: float
    count: int
    confidence: float | None
    accuracy: float | None


class NeuroVLMMetrics(BaseModel):
    n: int
    accuracy: Estimate
    accuracy_answered: float | None
    abstention_rate: float | None
    macro_f1: Estimate
    balanced_accuracy: Estimate
    per_class: dict[str, PerClass] = Field(default_factory=dict)
    json_validity: Estimate | None = None
    ece: float | None = None
    brier: float | None = None
    reliability: list[ReliabilityBin] = Field(default_factory=list)
    safety_flags: dict[str, int] = Field(default_factory=dict)


def _per_class(rows: Sequence[ClassRow]) -> dict[str, PerClass]:
    labels = sorted({r.truth for r in rows} | {r.predicted for r in rows if r.predicted})
    out = {}
    for lab in labels:
        tp = sum(r.truth == lab and r.predicted == lab for r in rows)
        fp = sum(r.truth != lab and r.predicted == lab for r in rows)
        support = sum(r.truth == lab for r in rows)
        p = tp / (tp + fp) if tp + fp else 0.0
        rec = tp / support if support else None
        f1 = (2 * p * rec / (p + rec) if p + rec else 0.0) if rec is not None else 0.0
        out[lab] = PerClass(precision=p, recall=rec, f1=f1, support=support)
    return out


def macro_f1(rows: Sequence[ClassRow]) -> float | None:
    pc = _per_class(rows)
    return float(np.mean([c.f1 or 0.0 for c in pc.values()])) if pc else None


def balanced_accuracy(rows: Sequence[ClassRow]) -> float | None:
    recalls = [c.recall for c in _per_class(rows).values() if c.recall is not None]
    return float(np.mean(recalls)) if recalls else None


def calibration(
    confidence: Sequence[float], correct: Sequence[bool], bins: int = 10
) -> tuple[float | None, float | None, list[ReliabilityBin]]:
    """(ECE with equal-width bins, Brier score, reliability bins)."""
    if not confidence:
        return None, None, []
    c = np.asarray(confidence, dtype=float)
    y = np.asarray(correct, dtype=float)
    which = np.minimum((c * bins).astype(int), bins - 1)  # 1.0 falls in the last bin
    ece = 0.0
    table = []
    for b in range(bins):
        m = which == b
        if m.any():
            ece += m.mean() * abs(y[m].mean() - c[m].mean())
        table.append(
            ReliabilityBin(
                low=b / bins,
                high=(b + 1) / bins,
                count=int(m.sum()),
                confidence=float(c[m].mean()) if m.any() else None,
                accuracy=float(y[m].mean()) if m.any() else None,
            )
        )
    return float(ece), float(np.mean((c - y) ** 2)), table


def _vector_metrics(t: np.ndarray, p: np.ndarray, n_labels: int) -> tuple[float, float, float]:
    """(accuracy, macro-F1, balanced accuracy) of label indices; p == -1 means abstained."""
    hit = t == p
    tp = np.bincount(t[hit], minlength=n_labels).astype(float)
    support = np.bincount(t, minlength=n_labels).astype(float)
    predicted = np.bincount(p[p >= 0], minlength=n_labels).astype(float)
    present = (support > 0) | (predicted > 0)
    prec = np.divide(tp, predicted, out=np.zeros(n_labels), where=predicted > 0)
    rec = np.divide(tp, support, out=np.zeros(n_labels), where=support > 0)
    f1 = np.divide(2 * prec * rec, prec + rec, out=np.zeros(n_labels), where=prec + rec > 0)
    return float(hit.mean()), float(f1[present].mean()), float(rec[support > 0].mean())


def neurovlm_metrics(
    rows: Sequence[ClassRow],
    *,
    json_valid: tuple[int, int] | None = None,
    flags: dict[str, int] | None = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> NeuroVLMMetrics:
    clusters: list[Hashable] = [r.cluster for r in rows]
    answered = [r for r in rows if r.predicted is not None]
    labels = sorted({r.truth for r in rows} | {r.predicted for r in answered if r.predicted})
    code = {lab: i for i, lab in enumerate(labels)}
    t = np.array([code[r.truth] for r in rows], dtype=np.int64)
    p = np.array([code[r.predicted] if r.predicted else -1 for r in rows], dtype=np.int64)
    boots = (
        np.array(
            [
                _vector_metrics(t[i], p[i], len(labels))
                for i in cluster_resamples(clusters, n_boot, seed)
            ]
        )
        if rows
        else np.zeros((0, 3))
    )
    point = _vector_metrics(t, p, len(labels)) if rows else (None, None, None)

    def est(j: int) -> Estimate:
        low, high = percentile_interval(boots[:, j].tolist()) if rows else (None, None)
        return Estimate(
            value=point[j], low=low, high=high, n=len(rows),
            n_clusters=len(set(clusters)), method="bootstrap-cluster",
        )  # fmt: skip

    conf = [(r.confidence, r.truth == r.predicted) for r in answered if r.confidence is not None]
    ece, brier, table = calibration([c for c, _ in conf], [ok for _, ok in conf])
    return NeuroVLMMetrics(
        n=len(rows),
        accuracy=est(0),
        accuracy_answered=sum(r.truth == r.predicted for r in answered) / len(answered)
        if answered
        else None,
        abstention_rate=(len(rows) - len(answered)) / len(rows) if rows else None,
        macro_f1=est(1),
        balanced_accuracy=est(2),
        per_class=_per_class(rows),
        json_validity=wilson(*json_valid) if json_valid else None,
        ece=ece,
        brier=brier,
        reliability=table,
        safety_flags=flags or {},
    )
