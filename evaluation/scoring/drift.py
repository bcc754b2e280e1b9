"""The canary's alarm rule: whether a model answers differently now than in its last canary run.

Per model, on a ``RunComparison`` of the earlier run (A) and the new one (B), both scored with one
scoring version (``compare_runs`` refuses otherwise):

- ALARM when more than ``flip_share`` of the shared units flipped (right -> wrong or
  wrong -> right, first sample: the cases that answer differently, whichever way);
- ALARM when a metric of ``metrics`` left the earlier run's 95% interval: B's value on the shared
  units below A's low bound or above its high bound (A's interval is a bootstrap over patients,
  so on a small set of cases it is wide, and the flip share is the sharper test);
- quiet otherwise. A metric neither run has a value for is named in the reasons, never an alarm.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from evaluation.scoring.runcompare import ACCURACY, ModelDelta, RunComparison


class DriftRule(BaseModel):
    """The thresholds of a canary (its file's ``alarm`` block)."""

    model_config = {"extra": "forbid"}

    flip_share: float = Field(default=0.1, ge=0.0, le=1.0)  # alarm when more flip than this
    metrics: list[str] = Field(default_factory=lambda: [ACCURACY], max_length=20)


class ModelDrift(BaseModel):
    """One model's verdict and why."""

    model: str
    verdict: Literal["quiet", "alarm"]
    n_shared_units: int
    flipped: int
    flip_share: float | None
    reasons: list[str] = Field(default_factory=list)  # why it alarms (or what it could not test)


def _share(x: float) -> str:
    return f"{100 * x:.0f}%"


def model_drift(m: ModelDelta, rule: DriftRule) -> ModelDrift:
    """The alarm rule on one model of a comparison."""
    alarms: list[str] = []
    notes: list[str] = []
    flipped = m.n_right_to_wrong + m.n_wrong_to_right
    share = m.flip_share
    if share is not None and share > rule.flip_share:
        alarms.append(
            f"{flipped} of {m.n_shared_units} case questions flipped ({m.n_right_to_wrong} right->wrong, "
            f"{m.n_wrong_to_right} wrong->right): {_share(share)} > {_share(rule.flip_share)}"
        )
    for name in rule.metrics:
        d = m.metric(name)
        if d is None or d.b.value is None or d.a.low is None or d.a.high is None:
            notes.append(f"{name}: no value in both runs, not tested")
            continue
        if not d.a.low <= d.b.value <= d.a.high:
            alarms.append(
                f"{name} {d.b.value:.3f} left the earlier run's 95% CI "
                f"[{d.a.low:.3f}, {d.a.high:.3f}] (was {d.a.value:.3f})"
            )
    return ModelDrift(
        model=m.model,
        verdict="alarm" if alarms else "quiet",
        n_shared_units=m.n_shared_units,
        flipped=flipped,
        flip_share=share,
        reasons=alarms + notes,
    )


def drift_verdicts(comparison: RunComparison, rule: DriftRule) -> list[ModelDrift]:
    """Every model both runs have, by the rule; a model the earlier run had and the new one
    lacks alarms (it stopped answering), a new model is quiet (nothing to compare yet)."""
    out = [model_drift(m, rule) for m in comparison.models]
    for name in comparison.models_only_a:
        out.append(
            ModelDrift(
                model=name,
                verdict="alarm",
                n_shared_units=0,
                flipped=0,
                flip_share=None,
                reasons=["scored in the earlier run, not in this one"],
            )
        )
    return out
