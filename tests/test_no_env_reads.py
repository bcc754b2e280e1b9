"""No library code reads environment variables: configuration comes from the one settings object
(gateway/settings.py, NEUROSANDBOX_*) and is passed down, or set once at start
(gateway/startup.py); a secret the user names by its variable is read by ``dicom.credential``.

Allowed, and why:
- gateway/settings.py: the settings object is where the environment is read.
- dicom/credentials.py: the one reader of user-named secrets (api_key_env, username_env,
  password_env, export-case --salt-env).
- Copying the whole environment for a child process (``{**os.environ, ...}``,
  ``dict(os.environ, ...)``, ``os.environ.copy()``, a dict comprehension over
  ``os.environ.items()``): no variable of ours is read, the child gets what we were given.
- Setting a third-party library's switch before importing it, named below: litellm's bundled
  price map (the project rules: no network at run time) and Hugging Face's offline switches for
  BERTScore's local model. These are writes, never reads.
The CLI (gateway/cli/) is scanned too: it reads the settings, not the environment.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dicom import credential
from gateway.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dicom", "evaluation", "gateway")
EXEMPT = {"gateway/settings.py", "dicom/credentials.py"}
# (module, variable): a switch set in the process environment before a library is imported
SWITCHES = {
    ("evaluation/models/litellm_lib.py", "LITELLM_LOCAL_MODEL_COST_MAP"),
    ("evaluation/scoring/bertscore.py", "HF_HUB_OFFLINE"),
    ("evaluation/scoring/bertscore.py", "TRANSFORMERS_OFFLINE"),
}
ENV_FUNCS = {"getenv", "getenvb", "putenv", "unsetenv"}


def _is_environ(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr in ("environ", "environb")
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    )


def _whole_copy(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """``os.environ`` copied whole (for a child process), never one variable read from it."""
    parent = parents.get(node)
    if isinstance(parent, ast.Dict):  # {**os.environ, ...}
        return any(k is None and v is node for k, v in zip(parent.keys, parent.values, strict=True))
    if isinstance(parent, ast.Call):  # dict(os.environ, ...)
        return (
            isinstance(parent.func, ast.Name)
            and parent.func.id == "dict"
            and parent.args[:1] == [node]
        )
    if isinstance(parent, ast.Attribute) and parent.attr in ("copy", "items"):
        call = parents.get(parent)
        if not isinstance(call, ast.Call) or call.args:
            return False
        if parent.attr == "copy":
            return True
        comp = parents.get(parents.get(call) or call)  # os.environ.items() -> comprehension -> {}
        return isinstance(comp, ast.DictComp)
    return False


def _switch(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> str | None:
    """The variable named by ``os.environ["X"] = ...`` or ``os.environ.setdefault("X", ...)``."""
    parent = parents.get(node)
    if (
        isinstance(parent, ast.Subscript)
        and isinstance(parent.ctx, ast.Store)
        and isinstance(parent.slice, ast.Constant)
    ):
        return str(parent.slice.value)
    if isinstance(parent, ast.Attribute) and parent.attr == "setdefault":
        call = parents.get(parent)
        if isinstance(call, ast.Call) and call.args and isinstance(call.args[0], ast.Constant):
            return str(call.args[0].value)
    return None


def env_uses(source: str, rel: str) -> tuple[list[str], set[tuple[str, str]]]:
    """(reads of the environment in ``source``, the allowed switches it sets)."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    bad: list[str] = []
    switches: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        where = f"{rel}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            bad += [
                f"{where} from os import {a.name}"
                for a in node.names
                if a.name in ENV_FUNCS | {"environ", "environb"}
            ]
        elif isinstance(node, ast.Attribute) and node.attr in ENV_FUNCS:
            if isinstance(node.value, ast.Name) and node.value.id == "os":
                bad.append(f"{where} os.{node.attr}")
        elif _is_environ(node):
            name = _switch(node, parents)
            if name is not None and (rel, name) in SWITCHES:
                switches.add((rel, name))
            elif not _whole_copy(node, parents):
                bad.append(f"{where} {ast.unparse(parents.get(node) or node)}")
    return bad, switches


def test_no_library_module_reads_the_environment() -> None:
    offenders: list[str] = []
    seen: set[tuple[str, str]] = set()
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in EXEMPT:
                continue
            bad, switches = env_uses(path.read_text(), rel)
            offenders += bad
            seen |= switches
    assert offenders == [], "read the value from gateway.settings (or dicom.credential)"
    assert seen == SWITCHES, f"allowed switches no longer set: {sorted(SWITCHES - seen)}"


@pytest.mark.parametrize(
    ("code", "reads"),
    [
        ('x = os.environ.get("NEUROSANDBOX_X")', True),
        ('x = os.environ["HOME"]', True),
        ('x = "A" in os.environ', True),
        ('x = os.getenv("A")', True),
        ("from os import environ", True),
        ('x = {k: v for k, v in os.environ.items() if not k.startswith("PG")}', False),
        ("x = [v for v in os.environ.values()]", True),
        ('env = {**os.environ, "HOME": "/tmp"}', False),
        ('env = dict(os.environ, TCP_NODELAY="1")', False),
        ('os.environ["NOT_ALLOWED"] = "1"', True),
    ],
)
def test_the_scan_tells_a_read_from_a_copy(code: str, reads: bool) -> None:
    bad, _ = env_uses(f"import os\n{code}\n", "x.py")
    assert bool(bad) == reads, bad


def test_credential_reads_the_variable_the_user_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NS_TEST_SECRET", "s3cret")
    monkeypatch.setenv("NS_TEST_EMPTY", "")
    monkeypatch.delenv("NS_TEST_UNSET", raising=False)
    assert credential("NS_TEST_SECRET") == "s3cret"
    assert credential("NS_TEST_EMPTY") == ""  # set, empty: the caller decides
    assert credential("NS_TEST_UNSET") is None
    assert credential(None) is None and credential("") is None


def test_the_same_variables_reach_the_libraries_through_the_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("NEUROSANDBOX_HEADER_CACHE", "NEUROSANDBOX_CHROMIUM", "NEUROSANDBOX_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)  # no .env of the checkout
    s = Settings()
    assert s.header_cache is None and s.chromium is None
    assert s.cache == tmp_path / "xdg" / "neurosandbox"
    assert "models" not in s.model_fields_set
    monkeypatch.setenv("NEUROSANDBOX_HEADER_CACHE", str(tmp_path / "h"))
    monkeypatch.setenv("NEUROSANDBOX_CHROMIUM", "/opt/chromium/chrome")
    monkeypatch.setenv("NEUROSANDBOX_CACHE", str(tmp_path / "c"))
    monkeypatch.setenv("NEUROSANDBOX_MODELS", "reference/text-prior")
    s = Settings()
    assert s.header_cache == tmp_path / "h" and s.chromium == Path("/opt/chromium/chrome")
    assert s.cache == tmp_path / "c"  # the phantoms' head under CACHE/phantoms, as before
    assert "models" in s.model_fields_set  # the demo's extra models
    monkeypatch.setenv("NEUROSANDBOX_HEADER_CACHE", "")
    assert Settings().header_cache is None  # empty: unset, as before


def test_the_configured_chromium_prints_first(tmp_path: Path) -> None:
    from evaluation.reports import configure_chromium
    from evaluation.reports.pdf import chromium_path

    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    try:
        configure_chromium(fake)
        assert chromium_path() == str(fake)
    finally:
        configure_chromium(None)
    assert chromium_path() != str(fake)
