"""Process metrics on prometheus-client, exposed as ``neurosandbox_<name>`` at ``/metrics``.

Every metric is declared in ``SPECS`` (kind, help, label names) and lives in its own
``CollectorRegistry`` (never the library's global one), so several ``Metrics`` in one process
(tests, more than one app) do not collide. Callers name a metric by string:
``METRICS.inc("dicom_associations_refused_total", reason="limit")``,
``METRICS.set("runs_in_progress", 2)``, ``METRICS.observe("http_request_seconds", dt, route=r)``.
An undeclared name or a wrong set of labels raises (KeyError / ValueError).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

PREFIX = "neurosandbox_"
Kind = Literal["counter", "gauge", "histogram"]
# Answer times of the HTTP API: ms for reads up to minutes for uploads and archives.
HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)
REFUSAL_REASONS = ("limit", "calling_aet", "called_aet", "rejected", "artim")


class Spec(NamedTuple):
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()


SPECS: dict[str, Spec] = {
    "dicom_associations_requested_total": Spec("counter", "DICOM associations requested"),
    "dicom_associations_total": Spec("counter", "DICOM associations accepted"),
    "dicom_associations_refused_total": Spec(
        "counter",
        "DICOM associations refused, by reason: limit (every association slot taken),"
        " calling_aet (calling AE not allowed), called_aet (called AE not ours),"
        " rejected (another A-ASSOCIATE-RJ), artim (connection closed by the node:"
        " no complete A-ASSOCIATE-RQ within the ARTIM timeout)",
        ("reason",),
    ),
    "dicom_associations_aborted_total": Spec("counter", "associations aborted or dropped"),
    "dicom_instances_received_total": Spec("counter", "instances stored by the DICOM node"),
    "dicom_instances_refused_total": Spec("counter", "instances refused (invalid UIDs/dataset)"),
    "dicom_instances_quarantined_total": Spec("counter", "instances of aborted associations"),
    "dicom_resends_refused_total": Spec(
        "counter", "instances re-sent with other bytes and kept as first received (as the PACS)"
    ),
    "evaluations_held_total": Spec(
        "counter", "studies held, not evaluated: more than one patient, or not the case's patient"
    ),
    "instances_undone_total": Spec(
        "counter", "instances an interrupted association left in Orthanc, deleted at start"
    ),
    "dicom_store_failures_total": Spec("counter", "instance writes that failed (answered 0xA700)"),
    "dicom_bytes_received_total": Spec("counter", "bytes of instances stored"),
    "studies_completed_total": Spec("counter", "studies declared complete after the quiet time"),
    "evaluations_total": Spec("counter", "study evaluations finished"),
    "evaluations_failed_total": Spec("counter", "study evaluations that failed"),
    "evaluations_skipped_total": Spec("counter", "complete studies no routing rule selected"),
    "reports_stored_total": Spec("counter", "SR and PDF objects stored in the PACS"),
    "writebacks_pending": Spec(
        "gauge", "SR and PDF objects kept until the PACS stores them (write-back pending)"
    ),
    "writeback_attempts_failed_total": Spec(
        "counter", "write-back deliveries that left objects pending (the PACS refused or was down)"
    ),
    "instances_forwarded_total": Spec("counter", "received instances stored in Orthanc on arrival"),
    "instances_forward_failed_total": Spec(
        "counter", "forwards to Orthanc that failed (uploaded from the spool instead)"
    ),
    "http_requests_total": Spec(
        "counter", "HTTP API requests by route template and status", ("method", "route", "status")
    ),
    "http_request_seconds": Spec(
        "histogram", "seconds spent answering HTTP requests, by route template", ("route",)
    ),
    "runs_in_progress": Spec("gauge", "evaluation runs queued or running"),
    # read from the canary marks of the runs folder at scrape time (the canary is its own process)
    "canary_alarm": Spec(
        "gauge",
        "1 when the canary's newest run says ALARM (a model answers differently than in its "
        "previous run), 0 when quiet or its first run",
        ("canary",),
    ),
    "canary_last_run_timestamp_seconds": Spec(
        "gauge", "when the canary's newest run started (Unix time)", ("canary",)
    ),
}

_Metric = Counter | Gauge | Histogram


class Metrics:
    """The declared metrics in a registry of their own; thread-safe (prometheus-client is)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.started = time.time()
        self._metrics: dict[str, _Metric] = {}
        for name, spec in SPECS.items():
            full = PREFIX + name
            m: _Metric
            if spec.kind == "counter":
                m = Counter(full, spec.help, spec.labels, registry=self.registry)
            elif spec.kind == "gauge":
                m = Gauge(full, spec.help, spec.labels, registry=self.registry)
            else:
                m = Histogram(
                    full, spec.help, spec.labels, registry=self.registry, buckets=HTTP_BUCKETS
                )
            self._metrics[name] = m
        # Known reasons show as 0 before the first refusal (a rate over a missing series is empty).
        refused = self._metrics["dicom_associations_refused_total"]
        for reason in REFUSAL_REASONS:
            refused.labels(reason=reason)
        uptime = Gauge(
            PREFIX + "uptime_seconds", "seconds since the process started", registry=self.registry
        )
        uptime.set_function(lambda: time.time() - self.started)

    def _child(self, name: str, labels: dict[str, str]) -> _Metric:
        try:
            metric = self._metrics[name]
        except KeyError:
            raise KeyError(f"metric {name!r} is not declared in gateway.metrics.SPECS") from None
        return metric.labels(**labels) if labels else metric

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        """Add ``value`` to a counter (or a gauge)."""
        child = self._child(name, labels)
        if isinstance(child, Histogram):
            raise ValueError(f"metric {name!r} is a histogram: observe() it")
        child.inc(value)

    def set(self, name: str, value: float, **labels: str) -> None:
        """Set a gauge."""
        child = self._child(name, labels)
        if not isinstance(child, Gauge):
            raise ValueError(f"metric {name!r} is not a gauge")
        child.set(value)

    def clear(self, name: str) -> None:
        """Drop every labelled child of a metric (a gauge rebuilt from a source at scrape)."""
        if name not in self._metrics:
            raise KeyError(f"metric {name!r} is not declared in gateway.metrics.SPECS")
        self._metrics[name].clear()

    def observe(self, name: str, value: float, **labels: str) -> None:
        """Record one observation (a duration) in a histogram."""
        child = self._child(name, labels)
        if not isinstance(child, Histogram):
            raise ValueError(f"metric {name!r} is not a histogram")
        child.observe(value)

    def get(self, sample: str, **labels: str) -> float:
        """Current value of one exposed sample, by its name without the prefix
        (``dicom_associations_refused_total``, ``http_request_seconds_count``); 0 if absent."""
        return self.registry.get_sample_value(PREFIX + sample, labels) or 0.0

    def exposition(self, accept: str = "") -> tuple[bytes, str]:
        """The registry in the format the ``Accept`` header asks for (Prometheus text by
        default, OpenMetrics on request): (body, content type)."""
        encoder: Callable[[CollectorRegistry], bytes]
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type

    def render(self) -> str:
        """The Prometheus text exposition format."""
        return self.exposition()[0].decode()


METRICS = Metrics()
