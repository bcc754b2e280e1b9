"""Each model's passport in a run: which model answered, reached how, asked with what.

A passport has two parts. What the run knew when it started (the name asked for, the litellm
model id and provider, the API host, the decoding parameters sent, the prompt set, the
renderer, litellm's version; a replay model's file) is recorded once, as the run note
``passport:<model>`` (``RunStore.record_passport``). What the provider said about the model
that answered (the response's ``model``, ``system_fingerprint``, version headers) is read from
the run's stored responses, as the distinct values seen with their call counts (a provider may
change the model mid-run), so it is there after a resume and a rescore, and for runs stored
before passports were kept. ``passport_changes`` says what differs between two passports.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, ValidationError, field_validator

from evaluation.modelio import reported_headers, reported_value

NOTE_PREFIX = "passport:"  # run note key of a model's recorded part: passport:<model name>
MAX_DISTINCT = 20  # distinct observed values kept per field (the rest counted as "(other)")
OTHER = "(other)"
# the fields read from the run's rows, not recorded (``RunStore.passports`` fills them)
OBSERVED = frozenset(
    {
        "served_models",
        "system_fingerprints",
        "version_headers",
        "responses",
        "prompt_digest",
        "prompts",
        "scoring_versions",
    }
)
Scalar = str | int | float | bool | None


class Observed(BaseModel):
    """One value a provider reported, and how many of the run's stored responses said it."""

    value: str
    calls: int = Field(ge=0)


class ModelPassport(BaseModel):
    """One model of one run: what was asked for, what answered, with which settings."""

    model: str  # the name asked for (the run's model name)
    role: Literal["model", "grader"] = "model"
    kind: str = "litellm"  # litellm | reference | replay (ModelSpec.kind)
    litellm_model: str | None = None  # the litellm model id
    provider: str | None = None  # litellm's get_llm_provider
    api_host: str | None = None  # host[:port] of the API base (never a key, path or query)
    # the decoding parameters sent (sample 0's seed; sample i is sent seed + i)
    decoding: dict[str, Scalar] = Field(default_factory=dict)
    prompt_version: str | None = None  # the prompt set: a hash of every template and schema
    # sha256 of the first-turn prompts this model was sent (their texts and images, sorted):
    # equal when the same prompts went out for the same cases
    prompt_digest: str | None = None
    prompts: int = 0  # first-turn requests the digest covers
    renderer_version: str | None = None
    scoring_versions: list[str] = Field(default_factory=list)  # of this model's scored samples
    litellm_version: str | None = None
    replay_file: str | None = None  # a replay model's file (name) and its sha256
    replay_sha256: str | None = None
    # what the provider reported, per distinct value with its calls
    served_models: list[Observed] = Field(default_factory=list)
    system_fingerprints: list[Observed] = Field(default_factory=list)
    version_headers: dict[str, list[Observed]] = Field(default_factory=dict)
    responses: int = 0  # stored responses read
    # when the recorded part was recorded; None: rebuilt from the run's configuration (a run
    # stored before passports were kept)
    recorded_at: str | None = None

    @field_validator("litellm_model", "provider", "api_host", "replay_file", mode="before")
    @classmethod
    def _bounded(cls, v: Any) -> str | None:
        return reported_value(v)

    def observed(self) -> dict[str, list[Observed]]:
        """The provider's reports by field name (``version_headers.<name>`` for headers)."""
        out = {"served_models": self.served_models, "system_fingerprints": self.system_fingerprints}
        for name, values in self.version_headers.items():
            out[f"version_headers.{name}"] = values
        return out


class PassportChange(BaseModel):
    """One field that differs between two passports, as text (None: absent on that side)."""

    field: str
    before: str | None = None
    after: str | None = None


# what says nothing about the model: counts and times
_NOT_COMPARED = {"model", "responses", "prompts", "recorded_at"}


def passport_changes(a: ModelPassport, b: ModelPassport) -> list[PassportChange]:
    """What differs from passport ``a`` to ``b``, field by field (the provider's reports as
    sets of values, not counts; decoding parameter by parameter; headers header by header)."""
    before, after = _flat(a), _flat(b)
    out = []
    for name in sorted(set(before) | set(after)):
        x, y = before.get(name), after.get(name)
        if x != y:
            out.append(PassportChange(field=name, before=x, after=y))
    return out


def _flat(p: ModelPassport) -> dict[str, str]:
    out: dict[str, str] = {}
    data = p.model_dump(
        exclude={"decoding", "served_models", "system_fingerprints", "version_headers"}
        | _NOT_COMPARED
    )
    for name, value in data.items():
        if value is None or value == []:
            continue
        out[name] = ", ".join(value) if isinstance(value, list) else str(value)
    for name, v in p.decoding.items():
        out[f"decoding.{name}"] = json.dumps(v)
    for name, values in p.observed().items():
        if values:
            out[name] = ", ".join(sorted(o.value for o in values))
    return out


