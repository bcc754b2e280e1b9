"""``replay``: answers read from a file, keyed by case, task, sample (and turn), for tests and
for scoring answers produced elsewhere.

The file is JSON Lines (or a JSON list) of ``{"case_id", "task", "sample", "turn"?, "text"}``
(``answer`` may hold the JSON object instead of ``text``); a run export (``runs export``) is
accepted as it is, filtered to one model with ``replay:PATH#MODEL``. A record without ``turn``
answers every turn. A missing answer is an error of that sample, not of the run.

The file is read only when it is a regular file (a named pipe would block, ``/dev/zero``
never ends) of at most :data:`MAX_REPLAY_BYTES`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evaluation.errors import ModelConfigError
from evaluation.modelio import GenerateConfig, Message, ModelOutput
from evaluation.models.context import current_request
from evaluation.models.spec import read_regular

Key = tuple[str, str, int, int | None]
MAX_REPLAY_BYTES = 256 << 20  # a run export of a large benchmark stays well under this


def _records(path: Path) -> list[dict[str, Any]]:
    text = read_regular(path, MAX_REPLAY_BYTES, "replay file")
    try:
        if text.lstrip().startswith("["):
            data = json.loads(text)
        else:
            data = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"replay file {path}: not JSON / JSON Lines: {exc}") from exc
    if not all(isinstance(r, dict) for r in data):
        raise ModelConfigError(f"replay file {path}: every record must be an object")
    return data


def load_answers(path: Path, model: str | None = None) -> dict[Key, str]:
    answers: dict[Key, str] = {}
    for r in _records(path):
        if model is not None and r.get("model") not in (None, model):
            continue
        case, task = str(r.get("case_id", "")), str(r.get("task", ""))
        sample = int(r.get("sample", r.get("sample_index", 0)) or 0)
        turns = r.get("turns")
        if isinstance(turns, list) and turns:  # a run export: one text per turn
            for t in turns:
                if isinstance(t, dict) and isinstance(t.get("response_text"), str):
                    answers[(case, task, sample, int(t.get("turn", 1)))] = t["response_text"]
            continue
        text = r.get("text", r.get("response_text"))
        if text is None and "answer" in r:
            text = json.dumps(r["answer"])
        if isinstance(text, str):
            turn = r.get("turn")
            answers[(case, task, sample, int(turn) if turn is not None else None)] = text
    return answers


class ReplayModel:
    def __init__(self, name: str, path: Path, model: str | None = None) -> None:
        self.name = name
        self.path = path
        self.answers = load_answers(path, model)

    async def generate(self, messages: list[Message], config: GenerateConfig) -> ModelOutput:
        ctx = current_request.get()
        if ctx is None:
            return ModelOutput(error="replay: called outside a run (no request context)")
        for key in (
            (ctx.case_id, ctx.task, ctx.sample, ctx.turn),
            (ctx.case_id, ctx.task, ctx.sample, None),
        ):
            if key in self.answers:
                return ModelOutput(text=self.answers[key], finish_reason="stop", cost_usd=0.0)
        return ModelOutput(
            error=f"replay: no answer in {self.path.name} for case {ctx.case_id}, task {ctx.task}, "
            f"sample {ctx.sample}, turn {ctx.turn}"
        )
