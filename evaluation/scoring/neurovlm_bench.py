"""NeuroVLM-Bench's own metric definitions, reported beside ours and named apart.

These follow the benchmark's evaluator (``evaluate_detailed.py`` and the response parser in
``utils.py`` of github ChatMED/neurovlm-bench, commit 50c06176), written here from its
definitions so that a run can be compared with the paper's tables. They differ from ours
(``scoring/neurovlm.py``) on purpose, and a reader must not mix them:

- The reply is read as the text from its first ``{`` to its last ``}``; if that is not JSON,
  every field is missing. A missing field, a null, and the words the evaluator maps to it, are
  the label "undetermined" (an abstention, never a format failure).
- Values are lower-cased with ``_`` read as a space, then mapped per field: a class containing
  a tumour subtype is "tumor", one containing ischemic/hemorrhagic "stroke", "atrophy" "other
  abnormalities"; a modality containing "mr" is "mri"; the subclass maps the answer spellings to
  the label table's (papilloma -> papiloma, neurocytoma -> neurocitoma, medulloblastoma ->
  meduloblastoma, pituitary -> pituitary tumor, glioblastoma/astrocytoma/ependymoma -> glioma)
  and several non-subtypes to "undetermined"; anything else stays a label of its own (and is
  wrong).
- A field is scored only on rows whose truth is known (not empty); subtype therefore only on
  tumour and stroke rows with a subclass. A call that failed is left out of every figure.
- "accuracy" is balanced accuracy (mean recall over the labels the truth holds); ``macro_f1``
  averages F1 over every label of truth and answers, "undetermined" and stray labels included
  (F1 0); ``macro_f1_abstention`` leaves "undetermined" out of the average.
- Calibration on ``diagnosis_confidence`` for the diagnosis and subtype fields only: a missing
  or unreadable confidence counts as 0, values are clipped to [0, 1]; ECE over 10 equal bins,
  the first [0, 0.1], the others (lo, hi]; Brier is the mean squared error of it.
- ``field_accuracy`` is their plain per-field accuracy over every answer, unknown truth included
  (an abstention on an unknown truth counts as right); ``json_valid`` the share of answers that
  are not a failed call.

``tests/test_neurovlm_bench_definitions.py`` pins these against numbers the benchmark's own
evaluator gave on 200 synthetic rows (``tests/data/neurovlm_bench``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from evaluation.scores import BenchLabels

UNDETERMINED = "undetermined"
# task -> (the answer's field, the label table's column)
TASKS: dict[str, tuple[str, str]] = {
    "diagnosis": ("diagnosis_name", "class"),
    "subtype": ("diagnosis_detailed", "subclass"),
    "modality": ("modality", "modality"),
    "sequence": ("specialized_sequence", "modality_subtype"),
    "plane": ("plane", "plane"),
}
CALIBRATED = ("diagnosis", "subtype")  # the fields their calibration covers
_EMPTY = frozenset({"null", "nan", ""})
_TUMOUR_WORDS = (
    "glioma", "meningioma", "pituitary tumor", "carcinoma", "germinoma", "granuloma",
    "medulloblastoma", "neurocytoma", "papilloma", "schwannoma", "tuberculoma",
)  # fmt: skip
# subclass words the evaluator reads as no subtype at all
_NOT_SUBTYPE_PARTS = ("abscess", "craniopharyngioma", "atrophy", "hemangioblastoma")
_NOT_SUBTYPE = frozenset(
    {"calcified pineal gland", "central nervous system tumor", "gliosis", "other", "cavernoma",
     "normal", "multiple sclerosis", "colloid cyst"}
)  # fmt: skip
_SEQ_EMPTY = frozenset({"null", "nan", "", "n/a", "none", "not applicable", "brain"})


def _text(value: Any) -> str:
    return UNDETERMINED if value is None else str(value).strip().lower().replace("_", " ")


def _or_undetermined(s: str, empty: frozenset[str] = _EMPTY) -> str:
    return UNDETERMINED if s in empty else s


def label_diagnosis(value: Any) -> str:
    s = _text(value)
    if "atrophy" in s:
        return "other abnormalities"
    if any(w in s for w in _TUMOUR_WORDS):
        return "tumor"
    if "ischemic" in s or "hemorrhagic" in s:
        return "stroke"
    return _or_undetermined(s)


def label_subtype(value: Any) -> str:
    s = _text(value)
    metastatic = "metastatic carcinoma" in s or "metastatic tumor" in s
    if s == "papilloma":
        return "papiloma"
    if "neurocytoma" in s:
        return "neurocitoma"
    if s == "medulloblastoma":
        return "meduloblastoma"
    if "ischemic" in s:
        return "ischemic"
    if s in ("glioblastoma", "ependymoma", "gliomatosis cerebri") or "astrocytoma" in s:
        return "glioma"
    if "metastatic carcinoma" in s:
        for word in ("meningioma", "carcioma", "granuloma"):
            if word in s:
                return word
    if metastatic and "glioma" in s:
        return "glioma"
    if any(p in s for p in _NOT_SUBTYPE_PARTS) or s in _NOT_SUBTYPE:
        return UNDETERMINED
    if "pituitary" in s:
        return "pituitary tumor"
    if "metastas" in s or "metastatic" in s:
        return UNDETERMINED
    return _or_undetermined(s)


def label_modality(value: Any) -> str:
    s = _text(value)
    return "mri" if "mr" in s else _or_undetermined(s)


def label_sequence(value: Any) -> str:
    s = _text(value)
    if s == "t1+c":
        return "t1c+"
    if s == "t2-weighted":
        return "t2"
    if s in ("non-contrast", "t1-weighted"):
        return "t1"
    if "post-contrast" in s or "with contrast" in s:
        return "t1c+"
    return _or_undetermined(s, _SEQ_EMPTY)


def label_plane(value: Any) -> str:
    s = _text(value)
    return "sagittal" if s == "s" else _or_undetermined(s)


LABELLERS = {
    "diagnosis": label_diagnosis,
    "subtype": label_subtype,
    "modality": label_modality,
    "sequence": label_sequence,
    "plane": label_plane,
}


def read_reply(text: str | None) -> dict[str, Any]:
    """The answer object as the benchmark reads a reply: the text from the first ``{`` to the
    last ``}`` as JSON; anything else (no braces, two objects, truncated) is no field at all."""
    if not text:
        return {}
    start, end = text.find("{"), text.rfind("}")
    if start == -1 or end <= start:
        return {}
    try:
        obj = json.loads(text[start : end + 1])
    except (json.JSONDecodeError, RecursionError):
        return {}
    return obj if isinstance(obj, dict) else {}


def read_confidence(value: Any) -> float:
    """``diagnosis_confidence`` as the benchmark reads it: a number (or numeric text), clipped to
    [0, 1]; missing or unreadable is 0."""
    try:
        c = float(value)
    except (TypeError, ValueError):
        return 0.0
    return 0.0 if c != c else min(1.0, max(0.0, c))


def bench_labels(
    truth: dict[str, str | None], text: str | None, *, call_error: bool = False
) -> BenchLabels:
    """``truth``: the label table's values by column (class, subclass, modality,
    modality_subtype, plane; empty or None when unknown); ``text``: the model's raw reply."""
    obj = {} if call_error else read_reply(text)
    out_truth, known, predicted = {}, [], {}
    for task, (field, column) in TASKS.items():
        raw = truth.get(column)
        label = LABELLERS[task]
        out_truth[task] = label(raw if raw is not None else "")
        if raw is not None and str(raw) not in _EMPTY:
            known.append(task)
        predicted[task] = label(obj.get(field))
    return BenchLabels(
        truth=out_truth,
        known=known,
        predicted=predicted,
        confidence=read_confidence(obj.get("diagnosis_confidence")),
        call_error=call_error,
    )


