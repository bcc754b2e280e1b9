"""`neurosandbox report` writes where the review pages look: NEUROSANDBOX_REPORTS_DIR when set,
else DATA_DIR/reports (the same rule as the gateway's, Settings.reports_root)."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_helpers import write_nmb
from typer.testing import CliRunner

from gateway.cli import app


@pytest.mark.parametrize("reports_dir", [False, True])
def test_report_goes_where_the_review_pages_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reports_dir: bool
) -> None:
    monkeypatch.setenv("NEUROSANDBOX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("NEUROSANDBOX_DATA_DIR", str(tmp_path / "var"))
    review_root = tmp_path / "var" / "reports"
    if reports_dir:
        review_root = tmp_path / "elsewhere"
        monkeypatch.setenv("NEUROSANDBOX_REPORTS_DIR", str(review_root))
    data, answers = write_nmb(tmp_path / "data", 1)
    run = tmp_path / "runs" / "r1"
    cli = CliRunner()
    res = cli.invoke(app, ["eval", "--suite", str(data), "--answers", str(answers), "--model",
                           "reference/text-prior", "--no-bertscore", "--out", str(run)])  # fmt: skip
    assert res.exit_code == 0, res.output
    res = cli.invoke(app, ["report", str(run), "--no-pdf"])
    assert res.exit_code == 0, res.output
    written = sorted(review_root.glob("*/summary.html"))
    assert len(written) == 1, (res.output, list(tmp_path.rglob("summary.html")))
