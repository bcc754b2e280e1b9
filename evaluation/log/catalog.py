"""The catalog: every run an install knows, one typed row each (``list_runs``).

Where runs are found, the one rule: a run folder holds its store (``run.sqlite``) or, with the
PostgreSQL run log, the marker naming its rows (``run.db.json``); the folders searched are the
runs folder of ``neurosandbox eval`` and the gateway's ``DATA_DIR/runs`` (a gateway run of an
early version kept its store in ``<run id>/engine``). With a database URL every run of the
PostgreSQL run log is listed too, with or without a folder here.

Where a run came from (``source``): ``cli`` (``neurosandbox eval``: no gateway record), else what
the gateway recorded in its ``GatewayRun.source`` (``gateway``, or ``demo`` for the gateway
``neurosandbox demo`` starts).

Per run: its date, dataset name and hash, models, status, each model's key metrics with their
confidence intervals as the leaderboard computes them from the stored scores (never re-scored),
the cost of its calls (unknown stays unknown), its scoring versions, the canary's mark (the run
note ``canary``, read leniently: a note may be written by hand) and each model's passport.

Reading a run costs tens of milliseconds and a bootstrap per model: each entry is kept in a
cache file keyed by the run's last-write stamp (``store_change_key``), so a listing of hundreds
of runs reads only the runs written since. A run that cannot be read is a row saying why.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import sqlalchemy as sa
from pydantic import BaseModel, Field, ValidationError

from dicom import atomic_write
from evaluation.errors import EvaluationError, StoreError
from evaluation.log import db as db_
from evaluation.log import schema as t_
from evaluation.log.records import CANARY_NOTE, StoredRecordError
from evaluation.log.store import (
    LAST_WRITE,
    PG_MARKER,
    STORE_FILE,
    RunStore,
    open_store,
    store_change_key,
)
from evaluation.models.cost import cost_text
from evaluation.scoring.stats import Estimate

if TYPE_CHECKING:
    from evaluation.scoring.summary import LeaderboardRow

CATALOG_VERSION = 2  # cached entries of another version are read again (2: the audit's measures)
CACHE_FILE = "catalog-cache.json"
MAX_TEXT = 300  # characters of a hostile string (a note, a model name) kept in an entry
Source = Literal["cli", "demo", "gateway"]


class CostFigure(BaseModel):
    """What a run's (or a model's) calls cost: the priced part, and how many had no price."""

    usd: float | None = None  # None: no call priced
    unknown_calls: int = 0

    @property
    def text(self) -> str:
        """``$0.0123``, ``unknown``, or the priced part and what it leaves out."""
        return cost_text(self.usd, unknown_calls=self.unknown_calls)


class ModelMetrics(BaseModel):
    """One model's key figures in one run, as the leaderboard computes them."""

    model: str
    n_samples: int = 0
    n_scored: int = 0
    accuracy: Estimate | None = None
    pass_at_1: Estimate | None = None  # sampled pass@1
    ranked_pass_at_1: Estimate | None = None
    cost: CostFigure = Field(default_factory=CostFigure)
    # the grounding audit's measures (a run with --robustness; empty otherwise), by variant
    # kind: the diagnosis score lost without the image evidence, the share of sides that follow
    # the mirror, the attack success of each planted kind (evaluation.robustness's measures)
    image_reliance: dict[str, Estimate] = Field(default_factory=dict)
    flip_follows: dict[str, Estimate] = Field(default_factory=dict)
    attack_success: dict[str, Estimate] = Field(default_factory=dict)

    @classmethod
    def of_row(cls, row: LeaderboardRow, cost: CostFigure | None = None) -> ModelMetrics:
        """A leaderboard row's key figures (the one mapping: the catalog and the summary's
        over-time section both read runs through it)."""
        return cls(
            model=row.model,
            n_samples=row.n_samples,
            n_scored=row.n_scored,
            accuracy=row.accuracy,
            pass_at_1=row.sampled_pass_at.get("1"),
            ranked_pass_at_1=row.ranked_pass_at.get("1"),
            cost=cost or CostFigure(),
        )


