"""The hospital case manifest as a record: what a manifest file may hold, its JSON Schema, and
its validation errors named by field path (``cases[1].tasks[0]: 'diagnosis' is not one of ...``).

The loader (``evaluation.datasets.suite.load_manifest``) and ``neurosandbox cases check`` both
validate through :func:`parse_manifest`, and the published schema (``docs/manifest.schema.json``)
is :func:`manifest_schema`: one rule. Validation forbids unknown fields at every level, the
ground-truth records of ``evaluation.case`` included, so a typo (``notes:``) is an error rather
than a field that silently vanishes.
"""

from __future__ import annotations

import copy
import difflib
import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import ErrorDetails, PydanticCustomError, core_schema

from dicom import PACS_CREDENTIAL_ENV
from evaluation.case import VOCABULARY_CONTEXT, GroundTruth, Question, TaskFamily, Turn
from evaluation.errors import field_path, is_union_tag
from evaluation.scoring.vocabulary import TRUTH_VOCABULARY

SCHEMA_ID = "https://neurosandbox.invalid/schemas/manifest.schema.json"

# The tags of the manifest's unions below start with "~" (evaluation.errors.is_union_tag): an
# error's path leaves them out (cases[0].study.path, not cases[0].study.~folder.path).


def _number_as_text(value: Any) -> Any:
    """YAML reads ``case_id: 12`` as a number: an id may be written either way."""
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


# An identifier: text, or a number taken as its text (the schema says so too)
Id = Annotated[str, BeforeValidator(_number_as_text, json_schema_input_type=str | int | float)]


def case_label(case_id: Any, id_: Any, n: int) -> str:
    """The case id the loader gives the case at position `n` (0-based): its ``case_id``, else
    its ``id`` (a number taken as its text), else ``case-NNN``."""
    for value in (case_id, id_):
        text = _number_as_text(value)
        if isinstance(text, str) and text:
            return text
    return f"case-{n + 1:03d}"


# The name of an environment variable a manifest may read a PACS credential from (dicom's rule).
CREDENTIAL_ENV = PACS_CREDENTIAL_ENV


class _OrthancAccess(BaseModel):
    """The study and the credentials, which may stand next to 'orthanc:' or inside its mapping."""

    model_config = ConfigDict(extra="forbid")

    study_uid: Id | None = Field(
        default=None, description="StudyInstanceUID (next to 'orthanc:' or inside its mapping)"
    )
    username: str | None = Field(default=None, description="user name for HTTP basic auth")
    # A manifest may come from elsewhere: it names only variables meant for a PACS, so it
    # cannot make the sandbox send another secret of this machine (a model's API key) to the
    # server it names.
    username_env: str | None = Field(
        default=None,
        pattern=CREDENTIAL_ENV,
        description="environment variable holding the user name (wins over username); its "
        "name contains PACS or ORTHANC",
    )
    password_env: str | None = Field(
        default=None,
        pattern=CREDENTIAL_ENV,
        description="environment variable holding the password (never the password); its name "
        "contains PACS or ORTHANC",
    )
    timeout_s: float | None = Field(default=None, gt=0, description="seconds (default 120)")


class OrthancServer(_OrthancAccess):
    """An Orthanc server and, optionally, the study on it."""

    url: str = Field(description="Orthanc's REST base URL, e.g. http://pacs.local:8042")


def _orthanc_tag(value: Any) -> str | None:
    return "~url" if isinstance(value, str) else "~server" if isinstance(value, dict) else None


OrthancRef = Annotated[
    Annotated[str, Tag("~url")] | Annotated[OrthancServer, Tag("~server")],
    Discriminator(
        _orthanc_tag,
        custom_error_type="orthanc",
        custom_error_message="a URL or a mapping {url, study_uid, username, password_env}",
    ),
]


