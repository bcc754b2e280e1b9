"""Studies in Orthanc: list, detail with series classes, start an evaluation.

Starting an evaluation is an admin action unless the routing file grants reviewers
(``api: {reviewers_may_evaluate: true}``), and it may name only the models the server
configures (``gateway.routing.api_models``): a name is checked against that list before
anything else happens, so no client-chosen path or provider string is ever opened or called.
"""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import APIRouter, HTTPException, Path, Query, status
from pydantic import BaseModel, Field

from dicom import SequenceClass
from evaluation import EvaluationError, TaskFamily
from evaluation.budget import RunEstimate
from gateway.api.deps import Ctx, Starter, Token, errors
from gateway.orthanc import OrthancError, SeriesSummary, StudySummary
from gateway.pipeline import EstimateUnavailable
from gateway.routing import CLINICAL, Route, api_models
from gateway.runs.view import RunView

router = APIRouter(prefix="/studies", tags=["studies"], responses=errors(400, 401, 413, 502))

# Orthanc identifiers: five groups of 8 hex digits (a SHA-1 of the DICOM identifiers).
ORTHANC_ID = r"^[0-9a-f]{8}(-[0-9a-f]{8}){4}$"
StudyId = Annotated[str, Path(pattern=ORTHANC_ID, description="Orthanc study ID")]
MODEL_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,99}$"


class StudyDetail(BaseModel):
    study: StudySummary
    series: list[SeriesSummary]
    runs: list[RunView]


class EvaluationRequest(BaseModel):
    models: list[Annotated[str, Field(pattern=MODEL_NAME)]] = Field(
        default_factory=lambda: ["reference/image-rules"], min_length=1, max_length=10
    )
    tasks: list[TaskFamily] = Field(
        default_factory=lambda: [TaskFamily.DIFFERENTIAL, TaskFamily.LESION],
        min_length=1,
        max_length=5,
    )
    series_classes: list[SequenceClass] = Field(default_factory=list, max_length=20)


class RunCreated(BaseModel):
    run_id: str
    status_url: str


def orthanc_failure(exc: OrthancError) -> HTTPException:
    if exc.status == 404:
        return HTTPException(status.HTTP_404_NOT_FOUND, detail="no such study in Orthanc")
    return HTTPException(status.HTTP_502_BAD_GATEWAY, detail="Orthanc request failed")


@router.get("", response_model=list[StudySummary], summary="Studies in Orthanc")
def list_studies(
    ctx: Ctx, _t: Token, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> list[StudySummary]:
    try:
        return ctx.orthanc.list_studies()[:limit]
    except OrthancError as exc:
        raise orthanc_failure(exc) from None


@router.get(
    "/{study_id}",
    response_model=StudyDetail,
    summary="A study with its series classes",
    responses=errors(404),
)
def get_study(ctx: Ctx, _t: Token, study_id: StudyId) -> StudyDetail:
    try:
        study = ctx.orthanc.study(study_id)
        series = ctx.orthanc.list_series(study_id)
    except OrthancError as exc:
        raise orthanc_failure(exc) from None
    # Runs of this study of this patient: the UID alone may name another patient's study
    # (Orthanc's study id is computed from the PatientID and the UID).
    runs = [
        RunView.of(r)
        for r in ctx.runs.list(limit=50, study_uid=study.study_uid)
        if r.orthanc_study_id in (None, study_id)
    ]
    return StudyDetail(study=study, series=series, runs=runs)


def _route(ctx: Ctx, study_id: str, body: EvaluationRequest) -> Route:
    """The evaluation's route once its models are ones the server configures (else 403) and
    the study is in Orthanc (else 404); 503 without an evaluation worker."""
    if ctx.pipeline is None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, detail="no evaluation worker")
    allowed = api_models(ctx.pipeline.router, ctx.settings.models_file)
    unknown = [m for m in dict.fromkeys(body.models) if m not in allowed]
    if unknown:  # 403: a well-formed request the server's policy refuses (the schema is static)
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            detail=f"not a model this server configures: {', '.join(map(repr, unknown))}; "
            f"the API may name {', '.join(allowed)} (reference models, the models file, "
            "the routing file)",
        )
    try:
        ctx.orthanc.study(study_id)
    except OrthancError as exc:
        raise orthanc_failure(exc) from None
    return Route(
        rule="api",
        models=list(dict.fromkeys(body.models)),
        tasks=list(dict.fromkeys(body.tasks)),
        series_classes=[c.value for c in body.series_classes] or list(CLINICAL),
    )


@router.post(
    "/{study_id}/evaluations/estimate",
    response_model=RunEstimate,
    summary="The dry run of an evaluation: calls, images, tokens, cost and time per model",
    description="Takes the body of `POST /studies/{study_id}/evaluations` and the same "
    "token; sends nothing to any model and records no run. The routed series are fetched, "
    "rendered and fitted as the evaluation would; per model it answers the calls (rubric "
    "graders apart), images, input tokens (text by litellm's counter, images by the "
    "provider's image-token rule), expected output tokens, the expected cost from litellm's "
    "price map (`null`: unknown, never 0) and the wall time at the model's concurrency. "
    "`422` when the study cannot be evaluated (no series of the routed classes).",
    responses=errors(403, 404, 422, 503),
)
def estimate_evaluation(
    ctx: Ctx, token: Starter, study_id: StudyId, body: EvaluationRequest
) -> RunEstimate:
    route = _route(ctx, study_id, body)
    assert ctx.pipeline is not None
    try:
        return cast(RunEstimate, ctx.pipeline.estimate(study_id, route))
    except EstimateUnavailable as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, detail=str(exc)) from None
    except OrthancError as exc:
        raise orthanc_failure(exc) from None
    except (EvaluationError, ValueError) as exc:  # nothing to evaluate in the study
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_ENTITY, detail=str(exc)[:500]) from None


@router.post(
    "/{study_id}/evaluations",
    response_model=RunCreated,
    status_code=status.HTTP_202_ACCEPTED,
    summary="Evaluate a study with the given models and tasks; returns a run id",
    description="Needs an admin token, or a reviewer token when the routing file grants "
    "reviewers (`api: {reviewers_may_evaluate: true}`). `models` are names the server "
    "configures: the reference models, the models file's entries and the routing rules' "
    "models (a `403` names them); never a `replay:` file.",
    responses=errors(403, 404, 503),
)
def start_evaluation(
    ctx: Ctx, token: Starter, study_id: StudyId, body: EvaluationRequest
) -> RunCreated:
    route = _route(ctx, study_id, body)
    assert ctx.pipeline is not None
    run_id = ctx.pipeline.request(study_id, route, actor=token.id)
    return RunCreated(run_id=run_id, status_url=f"/runs/{run_id}")
