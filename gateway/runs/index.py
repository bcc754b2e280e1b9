"""The install's runs, one catalog: the runs folder of ``neurosandbox eval``, the gateway's
``DATA_DIR/runs`` (the demo's runs among them) and, with ``NEUROSANDBOX_DATABASE_URL``, every
run of the PostgreSQL run log (``evaluation.log.list_runs``, cached in DATA_DIR/state)."""

from __future__ import annotations

from pathlib import Path

from evaluation import EvaluationError
from evaluation.log import CatalogEntry, list_runs
from gateway.settings import Settings

CACHE = Path("state") / "catalog-cache.json"  # under DATA_DIR


def install_runs(
    settings: Settings,
    *,
    folder: Path | None = None,
    dataset: str | None = None,
    model: str | None = None,
) -> list[CatalogEntry]:
    """Every run the install knows, newest first (``folder``: only the runs under it)."""
    roots = [folder] if folder is not None else [settings.runs_dir, settings.runs_root / "runs"]
    return list_runs(
        roots,
        database_url=settings.database_url,
        database_runs=folder is None,
        cache=settings.data_dir / CACHE,
        dataset=dataset,
        model=model,
    )


def summary_catalog(settings: Settings) -> list[CatalogEntry] | None:
    """The install's runs for a run summary's figures over time; None when they cannot be
    listed (a summary is written all the same, its over-time section saying no catalog was
    read)."""
    try:
        return install_runs(settings)
    except (OSError, EvaluationError):
        return None
