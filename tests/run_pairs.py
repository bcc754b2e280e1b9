"""Runs of a small Neural-MedBench-shaped dataset answered by a replay model whose answers the
test writes: right ("multiple sclerosis", the truth) or wrong per case, or missing (the call
fails). For comparisons across runs and the canary."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Collection
from pathlib import Path

from evaluation.datasets import DatasetSpec
from evaluation.engine import start_run
from evaluation.modelio import GenerateConfig
from evaluation.models.spec import resolve_specs
from evaluation.runconfig import RunConfig

TASK = "differential#q1"  # the key of a Neural-MedBench case's first question
RIGHT, WRONG = "multiple sclerosis", "glioblastoma"


def answer(diagnosis: str) -> str:
    return json.dumps(
        {
            "findings": [],
            "differential": [{"diagnosis": diagnosis, "likelihood": 0.7}],
            "final_diagnosis": diagnosis,
            "rationale": "periventricular FLAIR lesions",
            "confidence": 0.7,
        }
    )


def case_id(i: int) -> str:
    return f"nmb-{i:03d}"


UNUSABLE_REPLY = "I cannot say from these images."  # no JSON answer: a format failure
REFUSAL_REPLY = "As an AI model, I must decline to give a medical diagnosis."  # a refusal


def write_replay(
    path: Path,
    n: int,
    wrong: Collection[int] = (),
    missing: Collection[int] = (),
    unusable: Collection[int] = (),
    refused: Collection[int] = (),
) -> Path:
    """A replay file for cases 0..n-1: wrong on ``wrong``, no answer on ``missing``, a reply
    with no JSON answer (a format failure) on ``unusable``, a refusal on ``refused``."""
    lines = [
        json.dumps(
            {
                "case_id": case_id(i),
                "task": TASK,
                "sample": 0,
                "text": UNUSABLE_REPLY
                if i in unusable
                else REFUSAL_REPLY
                if i in refused
                else answer(WRONG if i in wrong else RIGHT),
            }
        )
        for i in range(n)
        if i not in missing
    ]
    path.write_text("".join(line + "\n" for line in lines))
    return path


def replay_run(data: Path, answers: Path, replay: Path, out: Path, cache: Path) -> Path:
    """One run of the replay model ``replay:<replay>`` on the dataset (no BERTScore)."""
    config = RunConfig(
        dataset=DatasetSpec(path=str(data), answers=str(answers)),
        models=resolve_specs([f"replay:{replay}"]),
        generate=GenerateConfig(temperature=0.0, max_tokens=500, timeout_s=10),
        bertscore=False,
        cache_dir=str(cache),
    )
    asyncio.run(start_run(config, out))
    return out
