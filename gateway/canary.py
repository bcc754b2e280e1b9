"""The canary: a pinned set of cases run again on a schedule, each model compared with its last
canary run from the same file (``neurosandbox canary FILE``; docs/evaluation.md "Canary").

The file (YAML, validated here, every error naming its field) names the canary, a dataset and
optionally the case ids pinned from it, the models, the samples, the decoding and the alarm
thresholds (``evaluation.scoring.DriftRule``). A canary run is an ordinary run in the runs folder
(``canary-<name>-<UTC time>``), marked with the run note ``canary``
(``evaluation.log.CanaryMark``: name, the file's sha256, the verdict, one line of detail), which
the index shows and the service's ``/metrics`` reads. The earlier run is the newest run of the
catalog carrying the same name and file hash; when its scores are of an older scoring version it
is rescored first (its stored answers, no model called), so a scoring change alone never fires.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evaluation import DatasetSpec, EvaluationError, GenerateConfig, TaskFamily, first_error
from evaluation.log import CANARY_NOTE, CanaryMark, ModelPassport, open_store, passport_changes
from evaluation.scoring import DriftRule, ModelDrift, RunComparison, drift_verdicts
from gateway.runs.comparing import compare_run_dirs

if TYPE_CHECKING:
    from gateway.metrics import Metrics
    from gateway.settings import Settings

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 256 << 10
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
MAX_DETAIL = 1900  # characters of the mark's detail (CanaryMark keeps 2000)


class CanaryFileError(EvaluationError):
    """The canary file cannot be read or is not a valid canary (the message names the field)."""


class CanaryDataset(BaseModel):
    """The dataset, as ``neurosandbox eval`` takes it; ``case_ids`` pins some of its cases."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1, max_length=4096)
    kind: Literal["auto", "suite", "manifest", "neural-medbench", "neurovlm"] = "auto"
    answers: str | None = Field(default=None, max_length=4096)
    columns: dict[str, str] | None = None
    image_root: str | None = Field(default=None, max_length=4096)
    case_ids: list[str] | None = Field(default=None, min_length=1, max_length=100_000)


class CanaryDecoding(BaseModel):
    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(default=2048, ge=16, le=65_536)
    timeout_s: float = Field(default=120.0, gt=0.0, le=3600.0)
    seed: int | None = 0  # sample i is sent seed + i


class CanaryFile(BaseModel):
    """A canary, as its file states it."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN)
    dataset: CanaryDataset
    models: list[str] = Field(min_length=1, max_length=20)
    tasks: list[TaskFamily] | None = None
    samples: int = Field(default=1, ge=1, le=20)
    decoding: CanaryDecoding = Field(default_factory=CanaryDecoding)
    models_file: str | None = Field(default=None, max_length=4096)
    api_base: str | None = Field(default=None, max_length=2048)
    max_images: int = Field(default=8, ge=1, le=64)
    bertscore: bool = False
    alarm: DriftRule = Field(default_factory=DriftRule)


class Canary(BaseModel):
    """A canary file read: its content, where it is, its sha256 (what marks its runs)."""

    spec: CanaryFile
    path: str
    sha256: str

    def folder(self) -> Path:
        return Path(self.path).parent

    def near(self, value: str | None) -> str | None:
        """A path of the file relative to the file's folder (absolute stays)."""
        if value is None:
            return None
        p = Path(value).expanduser()
        return str(p if p.is_absolute() else self.folder() / p)

    def dataset(self) -> DatasetSpec:
        d = self.spec.dataset
        return DatasetSpec(
            path=str(self.near(d.path)),
            kind=d.kind,
            answers=self.near(d.answers),
            columns=d.columns,
            image_root=self.near(d.image_root),
            case_ids=d.case_ids,
        )

    def models(self) -> list[str]:
        """The model names; a replay file named relative to the canary file is found there."""
        out = []
        for m in self.spec.models:
            if m.startswith("replay:"):
                m = f"replay:{self.near(m.split(':', 1)[1])}"
            out.append(m)
        return out

    def generate(self) -> GenerateConfig:
        d = self.spec.decoding
        return GenerateConfig(
            temperature=d.temperature, top_p=d.top_p, max_tokens=d.max_tokens, timeout_s=d.timeout_s
        )


