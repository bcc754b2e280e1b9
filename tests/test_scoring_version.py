"""The scoring version: recorded with every score, shown in reports, announced by rescore, and
never mixed silently by a comparison."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest
from test_scoring_conformance import ROWS
from test_scoring_taxonomy import GOLDEN

from evaluation.scores import ParseStatus
from evaluation.scoring import make_scored_sample
from evaluation.scoring.version import SCORING_VERSION

# What the scorers give on the conformance and golden answers, per scoring version (and the
# lexicon files byte for byte). A change that moves any score or label without a new
# SCORING_VERSION (evaluation/scoring/version.py) fails here; add a line when you bump it.
# Adding a row to the battery moves the fingerprint too: re-pin it under the same version only
# when the scorers did not change.
FINGERPRINTS = {
    "2": "8bbddbc85c96f9d6dde13c153b4afcb1e96101e81dc7a86092da2290d9c4e5e2",
    "3": "9c7c195ef57d40c3a9dc9719033569040d54d87899d1378debd26887978d1fc9",
    # 4 moves summary figures (pass@k of unusable answers), not the per-sample scores
    "4": "9c7c195ef57d40c3a9dc9719033569040d54d87899d1378debd26887978d1fc9",
}


def _fingerprint() -> str:
    h = hashlib.sha256()
    data = Path(__file__).resolve().parents[1] / "evaluation" / "scoring" / "data"
    for p in sorted(data.glob("*.yaml")):
        h.update(p.name.encode() + p.read_bytes())
    battery = [(r.case, r.answer, r.family, ParseStatus.OK, r.images_shown) for r in ROWS]
    battery += [(g[1], g[2], g[3], g[4], None) for g in GOLDEN]
    for case, parsed, family, status, shown in battery:
        s = make_scored_sample(
            case,
            family,
            "m",
            status,
            parsed,
            "",
            bertscore=False,
            images_shown=shown,  # type: ignore[arg-type]
        )
        row = {
            "scores": [
                (x.scorer, None if x.value is None else round(x.value, 6)) for x in s.scores
            ],
            "error": s.error.model_dump(mode="json") if s.error else None,
        }
        h.update(json.dumps(row, sort_keys=True).encode())
    return h.hexdigest()


def test_a_change_to_scores_bumps_the_scoring_version() -> None:
    digest = _fingerprint()
    assert SCORING_VERSION in FINGERPRINTS, (
        f"scoring version {SCORING_VERSION} has no pinned fingerprint: add {digest!r}"
    )
    assert FINGERPRINTS[SCORING_VERSION] == digest, (
        "scores or labels changed without a new SCORING_VERSION "
        f"(evaluation/scoring/version.py); fingerprint now {digest}"
    )


def test_every_scored_sample_carries_the_version() -> None:
    r = ROWS[0]
    s = make_scored_sample(r.case, r.family, "m", ParseStatus.OK, r.answer, "", bertscore=False)
    assert s.scoring_version == SCORING_VERSION


def _as_if_scored_before_versions(run: Path, model: str) -> int:
    """Make one model's stored scores look like a run scored before versions were recorded
    (what an old run store holds): no version on its scores or in its scored samples."""
    db = sqlite3.connect(run / "run.sqlite")
    sids = [r[0] for r in db.execute("SELECT sample_id FROM samples WHERE model=?", (model,))]
    for sid in sids:
        db.execute("UPDATE scores SET scoring_version=NULL WHERE sample_id=?", (sid,))
        row = db.execute(
            "SELECT scored_json FROM scored_samples WHERE sample_id=?", (sid,)
        ).fetchone()
        if row:
            data = json.loads(row[0])
            data.pop("scoring_version", None)
            db.execute(
                "UPDATE scored_samples SET scored_json=? WHERE sample_id=?", (json.dumps(data), sid)
            )
    db.commit()
    db.close()
    return len(sids)


def test_runs_record_show_and_refuse_to_compare_mixed_versions_until_rescored(
    phantom_suite,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    from engine_helpers import run_phantoms
    from typer.testing import CliRunner

    from evaluation.log.store import RunStore
    from gateway.cli import app

    models = ["reference/text-prior", "reference/image-rules"]
    run = run_phantoms(phantom_suite, ("stroke", "ich"), models, tmp_path, monkeypatch)
    store = RunStore(run)
    held = store.scoring_versions()
    store.close()
    assert set(held) == {SCORING_VERSION} and sum(held.values()) > 0

    cli = CliRunner()
    shown = cli.invoke(app, ["runs", "show", str(run)])
    assert shown.exit_code == 0 and f"scoring version {SCORING_VERSION}" in shown.output
    ok = cli.invoke(app, ["runs", "compare", str(run), "--json", "--n-boot", "200"])
    assert ok.exit_code == 0, ok.output

    n_old = _as_if_scored_before_versions(run, "reference/text-prior")
    mixed = cli.invoke(app, ["runs", "compare", str(run), "--n-boot", "200"])
    assert mixed.exit_code != 0
    assert "different scoring versions" in " ".join(mixed.output.split())
    shown = cli.invoke(app, ["runs", "show", str(run)])
    assert "mix scoring versions" in " ".join(shown.output.split())

    from evaluation.reports.html import render_summary
    from evaluation.reports.loader import load_run
    from evaluation.reports.summary import build_summary

    page = render_summary(build_summary(load_run(run), n_boot=200), {})
    assert 'id="mixed-versions"' in page and "1 (unrecorded)" in page

    out = cli.invoke(app, ["runs", "rescore", str(run)])
    text = " ".join(out.output.split())
    assert out.exit_code == 0, out.output
    assert f"scoring version changed: 1 (unrecorded) ({n_old} samples) -> {SCORING_VERSION}" in text
    after = cli.invoke(app, ["runs", "compare", str(run), "--json", "--n-boot", "200"])
    assert after.exit_code == 0, after.output
    again = cli.invoke(app, ["runs", "rescore", str(run)])
    assert (
        f"scoring version {SCORING_VERSION} (unchanged); scores changed on 0 samples"
        in " ".join(again.output.split())
    )
    page = render_summary(build_summary(load_run(run), n_boot=200), {})
    assert 'id="mixed-versions"' not in page
    assert f'<span id="scoring-version">{SCORING_VERSION}</span>' in page