def ci_text(e: Estimate | None) -> str:
    """``0.62 [0.41, 0.80]`` (``-``: no figure)."""
    if e is None or e.value is None:
        return "-"
    ci = f" [{e.low:.2f}, {e.high:.2f}]" if e.low is not None and e.high is not None else ""
    return f"{e.value:.2f}{ci}"


def figures_text(m: ModelMetrics) -> str:
    """A model's key figures on one line: accuracy and pass@1 with their 95% CIs, n."""
    parts = [f"acc {ci_text(m.accuracy)}"]
    if m.pass_at_1 is not None and m.pass_at_1.value is not None:
        parts.append(f"pass@1 {ci_text(m.pass_at_1)}")
    parts.append(f"n={m.n_scored}")
    return ", ".join(parts)


class CatalogCanary(BaseModel):
    """The canary's mark of a run (the note ``canary``), as far as it could be read."""

    name: str = ""
    file_sha256: str = ""
    verdict: Literal["first", "quiet", "alarm", "unreadable"] = "unreadable"
    detail: str = ""


class CatalogEntry(BaseModel):
    """One run of the install: what the index and the runs page show."""

    run_id: str
    run_dir: str | None = None  # its folder here (None: rows in the database, no folder found)
    source: Source = "cli"
    engine: Literal["sqlite", "postgresql"] = "sqlite"
    created_at: str | None = None
    status: str = "unknown"
    dataset_name: str | None = None
    dataset_hash: str | None = None
    models: list[str] = Field(default_factory=list)
    n_samples: int = 0
    scoring_versions: dict[str, int] = Field(default_factory=dict)
    cost: CostFigure = Field(default_factory=CostFigure)
    metrics: list[ModelMetrics] = Field(default_factory=list)
    # each model's passport, field -> value as text (empty until passports are recorded)
    passports: dict[str, dict[str, str]] = Field(default_factory=dict)
    # each model's passport on one line: the litellm id, provider, what answered
    passport_lines: dict[str, str] = Field(default_factory=dict)
    canary: CatalogCanary | None = None
    error: str | None = None  # why the run could not be read (the row stays)

    def metric(self, model: str) -> ModelMetrics | None:
        return next((m for m in self.metrics if m.model == model), None)

    def matches(self, dataset: str | None = None, model: str | None = None) -> bool:
        """Whether the run is of ``dataset`` (its name, or its hash or a prefix of 6+
        characters of it) and asked ``model`` (its name as the run lists it)."""
        if dataset:
            d = dataset.strip().lower()
            name = (self.dataset_name or "").lower()
            digest = (self.dataset_hash or "").lower()
            if d != name and not (len(d) >= 6 and digest.startswith(d)):
                return False
        return not model or model in self.models


# --------------------------------------------------------------------------- listing


def _stores_in(root: Path) -> list[Path]:
    """The run folders under ``root``: each folder holding a store or a marker (and the
    ``engine`` folder a gateway run of an early version kept its store in)."""
    if not root.is_dir():
        return []
    found = []
    for d in sorted(root.iterdir()):
        for folder in (d, d / "engine"):
            if (folder / STORE_FILE).is_file() or (folder / PG_MARKER).is_file():
                found.append(folder)
                break
    return found


def run_folders(roots: Iterable[Path]) -> list[Path]:
    """Every run folder under ``roots``, once each (a root may be another's folder)."""
    seen: dict[Path, Path] = {}
    for root in roots:
        for folder in _stores_in(Path(root)):
            seen.setdefault(folder.resolve(), folder)
    return list(seen.values())


def _marker_id(folder: Path) -> str | None:
    try:
        data = json.loads((folder / PG_MARKER).read_text())
        return str(data["run_id"]) if isinstance(data, dict) else None
    except (OSError, ValueError, KeyError):
        return None