class OrthancStudy(_OrthancAccess):
    """A study fetched from Orthanc's REST API (once; kept in the cache)."""

    model_config = ConfigDict(
        extra="forbid",
        # the schema's form of _has_study: study_uid next to 'orthanc:' or inside its mapping
        json_schema_extra={
            "anyOf": [
                {"required": ["study_uid"], "properties": {"study_uid": {"not": {"type": "null"}}}},
                {
                    "required": ["orthanc"],
                    "properties": {
                        "orthanc": {
                            "type": "object",
                            "required": ["study_uid"],
                            "properties": {"study_uid": {"not": {"type": "null"}}},
                        }
                    },
                },
            ]
        },
    )

    orthanc: OrthancRef = Field(description="the server: its URL, or a mapping")

    @model_validator(mode="after")
    def _has_study(self) -> OrthancStudy:
        if not self.server().study_uid:
            raise PydanticCustomError(
                "study_uid", "needs 'study_uid' (next to 'orthanc:' or inside it)"
            )
        return self

    def server(self) -> OrthancServer:
        """The server with the study: the keys next to 'orthanc:' win over those inside it."""
        inner = (
            {"url": self.orthanc}
            if isinstance(self.orthanc, str)
            else self.orthanc.model_dump(exclude_none=True)
        )
        outer = self.model_dump(exclude={"orthanc"}, exclude_none=True)
        return OrthancServer.model_validate({**inner, **outer})


# A PACS's name in the PACS file (gateway/pacs/config.py's rule, repeated here: this layer cannot
# import the gateway) and a DICOM UID (PS3.5 9.1; dicom.check_uid's rule, as a schema pattern)
PACS_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
UID_PATTERN = r"^(?:0|[1-9][0-9]*)(?:\.(?:0|[1-9][0-9]*))*$"


class PacsStudyRef(BaseModel):
    """A study on a PACS configured by name (DIMSE, DICOMweb or Orthanc; the PACS file), by its
    UID and its patient: fetched once into the cache on first use, by a fetcher the gateway
    gives the loader (this layer cannot reach a PACS itself)."""

    model_config = ConfigDict(extra="forbid")

    pacs: str = Field(
        pattern=PACS_NAME, description="the PACS by its name in the PACS file ('local': Orthanc)"
    )
    study_uid: str = Field(max_length=64, pattern=UID_PATTERN, description="StudyInstanceUID")
    patient_id: Id = Field(
        min_length=1,
        max_length=64,
        description="PatientID as the archive holds it: only this patient's study is fetched, "
        "a file of another patient is left out",
    )
    issuer: str | None = Field(
        default=None, max_length=64, description="IssuerOfPatientID, when the archive uses one"
    )


# What the loader asks for a study on a PACS: (the study, the cache folder) -> its DICOM folder.
# The gateway builds it (gateway/pacs/cohort.py); it raises DatasetError when it cannot fetch.
StudyFetcher = Callable[[PacsStudyRef, Path], Path]


