"""The evaluation engine's run folder (``run.sqlite`` + its dataset) read into ``RunData``.

The dataset is reopened as the run recorded it (``evaluation.engine.open_dataset``: the render
cache makes that cheap after the run); a changed dataset is reported, not refused, because the
report shows the truth it scores against. Answers, raw text and scored samples come from the
store; nothing calls a model or re-scores.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from evaluation.case import TaskFamily
from evaluation.log.records import SampleTurn
from evaluation.log.rundata import RunData, SampleResult, SentRequest
from evaluation.robustness import recorded_variants
from evaluation.scores import ParseStatus
from evaluation.scoring.scored import ScoredSample, case_modality

if TYPE_CHECKING:
    from evaluation.datasets import Dataset
    from evaluation.log.store import RunStore


def find_store(rundir: Path, database_url: str | None = None) -> Path | None:
    """The engine's store in ``rundir``, if there is one: its ``run.sqlite``, or with
    ``database_url`` (the PostgreSQL run log) the folder's marker naming its run."""
    from evaluation.log.store import store_file

    path = store_file(Path(rundir), database_url)  # a run.sqlite of before the switch too
    return path if path.is_file() else None


def _sent(turns: list[SampleTurn], held: dict[str, SentRequest]) -> str | None:
    """The key in ``held`` of the request of the answer's last turn (added when new)."""
    sent = turns[-1].request if turns else None
    if sent is None:
        return None
    key = sent.digest()
    held.setdefault(key, sent)
    return key


def _recorded_dataset(store: RunStore, config: Any, row: Any) -> Dataset:
    """The cases a run recorded (as scored: no note, no EHR), for a dataset that lived in memory."""
    from evaluation.datasets import Dataset

    return Dataset(
        name=str(row.dataset_name), kind="memory", spec=config.dataset,
        cases=list(store.cases().values()), hash=str(row.dataset_hash),
    )  # fmt: skip


def run_from_store(
    store_file: Path,
    cache_dir: Path | None = None,
    dataset: Dataset | None = None,
    database_url: str | None = None,
) -> RunData:
    """Every sample of the run with its case, parsed answer, raw reply and scores.

    ``dataset``: the run's dataset when the caller still holds it (the gateway, right after its
    run), instead of reopening it as the run recorded it. ``database_url``: the PostgreSQL run
    log (None: the folder's run.sqlite).
    """
    from evaluation.engine import load_config, open_dataset
    from evaluation.log.store import open_store

    rundir = store_file.parent
    config, row = load_config(rundir, database_url)
    store = open_store(rundir, database_url=database_url)
    try:
        if dataset is None and config.dataset.kind == "memory":  # a gateway run: the store's cases
            dataset = _recorded_dataset(store, config, row)
        rows = store.samples(scores=False)
        coverage = store.coverage()
        scored = store.scored_by_sample()
        passports = store.passports()
        variants = list(recorded_variants(store).values())
    finally:
        store.close()
    dataset = dataset or open_dataset(config, cache_dir)
    warnings = list(dataset.warnings)
    if dataset.hash != row.dataset_hash:
        warnings.append("the dataset changed since the run; the report shows today's truth")
    requests: dict[str, SentRequest] = {}
    cases = {c.case_id: c for c in dataset.cases}
    samples: list[SampleResult] = []
    for r in rows:
        case = cases.get(r.case_id)
        if case is None:
            warnings.append(f"case {r.case_id!r} of the run is not in the dataset any more")
            continue
        family = TaskFamily(r.family)
        turns = r.turns
        last = r.final_output
        sid = r.sample_id
        if sid in scored:
            sc = ScoredSample.model_validate_json(scored[sid])
        else:  # an error, or a case without ground truth: counted, never scored
            gt = case.ground_truth
            sc = ScoredSample(
                run_id=row.run_id,
                case_id=case.case_id,
                patient_id=case.patient_id or case.case_id,
                model=r.model,
                family=family,
                sample_index=r.sample,
                difficulty=gt.difficulty if gt else None,
                disease_group=gt.final_diagnosis.group if gt else None,
                modality=case_modality(case),
                status=ParseStatus(r.status),
            )
        samples.append(
            SampleResult(
                scored=sc,
                answer=r.parsed,
                text=last.text if last is not None else "",
                ablation=config.ablation.value,
                images_sent=list(r.image_hashes),
                turn=len(turns) - 1 if turns else None,
                request=_sent(r.turns, requests),
                parse_error=r.parse_error or None,
            )
        )
    cfg = row.config
    used = {s.scored.case_id for s in samples}
    run_cases = [c for c in dataset.cases if c.case_id in used]
    return RunData(
        run_id=row.run_id,
        title=dataset.name if dataset.name == dataset.kind else f"{dataset.name} ({dataset.kind})",
        created_at=row.created_at,
        dataset_name=dataset.name,
        dataset_hash=row.dataset_hash,
        config={**cfg, "status": row.status, "warnings": warnings[:50]},
        code_version=row.code_version,
        cases=run_cases,
        case_roots={c.case_id: str(c.root) for c in run_cases if c.root},
        samples=samples,
        coverage=coverage,
        requests=requests,
        passports=passports,
        variants=[v for v in variants if v.case_id in used],
    )
