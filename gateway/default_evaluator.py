"""The built-in ``Evaluator``: the evaluation engine's pieces, run on one received study.

What it does, plainly:
1. ``evaluation.datasets.rendering.render_study`` renders the study (one labelled montage per
   clinical series, plus single slices), as the engine does for a dataset case; only the
   series of the routed classes are kept.
2. For every routed model and task it builds the engine's prompt (``evaluation.tasks.
   build_turns``: system message, task template, answer schema, the montages), calls the
   model's adapter, and parses the reply with ``evaluation.parsing.parse_answer``.
3. Adapters: the ones passed in, else the engine's built-in local models
   (``reference/image-rules``, ``reference/text-prior``, ``replay:...``) via
   ``evaluation.models.create_model``. Remote (litellm) models are NOT called here: they go
   through the engine's runner, which de-identifies and audits what leaves; the case is
   recorded as not run.
4. No scoring (a clinical study has no ground truth); the checklist is written as PDF
   (matplotlib) and HTML.
"""

from __future__ import annotations

import asyncio
import shutil
from datetime import datetime
from pathlib import Path

import jinja2

from dicom.index import index_path
from evaluation.datasets.rendering import RenderPlan, render_study
from evaluation.models import ModelSpec, create_model
from evaluation.parsing import parse_answer
from evaluation.prompts import default_prompts
from evaluation.records import (
    Answer,
    ClassificationAnswer,
    GenerateConfig,
    ImageRef,
    ModelAdapter,
    ParseStatus,
    Provenance,
    TaskFamily,
)
from evaluation.records import Case as EvalCase
from evaluation.tasks import TaskItem, build_turns
from gateway import checklist_pdf
from gateway.pipeline import CaseResult, EvaluationResult
from gateway.routing import Route

_HTML = jinja2.Environment(autoescape=True).from_string(
    """<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>NeuroSandbox checklist (UNVERIFIED)</title>
<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}
.banner{color:#b00020;font-weight:bold}table{border-collapse:collapse}
td,th{border:1px solid #999;padding:.2em .5em}img{max-width:100%}</style></head><body>
<h1>NeuroSandbox AI checklist</h1>
<p class="banner">UNVERIFIED: AI output for research evaluation; a clinician must review and sign.</p>
<p>Evaluator {{ r.evaluator }}; rule {{ r.route.rule }}; generated {{ now }}</p>
{% for c in r.cases %}<h2>{{ c.model }} / {{ c.task.value }}</h2>
{% if c.error %}<p>Not run: {{ c.error }}</p>{% else %}
<p><b>Final diagnosis:</b> {{ c.final_diagnosis or "none" }}
{% if c.answer and c.answer.confidence is not none %}(confidence {{ "%.2f"|format(c.answer.confidence) }}){% endif %}</p>
<table><tr><th>finding</th><th>sequence</th><th>hemisphere</th><th>region</th><th>signal</th><th>size mm</th></tr>
{% for f in c.findings %}<tr><td>{{ f.description }}</td><td>{{ f.sequence or "" }}</td><td>{{ f.hemisphere or "" }}</td>
<td>{{ f.region or "" }}</td><td>{{ f.signal or "" }}</td><td>{{ f.size_mm or "" }}</td></tr>{% endfor %}</table>
{% if c.answer %}<p>{{ c.answer.rationale }}</p>{% endif %}{% endif %}{% endfor %}
<h2>Images shown</h2>{% for im in r.images %}<figure><img alt="{{ im.label }}" src="{{ im.path }}">
<figcaption>{{ im.label }}</figcaption></figure>{% endfor %}
{% for w in r.warnings %}<p>warning: {{ w }}</p>{% endfor %}</body></html>"""
)


def as_answer(parsed: Answer | ClassificationAnswer | None) -> Answer | None:
    """The checklist form of a reply (a classification answer becomes a minimal Answer)."""
    if parsed is None or isinstance(parsed, Answer):
        return parsed
    what = [
        f"{k} {v}"
        for k, v in (
            ("modality", parsed.modality),
            ("sequence", parsed.specialized_sequence),
            ("plane", parsed.plane),
        )
        if v
    ]
    return Answer(
        final_diagnosis=parsed.diagnosis_detailed or parsed.diagnosis_name,
        confidence=parsed.diagnosis_confidence,
        rationale="Structured classification: " + (", ".join(what) or "no labels"),
    )