def list_runs(
    roots: Sequence[Path],
    *,
    database_url: str | None = None,
    database_runs: bool = True,
    cache: Path | None = None,
    dataset: str | None = None,
    model: str | None = None,
) -> list[CatalogEntry]:
    """Every run under the folders ``roots`` and, with ``database_url`` (PostgreSQL) and
    ``database_runs``, every run of that run log; newest first, filtered by ``dataset`` (name or
    hash) and ``model``. ``cache``: the file entries are kept in between calls (None: none)."""
    kept = _read_cache(cache)
    fresh: dict[str, Any] = {}
    entries: list[CatalogEntry] = []
    pg = database_url if db_.is_postgres(database_url) else None
    by_id: dict[str, Path] = {}
    for folder in run_folders(roots):
        run_id = _marker_id(folder) if pg and not (folder / STORE_FILE).is_file() else None
        if run_id is not None:
            by_id.setdefault(run_id, folder)  # listed with the database's runs below
            continue
        if (folder / STORE_FILE).is_file():
            entries.append(_cached(kept, fresh, folder, None, None))
        else:  # a marker without a database URL (or naming nothing): the row says so
            entries.append(
                CatalogEntry(
                    run_id=_marker_id(folder) or folder.name,
                    run_dir=str(folder),
                    engine="postgresql",
                    status="unreadable",
                    error="its rows are in a PostgreSQL run log: set NEUROSANDBOX_DATABASE_URL",
                )
            )
    if pg is not None:
        try:
            ids = _database_ids(pg)
            stamps = _database_stamps(pg)
        except StoreError as exc:
            ids, stamps = list(by_id), {}
            entries += [_broken(r, by_id.get(r), "postgresql", str(exc)) for r in ids]
            ids = []
        for run_id in ids:
            found = by_id.get(run_id)
            if found is None and not database_runs:
                continue
            entries.append(_cached(kept, fresh, found, run_id, pg, stamps.get(run_id)))
    _write_cache(cache, fresh)
    entries.sort(key=lambda e: (e.created_at or "", e.run_id), reverse=True)
    return [e for e in entries if e.matches(dataset, model)]


def _database_ids(url: str) -> list[str]:
    """Every run of the run log at ``url``: the engine's runs and the gateway's."""
    stmt = sa.union(sa.select(t_.run.c.run_id), sa.select(t_.gateway_runs.c.run_id))
    return sorted(str(r[0]) for r in _pg_rows(url, stmt))


def _database_stamps(url: str) -> dict[str, str]:
    m = t_.meta
    stmt = sa.select(m.c.run_id, m.c.value).where(m.c.key == LAST_WRITE)
    return {str(r[0]): str(r[1]) for r in _pg_rows(url, stmt)}


def _pg_rows(url: str, stmt: Any) -> list[Any]:
    try:
        with db_.postgres_engine(url).connect() as conn:
            return list(conn.execute(stmt).fetchall())
    except sa.exc.DBAPIError as exc:
        raise StoreError(f"run log at {db_.safe_url(url)} could not be read: {exc.orig}") from exc


def _cached(
    kept: dict[str, Any],
    fresh: dict[str, Any],
    folder: Path | None,
    run_id: str | None,
    url: str | None,
    stamp: str | None = None,
) -> CatalogEntry:
    """The entry of one run: the cached one while the run is unchanged, else read now."""
    engine: Literal["sqlite", "postgresql"] = "postgresql" if url else "sqlite"
    key = f"{engine}:{run_id or ''}:{folder or ''}"
    try:
        change: Any = ["stamp", stamp] if url else store_change_key(folder / STORE_FILE)  # type: ignore[operator]
    except StoreError:
        change = None
    change = json.loads(json.dumps(change)) if change is not None else None
    hit = kept.get(key)
    if change is not None and isinstance(hit, dict) and hit.get("change") == change:
        try:
            entry = CatalogEntry.model_validate(hit.get("entry"))
            fresh[key] = hit
            return entry
        except ValidationError:
            pass
    entry = read_entry(folder, run_id=run_id, database_url=url)
    if change is not None and entry.error is None:
        fresh[key] = {"change": change, "entry": entry.model_dump(mode="json")}
    return entry


