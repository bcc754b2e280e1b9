"""The built-in ``Evaluator``: one received study, run through the evaluation engine.

What it does, plainly:
1. The study's one index (the pipeline's, headers kept) picks the series of the routed classes.
   The engine's case lives in memory: the registered case of this StudyInstanceUID when the
   team registered one (``NEUROSANDBOX_CASES``, ``evaluation.registered_case``: its EHR, note,
   ground truth and scripted turns), else the study alone. No suite is written to disk.
2. ``evaluation.render_study`` renders the received study from that index (a labelled montage
   per series, one slice for classification) into the run folder; no header is read again.
   Every series it leaves out (not routed, localizer, unreadable, over the plan's limit...)
   is recorded with why on the case (``Provenance.series_not_shown``), so the run's record
   and the checklist say so; the SR cites the series shown.
3. ``evaluation.start_run`` asks every routed model every routed task (multi-turn only for a
   registered case with turns): the built-in reference models in process, litellm models (any
   other name, or a models-file entry) through the engine's PHI gate (de-identified unless their
   endpoint is trusted) with every outbound payload audited in the run store.
4. The engine records the run in its run store in the run folder (``run.sqlite``), the one
   record of the run; the pipeline reads it back as ``RunData``, the input of the report
   bundle (whose ``rundata.json`` ``neurosandbox report`` reads) and the review pages. A
   registered case's answers are scored against its truth; a clinical study alone has none,
   and nothing is scored.

The service runs it in a worker process (``gateway.workers.ProcessEvaluator``).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from dicom import IndexResult, index_path, one_patient
from evaluation import Case as EvalCase
from evaluation import (
    Dataset,
    DatasetSpec,
    GenerateConfig,
    ImageRef,
    Provenance,
    RunConfig,
    TaskFamily,
    dataset_hash,
    resume_run,
    start_run,
)
from evaluation.budget import ModelHistory, RunEstimate, estimate_run
from evaluation.datasets import RenderPlan, registered_case, render_study
from evaluation.log import STORE_FILE, DatasetChangedError, RunExistsError
from evaluation.models import warm_up
from evaluation.reports import run_from_store
from evaluation.robustness import as_received, expand_dataset
from gateway.routing import Route
from gateway.runs.results import EvaluationResult
from gateway.settings import Settings

log = logging.getLogger(__name__)

# Clinical use: the most likely answer, as JSON, once per model and task.
GENERATE = GenerateConfig(temperature=0.0, max_tokens=2048, json_mode=True)


def _resume(work_dir: Path, dataset: Dataset, database_url: str | None, lease_s: float) -> str:
    """Continue the run in ``work_dir`` that an earlier attempt started, on the study as the
    PACS holds it now; what the run's note says about it. The study must be the one the run
    started on (its dataset's hash): otherwise nothing is asked and the run fails saying so."""
    try:
        stats = asyncio.run(
            resume_run(work_dir, dataset=dataset, database_url=database_url, lease_s=lease_s)
        )
    except DatasetChangedError:
        raise DatasetChangedError(
            "the study in the PACS changed since this run's earlier attempt started (its worker "
            "was lost): the run is not continued on other images; evaluate the study again"
        ) from None
    log.info("run %s resumed: %d of %d answers reused, %d calls made", work_dir.name,
             stats.done_before, stats.units_total, stats.calls)  # fmt: skip
    return (
        f"resumed after its earlier attempt stopped (its worker lost): {stats.done_before} of "
        f"{stats.units_total} answers it had stored reused, {stats.calls} call(s) made now"
    )


class DefaultEvaluator:
    name = "neurosandbox-gateway-engine-0.4"

    def __init__(self, settings: Settings, plan: RenderPlan | None = None) -> None:
        self.settings = settings
        self.plan = plan or RenderPlan()

    @staticmethod
    def warm() -> None:
        """Import what an evaluation loads on first use (a spare worker, while idle)."""
        warm_up()

    def _registered(self, study_uid: str, patient_id: str) -> tuple[EvalCase | None, list[str]]:
        """The registered case of this study of this patient (``NEUROSANDBOX_CASES``), if any."""
        if self.settings.cases is None:
            return None, []
        case, problems = registered_case(self.settings.cases, study_uid, patient_id)
        return case, [f"case registry: {p}" for p in problems]

    def evaluate(
        self, study_dir: Path, route: Route, work_dir: Path, index: IndexResult | None = None
    ) -> EvaluationResult:
        study = self._prepare(study_dir, route, work_dir, index)
        config, dataset, case = study.config, study.dataset, study.case
        # the run's record: the engine's run store in the run folder (the gateway's note in
        # it already), read back with the case as held here (a registered case's record and
        # note are not in the store)
        url = self.settings.database_url  # the install's PostgreSQL run log (None: run.sqlite)
        lease = self.settings.call_lease_s  # a call claimed by a worker lost is free after it
        warnings = list(study.warnings)
        try:
            asyncio.run(start_run(config, work_dir, dataset=dataset, database_url=url,
                                  lease_s=lease))  # fmt: skip
        except RunExistsError:
            # an earlier attempt of this run started it and stopped (a queued run's job
            # retried after its worker was lost): what it answered is reused, the rest asked
            warnings.append(_resume(work_dir, dataset, url, lease))
        run = run_from_store(work_dir / STORE_FILE, dataset=dataset, database_url=url)
        # the write-back, checklist and review are of the study as received: the audit's
        # variants (a routing rule's robustness) stay in the run's log for its measures
        run = as_received(run)
        run.title = f"PACS study, routing rule {route.rule}"
        return EvaluationResult(
            evaluator=self.name,
            study_uid=study.study_uid,
            images=_publish(case.images, work_dir / "images"),
            # what the model was shown, not every routed series (the SR cites these)
            evaluated_series_uids=sorted({i.series_uid for i in case.images if i.series_uid}),
            warnings=warnings,
            run=run,
        )

    def estimate(
        self,
        study_dir: Path,
        route: Route,
        work_dir: Path,
        index: IndexResult | None = None,
        history: dict[str, ModelHistory] | None = None,
    ) -> RunEstimate:
        """What ``evaluate`` would send and cost (the same case, images and run config);
        nothing is sent, the rendered images stay in ``work_dir``."""
        study = self._prepare(study_dir, route, work_dir, index)
        return estimate_run(study.config, study.dataset, history=history)

    def _prepare(
        self, study_dir: Path, route: Route, work_dir: Path, index: IndexResult | None = None
    ) -> _Prepared:
        """The engine's case of the study (rendered into ``work_dir``), its dataset and the run's
        configuration."""
        index = index or index_path(study_dir, workers=1, keep_headers=True)
        if not index.series:
            raise ValueError("no DICOM series in the study folder")
        routed = [s for s in index.series if s.series_class.value in route.series_classes]
        if not routed:
            found = sorted({s.series_class.value for s in index.series})
            raise ValueError(
                f"no series of the routed classes {route.series_classes}; found {found}"
            )
        # the evaluated images' study (a non-image object is listed without one, sorted first)
        study_uid = routed[0].study_uid
        known, warnings = self._registered(study_uid, one_patient(index).patient_id)
        scripted = known is not None and bool(known.turns)
        tasks = [t for t in route.tasks if t is not TaskFamily.MULTITURN or scripted]
        if not tasks:
            raise ValueError(f"routing rule {route.rule!r} names no task a received study can run")
        # The engine's case, in memory: the registered one (record, note, truth, turns) when
        # the team registered this study, else the study alone. Its images are the study's
        # as received, rendered from the one index.
        if known is not None:
            case = known.model_copy(deep=True)
            case.images, case.tasks = [], list(route.tasks)
            case.provenance = case.provenance.model_copy(update={"source": "gateway"})
        else:
            case = EvalCase(
                case_id=f"study-{study_uid[-16:]}",
                tasks=list(route.tasks),
                provenance=Provenance(source="gateway", study_uids=[study_uid]),
            )
        case.root = str(work_dir)
        cache = work_dir / "render"
        plan = self.plan.model_copy(update={"series_classes": list(route.series_classes)})
        rendered = render_study(study_dir, case, cache, plan, self.settings.memory_cap, index)
        case.images = rendered.images
        if rendered.burned_in_series:  # the PHI gate drops these images for remote models
            case.provenance.burned_in_series = rendered.burned_in_series
        # every series the images leave out, and why: in the run's record and the checklist
        case.provenance.series_not_shown = rendered.series_not_shown
        if rendered.series_not_shown is not None and rendered.series_not_shown.total:
            warnings.append(f"series: {rendered.series_not_shown.counts_text()}")
        if rendered.identity is not None:  # the study as received, not only the routed series
            case.provenance.identity = rendered.identity.model_copy(
                update={
                    "n_series": len({s.series_uid for s in [*index.series, *index.not_fetched]}),
                    "modalities": sorted(
                        {s.modality for s in [*index.series, *index.not_fetched] if s.modality}
                    ),
                }
            )
        warnings += rendered.warnings
        if len(tasks) < len(route.tasks):
            warnings.append("multi-turn not run: it needs a scripted case (turns), not a study")
        # The dataset exists only in memory: the run store records the case, the report
        # bundle (rundata.json) the whole run.
        spec = DatasetSpec(path=str(study_dir.resolve()), kind="memory", render=plan)
        dataset = Dataset(
            name="PACS study", kind="memory", spec=spec, cases=[case], hash=dataset_hash([case])
        )
        # the rule's robustness audit: the study's variants asked beside it, as `eval
        # --robustness` asks them (one function), so the estimate counts their calls too
        dataset = expand_dataset(dataset, route.robustness, cache)
        warnings += dataset.warnings
        config = RunConfig.from_settings(
            self.settings,
            spec,
            models=list(route.models),
            cache_dir=cache,
            run_id=work_dir.name,
            tasks=tasks,
            generate=GENERATE.model_copy(),
            bertscore=False,
            robustness=list(route.robustness),
        )
        return _Prepared(
            config=config, dataset=dataset, case=case, study_uid=study_uid, warnings=warnings
        )


@dataclass
class _Prepared:
    config: RunConfig
    dataset: Dataset
    case: EvalCase
    study_uid: str
    warnings: list[str]


def _publish(refs: list[ImageRef], folder: Path) -> list[ImageRef]:
    """Copy the PNGs next to the run (the API serves them from there)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for ref in refs:
        name = Path(ref.path).name
        shutil.copyfile(ref.path, folder / name)
        out.append(ref.model_copy(update={"path": f"images/{name}"}))
    return out