class BenchTask(BaseModel):
    """One field's figures under the benchmark's definitions."""

    n: int  # answers scored on this field (truth known, call not failed)
    balanced_accuracy: float | None  # the benchmark's "accuracy"
    macro_f1: float | None  # "undetermined" and stray labels in the average
    macro_f1_abstention: float | None  # "undetermined" out of the average
    per_class_f1: dict[str, float] = Field(default_factory=dict)
    accuracy: float | None = None  # plain, over the scored answers
    undetermined: int = 0  # abstentions among the scored answers
    field_accuracy: float | None = None  # their field_results: every answer, unknown truth too
    ece: float | None = None
    brier: float | None = None


class BenchMetrics(BaseModel):
    """NeuroVLM-Bench's own figures for one model (named apart from ours)."""

    definitions: str = "NeuroVLM-Bench evaluate_detailed.py (ChatMED/neurovlm-bench @50c06176)"
    n: int
    json_valid: float | None  # share of answers that are not a failed call
    tasks: dict[str, BenchTask] = Field(default_factory=dict)


def _f1s(t: list[str], p: list[str], labels: list[str]) -> dict[str, float]:
    out = {}
    for lab in labels:
        tp = sum(a == lab and b == lab for a, b in zip(t, p, strict=True))
        pred = sum(b == lab for b in p)
        true = sum(a == lab for a in t)
        prec = tp / pred if pred else 0.0
        rec = tp / true if true else 0.0
        out[lab] = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
    return out