def read_canary(path: Path) -> Canary:
    """The canary file at ``path``: a regular YAML file of at most 256 KiB, validated."""
    from dicom import FileTooLargeError, NotRegularFileError, read_regular

    try:
        raw = read_regular(path, MAX_FILE_BYTES)
    except FileTooLargeError:
        raise CanaryFileError(f"canary file {path}: larger than {MAX_FILE_BYTES} bytes") from None
    except NotRegularFileError:
        raise CanaryFileError(f"canary file {path}: not a regular file") from None
    except OSError as exc:
        raise CanaryFileError(f"canary file {path}: cannot be read: {exc.strerror}") from None
    try:
        data = yaml.safe_load(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise CanaryFileError(f"canary file {path}: not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise CanaryFileError(f"canary file {path}: not YAML: {exc}") from None
    if not isinstance(data, dict):
        raise CanaryFileError(f"canary file {path}: not a mapping of fields (name, dataset, ...)")
    try:
        spec = CanaryFile.model_validate(data)
    except ValidationError as exc:
        raise CanaryFileError(f"canary file {path}: {first_error(exc, 'the file')}") from None
    digest = hashlib.sha256(raw).hexdigest()
    return Canary(spec=spec, path=str(path.absolute()), sha256=digest)


def run_folder(runs_dir: Path, name: str, now: dt.datetime | None = None) -> Path:
    """A new run folder for the canary in the runs folder (where the index lists it)."""
    stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%dT%H%M%SZ")
    base = runs_dir / f"canary-{name}-{stamp}"
    folder, n = base, 1
    while folder.exists():
        n += 1
        folder = base.with_name(f"{base.name}-{n}")
    return folder


class Earlier(BaseModel):
    run_id: str
    run_dir: str
    created_at: str | None = None


class _Marked(BaseModel):
    run_id: str
    run_dir: str | None
    created_at: str | None
    dataset_hash: str | None = None
    mark: CanaryMark


def _marked_runs(settings: Settings) -> list[_Marked]:
    """The install's runs (the catalog) that carry a valid canary mark, newest first."""
    from gateway.runs.index import install_runs

    out = []
    for entry in install_runs(settings):
        c = entry.canary
        if c is None:
            continue
        try:  # the catalog read the note leniently: only a valid mark counts
            mark = CanaryMark.model_validate(
                {k: getattr(c, k, None) for k in ("name", "file_sha256", "verdict", "detail")}
            )
        except ValueError:
            continue
        out.append(
            _Marked(
                run_id=entry.run_id,
                run_dir=entry.run_dir,
                created_at=entry.created_at,
                dataset_hash=entry.dataset_hash,
                mark=mark,
            )
        )
    return out


def earlier_run(
    canary: Canary, settings: Settings, current: str, dataset_hash: str
) -> tuple[Earlier | None, str]:
    """The canary's newest run before ``current`` (a run id) with the same name, file hash and
    dataset hash, from the catalog of the install's runs (None: this is its first), and a note
    when newer runs of the file evaluated another dataset (its cases changed on disk: a new
    series starts, never compared across two datasets)."""
    other: _Marked | None = None
    for m in _marked_runs(settings):
        if (
            m.run_id == current
            or m.run_dir is None
            or m.mark.name != canary.spec.name
            or m.mark.file_sha256 != canary.sha256
        ):
            continue
        if m.dataset_hash != dataset_hash:
            other = other or m
            continue
        said = ""
        if other is not None:
            said = _dataset_changed(other, dataset_hash)
        return Earlier(run_id=m.run_id, run_dir=m.run_dir, created_at=m.created_at), said
    return None, _dataset_changed(other, dataset_hash) if other is not None else ""


def _dataset_changed(other: _Marked, now: str) -> str:
    return (
        f"the dataset's content changed since run {other.run_id} (hash "
        f"{(other.dataset_hash or '?')[:12]} -> {now[:12]}): runs of another dataset are not "
        "compared"
    )


class FieldChange(BaseModel):
    field: str
    before: str | None = None
    after: str | None = None


class CanaryOutcome(BaseModel):
    """What one canary run found: the verdict, per model why, the passports that changed."""

    name: str
    run_id: str
    run_dir: str
    verdict: Literal["first", "quiet", "alarm"]
    earlier: Earlier | None = None
    models: list[ModelDrift] = Field(default_factory=list)
    passport_changes: dict[str, list[FieldChange]] = Field(default_factory=dict)
    rescored: list[str] = Field(default_factory=list)  # what rescoring the earlier run said
    dataset_note: str = ""  # newer runs of the file evaluated another dataset
    comparison: RunComparison | None = None

    def detail(self) -> str:
        """One line for the mark (bounded): the alarming models and why, else a summary."""
        if self.verdict == "first":
            first = "first run of this canary file on this dataset: nothing to compare yet"
            return f"{first}; {self.dataset_note}" if self.dataset_note else first
        parts = [self.dataset_note] if self.dataset_note else []
        for m in self.models:
            if m.verdict == "alarm":
                parts.append(f"{m.model}: " + "; ".join(m.reasons))
            changed = self.passport_changes.get(m.model)
            if changed:
                parts.append(f"{m.model} passport: " + ", ".join(c.field for c in changed[:10]))
        if not [p for p in parts if p != self.dataset_note]:
            n = len(self.models)
            parts.append(f"{n} model{'s' if n != 1 else ''} quiet against run {self.earlier_id}")
        text = " | ".join(parts)
        return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 1] + "…"

    @property
    def earlier_id(self) -> str:
        return self.earlier.run_id if self.earlier else "-"


def _passports(run_dir: Path, database_url: str | None) -> dict[str, ModelPassport]:
    store = open_store(run_dir, database_url=database_url, read_only=True)
    try:
        return store.passports()
    finally:
        store.close()


def changed_passports(
    earlier: Path, current: Path, database_url: str | None
) -> dict[str, list[FieldChange]]:
    """Per model of both runs, the passport fields that changed (``evaluation.log``'s rule)."""
    before, after = _passports(earlier, database_url), _passports(current, database_url)
    out: dict[str, list[FieldChange]] = {}
    for model in sorted(set(before) & set(after)):
        found = [
            FieldChange(field=c.field, before=c.before, after=c.after)
            for c in passport_changes(before[model], after[model])
        ]
        if found:
            out[model] = found
    return out


def judge(
    canary: Canary, run_dir: Path, settings: Settings, *, n_boot: int = 2000
) -> CanaryOutcome:
    """Compare the canary's new run (``run_dir``) with its earlier run, mark the new run with the
    verdict, and return what was found."""
    database_url = settings.database_url
    store = open_store(run_dir, database_url=database_url, read_only=True)
    try:
        row = store.run_log()
    finally:
        store.close()
    run_id = row.run_id
    earlier, dataset_note = earlier_run(canary, settings, run_id, row.dataset_hash)
    outcome = CanaryOutcome(
        name=canary.spec.name,
        run_id=run_id,
        run_dir=str(run_dir),
        verdict="first",
        dataset_note=dataset_note,
    )
    if earlier is not None:
        rescored: list[str] = []
        comparison = compare_run_dirs(
            Path(earlier.run_dir),
            run_dir,
            database_url=database_url,
            rescore_first=True,
            n_boot=n_boot,
            on_rescore=lambda d, msg: rescored.append(f"{d}: {msg}"),
        )
        models = drift_verdicts(comparison, canary.spec.alarm)
        outcome = outcome.model_copy(
            update={
                "earlier": earlier,
                "models": models,
                "verdict": "alarm" if any(m.verdict == "alarm" for m in models) else "quiet",
                "passport_changes": changed_passports(Path(earlier.run_dir), run_dir, database_url),
                "rescored": rescored,
                "comparison": comparison,
            }
        )
    mark = CanaryMark(
        name=canary.spec.name,
        file_sha256=canary.sha256,
        verdict=outcome.verdict,
        detail=outcome.detail(),
    )
    store = open_store(run_dir, database_url=database_url)
    try:
        store.set_note(CANARY_NOTE, mark.note())
    finally:
        store.close()
    return outcome


def latest_marks(settings: Settings) -> dict[str, tuple[CanaryMark, str]]:
    """Each canary's newest mark in the catalog, with its run's creation time (ISO)."""
    out: dict[str, tuple[CanaryMark, str]] = {}
    for m in _marked_runs(settings):
        out.setdefault(m.mark.name, (m.mark, m.created_at or ""))
    return out


def export_marks(metrics: Metrics, settings: Settings) -> None:
    """Set the canary gauges of ``metrics`` from the newest mark of each canary (at scrape time:
    the canary runs in another process). A catalog that cannot be read leaves them as they were."""
    try:
        marks = latest_marks(settings)
    except (EvaluationError, OSError) as exc:
        log.warning("canary marks not read for /metrics: %s", exc)
        return
    metrics.clear("canary_alarm")
    metrics.clear("canary_last_run_timestamp_seconds")
    for name, (mark, created) in marks.items():
        metrics.set("canary_alarm", 1.0 if mark.verdict == "alarm" else 0.0, canary=name)
        try:
            when = dt.datetime.fromisoformat(created).timestamp()
        except ValueError:
            continue
        metrics.set("canary_last_run_timestamp_seconds", when, canary=name)
