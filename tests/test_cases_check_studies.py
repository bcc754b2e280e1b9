"""``cases check`` says what the run will do with each local study: a study with no series the
tasks use is refused as the run skips it (the run's own selection rule), and a study reached
through a symlink out of the manifest's folder is refused naming the rule and the way round it."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml
from conftest import corpus_path
from typer.testing import CliRunner

from gateway.cli import app


def _manifest(folder: Path, studies: list[str]) -> Path:
    cases = [
        {"case_id": f"c{n}", "study": s, "note": "Headache.", "tasks": ["differential"]}
        for n, s in enumerate(studies)
    ]
    path = folder / "cases.yaml"
    path.write_text(yaml.safe_dump({"name": "team", "cases": cases}))
    return path


def _check(manifest: Path) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["cases", "check", str(manifest)])
    return res.exit_code, " ".join(res.output.split())


def test_a_study_with_no_series_the_tasks_use_is_refused_as_the_run_skips_it(
    tmp_path: Path,
) -> None:
    corpus = corpus_path()
    shutil.copytree(corpus / "enhanced_mr" / "In" / "Siemens" / "XA10", tmp_path / "fmri")
    shutil.copytree(corpus / "brainix" / "BRAINIX" / "DICOM" / "FLAIR", tmp_path / "flair")
    code, text = _check(_manifest(tmp_path, ["fmri", "flair"]))
    assert code == 1, text
    assert "cases[0].study" in text and "no series the tasks use" in text
    assert "FMRI" in text and "skip" in text
    assert "cases[1].study" not in text and "1 of 2 cases ok" in text


def test_a_study_reached_through_a_symlink_names_the_rule_and_how_to_allow_it(
    tmp_path: Path,
) -> None:
    corpus = corpus_path()
    outside = tmp_path / "pacs-export" / "flair"
    shutil.copytree(corpus / "brainix" / "BRAINIX" / "DICOM" / "FLAIR", outside)
    team = tmp_path / "team"
    (team / "studies").mkdir(parents=True)
    (team / "studies" / "s1").symlink_to(outside, target_is_directory=True)
    code, text = _check(_manifest(team, ["studies/s1"]))
    assert code == 1, text
    assert "symlink" in text and str(team / "studies" / "s1") in text
    assert "inside the manifest's folder" in text
    assert f"absolute path ({outside})" in text  # what to write instead
    # and written as the message says, it passes
    code, text = _check(_manifest(team, [str(outside)]))
    assert code == 0, text
