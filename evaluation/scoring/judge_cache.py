"""The judge's verdicts on disk: what diagnosis matching reads (the judge writes them)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pydantic import BaseModel

from dicom import atomic_write
from evaluation.scoring.text import normalise

PROMPT_VERSION = "judge-v1"


class JudgeVerdict(BaseModel):
    answer: str
    truth: str
    equivalent: bool | None  # None: the judge's reply could not be read
    reason: str = ""
    model: str
    prompt_version: str = PROMPT_VERSION
    at: str
    raw: str = ""


def _key(answer: str, truth: str) -> str:
    text = f"{PROMPT_VERSION}\n{normalise(answer)}\n{normalise(truth)}"
    return hashlib.sha256(text.encode()).hexdigest()


class JudgeCache:
    """Judge verdicts on disk (one JSON file), keyed by the normalised pair."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._data: dict[str, JudgeVerdict] = {}
        if self.path.exists():
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            self._data = {k: JudgeVerdict.model_validate(v) for k, v in raw.items()}

    def __len__(self) -> int:
        return len(self._data)

    def get(self, answer: str, truth: str) -> JudgeVerdict | None:
        return self._data.get(_key(answer, truth))

    def put(self, verdict: JudgeVerdict) -> None:
        self._data[_key(verdict.answer, verdict.truth)] = verdict
        self.save()

    def save(self) -> None:
        payload = {k: v.model_dump() for k, v in self._data.items()}
        with atomic_write(self.path, "w", fsync=False) as fh:  # a kill never leaves half a file
            fh.write(json.dumps(payload, indent=1, sort_keys=True))
