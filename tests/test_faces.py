"""The public faces: the top-level ``evaluation`` face stays small, each concept package has its
own, and nothing outside the package imports past them (the import-linter contracts in
pyproject.toml, whose list of forbidden top-level modules this test keeps complete)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import evaluation

ROOT = Path(__file__).resolve().parents[1]
FACES = {"budget", "datasets", "log", "models", "reports", "review", "robustness", "scoring"}
MAX_TOP_LEVEL_NAMES = 35


def contracts() -> dict[str, dict[str, object]]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {c["id"]: c for c in cfg["tool"]["importlinter"]["contracts"]}


def test_the_top_level_face_exports_at_most_35_names() -> None:
    names = list(evaluation.__all__)
    assert len(names) == len(set(names))
    assert len(names) <= MAX_TOP_LEVEL_NAMES, sorted(names)
    for n in names:
        getattr(evaluation, n)  # every name resolves


def test_each_concept_face_resolves_every_name_it_lists() -> None:
    import importlib

    for face in sorted(FACES):
        mod = importlib.import_module(f"evaluation.{face}")
        assert mod.__all__, face
        for n in mod.__all__:
            getattr(mod, n)


def test_every_top_level_module_that_is_not_a_face_is_forbidden_outside() -> None:
    pkg = ROOT / "evaluation"
    modules = {p.stem for p in pkg.glob("*.py") if p.stem != "__init__"}
    packages = {p.name for p in pkg.iterdir() if (p / "__init__.py").is_file()}
    expected = {f"evaluation.{m}" for m in modules | (packages - FACES)}
    forbidden = set(contracts()["evaluation-modules"]["forbidden_modules"])  # type: ignore[arg-type]
    assert expected <= forbidden, sorted(expected - forbidden)


def test_no_module_imports_another_modules_private_names() -> None:
    """``from x import _name`` across modules of ours: a private helper is private."""
    offenders = []
    for top in ("dicom", "evaluation", "gateway"):
        for path in sorted((ROOT / top).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.ImportFrom)
                    and node.module
                    and node.module.split(".")[0] in ("dicom", "evaluation", "gateway")
                ):
                    for a in node.names:
                        if a.name.startswith("_") and not a.name.startswith("__"):
                            offenders.append(f"{path.relative_to(ROOT)}: {node.module}.{a.name}")
    assert offenders == []


def test_the_run_log_face_names_the_contracts_other_parts_build_on() -> None:
    """Issue 37's parts fit together through these names of ``evaluation.log``."""
    import evaluation.log as log

    for name in ("ModelPassport", "PassportChange", "passport_changes", "RunStore"):
        assert name in log.__all__, name
    assert callable(log.RunStore.passports)
    p = log.ModelPassport(model="m")
    assert log.passport_changes(p, p) == []