class DefaultEvaluator:
    name = "neurosandbox-gateway-default-0.2"

    def __init__(
        self,
        adapters: dict[str, ModelAdapter] | None = None,
        memory_cap: int | None = None,
        plan: RenderPlan | None = None,
    ) -> None:
        self.adapters = dict(adapters or {})
        self.memory_cap = memory_cap
        self.plan = plan or RenderPlan()
        self.prompts = default_prompts()

    def adapter(self, model: str) -> tuple[ModelAdapter | None, str | None]:
        if model in self.adapters:
            return self.adapters[model], None
        spec = ModelSpec(name=model)
        if not spec.is_local:
            return None, (
                "remote models run through the evaluation engine (de-identification and the "
                "outbound audit), not the gateway's default evaluator"
            )
        self.adapters[model] = create_model(spec)
        return self.adapters[model], None

    def evaluate(self, study_dir: Path, route: Route, work_dir: Path) -> EvaluationResult:
        index = index_path(study_dir, workers=1)
        if not index.series:
            raise ValueError("no DICOM series in the study folder")
        study_uid = index.series[0].study_uid
        case = EvalCase(
            case_id=f"study-{study_uid[-16:]}",
            study_path=str(study_dir),
            tasks=list(route.tasks),
            provenance=Provenance(source="gateway", study_uids=[study_uid]),
        )
        rendered = render_study(study_dir, case, work_dir / "render", self.plan, self.memory_cap)
        images = self._publish(
            [i for i in rendered.images if (i.series_class or "") in route.series_classes],
            work_dir / "images",
        )
        case.images = images
        cases = [
            self._case(case, model, task, work_dir)
            for model in route.models
            for task in route.tasks
        ]
        result = EvaluationResult(
            evaluator=self.name,
            study_uid=study_uid,
            route=route,
            cases=cases,
            images=images,
            evaluated_series_uids=sorted(
                {s.series_uid for s in index.series if s.series_class.value in route.series_classes}
            ),
            modality="CT" if any(s.modality == "CT" for s in index.series) else "MR",
            warnings=list(rendered.warnings),
        )
        result.pdf = checklist_pdf.render_pdf(
            "NeuroSandbox AI checklist",
            _sections(result),
            [work_dir / i.path for i in images if i.kind == "montage"],
        )
        result.html = _HTML.render(r=result, now=f"{datetime.now():%Y-%m-%d %H:%M}")
        return result

    @staticmethod
    def _publish(refs: list[ImageRef], folder: Path) -> list[ImageRef]:
        """Copy the PNGs next to the run (the API serves them from there)."""
        folder.mkdir(parents=True, exist_ok=True)
        out = []
        for ref in refs:
            name = Path(ref.path).name
            shutil.copyfile(ref.path, folder / name)
            out.append(ref.model_copy(update={"path": f"images/{name}"}))
        return out

    def _case(self, case: EvalCase, model: str, task: TaskFamily, work_dir: Path) -> CaseResult:
        base = CaseResult(case_id=case.case_id, model=model, task=task)
        adapter, why = self.adapter(model)
        if adapter is None:
            return base.model_copy(update={"parse_status": ParseStatus.ERROR, "error": why})
        if task is TaskFamily.MULTITURN:
            return base.model_copy(
                update={
                    "parse_status": ParseStatus.ERROR,
                    "error": "multi-turn needs a scripted case (turns), not a received study",
                }
            )
        turns = build_turns(
            case,
            TaskItem(case_id=case.case_id, family=task),
            self.prompts,
            lambda ref: (work_dir / ref.path).read_bytes(),
        )
        config = GenerateConfig(json_mode=True, temperature=0.0)
        out = asyncio.run(adapter.generate([turns.system, *turns.turns], config))
        parsed = parse_answer(
            out.text, task, refusal=out.refusal, error=out.error, prompts=self.prompts
        )
        answer = as_answer(parsed.answer)
        return base.model_copy(
            update={
                "answer": answer,
                "final_diagnosis": answer.final_diagnosis if answer else None,
                "findings": list(answer.findings) if answer else [],
                "parse_status": parsed.status,
                "error": parsed.error or None,
            }
        )


def _sections(r: EvaluationResult) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = [
        ("Evaluation", [f"evaluator {r.evaluator}", f"routing rule {r.route.rule}"]),
    ]
    for c in r.cases:
        body: list[str] = []
        if c.answer is None:
            body.append(f"not run or no answer ({c.parse_status.value}): {c.error or ''}")
        else:
            a = c.answer
            conf = f" (confidence {a.confidence:.2f})" if a.confidence is not None else ""
            body.append(f"Final diagnosis: {a.final_diagnosis or 'none'}{conf}")
            if a.sequences_identified:
                body.append("Sequences: " + ", ".join(s.sequence for s in a.sequences_identified))
            for n, f in enumerate(a.findings, 1):
                body.append(
                    f"[ ] finding {n}: {f.description}; sequence {f.sequence or '-'}; "
                    f"{f.hemisphere or '-'} {f.region or '-'}; signal {f.signal or '-'}; "
                    f"size {f.size_mm if f.size_mm is not None else '-'} mm"
                )
            if not a.findings:
                body.append("[ ] no findings reported")
            for d in a.differential:
                body.append(f"differential: {d.diagnosis} {d.icd10 or ''}".rstrip())
            body.append(f"Rationale: {a.rationale}")
            body += [f"Next step: {s}" for s in a.next_steps]
        out.append((f"{c.model} - {c.task.value}", body))
    if r.warnings:
        out.append(("Warnings", list(r.warnings)))
    out.append(("Images shown", [i.label for i in r.images] or ["none rendered"]))
    return out