def bench_ece(correct: Sequence[bool], confidence: Sequence[float], bins: int = 10) -> float:
    """ECE over equal bins, the first [0, 1/bins], the others (lo, hi]."""
    c = np.clip(np.asarray(confidence, dtype=float), 0.0, 1.0)
    y = np.asarray(correct, dtype=float)
    edges = np.linspace(0.0, 1.0, bins + 1)
    total = 0.0
    for i in range(bins):
        low = c >= edges[i] if i == 0 else c > edges[i]
        m = low & (c <= edges[i + 1])
        if m.any():
            total += m.sum() / len(c) * abs(float(y[m].mean()) - float(c[m].mean()))
    return float(total)


def _task(rows: Sequence[BenchLabels], task: str) -> BenchTask:
    scored = [r for r in rows if task in r.known]
    t = [r.truth[task] for r in scored]
    p = [r.predicted[task] for r in scored]
    everyone = [r.truth[task] == r.predicted[task] for r in rows]
    field_acc = float(np.mean(everyone)) if rows else None
    if not scored:
        return BenchTask(
            n=0, balanced_accuracy=None, macro_f1=None, macro_f1_abstention=None,
            field_accuracy=field_acc,
        )  # fmt: skip
    labels = sorted(set(t) | set(p))
    f1 = _f1s(t, p, labels)
    recalls = [
        sum(a == lab and b == lab for a, b in zip(t, p, strict=True)) / t.count(lab)
        for lab in sorted(set(t))
    ]
    real = [lab for lab in labels if lab != UNDETERMINED]
    correct = [a == b for a, b in zip(t, p, strict=True)]
    out = BenchTask(
        n=len(scored),
        balanced_accuracy=float(np.mean(recalls)),
        macro_f1=float(np.mean([f1[lab] for lab in labels])),
        macro_f1_abstention=float(np.mean([f1[lab] for lab in real])) if real else None,
        per_class_f1=f1,
        accuracy=float(np.mean(correct)),
        undetermined=p.count(UNDETERMINED),
        field_accuracy=field_acc,
    )
    if task in CALIBRATED:
        conf = [r.confidence for r in scored]
        out.ece = bench_ece(correct, conf)
        out.brier = float(np.mean((np.asarray(correct, dtype=float) - np.asarray(conf)) ** 2))
    return out


def bench_metrics(rows: Sequence[BenchLabels]) -> BenchMetrics:
    """Every figure the benchmark's evaluator reports per field, from its own reading."""
    answered = [r for r in rows if not r.call_error]
    return BenchMetrics(
        n=len(rows),
        json_valid=len(answered) / len(rows) if rows else None,
        tasks={task: _task(answered, task) for task in TASKS},
    )
