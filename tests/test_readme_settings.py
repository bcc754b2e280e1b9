"""docs/configuration.md names every setting there is; the README points to it."""

from __future__ import annotations

from pathlib import Path

from gateway.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
CONFIGURATION = ROOT / "docs" / "configuration.md"


def test_every_setting_is_in_the_configuration_table() -> None:
    text = CONFIGURATION.read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| `NEUROSANDBOX_")]
    # the variable is the row's first cell, so a setting merely mentioned in prose is not enough
    documented = {line.split("|")[1].strip().strip("`") for line in rows}
    missing = [
        f"NEUROSANDBOX_{name.upper()}"
        for name in Settings.model_fields
        if f"NEUROSANDBOX_{name.upper()}" not in documented
    ]
    assert not missing, f"undocumented settings: {missing}"


def test_the_readme_links_the_configuration_table() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "(docs/configuration.md)" in readme
