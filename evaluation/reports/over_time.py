"""The run summary's "over time" section: each of the run's models, its key figures across the
earlier runs of the same dataset (the same content hash) by date, with their 95% CIs.

The earlier runs come from the runs catalog (``evaluation.log.catalog``; each figure is its
run's leaderboard's, computed from its stored scores); the caller lists them (the gateway's
``install_runs``, or ``list_runs`` over the folders it knows) and hands them in: this package
does not look for runs itself. Only runs made before this one count, so a summary written again
later says the same. This run's own figures are its summary's (clinician overrides included).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from pydantic import BaseModel, Field

from evaluation.log.catalog import CatalogEntry, ModelMetrics
from evaluation.scoring.summary import LeaderboardRow

MAX_EARLIER = 40  # earlier runs shown (the newest ones); the rest are counted


class RunHistory(BaseModel):
    """The runs of this run's dataset the catalog holds, oldest first, this run last; each with
    the figures of this run's models only."""

    dataset_hash: str = ""  # "" : the run recorded none, nothing can be matched to it
    runs: list[CatalogEntry] = Field(default_factory=list)
    earlier: int = 0  # earlier runs of the dataset with figures in the catalog
    left_out: int = 0  # the oldest of them, beyond MAX_EARLIER, not shown

    @property
    def shown_earlier(self) -> int:
        return self.earlier - self.left_out


def _when(text: str | None) -> dt.datetime | None:
    """An ISO time as an aware datetime (naive: UTC); None when absent or unreadable."""
    try:
        t = dt.datetime.fromisoformat(text or "")
    except ValueError:
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC)


def this_run_entry(
    run_id: str,
    created_at: str | None,
    dataset_name: str,
    dataset_hash: str,
    leaderboard: Sequence[LeaderboardRow],
) -> CatalogEntry:
    """This run as a catalog entry, its figures from its own summary's leaderboard."""
    return CatalogEntry(
        run_id=run_id,
        created_at=created_at,
        dataset_name=dataset_name or None,
        dataset_hash=dataset_hash or None,
        models=[row.model for row in leaderboard],
        metrics=[ModelMetrics.of_row(row) for row in leaderboard],
    )


def run_history(this: CatalogEntry, catalog: Sequence[CatalogEntry]) -> RunHistory:
    """The section's runs: the catalog's readable runs of ``this`` run's dataset hash made
    before it (all of them when ``this`` has no date), oldest first, the newest
    ``MAX_EARLIER`` kept, then ``this``."""
    digest = this.dataset_hash or ""
    if not digest:
        return RunHistory(runs=[this])
    models = {m.model for m in this.metrics}
    start = _when(this.created_at)
    earlier = []
    for e in catalog:
        if e.run_id == this.run_id or e.dataset_hash != digest or e.error:
            continue
        when = _when(e.created_at)
        if when is None or (start is not None and when >= start):
            continue
        figures = [m for m in e.metrics if m.model in models]
        if not figures:
            continue
        # only what the section shows: the run, its date and source, this run's models' figures
        earlier.append(
            (
                when,
                CatalogEntry(
                    run_id=e.run_id,
                    source=e.source,
                    created_at=e.created_at,
                    status=e.status,
                    dataset_name=e.dataset_name,
                    dataset_hash=e.dataset_hash,
                    models=[m for m in e.models if m in models],
                    metrics=figures,
                ),
            )
        )
    earlier.sort(key=lambda pair: (pair[0], pair[1].run_id))
    kept = [e for _when_, e in earlier[-MAX_EARLIER:]]
    source = next((e.source for e in catalog if e.run_id == this.run_id), this.source)
    mine = this.model_copy(update={"source": source})
    return RunHistory(
        dataset_hash=digest,
        runs=[*kept, mine],
        earlier=len(earlier),
        left_out=max(0, len(earlier) - MAX_EARLIER),
    )


def no_history_text(history: RunHistory | None) -> str | None:
    """The sentence the section shows instead of a plot (None: there is a plot)."""
    if history is None:
        return (
            "Not plotted: no runs catalog was read for this summary "
            "(`neurosandbox report` reads the install's: every run it knows)."
        )
    if not history.dataset_hash:
        return (
            "Not plotted: this run recorded no dataset hash, so no earlier run can be matched "
            "to its cases."
        )
    if history.earlier == 0:
        return (
            f"No earlier run of dataset {history.dataset_hash[:12]} in the runs catalog: "
            "this run is the first of its dataset; the figures over time start here."
        )
    return None
