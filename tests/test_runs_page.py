"""The review app's runs page (/review/runs): every run of the install from the catalog, with
the index's filters, a link per run to its summary where the app has one, two picks that open
/review/compare?a=RUN&b=RUN, each model's metrics over the runs of one dataset (a plot with CI
bars, or a sentence), reviewer auth, hostile text escaped."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_helpers import write_nmb
from fastapi.testclient import TestClient
from review_server import build_context
from typer.testing import CliRunner

from evaluation.log import open_store
from gateway.api import create_app
from gateway.auth import Role
from gateway.cli import app

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("runs-page")
    suite, answers = write_nmb(d / "nmb", 3)
    other, other_answers = write_nmb(d / "other", 2)
    for name, s, a, model in (
        ("first", suite, answers, "reference/text-prior"),
        ("second", suite, answers, "reference/text-prior"),
        ("lone", other, other_answers, "reference/image-rules"),
    ):
        res = CliRunner().invoke(app, ["eval", "--suite", str(s), "--answers", str(a),
                                       "--model", model, "--no-bertscore",
                                       "--out", str(d / "runs" / name)])  # fmt: skip
        assert res.exit_code == 0, res.output
    with open_store(d / "runs" / "second") as store:  # hostile text in a hand-written note
        store.set_note("canary", json.dumps({"verdict": "alarm", "name": "<script>x</script>"}))
    return d


@pytest.fixture
def client(data: Path) -> Iterator[TestClient]:
    ctx = build_context(data, runs_dir=data / "runs")
    _, token = ctx.tokens.create(Role.REVIEWER, "Dr Runs", "Runs^Pat")
    with TestClient(create_app(ctx), base_url="http://testserver") as c:
        c.headers["Authorization"] = f"Bearer {token}"
        yield c


def _ids(data: Path) -> dict[str, str]:
    out = {}
    for name in ("first", "second", "lone"):
        with open_store(data / "runs" / name, read_only=True) as store:
            out[name] = store.run_id
    return out


def test_the_page_lists_every_run_with_picks_to_compare(client: TestClient, data: Path) -> None:
    ids = _ids(data)
    page = client.get("/review/runs")
    assert page.status_code == 200
    html = page.text
    for run_id in ids.values():
        assert f'data-run="{run_id}"' in html
        assert f'name="a" value="{run_id}"' in html and f'name="b" value="{run_id}"' in html
    assert 'action="/review/compare"' in html  # the picks open /review/compare?a=...&b=...
    assert "acc 1.00 [1.00, 1.00]" in html  # the text prior answers these cases right
    # a hand-written note's text is escaped, never markup
    assert "<script>x</script>" not in html and "&lt;script&gt;" in html
    assert "alarm" in html
    # several datasets: a sentence on how to get the plot, no empty figure
    assert "filter by one dataset" in html and "<img" not in html


def test_filtered_by_a_dataset_its_runs_are_plotted_over_time(
    client: TestClient, data: Path
) -> None:
    ids = _ids(data)
    with open_store(data / "runs" / "first", read_only=True) as store:
        digest = store.run_log().dataset_hash
    html = client.get("/review/runs", params={"dataset": digest[:10]}).text
    assert ids["first"] in html and ids["second"] in html and ids["lone"] not in html
    assert '<figure id="over-time"><img' in html and "data:image/png;base64," in html
    # one run of a dataset: a sentence instead of a plot
    html = client.get("/review/runs", params={"model": "reference/image-rules"}).text
    assert ids["lone"] in html and ids["first"] not in html
    assert "a plot needs two or more" in html and "<img" not in html


def test_the_page_needs_a_reviewer(data: Path) -> None:
    ctx = build_context(data, runs_dir=data / "runs")
    with TestClient(create_app(ctx), base_url="http://testserver") as c:
        r = c.get("/review/runs", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].endswith("/review/login")
