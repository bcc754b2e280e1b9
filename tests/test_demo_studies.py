"""The demo sends each case of its suite once and waits for one run per case, also for a case
that names two studies (the stroke phantoms: a prior study and the current one)."""

from __future__ import annotations

import json
from pathlib import Path

from evaluation.datasets import generate_suite
from gateway.cli.demo import _studies


def test_each_case_is_listed_once_with_its_first_study(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    generate_suite(suite, 3, 0)
    cases = {p.parent.name: json.loads(p.read_text()) for p in suite.glob("*/case.json")}
    assert any(len(c["provenance"]["study_uids"]) > 1 for c in cases.values())  # the class
    listed = _studies(suite)
    assert sorted(c for c, _, _ in listed) == sorted(c["case_id"] for c in cases.values())
    for case_id, uid, folder in listed:
        [case] = [c for c in cases.values() if c["case_id"] == case_id]
        assert uid == case["provenance"]["study_uids"][0]
        assert folder.is_dir() and any(folder.rglob("*.dcm"))
