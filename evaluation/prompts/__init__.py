"""Versioned prompt templates (Jinja2) and answer schemas, and how a rendered prompt becomes parts.

Each template starts with ``{# version: NAME-N #}``; the versions of every template and schema,
and a hash of their exact bytes, are recorded with every run (``PromptSet.version``), and every
request stores the hash of its own rendered text. A template places an image with the marker
``[[image:N]]`` on a line of its own; :func:`to_parts` splits the rendered text at the markers
and interleaves the image parts in that order.

Untrusted text (the note, the record's block, image labels from DICOM headers, a multi-turn
reveal) reaches a template only through the ``data`` filter (``{{ note | data("clinical-note")
}}``): made inert and fenced in a container it cannot close (:mod:`evaluation.prompts.untrusted`),
which the system prompt declares data, never instructions. Text the benchmark supplies but did
not write in the template (a dataset's question) goes through ``inert``: no markers, no role
labels, no control tokens. A rendered prompt whose containers do not balance is refused.
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import jinja2

from evaluation.errors import PromptError
from evaluation.modelio import ImagePart, TextPart
from evaluation.prompts.untrusted import (
    CONTROL_PLACEHOLDER,
    ROLE_PLACEHOLDER,
    DataBlock,
    check_blocks,
    data_block,
    data_blocks,
    inert,
    map_data,
    outside_data,
)

__all__ = [
    "CONTROL_PLACEHOLDER",
    "ROLE_PLACEHOLDER",
    "DataBlock",
    "PromptSet",
    "data_block",
    "data_blocks",
    "default_prompts",
    "inert",
    "map_data",
    "outside_data",
    "to_parts",
]

TEMPLATE_DIR = Path(__file__).parent / "templates"
SCHEMA_DIR = Path(__file__).parent / "schemas"
_VERSION = re.compile(r"\{#\s*version:\s*([\w.-]+)\s*#\}")
_MARKER = re.compile(r"^\[\[image:(\d+)\]\]$", re.M)


class PromptSet:
    """The templates and schemas of one prompt directory (the built-in one by default)."""

    def __init__(self, template_dir: Path | None = None, schema_dir: Path | None = None) -> None:
        self.template_dir = Path(template_dir or TEMPLATE_DIR)
        self.schema_dir = Path(schema_dir or SCHEMA_DIR)
        if not self.template_dir.is_dir():
            raise PromptError(f"prompt template folder not found: {self.template_dir}")
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(self.template_dir)),
            undefined=jinja2.StrictUndefined,
            autoescape=False,  # plain text prompts; untrusted text goes via `data` or `inert`
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=False,
            # read once: the run records the templates' hash when it starts (``versions``),
            # and a stat of the file per prompt cost more than the rendering
            auto_reload=False,
        )
        self.env.filters["data"] = data_block
        self.env.filters["inert"] = inert
        self._schemas: dict[str, str] = {}

    def render(self, name: str, **context: Any) -> str:
        try:
            text = self.env.get_template(name).render(**context)
        except jinja2.TemplateNotFound as exc:
            raise PromptError(f"prompt template {name!r} not found in {self.template_dir}") from exc
        except jinja2.UndefinedError as exc:
            raise PromptError(f"prompt template {name!r}: {exc}") from exc
        # Collapse runs of blank lines left by conditional blocks (outside the containers: a
        # note's blank lines are its own).
        blocks = data_blocks(text)
        pieces, pos = [], 0
        for b in blocks:
            pieces += [re.sub(r"\n{3,}", "\n\n", text[pos : b.start]), text[b.start : b.end]]
            pos = b.end
        text = "".join([*pieces, re.sub(r"\n{3,}", "\n\n", text[pos:])]).strip()
        try:
            check_blocks(text)
        except ValueError as exc:
            raise PromptError(f"prompt template {name!r}: {exc}") from exc
        return text

    def schema(self, name: str) -> dict[str, Any]:
        """The answer schema (a copy: callers may change it)."""
        loaded: dict[str, Any] = json.loads(self.schema_text(name))
        return loaded

    def schema_text(self, name: str) -> str:
        """The answer schema as compact JSON (read once)."""
        if name not in self._schemas:
            path = self.schema_dir / f"{name}.schema.json"
            try:
                loaded = json.loads(path.read_text(encoding="utf-8"))
            except FileNotFoundError as exc:
                raise PromptError(f"answer schema {name!r} not found at {path}") from exc
            self._schemas[name] = json.dumps(loaded, separators=(",", ":"))
        return self._schemas[name]

    @cached_property
    def versions(self) -> dict[str, str]:
        """Template/schema file name -> declared version (or the file's short hash)."""
        out = {}
        for path in sorted([*self.template_dir.glob("*.j2"), *self.schema_dir.glob("*.json")]):
            text = path.read_text(encoding="utf-8")
            m = _VERSION.search(text)
            if m:
                out[path.name] = m.group(1)
            else:
                sid = json.loads(text).get("$id") if path.suffix == ".json" else None
                out[path.name] = sid or hashlib.sha256(text.encode()).hexdigest()[:12]
        return out

    @cached_property
    def version(self) -> str:
        """One string for the whole set: a hash of every template and schema byte."""
        h = hashlib.sha256()
        for path in sorted([*self.template_dir.glob("*.j2"), *self.schema_dir.glob("*.json")]):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        return "prompts-" + h.hexdigest()[:16]


def to_parts(text: str, images: list[ImagePart]) -> list[TextPart | ImagePart]:
    """Split rendered text at ``[[image:N]]`` markers (1-based) and interleave the images."""
    parts: list[TextPart | ImagePart] = []
    pos = 0
    used = set()
    for m in _MARKER.finditer(text):
        n = int(m.group(1))
        if not 1 <= n <= len(images):
            raise PromptError(f"template refers to image {n}, but {len(images)} were given")
        chunk = text[pos : m.start()].strip("\n")
        if chunk.strip():
            parts.append(TextPart(text=chunk))
        parts.append(images[n - 1])
        used.add(n)
        pos = m.end()
    tail = text[pos:].strip("\n")
    if tail.strip():
        parts.append(TextPart(text=tail))
    if len(used) != len(images):
        missing = sorted(set(range(1, len(images) + 1)) - used)
        raise PromptError(f"template did not place images {missing}")
    return parts


@lru_cache(maxsize=1)
def default_prompts() -> PromptSet:
    """The built-in prompt set (loaded once)."""
    return PromptSet()
