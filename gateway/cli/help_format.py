"""How the command line's help is drawn, set once for every command and group.

typer 0.29's rich help prints a value type beside every option, flags included (`--keep <bool>`,
`--help <bool>`), although a flag takes no value; its plain-text help already leaves them out.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperOption

_value_type = TyperOption.display_type_rich


def _no_type_for_flags(self: TyperOption, ctx: Any) -> str | None:
    """The value type shown in an option's help row: none for a flag or a counter."""
    if self.is_flag or self.count:
        return None
    return _value_type(self, ctx)


def flags_take_no_value() -> None:
    """Make every command's rich help show no value type for flags (idempotent)."""
    setattr(TyperOption, "display_type_rich", _no_type_for_flags)  # noqa: B010
