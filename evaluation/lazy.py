"""Names of a face that live in modules with heavier imports, loaded on first use."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_getattr(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports ``names[name]`` (a module's full
    name) on first use of ``name``."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
