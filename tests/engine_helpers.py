"""Builders shared by the engine tests: small datasets written to tmp, model specs for the
loopback server, a tiny phantom suite generated once per session."""

from __future__ import annotations

import base64
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from evaluation.models.spec import ModelSpec

ROOT = Path(__file__).resolve().parents[1]


def brain_png(seed: int = 0, size: int = 96, lesion: tuple[int, int] | None = None) -> bytes:
    """A grey ellipse 'head' with an optional bright blob, as PNG bytes (distinct per seed)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size]
    c = size / 2
    img = np.where(((xx - c) / (0.38 * size)) ** 2 + ((yy - c) / (0.45 * size)) ** 2 < 1, 110, 0)
    img = img + rng.normal(0, 3, img.shape) * (img > 0)
    if lesion is not None:
        ly, lx = lesion
        img = np.where((xx - lx) ** 2 + (yy - ly) ** 2 < (size // 12) ** 2, 230, img)
    buf = io.BytesIO()
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), mode="L").save(buf, format="PNG")
    return buf.getvalue()


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def write_nmb(
    folder: Path,
    n_cases: int,
    *,
    images_per_case: int = 2,
    marker: dict[int, str] | None = None,
    fmt: str = "jsonl",
) -> tuple[Path, Path]:
    """A Neural-MedBench-shaped file (+ answers) of small cases; ``marker`` adds text to a case."""
    folder.mkdir(parents=True, exist_ok=True)
    records, answers = [], []
    for i in range(n_cases):
        text = f"Case {i}: 34-year-old woman with optic neuritis and relapsing numbness."
        if marker and i in marker:
            text += " " + marker[i]
        records.append(
            {
                "case_id": f"nmb-{i:03d}",
                "text": text,
                "images": [data_uri(brain_png(i * 10 + k)) for k in range(images_per_case)],
                "questions": [
                    {"question_number": 1, "question_text": "What is the most likely diagnosis?"}
                ],
            }
        )
        answers.append(
            {"case_id": f"nmb-{i:03d}", "answer": "multiple sclerosis", "difficulty": "L1"}
        )
    data = folder / f"nmb.{fmt}"
    if fmt == "jsonl":
        data.write_text("".join(json.dumps(r) + "\n" for r in records))
    elif fmt == "json":
        data.write_text(json.dumps(records))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(records), data)
    ans = folder / "answers.jsonl"
    ans.write_text("".join(json.dumps(a) + "\n" for a in answers))
    return data, ans


def server_spec(url: str, **kw: Any) -> ModelSpec:
    """A litellm model pointed at the loopback server, with quick backoff for tests."""
    base: dict[str, Any] = {
        "name": "test-model",
        "model": "openai/gpt-4o",
        "api_base": url,
        "backoff_base_s": 0.01,
        "backoff_max_s": 0.05,
        "max_retries": 4,
    }
    base.update(kw)
    return ModelSpec(**base)


def phantom_subset(suite: Any, keys: tuple[str, ...], dest: Path) -> Path:
    """A suite folder holding only some cases of the shared ``phantom_suite`` fixture (symlinks)."""
    dest.mkdir(parents=True, exist_ok=True)
    for key in keys:
        src = suite.case_dir(key)
        link = dest / src.name
        if not link.exists():
            link.symlink_to(src, target_is_directory=True)
    return dest


def run_phantoms(
    suite: Any, keys: tuple[str, ...], models: list[str], tmp: Path, monkeypatch: Any
) -> Path:
    """Run reference ``models`` on some phantom cases (no BERTScore); the run folder."""
    import asyncio

    from evaluation.datasets import DatasetSpec
    from evaluation.engine import start_run
    from evaluation.modelio import GenerateConfig
    from evaluation.models.spec import resolve_specs
    from evaluation.runconfig import RunConfig

    monkeypatch.setenv("NEUROSANDBOX_DATA_DIR", str(tmp / "var"))
    monkeypatch.setenv("NEUROSANDBOX_CACHE_DIR", str(tmp / "cache"))
    run = tmp / "run"
    config = RunConfig(
        dataset=DatasetSpec(path=str(phantom_subset(suite, keys, tmp / "suite"))),
        models=resolve_specs(models),
        generate=GenerateConfig(temperature=0.0, max_tokens=500, timeout_s=10),
        bertscore=False,
        cache_dir=str(tmp / "cache"),
    )
    asyncio.run(start_run(config, run))
    return run


def cli_env(cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["NEUROSANDBOX_CACHE_DIR"] = str(cache)
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    env.pop("NEUROSANDBOX_MODELS_FILE", None)
    return env


def neurosandbox_bin() -> str:
    import sys

    return str(Path(sys.executable).parent / "neurosandbox")