def api_host(url: str | None) -> str | None:
    """The host (and port) of an API base, without scheme, user info, path or query."""
    if not url:
        return None
    try:
        parts = urlsplit(url if "//" in url else f"//{url}")
        host = parts.hostname
        port = parts.port
    except ValueError:
        return None
    if not host:
        return None
    return reported_value(f"{host}:{port}" if port else host)


def prompt_digest(prompt_hashes: Iterable[str]) -> str | None:
    """sha256 of a model's first-turn prompt hashes (distinct, sorted)."""
    hashes = sorted(set(prompt_hashes))
    if not hashes:
        return None
    return hashlib.sha256("\n".join(hashes).encode()).hexdigest()


def sent_decoding(params: dict[str, Any]) -> dict[str, Scalar]:
    """Decoding parameters as a passport keeps them: scalars as they are, anything else as its
    JSON text (bounded)."""
    out: dict[str, Scalar] = {}
    for k, v in sorted(params.items()):
        if isinstance(v, str | int | float | bool) or v is None:
            out[str(k)[:100]] = reported_value(v) if isinstance(v, str) else v
        else:
            out[str(k)[:100]] = reported_value(json.dumps(v, sort_keys=True, default=str))
    return out


class _Tally:
    """Distinct values of one observed field with their counts (at most ``MAX_DISTINCT``)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, value: str | None) -> None:
        if value is None:
            return
        if value not in self.counts and len(self.counts) >= MAX_DISTINCT:
            value = OTHER
        self.counts[value] = self.counts.get(value, 0) + 1

    def rows(self) -> list[Observed]:
        return [Observed(value=v, calls=n) for v, n in sorted(self.counts.items())]


class ObservedTally:
    """The provider's reports in a model's stored responses, added one output at a time."""

    def __init__(self) -> None:
        self.responses = 0
        self._served = _Tally()
        self._fingerprints = _Tally()
        self._headers: dict[str, _Tally] = {}

    def add(self, output: dict[str, Any]) -> None:
        """One stored ``ModelOutput`` as JSON (its typed fields, else its raw response's)."""
        self.responses += 1
        raw = output.get("raw")
        raw = raw if isinstance(raw, dict) else {}
        served = output.get("served_model") or raw.get("model")
        fingerprint = output.get("system_fingerprint") or raw.get("system_fingerprint")
        self._served.add(reported_value(served))
        self._fingerprints.add(reported_value(fingerprint))
        for name, value in reported_headers(output.get("version_headers") or {}).items():
            if name not in self._headers and len(self._headers) >= MAX_DISTINCT:
                continue
            self._headers.setdefault(name, _Tally()).add(value)

    def fill(self, passport: ModelPassport) -> ModelPassport:
        return passport.model_copy(
            update={
                "responses": self.responses,
                "served_models": self._served.rows(),
                "system_fingerprints": self._fingerprints.rows(),
                "version_headers": {k: t.rows() for k, t in sorted(self._headers.items())},
            }
        )


def recorded_passport(text: str, model: str) -> ModelPassport | None:
    """A passport note as stored (hostile: None when it is not one of ``model``)."""
    try:
        p = ModelPassport.model_validate_json(text)
    except ValidationError:
        return None
    return p if p.model == model else None


def configured_passport(spec: dict[str, Any], role: str, generate: dict[str, Any]) -> ModelPassport:
    """A passport rebuilt from a run's configuration (a ``ModelSpec`` and the run's decoding,
    as the run's config JSON holds them, with sample 0's seed): for runs stored before
    passports were recorded, or a note not readable. Nothing is imported or called (no
    litellm): what a model rejects or litellm drops is not known here."""
    from evaluation.models.spec import ModelSpec

    try:
        s = ModelSpec.model_validate(spec)
    except ValidationError:
        return ModelPassport(model=str(spec.get("name", "?"))[:200], role=_role(role), kind="?")
    params: dict[str, Any] = {
        k: getattr(s, k, None) if getattr(s, k, None) is not None else generate.get(k)
        for k in ("temperature", "top_p", "max_tokens", "seed")
    }
    if generate.get("json_mode"):  # as the adapter sends it
        params["response_format"] = {"type": "json_object"}
    params.update(s.extra if s.kind == "litellm" else {})
    return ModelPassport(
        model=s.name,
        role=_role(role),
        kind=s.kind,
        litellm_model=s.litellm_model if s.kind == "litellm" else None,
        api_host=api_host(s.api_base),
        decoding=sent_decoding({k: v for k, v in params.items() if v is not None}),
        replay_file=replay_name(s.replay_file) if s.kind == "replay" else None,
    )


def replay_name(replay_file: str | None) -> str | None:
    """A replay file as a passport names it: the file's name and the model it is filtered to
    (not the folder: a path can say more about the machine than about the model)."""
    path, _, model = (replay_file or "").partition("#")
    name = path.replace("\\", "/").rpartition("/")[2]
    return reported_value(f"{name}#{model}" if model else name)


def _role(role: str) -> Literal["model", "grader"]:
    return "grader" if role == "grader" else "model"
