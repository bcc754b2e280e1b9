"""Routing rules: which studies are evaluated, by which models, on which tasks; and what API
clients may start.

A YAML file lists rules; the first rule whose ``match`` holds decides (``skip: true`` rules
exclude). A match may name calling AE titles (shell globs), modalities and series classes
(any of / all of, from the imaging core's classifier). Example: ``deploy/routing.example.yaml``.
A rule's ``evaluate.robustness`` asks the robustness audit's variants of the study beside it
(the kinds ``eval --robustness`` takes: ``ablations,mirrored``, ``attacks``...); a kind not
known is an error when the file is loaded.

An optional ``api`` section grants API clients more than the default::

    api:
      reviewers_may_evaluate: true   # default false: only admin tokens start evaluations
    rules:
      - ...

``POST /studies/{id}/evaluations`` may name only models the server configures
(:func:`api_models`): the reference models, the entries of the models file
(``NEUROSANDBOX_MODELS_FILE``) and the models the rules name here, never a ``replay:`` model
(answers read from a file: for the command line).
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Iterable
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from dicom import CLINICAL_CLASSES, IndexResult, SequenceClass
from evaluation import ModelConfigError, TaskFamily, first_error
from evaluation.models import BUILTIN, REPLAY, load_models_file
from evaluation.robustness import RobustnessOptionError, VariantKind, parse_kinds

log = logging.getLogger(__name__)

REFERENCE_MODEL = "reference/image-rules"
# The engine's built-in models: in process, no key, no network.
REFERENCE_MODELS = BUILTIN
# REPLAY: answers from a file (``replay:PATH``): the command line's, never the API's
CLINICAL = [c.value for c in SequenceClass if c in CLINICAL_CLASSES]  # in enum order


class RoutingError(ValueError):
    """The routing file cannot be read or does not follow the schema."""


def _classes(values: list[str]) -> list[str]:
    known = {c.value for c in SequenceClass}
    bad = [v for v in values if v not in known]
    if bad:
        raise ValueError(f"unknown series class(es) {bad}; known: {sorted(known)}")
    return values


class Match(BaseModel):
    model_config = ConfigDict(extra="forbid")

    calling_aet: list[str] = Field(default_factory=list)  # globs; empty = any
    modality: list[str] = Field(default_factory=list)  # e.g. MR, CT; empty = any
    series_classes_any: list[str] = Field(default_factory=list)
    series_classes_all: list[str] = Field(default_factory=list)

    _check_any = field_validator("series_classes_any")(_classes)
    _check_all = field_validator("series_classes_all")(_classes)


class Evaluate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    models: list[str] = Field(default_factory=lambda: [REFERENCE_MODEL], min_length=1)
    tasks: list[TaskFamily] = Field(
        default_factory=lambda: [TaskFamily.DIFFERENTIAL, TaskFamily.LESION], min_length=1
    )
    series_classes: list[str] = Field(default_factory=lambda: list(CLINICAL))  # what to fetch
    # the robustness audit's variants, asked beside the study (opt-in: they multiply the calls);
    # written as ``eval --robustness`` takes them ("ablations,mirrored"), or as a list
    robustness: list[VariantKind] = Field(default_factory=list)

    _check = field_validator("series_classes")(_classes)

    @field_validator("robustness", mode="before")
    @classmethod
    def _kinds(cls, value: object) -> list[VariantKind]:
        if value is None:
            return []
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = ",".join(value)
        if not isinstance(value, str):
            raise ValueError("robustness: kinds separated by commas, or a list of kinds")
        try:
            return list(parse_kinds(value))
        except RobustnessOptionError as exc:
            raise ValueError(str(exc)) from None


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    match: Match = Field(default_factory=Match)
    skip: bool = False
    evaluate: Evaluate = Field(default_factory=Evaluate)


class ApiGrants(BaseModel):
    """What API clients may do beyond the default (admin tokens start evaluations)."""

    model_config = ConfigDict(extra="forbid")

    reviewers_may_evaluate: bool = False  # a reviewer token may start evaluations too


class RoutingTable(BaseModel):
    model_config = ConfigDict(extra="forbid")

    api: ApiGrants = Field(default_factory=ApiGrants)
    rules: list[Rule]


class StudyFacts(BaseModel):
    """What routing may look at: who sent the study and what it holds."""

    calling_aets: list[str] = Field(default_factory=list)
    modalities: list[str] = Field(default_factory=list)
    series_classes: list[str] = Field(default_factory=list)

    @classmethod
    def from_index(cls, index: IndexResult, calling_aets: Iterable[str] = ()) -> StudyFacts:
        """The facts of an indexed study."""
        return cls(
            calling_aets=list(calling_aets),
            modalities=sorted({s.modality for s in index.series if s.modality}),
            series_classes=sorted({s.series_class.value for s in index.series}),
        )


class Route(BaseModel):
    """The decision: the rule that matched and what to run."""

    rule: str
    models: list[str]
    tasks: list[TaskFamily]
    series_classes: list[str]
    robustness: list[VariantKind] = Field(default_factory=list)  # the audit's variants, if any


DEFAULT_TABLE = RoutingTable(
    rules=[
        Rule(
            name="neuro-mr-ct",
            match=Match(modality=["MR", "CT"], series_classes_any=CLINICAL),
        )
    ]
)


def _matches(m: Match, facts: StudyFacts) -> bool:
    if m.calling_aet and not any(
        fnmatch.fnmatchcase(aet, pat) for aet in facts.calling_aets for pat in m.calling_aet
    ):
        return False
    if m.modality and not set(m.modality) & set(facts.modalities):
        return False
    classes = set(facts.series_classes)
    if m.series_classes_any and not set(m.series_classes_any) & classes:
        return False
    return set(m.series_classes_all) <= classes


class Router:
    """First matching rule wins; ``route`` returns None when the study is not evaluated."""

    def __init__(self, table: RoutingTable = DEFAULT_TABLE) -> None:
        self.table = table

    @classmethod
    def from_file(cls, path: Path | None) -> Router:
        if path is None:
            return cls()
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise RoutingError(f"{path}: cannot read routing rules: {exc}") from exc
        try:
            return cls(RoutingTable.model_validate(data))
        except ValidationError as exc:
            raise RoutingError(f"{path}: {first_error(exc, 'the rules')}") from exc

    @property
    def reviewers_may_evaluate(self) -> bool:
        return self.table.api.reviewers_may_evaluate

    def model_names(self) -> list[str]:
        """Every model a rule names, in order of first mention."""
        names = (m for rule in self.table.rules if not rule.skip for m in rule.evaluate.models)
        return list(dict.fromkeys(names))

    def route(self, facts: StudyFacts) -> Route | None:
        for rule in self.table.rules:
            if _matches(rule.match, facts):
                if rule.skip:
                    return None
                ev = rule.evaluate
                return Route(
                    rule=rule.name,
                    models=list(ev.models),
                    tasks=list(ev.tasks),
                    series_classes=list(ev.series_classes),
                    robustness=list(ev.robustness),
                )
        return None


def is_replay(model: str) -> bool:
    return model == REPLAY or model.startswith(REPLAY + ":")


def api_models(router: Router, models_file: Path | None) -> list[str]:
    """The model names an API client may ask for, sorted: the reference models, the models
    file's entries and the routing rules' models; never a replay (it reads a file named in the
    request). The check is on names only: nothing a client names is opened or resolved."""
    names = set(REFERENCE_MODELS) | set(router.model_names())
    if models_file is not None:
        try:
            specs = load_models_file(models_file)
        except ModelConfigError as exc:  # said in the server log, not to the client
            log.warning("models file left out of the API's models: %s", exc)
            specs = {}
        names |= {n for n, s in specs.items() if not is_replay(s.litellm_model)}
    return sorted(n for n in names if not is_replay(n))
