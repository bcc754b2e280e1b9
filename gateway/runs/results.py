"""What the evaluation of one received study tells the pipeline besides the run itself.

The run (every answer, score and error label) is recorded in the engine's run store, the one
record of the run; the worker reads it back from there as ``RunData``, the one result type the
reports, the write-back and the API read (the bundle's ``rundata.json``). Beside it, only what
the store does not hold: the study's facts the write-back needs (which series were evaluated),
the images the API serves, and warnings.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from evaluation import ImageRef
from evaluation.log import RunData


class EvaluationResult(BaseModel):
    evaluator: str
    study_uid: str
    images: list[ImageRef] = Field(default_factory=list)  # paths relative to the work folder
    evaluated_series_uids: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    # the run as the engine's store records it (read back by the worker): the report bundle's
    # RunData, the one result type of reports
    run: RunData = Field(repr=False)
