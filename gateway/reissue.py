"""Re-issue a signed-off case to PACS: a VERIFIED SR per model, with the reviewer as verifying
observer, carrying the clinician's corrections (rejected lines dropped, corrected lines replaced,
the clinician's diagnosis as the final diagnosis). Like the model's UNVERIFIED SR, it merges the
model's reviewed answers (findings from the lesion task, diagnosis and differential from the
differential task: :func:`gateway.sr.merged_answer`). When the study holds that UNVERIFIED SR
(written back by the gateway or the demo), the VERIFIED one names it as its predecessor document
and continues its instance numbers."""

from __future__ import annotations

import io

import pydicom
from pydicom.dataset import Dataset

from evaluation import (
    FULL_INPUT,
    Answer,
    Case,
    CaseReview,
    DifferentialItem,
    Finding,
    RunData,
    TaskFamily,
    Verdict,
    answer_key,
    reviewed_samples,
)
from gateway.orthanc import OrthancClient, OrthancError
from gateway.run_report import gateway_info
from gateway.sr import build_sr, merged_answer, model_of, series_uid_for, verify_sr

MAX_SOURCE_HEADERS = 500


class ReissueError(RuntimeError):
    """The case cannot be re-issued (no source study in PACS, nothing signed off)."""


def corrected_answer(answer: Answer, key: str, review: CaseReview) -> Answer:
    """The answer as the clinician left it."""
    items = review.items.get(key, {})

    def keep(item_id: str) -> tuple[bool, str | None]:
        st = items.get(item_id)
        if st is None or st.verdict is Verdict.ACCEPT:
            return True, None
        return st.verdict is Verdict.CORRECT, st.text if st.verdict is Verdict.CORRECT else None

    findings: list[Finding] = []
    for n, f in enumerate(answer.findings, start=1):
        ok, text = keep(f"finding.{n}")
        if ok:
            findings.append(f.model_copy(update={"description": text}) if text else f)
    diff: list[DifferentialItem] = []
    for n, d in enumerate(answer.differential, start=1):
        ok, text = keep(f"dx.{n}")
        if ok:
            diff.append(d.model_copy(update={"diagnosis": text, "icd10": None}) if text else d)
    ok, text = keep("final")
    final = review.diagnosis or text or (answer.final_diagnosis if ok else None)
    return answer.model_copy(
        update={"findings": findings, "differential": diff, "final_diagnosis": final}
    )


def _source_headers(orthanc: OrthancClient, case: Case) -> tuple[list[Dataset], str]:
    if not case.provenance.study_uids:
        raise ReissueError(f"case {case.case_id!r} names no source study (StudyInstanceUID)")
    study_uid = case.provenance.study_uids[0]
    study_id = orthanc.find_study(study_uid)
    if study_id is None:
        raise ReissueError(f"the source study of case {case.case_id!r} is not in PACS")
    wanted = {i.series_uid for i in case.images if i.series_uid}
    series = [
        s for s in orthanc.list_series(study_id, classify=False) if s.modality in ("MR", "CT")
    ]
    series.sort(key=lambda s: s.series_uid not in wanted)
    if not series:
        raise ReissueError(f"the source study of case {case.case_id!r} has no MR or CT series")
    headers = orthanc.series_metadata(study_uid, series[0].series_uid)[:MAX_SOURCE_HEADERS]
    if not headers:
        raise ReissueError("the source series has no readable instance header")
    return headers, series[0].modality


def _number(ds: Dataset) -> int:
    try:
        return int(ds.get("InstanceNumber") or 0)
    except (TypeError, ValueError):
        return 0


def stored_srs(orthanc: OrthancClient, study_uid: str) -> list[Dataset]:
    """Headers of the SRs in the study's NeuroSandbox SR series, newest first."""
    try:
        items = orthanc.series_metadata(study_uid, series_uid_for(study_uid, "sr"))
    except OrthancError as exc:
        if exc.status == 404:  # nothing written back yet
            return []
        raise
    return sorted(items, key=lambda d: -_number(d))


def predecessor(srs: list[Dataset], model: str, named: str | None) -> Dataset | None:
    """The UNVERIFIED SR the run wrote for ``model`` (``named``), else that model's newest."""
    of_model = [
        d for d in srs if d.get("VerificationFlag") == "UNVERIFIED" and model_of(d) == model
    ]
    exact = next((d for d in of_model if str(d.SOPInstanceUID) == named), None)
    return exact or (of_model[0] if of_model else None)


def reissue_case(
    orthanc: OrthancClient,
    run: RunData,
    case_id: str,
    review: CaseReview,
    organization: str,
) -> list[str]:
    """Store one VERIFIED SR per model with reviewed answers; returns their SOP Instance UIDs."""
    if review.signed_off_at is None:
        raise ReissueError("only a signed-off case can be re-issued")
    case = run.case(case_id)
    by_model: dict[str, list[tuple[TaskFamily, Answer]]] = {}
    for s, _ in reviewed_samples(run.samples_of(case_id)):
        if s.ablation == FULL_INPUT and isinstance(s.answer, Answer):
            corrected = corrected_answer(s.answer, answer_key(s), review)
            by_model.setdefault(s.scored.model, []).append((s.scored.family, corrected))
    if not by_model:
        raise ReissueError(f"case {case_id!r} has no diagnostic answer to report")
    headers, modality = _source_headers(orthanc, case)
    earlier = stored_srs(orthanc, case.provenance.study_uids[0])
    named = gateway_info(run).get("unverified_sr") or {}
    number = max((_number(d) for d in earlier), default=0) + 1  # next in the series
    uids = []
    for model, answers in by_model.items():
        answer = merged_answer(answers)
        assert answer is not None
        prior = predecessor(earlier, model, named.get(model))
        sr = build_sr(headers, answer, model, "clinician-reviewed", number, (), modality)
        # The draft built here is never stored: the document the signed one replaces is the
        # model's UNVERIFIED SR in PACS, when there is one.
        signed = verify_sr(
            sr,
            observer_name=review.reviewer[:64],
            organization=organization,
            replaces=[prior] if prior is not None else [],
            instance_number=number,
        )
        number += 1
        buf = io.BytesIO()
        pydicom.dcmwrite(buf, signed, enforce_file_format=True)
        orthanc.upload(buf.getvalue())
        uids.append(str(signed.SOPInstanceUID))
    return uids
