"""``replay``: answers read from a file, keyed by case, task, sample (and turn), for tests and
for scoring answers produced elsewhere.

The file is JSON Lines (or a JSON list) of ``{"case_id", "task", "sample", "turn"?, "text"}``
(``answer`` may hold the JSON object instead of ``text``); a run export (``runs export``) is
accepted as it is, filtered to one model with ``replay:PATH#MODEL``. A record without ``turn``
answers every turn. A missing answer is an error of that sample, not of the run.

A record (or a run export's turn) may say what answered it, as a stored response does
(``served_model``, ``system_fingerprint``, ``version_headers``): the replay model's answers
carry it, and the run's passport of the model shows it.

The file is read only when it is a regular file (a named pipe would block, ``/dev/zero``
never ends) of at most :data:`MAX_REPLAY_BYTES`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from evaluation.errors import ModelConfigError
from evaluation.modelio import GenerateConfig, Message, ModelOutput
from evaluation.models.context import current_request
from evaluation.models.spec import read_regular

Key = tuple[str, str, int, int | None]
MAX_REPLAY_BYTES = 256 << 20  # a run export of a large benchmark stays well under this


def _records(path: Path, text: str | None = None) -> list[dict[str, Any]]:
    text = read_regular(path, MAX_REPLAY_BYTES, "replay file") if text is None else text
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
    """The answers' texts by (case, task, sample, turn); turn None answers every turn."""
    return {k: out.text for k, out in load_outputs(path, model).items()}


def load_outputs(
    path: Path, model: str | None = None, text: str | None = None
) -> dict[Key, ModelOutput]:
    """The answers as outputs (text, and what the record says answered), by key."""
    answers: dict[Key, ModelOutput] = {}
    for r in _records(path, text):
        if model is not None and r.get("model") not in (None, model):
            continue
        case, task = str(r.get("case_id", "")), str(r.get("task", ""))
        sample = int(r.get("sample", r.get("sample_index", 0)) or 0)
        turns = r.get("turns")
        if isinstance(turns, list) and turns:  # a run export: one text per turn
            for t in turns:
                if isinstance(t, dict) and isinstance(t.get("response_text"), str):
                    answers[(case, task, sample, int(t.get("turn", 1)))] = _output(
                        t["response_text"], t
                    )
            continue
        reply = r.get("text", r.get("response_text"))
        if reply is None and "answer" in r:
            reply = json.dumps(r["answer"])
        if isinstance(reply, str):
            turn = r.get("turn")
            answers[(case, task, sample, int(turn) if turn is not None else None)] = _output(
                reply, r
            )
    return answers


def _output(text: str, record: dict[str, Any]) -> ModelOutput:
    """A replayed answer, with what its record says answered (bounded by ModelOutput)."""
    return ModelOutput(
        text=text,
        finish_reason="stop",
        cost_usd=0.0,
        served_model=record.get("served_model"),
        system_fingerprint=record.get("system_fingerprint"),
        version_headers=record.get("version_headers") or {},
    )


class ReplayModel:
    def __init__(self, name: str, path: Path, model: str | None = None) -> None:
        self.name = name
        self.path = path
        text = read_regular(path, MAX_REPLAY_BYTES, "replay file")
        self.sha256 = hashlib.sha256(text.encode()).hexdigest()  # the file the run replayed
        self.answers = load_outputs(path, model, text)

    async def generate(self, messages: list[Message], config: GenerateConfig) -> ModelOutput:
        ctx = current_request.get()
        if ctx is None:
            return ModelOutput(error="replay: called outside a run (no request context)")
        for key in (
            (ctx.case_id, ctx.task, ctx.sample, ctx.turn),
            (ctx.case_id, ctx.task, ctx.sample, None),
        ):
            if key in self.answers:
                return self.answers[key].model_copy()
        return ModelOutput(
            error=f"replay: no answer in {self.path.name} for case {ctx.case_id}, task {ctx.task}, "
            f"sample {ctx.sample}, turn {ctx.turn}"
        )
