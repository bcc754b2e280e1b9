"""A phantom suite: N cases from one seed, and a manifest with the sha256 of every file.

``suite.json`` is written last, with sorted keys and no timestamps, so two runs with the same
seed (and generator version) produce byte-identical folders.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from evaluation.case import PhantomSeries
from evaluation.datasets.phantoms.anatomy import ANATOMY_SOURCE, get_anatomy
from evaluation.datasets.phantoms.atlas import get_atlas
from evaluation.datasets.phantoms.case import GeneratedCase, generate_case
from evaluation.datasets.phantoms.series import GENERATOR, GENERATOR_VERSION
from evaluation.datasets.phantoms.spec import CaseSpec, case_specs

ProgressFn = Callable[[int, int, str], None]
MANIFEST_SCHEMA = 1


class SuiteCase(BaseModel):
    case_id: str
    index: int
    group: str  # phantom group (normal, ms, stroke-mca, ...)
    disease_group: str  # evaluation.case.DiseaseGroup value
    difficulty: str
    diagnosis: str
    icd10: str | None = None
    study_uids: list[str] = Field(default_factory=list)
    series: list[PhantomSeries] = Field(default_factory=list)  # role, modality, class, uid
    n_lesions: int = 0
    files: dict[str, str] = Field(default_factory=dict)  # relative path -> sha256


class SuiteManifest(BaseModel):
    schema_version: int = MANIFEST_SCHEMA
    generator: str = GENERATOR
    generator_version: str = GENERATOR_VERSION
    anatomy: str = ANATOMY_SOURCE
    seed: int
    n_cases: int
    cases: list[SuiteCase] = Field(default_factory=list)

    def write(self, path: Path) -> None:
        data = json.loads(self.model_dump_json())
        path.write_text(
            json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )


def suite_case(result: GeneratedCase, spec: CaseSpec) -> SuiteCase:
    gt = result.case.ground_truth
    assert gt is not None
    return SuiteCase(
        case_id=spec.case_id,
        index=spec.index,
        group=spec.group,
        disease_group=gt.final_diagnosis.group.value if gt.final_diagnosis.group else "",
        difficulty=spec.difficulty,
        diagnosis=gt.final_diagnosis.name,
        icd10=gt.final_diagnosis.icd10,
        study_uids=result.case.provenance.study_uids,
        series=result.series,
        n_lesions=len(gt.lesions),
        files={f"{spec.case_id}/{k}": v for k, v in result.files.items()},
    )


def generate_suite(
    out_dir: str | Path,
    n_cases: int,
    seed: int,
    progress: ProgressFn | None = None,
    only: list[int] | None = None,
    cache: Path | None = None,
) -> SuiteManifest:
    """Write ``n_cases`` cases (or the 1-based indices in ``only``) and ``suite.json``.
    ``cache``: the per-user cache folder the built head is kept under (the settings' ``cache``;
    default ~/.cache/neurosandbox)."""
    if n_cases < 1:
        raise ValueError(f"a suite needs at least one case, got {n_cases}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    get_anatomy(cache)
    get_atlas(cache)
    specs = case_specs(n_cases)
    if only:
        bad = [i for i in only if not 1 <= i <= n_cases]
        if bad:
            raise ValueError(f"case indices {bad} are outside 1..{n_cases}")
        specs = [s for s in specs if s.index in set(only)]
    manifest = SuiteManifest(seed=seed, n_cases=len(specs))
    for n, spec in enumerate(specs):
        result = generate_case(out, spec, seed)
        manifest.cases.append(suite_case(result, spec))
        if progress:
            progress(n + 1, len(specs), spec.case_id)
    manifest.write(out / "suite.json")
    return manifest
