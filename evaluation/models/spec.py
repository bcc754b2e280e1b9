"""Model specifications: a name in the run, the litellm model behind it, and how to reach it.

A spec comes from ``--model NAME`` (plus ``--api-base``/``--api-key-env``) or from a models
file (YAML or JSON)::

    models:
      - name: gpt-4o
        model: openai/gpt-4o
        api_key_env: OPENAI_API_KEY
      - name: medgemma
        model: hosted_vllm/google/medgemma-27b-it
        api_base: http://gpu-box:8000/v1
        concurrency: 4

The key itself is never written anywhere: a spec names the environment variable holding it.

Files named here (a models file, a replay file) are read only when they are regular files (a
named pipe would block the open forever, ``/dev/zero`` would never end) and up to a size cap.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, ValidationError

from evaluation.errors import ModelConfigError, first_error

REFERENCE_TEXT = "reference/text-prior"
REFERENCE_IMAGE = "reference/image-rules"
REFERENCE_GULLIBLE = "reference/gullible"
REPLAY = "replay"
BUILTIN = (REFERENCE_TEXT, REFERENCE_IMAGE, REFERENCE_GULLIBLE)
LIMITS = ("max_images_per_request", "max_images_per_message", "max_image_bytes", "reasoning")
MAX_MODELS_FILE_BYTES = 4 << 20


def check_regular(path: Path, what: str) -> None:
    """Raise ``ModelConfigError`` unless ``path`` (symlinks followed) is a regular file (the
    imaging core's rule, ``dicom.check_regular``): a stat, never an open."""
    from dicom import NotRegularFileError
    from dicom import check_regular as regular

    try:
        regular(path)
    except NotRegularFileError:
        raise ModelConfigError(
            f"{what} {path}: not a regular file: only regular files are read"
        ) from None
    except OSError as exc:
        raise ModelConfigError(f"{what} {path}: {exc.strerror or exc}") from None


def read_regular(path: Path, cap: int, what: str) -> str:
    """The text of ``path`` when it is a regular file of at most ``cap`` bytes; else
    ``ModelConfigError`` (``dicom.read_regular``: a named pipe or device is never opened, or
    read from if swapped in after the check, and nothing is read past the cap)."""
    from dicom import FileTooLargeError, NotRegularFileError
    from dicom import read_regular as read

    check_regular(path, what)  # a device is not even opened (opening one may do something)
    try:
        data = read(path, cap)
    except NotRegularFileError:
        raise ModelConfigError(
            f"{what} {path}: not a regular file: only regular files are read"
        ) from None
    except FileTooLargeError as exc:
        over = (
            f"{exc.size} bytes, over the {cap}-byte cap" if exc.size else f"over the {cap}-byte cap"
        )
        raise ModelConfigError(f"{what} {path}: {over}") from None
    except OSError as exc:
        raise ModelConfigError(f"{what} {path}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelConfigError(f"{what} {path}: not UTF-8 text ({exc.reason})") from None


class ModelSpec(BaseModel):
    name: str  # how the model is called in the run (unique)
    model: str | None = None  # litellm model name; default: ``name``
    api_base: str | None = None
    api_key_env: str | None = None  # environment variable holding the key
    concurrency: int = Field(default=8, ge=1, le=1024)
    # the provider's own limits, shared by every worker of a run on the PostgreSQL run log
    # (evaluation.log.claims): concurrent requests and requests per minute (None: not shared)
    shared_concurrency: int | None = Field(default=None, ge=1, le=10_000)
    shared_rpm: int | None = Field(default=None, ge=1, le=10_000)
    max_retries: int = Field(default=5, ge=0, le=50)
    backoff_base_s: float = Field(default=1.0, ge=0)
    backoff_max_s: float = Field(default=60.0, ge=0)
    timeout_s: float | None = None  # per call; default: the run's GenerateConfig
    temperature: float | None = None  # overrides the run's decoding for this model
    top_p: float | None = None
    max_tokens: int | None = None
    drop_params: bool = True  # let litellm drop parameters a model does not accept
    # Provider limits (None: the provider's default, see evaluation.models.providers; 0: none).
    # More images than a request takes are montaged, more than a message takes are split over
    # consecutive messages, a larger image is re-encoded or downscaled; each change is recorded.
    max_images_per_request: int | None = Field(default=None, ge=0)  # vLLM --limit-mm-per-prompt
    max_images_per_message: int | None = Field(default=None, ge=0)
    max_image_bytes: int | None = Field(default=None, ge=0)  # base64 bytes per image
    reasoning: bool | None = None  # rejects temperature/top_p (None: known from the name)
    processes: int = Field(default=0, ge=0, le=64)  # >0: litellm calls in N worker processes
    replay_file: str | None = None  # for ``replay``
    extra: dict[str, Any] = Field(default_factory=dict)  # passed to litellm.acompletion

    @property
    def litellm_model(self) -> str:
        return self.model or self.name

    @property
    def kind(self) -> str:
        m = self.litellm_model
        if m in BUILTIN:
            return m
        if m == REPLAY or m.startswith(REPLAY + ":"):
            return REPLAY
        return "litellm"

    @property
    def is_local(self) -> bool:
        """Runs in this process (reference models, replay): nothing leaves."""
        return self.kind != "litellm"

    def identity(self) -> dict[str, Any]:
        """What makes two specs the same model for the cache key (not endpoint, not key)."""
        out = {
            "name": self.name,
            "model": self.litellm_model,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "extra": self.extra,
        }
        # Limits change what is sent; listed only when set, so earlier runs keep their keys.
        for k in LIMITS:
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        return out


def did_you_mean(word: str, choices: list[str] | tuple[str, ...], cutoff: float = 0.6) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` (case ignored), or ``""``."""
    lower = {c.lower(): c for c in choices}
    found = difflib.get_close_matches(word.lower(), list(lower), n=1, cutoff=cutoff)
    return f" (did you mean {lower[found[0]]!r}?)" if found else ""


def reference_problem(litellm_model: str) -> str | None:
    """Why a ``reference/...`` name is no built-in reference model (None: it is one, or it is
    no reference name): litellm would be asked for it and fail on every call."""
    if litellm_model in BUILTIN or not litellm_model.lower().startswith("reference/"):
        return None
    return (
        f"{litellm_model!r} is not a reference model{did_you_mean(litellm_model, BUILTIN)}; "
        f"the reference models are {', '.join(BUILTIN)}"
    )


FILE_KEYS = ("models",)  # the top-level keys of a models file written as a mapping


def _unknown_keys(entry: object, where: str) -> None:
    """Refuse a models-file key no field reads (a typo would be silently ignored)."""
    if not isinstance(entry, dict):
        return
    fields = list(ModelSpec.model_fields)
    for key in entry:
        if key not in fields:
            raise ModelConfigError(
                f"{where}: unknown key {str(key)[:80]!r}{did_you_mean(str(key), fields)}; "
                f"the keys are {', '.join(fields)} (litellm's own arguments go under 'extra')"
            )


def load_models_file(path: Path) -> dict[str, ModelSpec]:
    """Specs of a models file, by name: every key must be a field of ``ModelSpec`` and every
    ``reference/...`` model a built-in one."""
    text = read_regular(path, MAX_MODELS_FILE_BYTES, "models file")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ModelConfigError(f"models file {path}: {exc}") from exc
    entries = data.get("models") if isinstance(data, dict) else data
    if isinstance(data, dict):
        for key in data:
            if key not in FILE_KEYS:
                raise ModelConfigError(
                    f"models file {path}: unknown top-level key {str(key)[:80]!r}"
                    f"{did_you_mean(str(key), FILE_KEYS)}: only 'models' (a list or mapping "
                    "of model specs) is read"
                )
    if isinstance(entries, dict):
        entries = [{"name": k, **(v or {})} for k, v in entries.items()]
    if not isinstance(entries, list):
        raise ModelConfigError(f"models file {path}: expected a 'models' list or mapping")
    out: dict[str, ModelSpec] = {}
    for n, entry in enumerate(entries):
        _unknown_keys(entry, f"models file {path}, entry {n + 1}")
        try:
            spec = ModelSpec.model_validate(entry)
        except ValidationError as exc:
            raise ModelConfigError(
                f"models file {path}, entry {n + 1}: {first_error(exc, 'the entry')}"
            ) from exc
        problem = reference_problem(spec.litellm_model)
        if problem:
            raise ModelConfigError(f"models file {path}, entry {n + 1}: model: {problem}")
        if spec.name in out:
            raise ModelConfigError(f"models file {path}: model {spec.name!r} listed twice")
        out[spec.name] = spec
    return out


def resolve_specs(
    names: list[str],
    *,
    models_file: Path | None = None,
    api_base: str | None = None,
    api_key_env: str | None = None,
    concurrency: int | None = None,
    processes: int | None = None,
) -> list[ModelSpec]:
    """Specs for ``--model`` names: from the models file when listed there, else by name.

    Every name is checked before any call: a ``reference/...`` name must be a built-in one and
    a litellm name one litellm can route (``ModelConfigError`` with what it could be)."""
    known = load_models_file(models_file) if models_file else {}
    specs: list[ModelSpec] = []
    for name in names:
        problem = reference_problem(name) if name not in known else None
        if problem:
            raise ModelConfigError(f"model {problem}")
        if name in known:
            spec = known[name].model_copy()
        elif name.startswith(REPLAY + ":"):
            spec = ModelSpec(name=name, model=REPLAY, replay_file=name.split(":", 1)[1])
        else:
            spec = ModelSpec(name=name)
        if spec.kind == "litellm":
            if api_base and not spec.api_base:
                spec.api_base = api_base
            if api_key_env and not spec.api_key_env:
                spec.api_key_env = api_key_env
        if concurrency and name not in known:
            spec.concurrency = concurrency
        if processes and name not in known and spec.kind == "litellm":
            spec.processes = processes
        if spec.kind == REPLAY:
            if not spec.replay_file:
                raise ModelConfigError(f"model {name!r}: replay needs a file (replay:PATH)")
            path = Path(spec.replay_file.partition("#")[0])
            if os.path.exists(path):  # a missing file is an error when it is read, as before
                check_regular(path, "replay file")
        if spec.kind == "litellm":
            from evaluation.models.litellm_lib import route_problem

            problem = route_problem(spec.litellm_model, spec.api_base)
            if problem:
                listed = ""
                if models_file is not None and name not in known:
                    listed = f"not in the models file {models_file}{did_you_mean(name, list(known))}, and "
                raise ModelConfigError(f"model {name!r}: {listed}{problem}")
        specs.append(spec)
    if len({s.name for s in specs}) != len(specs):
        raise ModelConfigError("the same model is named twice")
    return specs