def _broken(run_id: str, folder: Path | None, engine: Any, why: str) -> CatalogEntry:
    return CatalogEntry(
        run_id=run_id,
        run_dir=str(folder) if folder is not None else None,
        engine=engine,
        status="unreadable",
        error=why[:MAX_TEXT],
    )


# --------------------------------------------------------------------------- one run

_UNREADABLE = (EvaluationError, ValueError, OSError, sqlite3.Error, sa.exc.SQLAlchemyError)


def read_entry(
    folder: Path | None, *, run_id: str | None = None, database_url: str | None = None
) -> CatalogEntry:
    """The catalog entry of the run in ``folder`` (or, in the PostgreSQL run log at
    ``database_url``, of ``run_id``: its folder may be None); a run that cannot be read is an
    entry whose ``error`` says why."""
    engine: Literal["sqlite", "postgresql"] = "postgresql" if database_url else "sqlite"
    where = folder if folder is not None else Path(run_id or "run")
    ident = run_id or (folder.name if folder is not None else "?")
    try:
        store = open_store(where, run_id=run_id, database_url=database_url, read_only=True)
    except _UNREADABLE as exc:
        return _broken(ident, folder, engine, str(exc))
    try:
        entry = _entry(store, folder, engine)
    except _UNREADABLE as exc:
        return _broken(store.run_id, folder, engine, str(exc))
    finally:
        store.close()
    return entry


def _text(value: Any) -> str:
    return str(value)[:MAX_TEXT]


def _entry(store: RunStore, folder: Path | None, engine: Any) -> CatalogEntry:
    try:
        rec = store.gateway_record(evidence=False)
    except ValueError as exc:  # ValidationError is one
        del exc  # (pydantic's text names fields, not what to do)
        raise StoredRecordError("unreadable gateway record") from None
    source: Source = "cli" if rec is None else rec.source
    entry = CatalogEntry(
        run_id=store.run_id,
        run_dir=str(folder) if folder is not None else None,
        source=source,
        engine=engine,
        canary=canary_mark(store.note(CANARY_NOTE)),
    )
    if rec is not None:
        entry.created_at = rec.created_at
        entry.status = rec.status.value
        entry.models = list(rec.route.models) if rec.route is not None else []
        entry.error = _text(rec.error) if rec.error and not store.has_run() else None
    if not store.has_run():  # a gateway run the engine never started (skipped, held...)
        entry.dataset_name = "PACS study" if rec is not None else None
        return entry
    log = store.run_log()
    models = log.config.get("models") if isinstance(log.config, dict) else None
    entry.models = [
        _text(m.get("name")) for m in models or [] if isinstance(m, dict) and m.get("name")
    ]
    entry.created_at = log.created_at
    if rec is None or rec.status.value in ("done", "running"):
        entry.status = log.status
    entry.dataset_name = log.dataset_name
    entry.dataset_hash = log.dataset_hash
    entry.n_samples = store.counts().samples
    costs = _costs(store)
    entry.metrics = _metrics(store, costs)
    for m in costs:
        if entry.metric(m) is None:
            entry.metrics.append(ModelMetrics(model=m, cost=costs[m]))
    known = [c.usd for c in costs.values() if c.usd is not None]
    entry.cost = CostFigure(
        usd=sum(known) if known else None,
        unknown_calls=sum(c.unknown_calls for c in costs.values()),
    )
    from evaluation.scoring.version import version_name

    entry.scoring_versions = {version_name(v): n for v, n in log.scoring_versions.items()}
    entry.passports, entry.passport_lines = _passports(store)
    return entry


def _costs(store: RunStore) -> dict[str, CostFigure]:
    """Each model's cost over its stored responses (a response without a price: unknown)."""
    out: dict[str, CostFigure] = {}
    for model, costs in store.response_costs().items():
        known = [c for c in costs if c is not None]
        out[_text(model)] = CostFigure(
            usd=sum(known) if known else None, unknown_calls=len(costs) - len(known)
        )
    return out


