"""Two runs of one dataset compared (``runs compare RUN_A RUN_B``, the review app's compare page,
the canary): each run's scored samples read from its log, scoring versions brought to one by a
rescore (or refused with the command that does it), then ``evaluation.scoring.compare_runs``.

A run is named by its folder (the CLI) or found by id (the page, through the catalog); the
checklists of flipped cases are linked by the review app's URL of the case, which is the same for a
gateway run and for a run whose report ``neurosandbox report`` wrote into the reports folder.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from evaluation import Case, EvaluationError, TaskFamily, rescore
from evaluation.log import open_store
from evaluation.reports import case_slug
from evaluation.scoring import (
    SCORING_VERSION,
    RunComparison,
    RunSide,
    ScoredSample,
    compare_runs,
    version_name,
)

if TYPE_CHECKING:
    from gateway.settings import Settings

REVIEW_BASE = "/review"


class RescoreNeeded(EvaluationError):
    """The two runs' scores carry different scoring versions and no rescore was asked for: the
    message names the commands that bring them to one."""


class UnknownRun(EvaluationError):
    """No run of the install has this id."""


def find_run(run_id: str, settings: Settings) -> Path:
    """The folder of the run ``run_id`` among the install's runs (the catalog: the runs folder,
    the gateway's DATA_DIR/runs and the PostgreSQL run log)."""
    from gateway.runs.index import install_runs

    for entry in install_runs(settings):
        if entry.run_id == run_id and entry.run_dir is not None:
            return Path(entry.run_dir)
    raise UnknownRun(f"no run {run_id!r} among the install's runs")


def checklist_url(run_id: str, case_id: str) -> str:
    """The review app's page of a case's checklist in a run (its report is named by the run)."""
    return f"{REVIEW_BASE}/runs/{case_slug(run_id)}/cases/{case_slug(case_id)}"


def read_side(
    run_dir: Path, database_url: str | None, label: str = ""
) -> tuple[RunSide, list[ScoredSample], dict[str | None, int]]:
    """A run's identity, its scored samples, and its samples per scoring version."""
    store = open_store(run_dir, database_url=database_url, read_only=True)
    try:
        row = store.run_log()
        samples = [ScoredSample.model_validate_json(j) for j in store.scored_samples()]
        versions = store.scoring_versions()
    finally:
        store.close()
    side = RunSide(
        run_id=row.run_id,
        dataset_hash=row.dataset_hash,
        dataset_name=row.dataset_name,
        created_at=row.created_at,
        label=label or str(run_dir),
    )
    return side, samples, versions


def stale(versions: dict[str | None, int]) -> bool:
    """Whether a run holds scores of a version other than the current one."""
    return any(v != SCORING_VERSION for v in versions)


def rescore_command(run_dir: Path) -> str:
    return f"neurosandbox runs rescore {run_dir}"


def compare_run_dirs(
    dir_a: Path,
    dir_b: Path,
    *,
    database_url: str | None,
    rescore_first: bool = False,
    models: list[str] | None = None,
    family: TaskFamily | None = None,
    n_boot: int = 2000,
    checklist: Callable[[str, str], str] | None = checklist_url,
    on_rescore: Callable[[Path, str], None] | None = None,
) -> RunComparison:
    """Run B (the later) against run A. Runs of different scoring versions are rescored to the
    current one when ``rescore_first`` (``on_rescore`` hears what each rescore changed), else
    refused with the commands (``RescoreNeeded``): a scoring change never reads as drift.

    Raises DatasetMismatch, RescoreNeeded, ValueError (a model neither run has), EvaluationError
    (a run that cannot be read)."""
    sides = [read_side(d, database_url) for d in (dir_a, dir_b)]
    held = {v for _, _, versions in sides for v in versions}
    if len(held) > 1:
        todo = [d for d, (_, _, v) in zip((dir_a, dir_b), sides, strict=True) if stale(v)]
        if not rescore_first:
            said = "; ".join(
                f"{d}: " + ", ".join(f"{version_name(v)} ({n} samples)" for v, n in vs.items())
                for d, (_, _, vs) in zip((dir_a, dir_b), sides, strict=True)
            )
            raise RescoreNeeded(
                f"the runs were scored with different scoring versions ({said}); a scoring "
                f"change is not drift: bring them to version {SCORING_VERSION} with "
                + " and ".join(f"`{rescore_command(d)}`" for d in todo)
                + " (stored answers are scored again, no model is called), or compare with "
                "--rescore"
            )
        for d in todo:
            counts = rescore(d, database_url=database_url)
            if on_rescore is not None:
                on_rescore(d, counts.message())
        sides = [read_side(d, database_url) for d in (dir_a, dir_b)]
    (a, samples_a, _), (b, samples_b, _) = sides
    return compare_runs(
        a,
        samples_a,
        b,
        samples_b,
        models=models,
        family=family,
        checklist=checklist,
        cases=case_snapshots(dir_b, dir_a, database_url),
        n_boot=n_boot,
    )


def case_snapshots(dir_b: Path, dir_a: Path, database_url: str | None) -> dict[str, Case]:
    """The cases as the runs recorded them (run B's, and run A's for any B lacks): what the
    subgroups (scanner, field strength, age band, sex) are read from."""
    out: dict[str, Case] = {}
    for d in (dir_b, dir_a):
        store = open_store(d, database_url=database_url, read_only=True)
        try:
            for cid, case in store.cases().items():
                out.setdefault(cid, case)
        finally:
            store.close()
    return out


LIVE_BOOT = 1000  # bootstrap draws of a comparison the page computes per request


def compare_run_ids(settings: Settings, a: str, b: str) -> tuple[RunComparison | None, str, int]:
    """The review page's comparison of two runs by id: (the comparison, or None and why, with
    the HTTP status: 404 an unknown run, 409 runs that cannot be compared). Never rescores (a
    page read changes nothing): runs of two scoring versions are refused with the command."""
    try:
        dirs = [find_run(r, settings) for r in (a, b)]
    except UnknownRun as exc:
        return None, str(exc), 404
    try:
        found = compare_run_dirs(*dirs, database_url=settings.database_url, n_boot=LIVE_BOOT)
    except (EvaluationError, ValueError) as exc:  # datasets, scoring versions, unreadable
        return None, str(exc), 409
    return found, "", 200
