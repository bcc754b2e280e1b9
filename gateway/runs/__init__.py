"""Gateway runs: the module that owns them. ``store`` keeps each run's record (its folder and
the run log) and each study's state; ``results`` is what an evaluation of a study hands back
beside the run; ``report`` writes and publishes a run's report bundle."""

from gateway.runs.store import (
    FINAL,
    GATEWAY_NOTE,
    RunNotFoundError,
    RunRecord,
    RunStatus,
    SkipKind,
    StudyRunStore,
    StudyState,
    now_iso,
    record_of,
    route_record,
)

__all__ = [
    "FINAL",
    "GATEWAY_NOTE",
    "RunNotFoundError",
    "RunRecord",
    "RunStatus",
    "SkipKind",
    "StudyRunStore",
    "StudyState",
    "now_iso",
    "record_of",
    "route_record",
]