def _metrics(store: RunStore, costs: dict[str, CostFigure]) -> list[ModelMetrics]:
    """Each model's leaderboard figures, from the stored scored samples of the cases as
    received (the audit's variants are not cases), with the audit's measures (none: empty)."""
    from evaluation.robustness import variant_of
    from evaluation.scoring.scored import ScoredSample
    from evaluation.scoring.summary import summarise

    samples = [ScoredSample.model_validate_json(j) for j in store.scored_samples()]
    received = [s for s in samples if variant_of(s.case_id)[1] is None]
    if not received:
        return []
    summary = summarise(received)
    out = [ModelMetrics.of_row(row, costs.get(row.model)) for row in summary.leaderboard]
    if len(received) < len(samples):
        _audit(store, out)
    return out


def _audit(store: RunStore, metrics: list[ModelMetrics]) -> None:
    """The audit's measures of a run with variants, into each model's figures."""
    from evaluation.log.rundata import SampleResult
    from evaluation.robustness import recorded_variants, robustness_measures
    from evaluation.scoring.scored import ScoredSample

    scored = store.scored_by_sample()
    samples = [
        SampleResult(
            scored=ScoredSample.model_validate_json(scored[r.sample_id]),
            answer=r.parsed,
            images_sent=list(r.image_hashes),
            turn=len(r.turns) - 1 if r.turns else None,
        )
        for r in store.samples(scores=False)
        if r.sample_id in scored
    ]
    measures = robustness_measures(samples, recorded_variants(store))
    for m in metrics:
        m.image_reliance = {
            x.kind.value: x.loss
            for x in measures.reliance
            if x.model == m.model and x.metric == "diagnosis"
        }
        m.flip_follows = {x.kind.value: x.follows for x in measures.flips if x.model == m.model}
        m.attack_success = {x.kind.value: x.success for x in measures.attacks if x.model == m.model}


def _passports(store: RunStore) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """Each model's passport as field -> text, and on one line (what was asked, what answered)."""
    fields: dict[str, dict[str, str]] = {}
    lines: dict[str, str] = {}
    for name, p in store.passports().items():
        data = p.model_dump(mode="json")
        key = _text(name)
        fields[key] = {
            _text(k): _text(v if isinstance(v, str) else json.dumps(v))
            for k, v in data.items()
            if v not in (None, "", [], {})
        }
        asked = p.litellm_model or p.kind
        if p.provider:
            asked += f" ({p.provider})"
        said = ", ".join(o.value for o in p.served_models[:3])
        prints = ", ".join(o.value for o in p.system_fingerprints[:3])
        line = asked + (f"; answered as {said}" if said else "")
        lines[key] = _text(line + (f"; fingerprint {prints}" if prints else ""))
    return fields, lines


def canary_mark(note: str | None) -> CatalogCanary | None:
    """The canary's mark from the run note (None: no note); a note that is not the canary's
    JSON object is an ``unreadable`` mark, never an error."""
    if note is None:
        return None
    try:
        data = json.loads(note)
    except ValueError:
        return CatalogCanary(detail="the canary note is not JSON")
    if not isinstance(data, dict):
        return CatalogCanary(detail="the canary note is not an object")
    verdict = data.get("verdict")
    return CatalogCanary(
        name=_text(data.get("name") or ""),
        file_sha256=_text(data.get("file_sha256") or "")[:64],
        verdict=verdict if verdict in ("first", "quiet", "alarm") else "unreadable",
        detail=_text(data.get("detail") or ""),
    )


# --------------------------------------------------------------------------- the cache


def _read_cache(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != CATALOG_VERSION:
        return {}
    runs = data.get("runs")
    return runs if isinstance(runs, dict) else {}


def _write_cache(path: Path | None, runs: dict[str, Any]) -> None:
    """Keep the entries read (only the runs listed now: a purged run's entry goes)."""
    if path is None:
        return
    try:
        with atomic_write(path, "w", fsync=False) as fh:
            fh.write(json.dumps({"version": CATALOG_VERSION, "runs": runs}))
    except OSError:
        pass  # a read-only place: the next listing reads the runs again
