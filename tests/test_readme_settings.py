"""The README's configuration table names every setting there is."""

from __future__ import annotations

from pathlib import Path

from gateway.settings import Settings

README = Path(__file__).resolve().parents[1] / "README.md"


def test_every_setting_is_in_the_readme_configuration_table() -> None:
    text = README.read_text(encoding="utf-8")
    table = text[text.index("## Configuration") :]
    missing = [
        f"NEUROSANDBOX_{name.upper()}"
        for name in Settings.model_fields
        if f"`NEUROSANDBOX_{name.upper()}`" not in table
    ]
    assert not missing, f"undocumented settings: {missing}"
