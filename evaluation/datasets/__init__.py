"""Datasets: where cases come from, and the hash that pins a run to their exact content.

Kinds: ``suite`` (phantom suite or any folder of case folders), ``manifest`` (a hospital's
YAML/JSON list of cases), ``neural-medbench`` (JSON/JSONL/Parquet records + answers file) and
``neurovlm`` (image_mapping.csv + image root). ``load_dataset`` detects the kind from the path
when it is not given. The dataset hash covers every case's content (record, note, questions,
ground truth) and the sha256 of every image; a run records it, and resume refuses a dataset
whose hash changed.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from evaluation.case import Case, ImageRef
from evaluation.coverage import LoadNotes, SkippedCase
from evaluation.datasets.manifest import StudyFetcher
from evaluation.datasets.neural_medbench import ColumnMap, load_neural_medbench
from evaluation.datasets.neurovlm import load_neurovlm
from evaluation.datasets.rendering import RenderPlan
from evaluation.datasets.suite import load_manifest, load_suite
from evaluation.errors import DatasetError
from evaluation.lazy import lazy_getattr

# "memory": cases built in memory (a gateway run's study); the run store keeps them
DatasetKind = Literal["auto", "suite", "manifest", "neural-medbench", "neurovlm", "memory"]

__all__ = [
    "GENERATOR_VERSION",
    "AnatomyError",
    "ColumnMap",
    "Dataset",
    "DatasetSpec",
    "ImageStore",
    "ManifestCase",
    "ManifestCheck",
    "ManifestProblem",
    "PacsStudyRef",
    "RenderPlan",
    "SharedCase",
    "StudyFetcher",
    "SuiteManifest",
    "case_registry",
    "check_manifest",
    "dataset_hash",
    "detect_kind",
    "find_case",
    "generate_suite",
    "load_dataset",
    "load_shared_case",
    "manifest_schema",
    "registered_case",
    "render_study",
    "share_case",
    "write_case_manifest",
]


class DatasetSpec(BaseModel):
    """How to load a dataset; recorded with the run so that resume loads the same one."""

    path: str
    kind: DatasetKind = "auto"
    answers: str | None = None  # Neural-MedBench answers file
    columns: dict[str, str] | None = None  # Neural-MedBench column map
    image_root: str | None = None  # NeuroVLM-Bench images
    limit: int | None = None  # first N cases only
    # these cases only, by id (a canary's pinned set); an id the dataset lacks is an error
    case_ids: list[str] | None = None
    render: RenderPlan = Field(default_factory=RenderPlan)


class Dataset(BaseModel):
    name: str
    kind: str
    spec: DatasetSpec
    cases: list[Case]
    hash: str
    warnings: list[str] = Field(default_factory=list)  # every note, skipped cases included
    skipped: list[SkippedCase] = Field(default_factory=list)  # listed, but not loaded

    def case(self, case_id: str) -> Case:
        for c in self.cases:
            if c.case_id == case_id:
                return c
        raise KeyError(case_id)


def detect_kind(path: Path) -> str:
    """The dataset kind a path looks like."""
    if path.is_dir():
        if (path / "suite.json").exists() or any(path.glob("*/case.json")):
            return "suite"
        if (path / "image_mapping.csv").exists():
            return "neurovlm"
        raise DatasetError(
            f"{path}: not a suite (no suite.json or */case.json) nor a NeuroVLM folder "
            "(no image_mapping.csv)"
        )
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "neurovlm"
    if suffix in (".yaml", ".yml"):
        return "manifest"
    if suffix in (".jsonl", ".ndjson", ".parquet"):
        return "neural-medbench"
    if suffix == ".json":
        head = path.read_text(encoding="utf-8", errors="replace")[:4096]
        if '"cases"' in head and '"case_id"' not in head.split('"cases"')[0]:
            return "manifest"
        return "neural-medbench"
    raise DatasetError(f"{path}: unknown dataset kind; give --kind")


_NOT_HASHED: dict[str, Any] = {
    "images": {"__all__": {"path"}},
    "provenance": {"patient": True, "identity": {"age", "scanners"}},
}


def dataset_hash(cases: list[Case]) -> str:
    """sha256 over each case's content (image paths excluded, image hashes included).

    Left out too: what the subgroups read from the study's headers and a run's snapshot (the
    scanners, PatientAge, the record's age and sex), so a dataset keeps the hash it had before
    they were recorded: runs of it a month apart still compare."""
    h = hashlib.sha256()
    for case in sorted(cases, key=lambda c: c.case_id):
        body = case.model_dump(mode="json", exclude=_NOT_HASHED)
        h.update(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
        h.update(b"\n")
    return h.hexdigest()


def _pinned(
    path: Path, cases: list[Case], notes: LoadNotes, ids: list[str]
) -> tuple[list[Case], LoadNotes]:
    """The cases named by ``ids`` (in the dataset's order), and the notes about them; an id
    that is neither a loaded case nor a case the loader skipped is an error."""
    wanted = set(ids)
    skipped = {n.case_id for n in notes if isinstance(n, SkippedCase) and n.case_id}
    unknown = sorted(wanted - {c.case_id for c in cases} - skipped)
    if unknown:
        shown = ", ".join(repr(i[:80]) for i in unknown[:5])
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise DatasetError(f"{path}: no case {shown}{more} (case_ids names cases of the dataset)")
    kept = [n for n in notes if not isinstance(n, SkippedCase) or n.case_id in wanted]
    return [c for c in cases if c.case_id in wanted], kept


def load_dataset(
    spec: DatasetSpec | str | Path, cache_dir: Path, fetch_study: StudyFetcher | None = None
) -> Dataset:
    """Load every case of a dataset (rendering studies into ``cache_dir`` as needed).
    ``fetch_study``: how a manifest's study on a configured PACS is fetched (the gateway's
    ``pacs_fetcher``); without it such a case is skipped, saying why."""
    if not isinstance(spec, DatasetSpec):
        spec = DatasetSpec(path=str(spec))
    cache_dir = Path(cache_dir).expanduser().resolve()  # image paths must not depend on the cwd
    path = Path(spec.path).expanduser()
    if spec.kind == "memory":
        raise DatasetError(
            f"the cases of this run were built in memory (a gateway run of {path}): "
            "they are read from its run store, not loaded again"
        )
    if not path.exists():
        raise DatasetError(f"dataset not found: {path}")
    kind = detect_kind(path) if spec.kind == "auto" else spec.kind
    notes: LoadNotes
    if kind == "suite":
        name, cases, notes = load_suite(path, cache_dir, spec.render)
    elif kind == "manifest":
        name, cases, notes = load_manifest(path, cache_dir, spec.render, fetch_study)
    elif kind == "neural-medbench":
        name, cases, notes = load_neural_medbench(
            path,
            cache_dir,
            answers=Path(spec.answers) if spec.answers else None,
            columns=ColumnMap.parse(spec.columns),
        )
    elif kind == "neurovlm":
        name, cases, notes = load_neurovlm(
            path, Path(spec.image_root) if spec.image_root else None, cache_dir
        )
    else:
        raise DatasetError(f"unknown dataset kind {kind!r}")
    if spec.case_ids is not None:
        cases, notes = _pinned(path, cases, notes, spec.case_ids)
    if spec.limit:
        cases = cases[: spec.limit]
    skipped = [n for n in notes if isinstance(n, SkippedCase)]
    ids = [c.case_id for c in cases]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise DatasetError(f"{path}: duplicate case ids {dup[:5]}")
    return Dataset(
        name=name,
        kind=kind,
        spec=spec,
        cases=cases,
        hash=dataset_hash(cases),
        warnings=[str(n) for n in notes],
        skipped=skipped,
    )


class ImageStore:
    """PNG bytes of image refs, checked against their sha256, with a bounded in-memory cache."""

    def __init__(self, max_bytes: int = 512 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._size = 0

    def __call__(self, ref: ImageRef) -> bytes:
        hit = self._cache.get(ref.sha256)
        if hit is not None:
            self._cache.move_to_end(ref.sha256)
            return hit
        try:
            data = Path(ref.path).read_bytes()
        except OSError as exc:
            raise DatasetError(f"image {ref.path} cannot be read: {exc}") from exc
        if hashlib.sha256(data).hexdigest() != ref.sha256:
            raise DatasetError(
                f"image {ref.path} changed since the dataset was loaded (sha256 differs)"
            )
        self._cache[ref.sha256] = data
        self._size += len(data)
        while self._size > self.max_bytes and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._size -= len(old)
        return data


# Names of the face that live in modules with heavier imports: loaded on first use.
_LAZY = {
    "AnatomyError": "evaluation.datasets.phantoms.anatomy",
    "GENERATOR_VERSION": "evaluation.datasets.phantoms.series",
    "ManifestCase": "evaluation.datasets.manifest",
    "ManifestCheck": "evaluation.datasets.suite",
    "ManifestProblem": "evaluation.datasets.manifest",
    "PacsStudyRef": "evaluation.datasets.manifest",
    "RenderPlan": "evaluation.datasets.rendering",
    "SharedCase": "evaluation.sharing",
    "SuiteManifest": "evaluation.datasets.phantoms.suite",
    "case_registry": "evaluation.datasets.registry",
    "check_manifest": "evaluation.datasets.suite",
    "find_case": "evaluation.sharing",
    "generate_suite": "evaluation.datasets.phantoms.suite",
    "load_shared_case": "evaluation.sharing",
    "manifest_schema": "evaluation.datasets.manifest",
    "registered_case": "evaluation.datasets.registry",
    "render_study": "evaluation.datasets.rendering",
    "share_case": "evaluation.sharing",
    "write_case_manifest": "evaluation.sharing",
}
__getattr__ = lazy_getattr(__name__, _LAZY)
