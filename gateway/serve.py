"""``neurosandbox serve``: the HTTP API and the DICOM node in one process.

Threads: uvicorn (main), the storage SCP (one per association), the study-quiet ticker, the
pipeline worker, and optionally the Orthanc /changes follower. Each evaluation runs in a worker
process of its own, stopped at ``NEUROSANDBOX_RUN_DEADLINE_S``. Logs carry no PHI: UIDs are
hashed, pynetdicom and httpx speak only at WARNING, the access log names route templates.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.types import ASGIApp

from evaluation.reports import Printer
from evaluation.review import ReviewStore
from gateway.api import GatewayContext, create_app
from gateway.api.middleware import ConcurrencyLimit
from gateway.cache import InstanceCache
from gateway.case_studies import CaseGatherer
from gateway.follower import ChangesFollower
from gateway.forward import Forwarder
from gateway.http_guard import ConnectionLimits, guarded_protocol
from gateway.logs import configure_logging
from gateway.pacs_local import resolve_endpoints
from gateway.pipeline import Evaluator, StudyPipeline
from gateway.ports import bind_listening, check_free, serve_ports, unavailable
from gateway.purge import Places, Purger, RetentionTimer
from gateway.review.actions import record_stored
from gateway.routing import Router
from gateway.scp import StorageSCP
from gateway.scp_transport import PeerLimits
from gateway.settings import Settings
from gateway.startup import check_run_log, configure_libraries, writeback_client
from gateway.study_queue import StudyQueue
from gateway.study_run import DefaultEvaluator
from gateway.workers import ProcessEvaluator
from gateway.writeback_retry import WritebackRetrier

log = logging.getLogger(__name__)


def start_worker(settings: Settings) -> None:
    """First thing in an evaluation worker process (spawned: nothing of ours is set yet)."""
    configure_logging()
    configure_libraries(settings)


@dataclass
class Gateway:
    ctx: GatewayContext
    scp: StorageSCP
    pipeline: StudyPipeline
    follower: ChangesFollower | None
    retention: RetentionTimer | None = None  # NEUROSANDBOX_RETENTION_DAYS: purge, then daily
    # stores the SR and PDF the PACS did not take at once (kept until stored)
    writeback_retry: WritebackRetrier | None = None
    _stopped: bool = False

    def start(self) -> None:
        self.pipeline.start()
        self.scp.start()
        if self.writeback_retry is not None:
            self.writeback_retry.start()
        if self.follower is not None:
            self.follower.start()
        if self.retention is not None:
            self.retention.start()

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.retention is not None:
            self.retention.stop()
        if self.writeback_retry is not None:
            self.writeback_retry.stop()
        self.scp.stop()
        if self.follower is not None:
            self.follower.stop()
        self.pipeline.stop()
        if self.pipeline.forwarder is not None:
            self.pipeline.forwarder.close()
        self.ctx.orthanc.close()
        log.info("gateway stopped")


def build_gateway(settings: Settings, evaluator: Evaluator | None = None) -> Gateway:
    """Wire the parts together from settings (and the local PACS's pacs.json when present).
    The evaluator (default: the engine's) runs in a worker process per study, stopped at the
    run deadline; it must be picklable. Refuses (``SchemaOutOfDateError``) a PostgreSQL run
    log of an older schema, naming the command that migrates it."""
    check_run_log(settings)
    ep = resolve_endpoints(settings)
    configure_libraries(settings)  # the header cache, Chromium (gateway/startup.py)
    ctx = GatewayContext.from_settings(settings)
    data = settings.data_dir
    # with the PostgreSQL run log and its queue, `neurosandbox worker`s evaluate the studies
    queue = StudyQueue.from_settings(settings)
    worker = ProcessEvaluator(
        evaluator or DefaultEvaluator(settings),
        settings.run_deadline_s,
        init=functools.partial(start_worker, settings),
        warm=settings.warm_worker and queue is None,
    )
    # received instances go to Orthanc as they arrive (an aborted association's are deleted)
    forwarder = Forwarder(ctx.orthanc.store_instance, ctx.orthanc.delete_instance)
    pipeline = StudyPipeline(
        orthanc=ctx.orthanc,
        evaluator=worker,
        router=Router.from_file(settings.routing_file),
        runs=ctx.runs,
        audit=ctx.audit,
        cache=InstanceCache(data / "cache"),
        forwarder=forwarder,
        printer=Printer(idle_s=600),  # the checklists' Chromium: started ahead, closed when idle
        cases=settings.cases,  # a registered case is matched on its UID and its patient
    )
    ctx.pipeline = pipeline
    pipeline.queue = queue
    worker.waiting = pipeline.waiting  # a study taking the spare starts the next one if needed
    pipeline.spool_studies = data / "spool" / "studies"  # another patient under the same UID
    # a registered case of several studies: evaluated once, on all of them
    pipeline.gatherer = CaseGatherer(
        settings.cases, pipeline.spool_studies, pipeline.on_case, settings.case_wait_s
    )
    scp = StorageSCP(
        forwarder=forwarder,
        spool=data / "spool",
        ae_title=ep.gateway_aet,
        host=ep.gateway_host,
        port=ep.gateway_dicom_port,
        quiet_s=settings.study_quiet_s,
        on_complete=pipeline.on_received,
        on_failed=pipeline.on_failed,
        pacs_overwrites=settings.pacs_overwrites_instances,
        max_associations=settings.max_associations,
        artim_timeout_s=settings.gateway_artim_timeout_s,
        allowed_calling_aets=settings.gateway_allowed_aets,
        peer_limits=PeerLimits(
            per_peer=settings.gateway_max_associations_per_host,
            reserved=settings.gateway_reserved_associations,
            known_hosts=frozenset(settings.gateway_sender_hosts),
        ),
    )
    ctx.scp = scp  # STOW-RS (POST /dicomweb/studies) stores through the DICOM node's path
    pipeline.writeback = writeback_client(settings)
    # a VERIFIED object a sign-off could not store: once stored, the review log records it
    reviews = ReviewStore(settings.review_log)
    writeback_retry = WritebackRetrier(
        ctx.runs, pipeline.destination, pipeline.kept_dir, ctx.audit, settings.writeback_retry_s,
        on_verified=functools.partial(record_stored, reviews),
    )  # fmt: skip
    follower = (
        ChangesFollower(ctx.orthanc, pipeline.on_stable, data / "state" / "changes.json")
        if settings.follow_changes
        else None
    )
    retention = None
    if settings.retention_days is not None:
        purger = Purger(Places.from_settings(settings), audit=ctx.audit, runs=ctx.runs)
        retention = RetentionTimer(purger, settings.retention_days)
    return Gateway(ctx=ctx, scp=scp, pipeline=pipeline, follower=follower, retention=retention,
                   writeback_retry=writeback_retry)  # fmt: skip


def api_server_config(app: ASGIApp, settings: Settings, port: int) -> uvicorn.Config:
    """uvicorn for the API: request headers within API_HEADER_TIMEOUT_S, a share of the
    connections per client address (``gateway.http_guard``), at most API_MAX_REQUESTS requests
    in progress (counted as requests, not connections, so idle sockets cannot make /health
    answer 503)."""
    limits = ConnectionLimits(
        header_timeout_s=settings.api_header_timeout_s,
        per_client=settings.api_max_connections_per_client,
        total=settings.api_max_connections,
    )
    return uvicorn.Config(
        ConcurrencyLimit(app, settings.api_max_requests),
        host=settings.api_host,
        port=port,
        http=guarded_protocol(limits),
        access_log=False,
        log_config=None,
        server_header=False,
        timeout_keep_alive=5,
    )


def serve(settings: Settings) -> None:
    """Run until SIGINT/SIGTERM."""
    configure_logging()
    ep = resolve_endpoints(settings)
    # Both ports before any part starts (the pipeline's start marks a running gateway's runs
    # of this DATA_DIR interrupted): the API's socket is bound here and handed to uvicorn,
    # the DICOM port checked (the node binds it a moment later). A port taken: one line.
    api, dicom = serve_ports(settings.api_host, ep)
    api_sock = bind_listening(*api)
    try:
        check_free(*dicom)
        gw = build_gateway(settings)
    except BaseException:
        api_sock.close()
        raise
    app = create_app(gw.ctx)
    # uvicorn re-raises SIGTERM once it has shut down, which ends the process at once (no
    # `finally`): the gateway's parts stop in the app's shutdown, before that.
    serving = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app_: Starlette) -> AsyncIterator[Any]:
        async with serving(app_) as state:
            yield state
        await asyncio.to_thread(gw.stop)

    app.router.lifespan_context = lifespan
    server = uvicorn.Server(api_server_config(app, settings, ep.api_port))
    try:
        gw.start()
    except OSError as exc:  # the DICOM port taken between the check and the node's bind
        gw.stop()
        api_sock.close()
        if exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
            raise unavailable(exc, *dicom) from None
        raise
    log.info(
        "gateway up: API http://%s:%d, DICOM %s@%s:%d, Orthanc %s",
        settings.api_host,
        ep.api_port,
        ep.gateway_aet,
        ep.gateway_host,
        gw.scp.port,
        ep.orthanc_url,
    )
    try:  # uvicorn handles SIGINT/SIGTERM; the parts stop in the app's shutdown (above)
        server.run(sockets=[api_sock])
    finally:
        gw.stop()
        api_sock.close()
