"""One settings object for the whole service: environment variables prefixed NEUROSANDBOX_."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from dicom import DEFAULT_MEMORY_CAP


class Settings(BaseSettings):
    """Configuration; every field can be set as NEUROSANDBOX_<FIELD> (e.g. NEUROSANDBOX_MEMORY_CAP)."""

    model_config = SettingsConfigDict(env_prefix="NEUROSANDBOX_", env_file=".env", extra="ignore")

    memory_cap: int = DEFAULT_MEMORY_CAP  # bytes one decoded image or volume may need
    workers: int | None = None  # header-reading processes; default: up to 4, by CPU count
    corpus: Path = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "dicom"
    out: Path = Path("out")

    # PACS gateway (see deploy/README.md). Ports left unset are chosen by `neurosandbox pacs up`
    # (a free loopback port) and read back from DATA_DIR/pacs/pacs.json by the other commands.
    # local Orthanc, spool, cache, runs, tokens, audit log; made absolute when read (below)
    data_dir: Path = Field(Path("var"), validate_default=True)
    orthanc_url: str | None = None  # default: the local Orthanc of `neurosandbox pacs up`
    orthanc_username: str = "neurosandbox"
    orthanc_password: SecretStr | None = None  # from the environment only, never a CLI flag
    orthanc_password_file: Path | None = None  # or a file (0600) holding the password
    orthanc_aet: str = "ORTHANC"
    orthanc_dicom_host: str = "127.0.0.1"
    orthanc_dicom_port: int | None = None
    orthanc_http_port: int | None = None
    orthanc_stable_age: int = 60  # seconds without new instance before Orthanc calls a study stable
    orthanc_timeout_s: float = 600.0  # read timeout: archive, move and upload calls are long
    gateway_aet: str = "NEUROSANDBOX"
    gateway_host: str = "127.0.0.1"  # address the DICOM node listens on
    gateway_dicom_port: int | None = None
    gateway_allowed_aets: list[str] = []  # calling AEs the DICOM node accepts; empty = any
    study_quiet_s: float = 30.0  # a received study is complete after this long without news
    max_associations: int = 32
    # What the PACS does with an instance re-sent under the same UIDs with other bytes
    # (Orthanc's OverwriteInstances; deploy/orthanc says false): the spool does the same, so
    # what is evaluated is what the PACS holds
    pacs_overwrites_instances: bool = False
    # a registered case naming several studies waits this long after its first study for the
    # others, then is evaluated on what arrived (saying which study is missing)
    case_wait_s: Annotated[float, Field(gt=0)] = 600.0
    gateway_artim_timeout_s: float = 5.0  # a connection must send its association request in time
    # connections one peer address may hold; slots only known senders may use (hosts below,
    # and addresses an allowed calling AE associated from); the known senders' IP addresses
    gateway_max_associations_per_host: Annotated[int, Field(ge=1)] = 16
    gateway_reserved_associations: Annotated[int, Field(ge=0)] = 8
    gateway_sender_hosts: list[str] = []
    follow_changes: bool = False  # also evaluate StableStudy events from Orthanc's /changes
    # registered cases (a suite folder): a received study one names is evaluated as that case
    # (its EHR, note, ground truth, turns); see gateway/study_run.py
    cases: Path | None = None
    # the run log in PostgreSQL (postgresql+psycopg://...) for every run of the install;
    # None: one run.sqlite per run folder. Read here only, passed to evaluation.log.
    database_url: str | None = None
    # several workers on one run (PostgreSQL): a call's claim, and a provider slot, lasts this
    # long unless its worker renews it (every third of it); a dead or stalled worker's calls
    # are taken over after it
    call_lease_s: Annotated[float, Field(ge=0.3, le=3600)] = 30.0
    # the queue (`neurosandbox worker`, `eval --queue`; PostgreSQL only, gateway/jobs.py): a
    # worker's heartbeat; a worker silent this long is stalled and its jobs are queued again;
    # how often that is checked and the outbox drained; jobs one worker runs at once
    queue_heartbeat_s: Annotated[float, Field(gt=0, le=3600)] = 10.0
    queue_stall_s: Annotated[float, Field(gt=0, le=86400)] = 60.0
    queue_check_s: Annotated[int, Field(ge=1, le=3600)] = 10
    worker_concurrency: Annotated[int, Field(ge=1, le=64)] = 1
    # the gateway's run folders (rendered images, SR copies), study state and report bundles,
    # when `neurosandbox worker`s on other hosts evaluate the gateway's studies: one folder
    # mounted at this same path on the gateway and on every worker host (deploy/SCALING.md);
    # None: DATA_DIR (one host)
    shared_dir: Path | None = None
    # the PACS the sandbox finds, pulls from and writes back to, by name (YAML; docs/gateway.md
    # "Using your own PACS"); None: only `local`, the Orthanc above
    pacs_file: Path | None = None
    # an SR or PDF the write-back PACS did not store is kept and tried again: the gateway looks
    # every this many seconds (each object waits 30 s, 60 s, ... up to an hour between tries)
    writeback_retry_s: Annotated[float, Field(gt=0)] = 30.0
    routing_file: Path | None = None  # YAML rules; default: MR/CT studies, reference model
    # how the runs index lists this gateway's runs: gateway, or demo (`neurosandbox demo`'s)
    run_source: Literal["gateway", "demo"] = "gateway"
    # an evaluation's worker process is stopped after this long; the run fails, the queue goes on
    run_deadline_s: Annotated[float, Field(gt=0)] = 3600.0
    # one spare evaluation worker started ahead while idle (its 1-2 s start not paid per study)
    warm_worker: bool = True
    api_host: str = "127.0.0.1"
    api_port: int | None = None
    api_max_body_bytes: int = 1_048_576
    api_body_timeout_s: float = 30.0  # a request body must be complete this long after it starts
    # STOW-RS (POST /dicomweb/studies): a request's body, and each instance in it, at most this
    # many bytes, complete this long after it starts (every other route keeps the bounds above)
    stow_max_body_bytes: Annotated[int, Field(gt=0)] = 2 * 1024**3
    stow_body_timeout_s: Annotated[float, Field(gt=0)] = 600.0
    # Slow and idle clients (gateway/http_guard.py): request headers must be complete this long
    # after the connection (or the previous response); one client address holds at most
    # API_MAX_CONNECTIONS_PER_CLIENT connections (behind a reverse proxy: raise it), all
    # together API_MAX_CONNECTIONS; API_MAX_REQUESTS requests run at once (more: 503)
    api_header_timeout_s: Annotated[float, Field(gt=0)] = 10.0
    api_max_connections_per_client: Annotated[int, Field(ge=1)] = 16
    api_max_connections: Annotated[int, Field(ge=1)] = 256
    api_max_requests: Annotated[int, Field(ge=1)] = 64
    # runs and study data (spool, state, cache, reports, their review events) older than this
    # many days are purged at start and then daily (gateway/purge.py); None keeps them
    retention_days: Annotated[int, Field(gt=0)] | None = None
    audit_max_bytes: int = 16 << 20  # the audit log rotates past this size...
    audit_backups: int = 5  # ...keeping this many older files (audit.jsonl.1 ... .N)

    # Reports and clinician review (evaluation/reports, /review pages)
    reports_dir: Path | None = None  # report folders to review; default DATA_DIR/reports
    review_db: Path | None = None  # append-only review log; default DATA_DIR/reviews.sqlite
    review_session_hours: float = 8.0  # browser session lifetime after login
    review_cookie_secure: bool = False  # set True behind HTTPS (Secure cookie)
    verifying_organization: str = "NeuroSandbox"  # recorded in re-issued VERIFIED SRs
    # OHIF's static files for the web DICOM viewer at /review/viewer/ (installed by `make setup`)
    viewer_dir: Path = (
        Path(__file__).resolve().parents[1] / "viewer" / "node_modules" / "@ohif" / "app" / "dist"
    )

    # Evaluation engine (`neurosandbox eval`, `neurosandbox runs`)
    # when no --model; NEUROSANDBOX_MODELS="openai/gpt-4o,ollama/llava" (comma/space list or JSON)
    models: Annotated[list[str], NoDecode] = ["reference/text-prior", "reference/image-rules"]
    models_file: Path | None = None  # YAML/JSON model specs (name, model, api_base, api_key_env)
    api_base: str | None = None  # default endpoint for litellm models named on the command line
    phi_trusted_hosts: list[str] = ["loopback"]  # may receive identified content (host/IP/CIDR)
    concurrency: int = 8  # model calls in flight per model (backs off on 429s)
    call_processes: int = 0  # >0: litellm calls in N worker processes (for CPU-bound large runs)
    cache_dir: Path = Path("out/cache")  # rendered studies, dataset images, Orthanc downloads
    runs_dir: Path = Path("out/runs")  # where `runs list` looks

    # Given to the libraries once at start (gateway/startup.py), never read by them
    header_cache: Path | None = None  # folder of a persistent header cache; unset: off
    chromium: Path | None = None  # the browser that prints PDFs; unset: Debian's
    # per-user cache (the phantoms' built head, CACHE/phantoms); unset:
    # $XDG_CACHE_HOME/neurosandbox, else ~/.cache/neurosandbox
    cache: Path | None = Field(None, validate_default=True)

    @property
    def runs_root(self) -> Path:
        """The root of the gateway's runs (``runs/``, ``state/``): SHARED_DIR, else DATA_DIR."""
        return self.shared_dir or self.data_dir

    @property
    def reports_root(self) -> Path:
        """Where report bundles live for the review pages (REPORTS_DIR, else
        SHARED_DIR/reports, else DATA_DIR/reports)."""
        return self.reports_dir or self.runs_root / "reports"

    @property
    def review_log(self) -> Path:
        """The clinicians' review log (REVIEW_DB, else DATA_DIR/reviews.sqlite)."""
        return self.review_db or self.data_dir / "reviews.sqlite"

    @model_validator(mode="before")
    @classmethod
    def _under_out(cls, data: Any) -> Any:
        """The cache and runs folders follow NEUROSANDBOX_OUT (OUT/cache, OUT/runs) unless
        set themselves. ``data`` is every source merged (arguments, environment, ``.env``)."""
        if isinstance(data, dict):
            out = data.get("out") or "out"
            for key in ("cache_dir", "runs_dir"):
                if data.get(key) is None:
                    data[key] = Path(out) / key.removesuffix("_dir")
        return data

    @field_validator("shared_dir")
    @classmethod
    def _absolute_shared_dir(cls, value: Path | None) -> Path | None:
        """SHARED_DIR as DATA_DIR: absolute (every host names a run's files by one path)."""
        return None if value is None else value.expanduser().resolve()

    @field_validator("data_dir")
    @classmethod
    def _absolute_data_dir(cls, value: Path) -> Path:
        """DATA_DIR relative to the working directory the settings are read in (``~``
        expanded): every path a run stores under it (its folder, its images, its SR copies,
        its report's case root) then reads the same from any working directory."""
        return value.expanduser().resolve()

    @field_validator("header_cache", "chromium", "cache", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:
        """An empty variable (``NEUROSANDBOX_HEADER_CACHE=``) leaves the setting unset."""
        if isinstance(value, str) and not value.strip():
            return None
        return value.strip() if isinstance(value, str) else value

    @field_validator("cache")
    @classmethod
    def _user_cache(cls, value: Path | None) -> Path:
        """The XDG base directory rule: $XDG_CACHE_HOME/neurosandbox, else ~/.cache/..."""
        if value is not None:
            return value.expanduser()
        xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
        return (Path(xdg) if xdg else Path.home() / ".cache") / "neurosandbox"

    @field_validator("models", mode="before")
    @classmethod
    def _split_models(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                import json

                return json.loads(text)
            return [m for m in text.replace(",", " ").split() if m]
        return value


def get_settings() -> Settings:
    return Settings()
