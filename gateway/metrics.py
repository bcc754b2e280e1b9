"""Process metrics in the Prometheus text exposition format (no client library needed)."""

from __future__ import annotations

import threading
import time

HELP: dict[str, tuple[str, str]] = {
    "dicom_associations_requested_total": ("counter", "DICOM associations requested"),
    "dicom_associations_total": ("counter", "DICOM associations accepted"),
    "dicom_associations_refused_total": (
        "counter",
        "DICOM associations refused, by reason: limit (every association slot taken),"
        " calling_aet (calling AE not allowed), called_aet (called AE not ours),"
        " rejected (another A-ASSOCIATE-RJ), artim (connection closed by the node:"
        " no complete A-ASSOCIATE-RQ within the ARTIM timeout)",
    ),
    "dicom_associations_aborted_total": ("counter", "associations aborted or dropped"),
    "dicom_instances_received_total": ("counter", "instances stored by the DICOM node"),
    "dicom_instances_refused_total": ("counter", "instances refused (invalid UIDs/dataset)"),
    "dicom_instances_quarantined_total": ("counter", "instances of aborted associations"),
    "dicom_store_failures_total": ("counter", "instance writes that failed (answered 0xA700)"),
    "dicom_bytes_received_total": ("counter", "bytes of instances stored"),
    "studies_completed_total": ("counter", "studies declared complete after the quiet time"),
    "evaluations_total": ("counter", "study evaluations finished"),
    "evaluations_failed_total": ("counter", "study evaluations that failed"),
    "evaluations_skipped_total": ("counter", "complete studies no routing rule selected"),
    "reports_stored_total": ("counter", "SR and PDF objects stored in Orthanc"),
    "http_requests_total": ("counter", "HTTP API requests by route template and status"),
    "http_request_seconds_sum": ("counter", "total seconds spent answering HTTP requests"),
    "runs_in_progress": ("gauge", "evaluation runs queued or running"),
}


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""

    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in sorted(labels.items())) + "}"


class Metrics:
    """Thread-safe counters and gauges, rendered as ``neurosandbox_<name>``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[tuple[str, str], float] = {}
        self.started = time.time()

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        key = (name, _labels(labels))
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + value

    def set(self, name: str, value: float, **labels: str) -> None:
        with self._lock:
            self._values[(name, _labels(labels))] = value

    def get(self, name: str, **labels: str) -> float:
        return self._values.get((name, _labels(labels)), 0.0)

    def render(self) -> str:
        lines: list[str] = []
        with self._lock:
            items = sorted(self._values.items())
        names = sorted({n for (n, _l), _v in items} | set(HELP))
        for name in names:
            kind, text = HELP.get(name, ("untyped", name))
            full = f"neurosandbox_{name}"
            lines.append(f"# HELP {full} {text}")
            lines.append(f"# TYPE {full} {kind}")
            series = [(lab, v) for (n, lab), v in items if n == name]
            for lab, v in series or [("", 0.0)]:
                lines.append(f"{full}{lab} {v:g}")
        lines.append("# HELP neurosandbox_uptime_seconds seconds since the process started")
        lines.append("# TYPE neurosandbox_uptime_seconds gauge")
        lines.append(f"neurosandbox_uptime_seconds {time.time() - self.started:.1f}")
        return "\n".join(lines) + "\n"


METRICS = Metrics()