class StudyFolder(BaseModel):
    """A study on disk, given as a mapping."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="DICOM folder, zip or file, relative to the manifest")


def _study_tag(value: Any) -> str | None:
    if isinstance(value, str):
        return "~path"
    if isinstance(value, dict):
        if "orthanc" in value:
            return "~orthanc"
        return "~pacs" if "pacs" in value else "~folder"
    return None


StudyRef = Annotated[
    Annotated[str, Tag("~path")]
    | Annotated[StudyFolder, Tag("~folder")]
    | Annotated[OrthancStudy, Tag("~orthanc")]
    | Annotated[PacsStudyRef, Tag("~pacs")],
    Discriminator(
        _study_tag,
        custom_error_type="study",
        custom_error_message="a path, {path: ...}, {orthanc: ..., study_uid: ...} or "
        "{pacs: NAME, study_uid: ..., patient_id: ...}",
    ),
]


def _ehr_tag(value: Any) -> str | None:
    return "~file" if isinstance(value, str) else "~bundle" if isinstance(value, dict) else None


EhrRef = Annotated[
    Annotated[str, Tag("~file")] | Annotated[dict[str, Any], Tag("~bundle")],
    Discriminator(
        _ehr_tag,
        custom_error_type="ehr",
        custom_error_message="a FHIR R4 Bundle (a mapping) or the name of its JSON file",
    ),
]


class ManifestCase(BaseModel):
    """One case: a study, the record and note that go with it, the truth and the tasks."""

    model_config = ConfigDict(extra="forbid", title="Case")

    case_id: Id | None = Field(
        default=None,
        description="the case's id in runs and reports (default: case-001, case-002... by position)",
    )
    id: Id | None = Field(default=None, description="another name for case_id")
    patient_id: Id | None = Field(
        default=None,
        description="pseudonymous patient id: cases of one patient are resampled together",
    )
    study: StudyRef = Field(
        description="the DICOM study: a folder, zip or file relative to the manifest, "
        "{path: ...}, {orthanc: URL, study_uid: ...}, or a configured PACS's study "
        "{pacs: NAME, study_uid: ..., patient_id: ...}"
    )
    ehr: EhrRef | None = Field(
        default=None,
        description="the record: a FHIR R4 Bundle inline, or a JSON file relative to the manifest",
    )
    note: str | None = Field(
        default=None,
        description="the clinical note: the text itself, or a one-line name of a .txt file "
        "relative to the manifest",
    )
    ground_truth: GroundTruth | None = Field(
        default=None, description="the right answer (needed for scores)"
    )
    tasks: list[TaskFamily] | None = Field(
        default=None, description="task families to ask (default: every family the case allows)"
    )
    questions: list[Question] | None = Field(
        default=None, description="the dataset's own questions, in its own words"
    )
    turns: list[Turn] | None = Field(
        default=None, description="multi-turn (L3) cases: what each turn reveals and asks"
    )

    def label(self, n: int) -> str:
        """The case id the loader gives the case at position `n` (0-based)."""
        return case_label(self.case_id, self.id, n)


_STUDY: TypeAdapter[Any] = TypeAdapter(StudyRef)
_EHR: TypeAdapter[Any] = TypeAdapter(EhrRef)


def files_of(entry: Any) -> tuple[Any, Any, str | None]:
    """The study, record and note of a raw case, each kept when it is valid on its own (None
    otherwise): the files of a case with other bad fields are still checked."""
    if not isinstance(entry, dict):
        return None, None, None
    out: list[Any] = []
    for key, adapter in (("study", _STUDY), ("ehr", _EHR)):
        try:
            out.append(adapter.validate_python(entry[key]) if key in entry else None)
        except ValidationError:
            out.append(None)
    note = entry.get("note")
    return out[0], out[1], note if isinstance(note, str) else None


class Manifest(BaseModel):
    """A hospital's case manifest (YAML or JSON): a name and a list of cases."""

    model_config = ConfigDict(extra="forbid", title="NeuroSandbox case manifest")

    name: Id | None = Field(
        default=None, description="the dataset's name in runs and reports (default: file name)"
    )
    cases: list[ManifestCase] = Field(min_length=1, description="the cases, in order")


class ManifestProblem(BaseModel):
    """One thing wrong with a manifest, named by its path (``cases[1].tasks[0]``)."""

    path: str  # "" for the manifest as a whole
    message: str
    case: int | None = None  # 0-based index of the case it is in; None for the manifest level

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ParsedManifest(BaseModel):
    """A manifest validated case by case: a case with problems is None in ``cases``."""

    name: str | None = None
    cases: list[ManifestCase | None] = Field(default_factory=list)
    problems: list[ManifestProblem] = Field(default_factory=list)


# --------------------------------------------------------------------------- the schema


class _ForbidExtra(GenerateJsonSchema):
    """Every record says additionalProperties: false, as the loader validates them."""

    def model_schema(self, schema: core_schema.ModelSchema) -> JsonSchemaValue:
        out = super().model_schema(schema)
        if "properties" in out:
            out.setdefault("additionalProperties", False)
        return out


def manifest_schema() -> dict[str, Any]:
    """JSON Schema of a case manifest (draft 2020-12, generated from :class:`Manifest`)."""
    return copy.deepcopy(_schema())


