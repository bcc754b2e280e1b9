"""The units of a run: one (case, task, model, sample), one model call, and the run's counters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from evaluation.case import Case, ImageRef, TaskFamily
from evaluation.coverage import SkippedCase
from evaluation.models.spec import ModelSpec
from evaluation.tasks import TaskItem, plan_tasks

if TYPE_CHECKING:
    from evaluation.datasets import Dataset
    from evaluation.runconfig import RunConfig

# The families whose answers the rubric graders grade.
GRADED = {TaskFamily.DIFFERENTIAL, TaskFamily.RATIONALE, TaskFamily.MULTITURN, TaskFamily.LESION}


class RunStats(BaseModel):
    """The run's counters and what a report of it must never hide: the retries its calls took,
    the answered calls whose cost is unknown (no price: not $0), the cases it skipped."""

    cases_total: int = 0
    cases_done: int = 0  # cases whose every unit is done
    units_total: int = 0
    units_done: int = 0
    done_before: int = 0  # units an earlier session of the run had finished (a resume)
    calls: int = 0  # model calls made now
    cached: int = 0  # responses reused from the store
    errors: int = 0  # samples whose call failed after retries
    format_failures: int = 0
    refusals: int = 0
    scored: int = 0
    scoring_errors: int = 0
    cost_usd: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retries: int = 0
    cost_unknown: int = 0
    budget_reached: str | None = None  # why the budget stopped the run (None: it did not)
    skipped: list[SkippedCase] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)  # the loader's other notes on the dataset


@dataclass
class Call:
    case: Case
    task: str
    family: str
    spec: ModelSpec
    sample: int
    turn: int


@dataclass
class Unit:
    case: Case
    item: TaskItem
    spec: ModelSpec
    sample: int


def shown_case(case: Case, shown: list[str]) -> Case:
    """The case as the scorer must see it: the images the model was shown, in that order."""
    by_hash: dict[str, ImageRef] = {i.sha256: i for i in case.images}
    images = [by_hash[h] for h in shown if h in by_hash]
    return case.model_copy(update={"images": images})


def plan_units(config: RunConfig, dataset: Dataset) -> list[Unit]:
    """Every (case, task, model, sample) of a run, in the order the runner queues them (the
    dry run's estimate counts these same units)."""
    families = set(config.tasks) if config.tasks else None
    out = []
    for case in dataset.cases:
        for item in plan_tasks(case, families):
            for s in range(config.samples):
                for spec in config.models:
                    out.append(Unit(case, item, spec, s))
    return out


def graded(unit: Unit, config: RunConfig) -> bool:
    """Whether the graders are asked about this unit's answer (when it parses)."""
    return (
        bool(config.graders) and unit.item.family in GRADED and unit.case.ground_truth is not None
    )
