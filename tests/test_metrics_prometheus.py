"""/metrics on prometheus-client: the app's answer parses as Prometheus text (and OpenMetrics on
request), its counters move with requests, and a refused DICOM association shows with its reason."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families
from pynetdicom import AE
from pynetdicom.sop_class import Verification  # type: ignore[attr-defined]
from review_server import build_context

from gateway.api import create_app
from gateway.auth import Role
from gateway.metrics import METRICS, PREFIX, REFUSAL_REASONS, SPECS, Metrics
from gateway.scp import StorageSCP

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str, parse=text_string_to_metric_families) -> Samples:  # type: ignore[no-untyped-def]
    """Every sample of an exposition: (name, sorted labels) -> value (the parser checks syntax)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in parse(text)
        for s in family.samples
    }


@pytest.fixture
def client(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    ctx = build_context(tmp_path)
    _, token = ctx.tokens.create(Role.REVIEWER, "metrics")
    with TestClient(create_app(ctx), raise_server_exceptions=False) as c:
        yield c, {"Authorization": f"Bearer {token}"}


def test_metrics_endpoint_parses_and_counts_requests(
    client: tuple[TestClient, dict[str, str]],
) -> None:
    c, auth = client
    r = c.get("/metrics", headers=auth)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    before = samples(r.text)
    for _ in range(3):
        assert c.get("/health").status_code == 200
    assert c.get("/metrics").status_code == 401  # still needs a token
    after = samples(c.get("/metrics", headers=auth).text)

    health = (("method", "GET"), ("route", "/health"), ("status", "200"))
    key = (PREFIX + "http_requests_total", health)
    assert after[key] - before.get(key, 0.0) == 3
    count = (PREFIX + "http_request_seconds_count", (("route", "/health"),))
    assert after[count] - before.get(count, 0.0) == 3
    assert after[(PREFIX + "http_request_seconds_sum", (("route", "/health"),))] > 0
    inf = (PREFIX + "http_request_seconds_bucket", (("le", "+Inf"), ("route", "/health")))
    assert after[inf] == after[count]
    # Every declared metric is exposed, labelled ones once they have a series.
    names = {name for name, _labels in after}
    for name, spec in SPECS.items():
        exposed = name[: -len("_total")] if name.endswith("_total") else name
        if not spec.labels or name == "dicom_associations_refused_total":
            assert any(n.startswith(PREFIX + exposed) for n in names), name
    assert after[(PREFIX + "uptime_seconds", ())] >= 0


def test_metrics_endpoint_speaks_openmetrics_when_asked(
    client: tuple[TestClient, dict[str, str]],
) -> None:
    c, auth = client
    r = c.get("/metrics", headers={**auth, "Accept": "application/openmetrics-text; version=1.0.0"})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/openmetrics-text")
    assert r.text.endswith("# EOF\n")
    parsed = samples(r.text, om_families)
    assert (PREFIX + "dicom_associations_refused_total", (("reason", "artim"),)) in parsed


def test_refused_association_is_counted_with_its_reason(
    client: tuple[TestClient, dict[str, str]], tmp_path: Path
) -> None:
    c, auth = client
    refused = PREFIX + "dicom_associations_refused_total"
    before = samples(c.get("/metrics", headers=auth).text)
    for reason in REFUSAL_REASONS:  # every known reason is a series from the start
        assert (refused, (("reason", reason),)) in before

    node = StorageSCP(tmp_path / "spool", port=0, quiet_s=0.5)
    node.start()
    try:
        ae = AE(ae_title="METRICS")
        ae.add_requested_context(Verification)
        assoc = ae.associate("127.0.0.1", node.port, ae_title="NOT-OURS")
        assert assoc.is_rejected
    finally:
        node.stop()
    after = samples(c.get("/metrics", headers=auth).text)
    key = (refused, (("reason", "called_aet"),))
    assert after[key] - before[key] == 1
    assert METRICS.get("dicom_associations_refused_total", reason="called_aet") == after[key]


def test_registries_are_separate_and_names_are_checked() -> None:
    a, b = Metrics(), Metrics()  # no "Duplicated timeseries" error: each has its own registry
    a.inc("evaluations_total")
    a.inc("dicom_bytes_received_total", 1024)
    a.set("runs_in_progress", 2)
    assert a.get("evaluations_total") == 1 and b.get("evaluations_total") == 0
    assert a.get("dicom_bytes_received_total") == 1024
    assert a.get("runs_in_progress") == 2
    with pytest.raises(KeyError, match="not declared"):
        a.inc("no_such_total")
    with pytest.raises(ValueError):
        a.inc("http_requests_total", route="/x")  # labels missing
    with pytest.raises(ValueError):
        a.set("evaluations_total", 3)  # a counter is never set
    with pytest.raises(ValueError):
        a.inc("http_request_seconds", route="/x")  # a histogram is observed