@functools.cache
def _schema() -> dict[str, Any]:
    schema = Manifest.model_json_schema(schema_generator=_ForbidExtra)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = SCHEMA_ID
    return schema


# --------------------------------------------------------------------------- errors


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _known_fields(schema: dict[str, Any], loc: tuple[int | str, ...]) -> list[str]:
    """The field names the schema allows where `loc` points (for a "did you mean")."""
    defs = schema.get("$defs", {})

    def deref(node: dict[str, Any]) -> list[dict[str, Any]]:
        if "$ref" in node:
            return deref(defs[node["$ref"].rsplit("/", 1)[-1]])
        subs = node.get("anyOf") or node.get("oneOf")
        return [n for s in subs for n in deref(s)] if subs else [node]

    nodes = [schema]
    for part in loc:
        if is_union_tag(part):
            continue
        nxt: list[dict[str, Any]] = []
        for node in (n for x in nodes for n in deref(x)):
            if isinstance(part, int) and "items" in node:
                nxt.append(node["items"])
            elif isinstance(part, str) and part in node.get("properties", {}):
                nxt.append(node["properties"][part])
        nodes = nxt
    return sorted({k for x in nodes for n in deref(x) for k in n.get("properties", {})})


def _message(err: ErrorDetails, schema: dict[str, Any]) -> str:
    kind = err["type"]
    if kind == "missing":
        return "field required"
    if kind == "extra_forbidden":
        known = _known_fields(schema, tuple(err["loc"][:-1]))
        near = difflib.get_close_matches(str(err["loc"][-1]), known, n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        return f"unknown field ({hint}allowed: {', '.join(known)})"
    if kind in ("enum", "literal_error"):
        # pydantic's own list of the values ("'a', 'b' or 'c'"), so no second list is kept here
        allowed = re.findall(r"'([^']*)'", str((err.get("ctx") or {}).get("expected", "")))
        return f"{_short(err['input'])} is not one of {', '.join(allowed)}"
    if kind in ("study_uid", "truth_vocabulary"):
        return err["msg"]
    return f"{err['msg'][:1].lower()}{err['msg'][1:]} (got {_short(err['input'])})"


def problems_of(exc: ValidationError, prefix: tuple[int | str, ...] = ()) -> list[ManifestProblem]:
    """Every error of a validation, named by its path (`prefix` + the error's location)."""
    schema = _schema()
    out = []
    for err in exc.errors():
        loc = (*prefix, *err["loc"])
        case = loc[1] if len(loc) > 1 and loc[0] == "cases" and isinstance(loc[1], int) else None
        out.append(ManifestProblem(path=field_path(loc), message=_message(err, schema), case=case))
    return out


# A manifest's truth is read through the answers' vocabulary (evaluation.scoring.vocabulary)
_CONTEXT = {VOCABULARY_CONTEXT: TRUTH_VOCABULARY}


def parse_case(entry: Any) -> ManifestCase:
    """One case of a manifest, validated as the manifest validates its cases."""
    return ManifestCase.model_validate(entry, extra="forbid", context=_CONTEXT)


def parse_manifest(data: Any) -> ParsedManifest:
    """Validate a manifest's parsed YAML/JSON: the cases that are valid, and every problem."""
    if not isinstance(data, dict):
        problem = "a manifest is a mapping with 'name' and a 'cases' list"
        return ParsedManifest(problems=[ManifestProblem(path="", message=problem)])
    try:
        manifest = Manifest.model_validate(data, extra="forbid", context=_CONTEXT)
    except ValidationError as exc:
        problems = problems_of(exc)
    else:
        return ParsedManifest(name=manifest.name, cases=list(manifest.cases))
    bad = {p.case for p in problems}
    listed = data.get("cases")
    entries: list[Any] = listed if isinstance(listed, list) else []
    cases = [None if n in bad else parse_case(e) for n, e in enumerate(entries)]
    name = data.get("name")
    return ParsedManifest(
        name=str(name) if isinstance(name, str | int | float) else None,
        cases=cases,
        problems=problems,
    )
