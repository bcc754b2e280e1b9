"""Which of a dataset's cases a run evaluates, and every one it does not, with the reason.

A case the dataset lists but that cannot be loaded (a missing study folder, an invalid record,
an unreadable image) or that has no task to run is never dropped silently: each loader reports
it as a :class:`SkippedCase`, the run store keeps them, and the command line and the reports say
"n of m cases evaluated" and list them.
"""

from __future__ import annotations

from pydantic import BaseModel, Field, computed_field


class SkippedCase(BaseModel):
    """A case of the dataset that the run does not evaluate, and why."""

    entry: str = "case"  # what the dataset calls one: case folder, manifest case, record, row
    position: int | None = None  # its 1-based place there (a CSV row: its line number)
    case_id: str | None = None  # the id or name the dataset gives it, when it gives one
    reason: str

    @computed_field  # type: ignore[prop-decorator]
    @property
    def label(self) -> str:
        """How a person finds it in the dataset: ``manifest case 2 (H2)``, ``row 5``."""
        where = self.entry if self.position is None else f"{self.entry} {self.position}"
        if self.case_id and self.position is None:
            return f"{where} {self.case_id}"
        return f"{where} ({self.case_id})" if self.case_id else where

    def __str__(self) -> str:
        return f"skipped {self.label}: {self.reason}"


# What a loader hands back besides its cases, in the order it met them: warnings (text) and the
# cases it skipped (records, turned into text only where a person reads them).
LoadNotes = list[str | SkippedCase]


class CaseCoverage(BaseModel):
    """The cases a run evaluates out of those its dataset lists."""

    evaluated: int  # cases with at least one task to run
    skipped: list[SkippedCase] = Field(default_factory=list)
    recorded: bool = True  # False: a run stored before skipped cases were recorded

    @computed_field  # type: ignore[prop-decorator]
    @property
    def listed(self) -> int:
        return self.evaluated + len(self.skipped)

    def headline(self) -> str:
        """``1 of 2 cases evaluated (1 skipped)``; for old runs, that nothing was recorded."""
        if not self.recorded:
            return (
                f"cases evaluated: {self.evaluated} (skipped cases not recorded: the run was "
                "stored before they were)"
            )
        line = f"{self.evaluated} of {self.listed} cases evaluated"
        return line + (f" ({len(self.skipped)} skipped)" if self.skipped else "")
