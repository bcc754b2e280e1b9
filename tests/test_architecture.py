"""The layers of ARCHITECTURE.md hold: import-linter's contracts, and the rules it cannot state."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dicom", "evaluation", "gateway")


def _sources(*packages: str) -> list[Path]:
    return sorted(p for pkg in packages for p in (ROOT / pkg).rglob("*.py"))


def test_import_linter_contracts_are_kept() -> None:
    """Layers (gateway > evaluation > dicom), public faces, no import cycles: pyproject.toml."""
    lint = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "broken" in out.stdout and "0 broken" in out.stdout


def _imports(path: Path) -> set[str]:
    """Every module a file imports absolutely (module level and inside functions)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def _our_imports(path: Path) -> set[str]:
    return {m for m in _imports(path) if m.split(".")[0] in PACKAGES}


def test_case_vocabulary_is_the_bottom_of_evaluation() -> None:
    """evaluation.case (Case, GroundTruth, lesions, enums) imports nothing of evaluation or the
    gateway: only records of the imaging core's public face, the layer below (its record of
    the series a case leaves out, dicom.SeriesNotShown)."""
    assert _our_imports(ROOT / "evaluation" / "case.py") <= {"dicom"}


def _calls_settings(path: Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            name = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            if name in ("get_settings", "Settings"):
                lines.append(node.lineno)
    return lines


def test_only_the_composition_root_reads_settings() -> None:
    """Settings are read by gateway/cli and the service (gateway/serve); the rest takes arguments."""
    allowed = {ROOT / "gateway" / "settings.py", ROOT / "gateway" / "serve.py"}
    offenders: dict[str, list[int]] = {}
    for p in _sources(*PACKAGES):
        rel = p.relative_to(ROOT)
        if p in allowed or rel.parts[:2] == ("gateway", "cli"):
            continue
        if lines := _calls_settings(p):
            offenders[str(rel)] = lines
    assert offenders == {}


def test_no_two_classes_share_a_name() -> None:
    """One name, one thing: no two public classes of the packages are named alike."""
    where: dict[str, list[str]] = defaultdict(list)
    for p in _sources(*PACKAGES):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where[node.name].append(str(p.relative_to(ROOT)))
    assert {k: v for k, v in where.items() if len(v) > 1} == {}


def test_every_command_lives_in_the_composition_root() -> None:
    """Typer commands are declared in gateway/cli/ only; library modules import no typer."""
    offenders = [
        str(p.relative_to(ROOT))
        for p in _sources(*PACKAGES)
        if p.relative_to(ROOT).parts[:2] != ("gateway", "cli")
        and "typer" in {m.split(".")[0] for m in _imports(p)}
    ]
    assert offenders == []


def test_every_public_name_is_the_object_its_module_defines() -> None:
    """A face name is never shadowed by a submodule of the same name (dicom.classify is both a
    module and the function the face exports), whatever was imported before."""
    import importlib
    import pkgutil

    for pkg in ("dicom", "evaluation", "evaluation.reports"):
        face = importlib.import_module(pkg)
        for info in pkgutil.walk_packages(face.__path__, pkg + "."):
            importlib.import_module(info.name)
        stub = ast.parse((ROOT / pkg.replace(".", "/") / "__init__.pyi").read_text())
        for node in stub.body:
            assert isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
            module = importlib.import_module(f"{pkg}.{node.module}")
            for alias in node.names:
                assert getattr(face, alias.name) is getattr(module, alias.name), (pkg, alias.name)
