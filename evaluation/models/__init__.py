"""Model adapters: the registry that turns a :class:`ModelSpec` into a ``ModelAdapter``.

Built in, with no key and no network (baselines, not vision-language models):
``reference/text-prior`` (the record alone), ``reference/image-rules`` (classical image
analysis), ``reference/gullible`` (obeys any instruction found in the text or the pixels)
and ``replay:PATH`` (answers from a file). Any other name is a litellm model.
"""

from __future__ import annotations

from pathlib import Path

from evaluation.lazy import lazy_getattr
from evaluation.modelio import ModelAdapter
from evaluation.models.spec import (
    BUILTIN,
    REFERENCE_GULLIBLE,
    REFERENCE_IMAGE,
    REFERENCE_TEXT,
    REPLAY,
    ModelSpec,
    load_models_file,
    resolve_specs,
)

__all__ = [
    "BUILTIN",
    "ModelSpec",
    "check_model",
    "cost_text",
    "create_model",
    "load_models_file",
    "resolve_specs",
    "warm_up",
]


def create_model(spec: ModelSpec) -> ModelAdapter:
    """The adapter for a spec (litellm is imported only when a litellm model is used)."""
    kind = spec.kind
    if kind == REFERENCE_TEXT:
        from evaluation.models.reference_text import TextPriorModel

        return TextPriorModel(spec.name)
    if kind == REFERENCE_IMAGE:
        from evaluation.models.reference_image import ImageRulesModel

        return ImageRulesModel(spec.name)
    if kind == REFERENCE_GULLIBLE:
        from evaluation.models.reference_gullible import GullibleModel

        return GullibleModel(spec.name)
    if kind == REPLAY:
        from evaluation.models.replay import ReplayModel

        path, _, model = (spec.replay_file or "").partition("#")
        return ReplayModel(spec.name, Path(path), model or None)
    from evaluation.models.litellm_adapter import LiteLLMAdapter

    if spec.processes:
        from evaluation.models.call_pool import PREPARE_INLINE, CallPool
        from evaluation.models.providers import profile_for

        inline = profile_for(spec).provider in PREPARE_INLINE
        return LiteLLMAdapter(spec, pool=CallPool(spec.processes, prepare_inline=inline))
    return LiteLLMAdapter(spec)


# Names of the face that live in modules with heavier imports: loaded on first use.
_LAZY = {
    "check_model": "evaluation.models.check",
    "cost_text": "evaluation.models.cost",
    "warm_up": "evaluation.warmup",
}
__getattr__ = lazy_getattr(__name__, _LAZY)
