"""Gateway parts without network peers: routing, tokens, Part 10 header, cache, SR/PDF, rules."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pydicom
import pytest
from dciodvfy import assert_dciodvfy_clean
from gateway_synth import make_study
from highdicom.sr import Comprehensive3DSR
from openai_server import OpenAIServer
from pydicom.uid import generate_uid

from dicom import InvalidUIDError, check_uid
from evaluation.answers import Answer, ClassificationAnswer, DifferentialItem, Finding
from evaluation.case import TaskFamily
from evaluation.log.store import RunStore
from evaluation.reports import load_run
from evaluation.review import ReportContent, report_blocks
from evaluation.scores import ParseStatus
from gateway.auth import Role, TokenStore
from gateway.cache import CacheKey, InstanceCache, InvalidCacheKeyError
from gateway.metrics import Metrics
from gateway.part10 import file_meta_bytes, read_uids
from gateway.routing import CLINICAL, Route, Router, RoutingError, StudyFacts
from gateway.settings import Settings
from gateway.sr import ReportBuildError, Verifier, build_pdf, build_sr
from gateway.study_run import DefaultEvaluator

# --------------------------------------------------------------------------- routing


def test_routing_first_match_wins_and_skip_rules_exclude(tmp_path: Path) -> None:
    rules = tmp_path / "routing.yaml"
    rules.write_text(
        """
rules:
  - name: research
    match: {calling_aet: ["RESEARCH_*"]}
    skip: true
  - name: stroke
    match: {modality: [CT], series_classes_any: [CT]}
    evaluate: {models: [reference/image-rules, openai/gpt-4o], tasks: [differential]}
  - name: ms
    match: {series_classes_all: [FLAIR, T2]}
    evaluate: {tasks: [lesion], series_classes: [FLAIR]}
"""
    )
    router = Router.from_file(rules)
    ct = router.route(StudyFacts(calling_aets=["CT1"], modalities=["CT"], series_classes=["CT"]))
    assert ct is not None and ct.rule == "stroke"
    assert ct.models == ["reference/image-rules", "openai/gpt-4o"]
    assert ct.tasks == [TaskFamily.DIFFERENTIAL]
    assert (
        router.route(
            StudyFacts(calling_aets=["RESEARCH_3T"], modalities=["CT"], series_classes=["CT"])
        )
        is None
    )
    ms = router.route(StudyFacts(modalities=["MR"], series_classes=["FLAIR", "T2", "DWI"]))
    assert ms is not None and ms.rule == "ms" and ms.series_classes == ["FLAIR"]
    assert router.route(StudyFacts(modalities=["MR"], series_classes=["FLAIR"])) is None


def test_routing_file_errors_name_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - name: x\n    match: {series_classes_any: [T7]}\n")
    with pytest.raises(RoutingError, match=r"series_classes_any.*T7"):
        Router.from_file(bad)
    bad.write_text("rules:\n  - name: x\n    evaluate: {tasks: [guessing]}\n")
    # the field's path written as case and manifest errors write it
    with pytest.raises(RoutingError, match=r": rules\[0\]\.evaluate\.tasks\[0\]: "):
        Router.from_file(bad)


def test_default_routing_takes_clinical_mr_and_ct_only() -> None:
    router = Router()
    assert router.route(StudyFacts(modalities=["MR"], series_classes=["T2"])) is not None
    assert router.route(StudyFacts(modalities=["MR"], series_classes=["LOCALIZER"])) is None
    assert router.route(StudyFacts(modalities=["US"], series_classes=["UNKNOWN"])) is None


# --------------------------------------------------------------------------- tokens


def test_tokens_are_stored_hashed_and_checked(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "secret" / "tokens.json")
    rec, token = store.create(Role.REVIEWER, "alice")
    text = store.path.read_text()
    secret = token.split("_", 2)[2]
    assert secret not in text and rec.sha256 in text
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert store.verify(token) is not None and store.verify(token).role is Role.REVIEWER  # type: ignore[union-attr]
    assert store.verify(token[:-1] + ("A" if token[-1] != "A" else "B")) is None
    assert store.verify("nsbx_nothere_" + secret) is None
    assert store.verify("Bearer " + token) is None
    # A second store (another process, e.g. the CLI) sees the revocation.
    TokenStore(store.path).revoke(rec.id)
    assert store.verify(token) is None


# --------------------------------------------------------------------------- part 10, cache


def test_file_meta_bytes_make_a_readable_part10_file(tmp_path: Path) -> None:
    study = make_study(tmp_path / "s", classes=("T1",), n_slices=1)
    src = pydicom.dcmread(study.files[0])
    body = io.BytesIO()
    src.save_as(body, enforce_file_format=False, implicit_vr=False, little_endian=True)
    raw = study.files[0].read_bytes()
    dataset_bytes = raw[raw.index(b"\x08\x00", 132 + 12 + 200) :]  # after the meta group
    meta = file_meta_bytes(src.SOPClassUID, src.SOPInstanceUID, "1.2.840.10008.1.2.1", "MODALITY1")
    out = tmp_path / "out.dcm"
    out.write_bytes(meta + dataset_bytes)
    back = pydicom.dcmread(out)
    assert back.file_meta.SourceApplicationEntityTitle == "MODALITY1"
    assert back.SOPInstanceUID == src.SOPInstanceUID and back.PixelData == src.PixelData
    assert read_uids(io.BytesIO(dataset_bytes), "1.2.840.10008.1.2.1") == (
        study.study_uid,
        study.series_uids["T1"],
        str(src.PatientID),
        "",
    )


def test_uids_from_peers_never_become_paths(tmp_path: Path) -> None:
    for hostile in ("../../etc/passwd", "1.2.3/../../x", "1.2." + "9" * 70, "", "1..2"):
        with pytest.raises(InvalidUIDError):
            check_uid(hostile)
    cache = InstanceCache(tmp_path)
    key = CacheKey("0a1b2c3d-00000000-00000000-00000000-00000000", "f00d", "1.2.840.99")
    path = cache.put_bytes(key, b"data")
    assert path.parent.parent == tmp_path and cache.has(key)
    for hostile in ("../../x", "a/b", "", "x" * 65):
        with pytest.raises(InvalidCacheKeyError):
            CacheKey(hostile, "f00d", "1.2.840.99")
        with pytest.raises(InvalidCacheKeyError):
            CacheKey("0a1b", hostile, "1.2.840.99")


# --------------------------------------------------------------------------- default evaluator


@pytest.mark.parametrize("side", ["left", "right", None])
def test_default_evaluator_runs_the_engine_reference_model_on_a_study(
    tmp_path: Path, side: str | None
) -> None:
    make_study(tmp_path / "study", classes=("FLAIR", "T2"), n_slices=12, lesion=side)
    route = Route(
        rule="t",
        models=["reference/image-rules"],
        tasks=[TaskFamily.LESION, TaskFamily.CLASSIFICATION, TaskFamily.MULTITURN],
        series_classes=["FLAIR"],
    )
    work = tmp_path / "runs" / ("0" * 32)
    result = DefaultEvaluator(Settings(data_dir=tmp_path)).evaluate(tmp_path / "study", route, work)
    by = {(x.scored.model, x.scored.family): x for x in result.run.samples}
    assert set(by) == {
        ("reference/image-rules", TaskFamily.LESION),
        ("reference/image-rules", TaskFamily.CLASSIFICATION),
    }
    lesion = by[("reference/image-rules", TaskFamily.LESION)]
    assert lesion.scored.status is ParseStatus.OK and isinstance(lesion.answer, Answer)
    if side is None:
        assert lesion.answer.findings == []
    else:
        assert {f.hemisphere for f in lesion.answer.findings} == {side}
    classified = by[("reference/image-rules", TaskFamily.CLASSIFICATION)].answer
    assert isinstance(classified, ClassificationAnswer) and classified.diagnosis_name
    assert any("multi-turn not run" in w for w in result.warnings)
    # Only the routed series was evaluated, and the run is an ordinary engine run.
    assert {i.series_class for i in result.images} == {"FLAIR"}
    assert all((work / i.path).exists() for i in result.images)
    assert result.run.run_id == work.name and len(result.run.cases) == 1
    assert result.run.cases[0].provenance.study_uids == [result.study_uid]
    again = load_run(work)  # the run store in the run folder: `neurosandbox report RUNDIR`
    assert [s.answer for s in again.samples] == [s.answer for s in result.run.samples]
    assert "reference/image-rules" in {b.model for b in report_blocks(result.run.samples)}


def test_routed_litellm_models_run_through_the_engine_and_its_phi_gate(tmp_path: Path) -> None:
    study = make_study(tmp_path / "study", lesion="left", patient_name="Secret^Patient")
    for f in study.files:  # the T2 series carries burned-in text: never sent to a remote model
        ds = pydicom.dcmread(f)
        if "T2" in str(ds.SeriesDescription):
            ds.BurnedInAnnotation = "YES"
            ds.save_as(f)
    models = tmp_path / "models.yaml"
    models.write_text("models:\n  - name: ward-vlm\n    model: openai/gpt-4o\n    max_retries: 1\n")
    route = Route(
        rule="ward",
        models=["reference/image-rules", "ward-vlm"],
        tasks=[TaskFamily.DIFFERENTIAL, TaskFamily.LESION],
        series_classes=list(CLINICAL),
    )
    with OpenAIServer() as server:
        # No trusted host: even this loopback endpoint counts as remote for the PHI gate.
        settings = Settings(
            data_dir=tmp_path, models_file=models, api_base=server.url, phi_trusted_hosts=[]
        )
        work = tmp_path / "runs" / ("1" * 32)
        result = DefaultEvaluator(settings).evaluate(tmp_path / "study", route, work)
        bodies = json.dumps(server.stats.bodies)
        calls = server.stats.calls
    assert calls == 2  # one per task: the routed litellm model was called
    remote = {x.scored.family: x.answer for x in result.run.samples if x.scored.model == "ward-vlm"}
    assert set(remote) == {TaskFamily.DIFFERENTIAL, TaskFamily.LESION}
    differential, lesion = remote[TaskFamily.DIFFERENTIAL], remote[TaskFamily.LESION]
    assert isinstance(differential, Answer) and isinstance(lesion, Answer)
    assert differential.final_diagnosis == "multiple sclerosis"
    assert [f.hemisphere for f in lesion.findings] == ["left"]
    assert {s.scored.model for s in result.run.samples} == {"reference/image-rules", "ward-vlm"}
    assert "Secret" not in bodies and study.patient_id not in bodies
    store = RunStore(work)
    try:
        audit = [a for a in store.audit() if a.model == "ward-vlm"]
    finally:
        store.close()
    assert len(audit) == 2 and all(a.remote and a.deidentified for a in audit)
    t2 = {i.sha256 for i in result.images if i.series_class == "T2"}
    assert t2 and all(set(a.dropped_images) == t2 for a in audit)
    assert not t2 & {h for a in audit for h in a.image_sha256}


# --------------------------------------------------------------------------- SR and PDF


def _content() -> ReportContent:
    return ReportContent(
        findings=[
            Finding(
                description="plaque", hemisphere="left", region="frontal", signal="hyperintense"
            )
        ],
        differential=[DifferentialItem(diagnosis="Multiple sclerosis", icd10="G35")],
        final_diagnoses=[DifferentialItem(diagnosis="Multiple sclerosis", icd10="G35")],
        error_categories=["perceptual"],
    )


def _procedure(sr: pydicom.Dataset) -> str:
    """The code value of the SR's "Procedure reported" (121058, DCM) content item."""
    (code,) = [
        item.ConceptCodeSequence[0].CodeValue
        for item in sr.ContentSequence
        if item.ConceptNameCodeSequence[0].CodeValue == "121058"
    ]
    return str(code)


def test_the_procedure_an_sr_reports_follows_every_evaluated_series_in_any_order(
    tmp_path: Path,
) -> None:
    """One rule, from the SR's own evidence: CT when any evaluated series is CT, whichever series
    comes first, so the pipeline's UNVERIFIED SR and re-issue's VERIFIED one (built from the
    evidence recorded at write-back) report the same procedure."""
    from highdicom.sr import CodedConcept
    from pydicom.sr.codedict import codes
    from pydicom.uid import CTImageStorage

    study = make_study(tmp_path / "s", n_slices=2)  # FLAIR then T2, two slices each
    headers = [pydicom.dcmread(p, stop_before_pixels=True) for p in study.files]
    for h in headers[2:]:  # the second series is a head CT
        h.Modality, h.SOPClassUID = "CT", CTImageStorage
    ct = CodedConcept.from_code(codes.SCT.ComputedTomographyOfHead).value
    mr_only = _procedure(build_sr(headers[:2], _content(), "m", "v", 1))
    assert mr_only != ct
    who = [Verifier("Doe^Jane", "Neuro Hospital", datetime(2026, 11, 24, 9, 30))]
    for source in (headers, headers[::-1]):
        assert _procedure(build_sr(source, _content(), "m", "v", 1)) == ct
        assert _procedure(build_sr(source, _content(), "m", "v", 1, verifiers=who)) == ct


def test_sr_is_tid1500_unverified_with_coded_findings_and_reads_back(tmp_path: Path) -> None:
    study = make_study(tmp_path / "s", n_slices=2, patient_name="Müller^Jörg")
    headers = [pydicom.dcmread(p, stop_before_pixels=True) for p in study.files]
    sr = build_sr(headers, _content(), "reference/image-rules", "test", 1)
    path = tmp_path / "sr.dcm"
    sr.save_as(path, enforce_file_format=True)
    assert_dciodvfy_clean(path)
    ds = pydicom.dcmread(path)
    assert ds.VerificationFlag == "UNVERIFIED" and ds.StudyInstanceUID == study.study_uid
    assert ds.SeriesDescription.endswith("(UNVERIFIED)")
    assert ds.PatientID == study.patient_id and str(ds.PatientName) == "Müller^Jörg"
    Comprehensive3DSR.from_dataset(ds)  # highdicom parses it back
    dump = subprocess.run(
        ["/usr/bin/dsrdump", "-Ee", str(path)], capture_output=True, encoding="latin-1"
    )
    assert dump.returncode == 0, dump.stderr  # dcmtk validates the document structure
    text = dump.stdout
    assert '(7771000,SCT,"Left")' in text and '(83251001,SCT,"Frontal lobe")' in text
    assert '(121053,DCM,"Present")' in text and '(G35,I10,"Multiple sclerosis")' in text
    assert "plaque" in text and "perceptual" in text  # the description and the error category
    # The VERIFIED version: its own series, the clinicians as verifying observers, the
    # UNVERIFIED one as predecessor.
    when = datetime(2026, 11, 24, 9, 30)
    who = [
        Verifier("Doe^Jane", "Neuro Hospital", when),
        Verifier("Roe^Ann", "Neuro Hospital", when),
    ]
    signed = build_sr(headers, _content(), "reference/image-rules", "clinician-verified", 1,
                      previous=[ds], verifiers=who)  # fmt: skip
    assert_dciodvfy_clean(signed)
    assert signed.VerificationFlag == "VERIFIED" and signed.PreliminaryFlag == "FINAL"
    assert signed.SeriesInstanceUID != ds.SeriesInstanceUID
    assert signed.SeriesDescription.endswith("(VERIFIED)")
    observers = signed.VerifyingObserverSequence
    assert [str(o.VerifyingObserverName) for o in observers] == ["Doe^Jane", "Roe^Ann"]
    assert observers[0].VerifyingOrganization == "Neuro Hospital"
    assert observers[0].VerificationDateTime == "20261124093000"
    assert (
        signed.PredecessorDocumentsSequence[0]
        .ReferencedSeriesSequence[0]
        .ReferencedSOPSequence[0]
        .ReferencedSOPInstanceUID
        == ds.SOPInstanceUID
    )
    with pytest.raises(ReportBuildError, match="family\\^given"):
        build_sr(headers, _content(), "m", "v", 1, verifiers=[Verifier("Dr Jane", "H", when)])
    v2 = build_sr(headers, ReportContent(no_findings=True), "reference/image-rules", "test", 2,
                  previous=[ds])  # fmt: skip
    assert v2.SeriesInstanceUID == ds.SeriesInstanceUID and v2.InstanceNumber == 2
    assert "PredecessorDocumentsSequence" in v2
    assert_dciodvfy_clean(v2)


def test_an_sr_with_every_item_rejected_or_any_script_is_valid(tmp_path: Path) -> None:
    """Found in review: a VERIFIED SR whose every item was rejected could not be built; text in
    another script became '?' and a backslash split a code meaning into several values."""
    study = make_study(tmp_path / "s", n_slices=1, classes=("T1",), patient_name="Doe^John")
    headers = [pydicom.dcmread(p, stop_before_pixels=True) for p in study.files]
    when = datetime(2026, 11, 24, 9, 30)
    nothing = build_sr(headers, ReportContent(), "m", "v", 1,
                       verifiers=[Verifier("Łukasiewicz^Jan", "Szpital Bródno", when)])  # fmt: skip
    assert_dciodvfy_clean(nothing)
    content = ReportContent(
        findings=[Finding(description="zmiana w płacie czołowym")],
        final_diagnoses=[DifferentialItem(diagnosis="glioma\\metastasis")],
        comments=["Komentarz: Łódź"],
    )
    sr = build_sr(headers, content, "m", "v", 1)
    buf = io.BytesIO()
    sr.save_as(buf, enforce_file_format=True)
    assert_dciodvfy_clean(buf.getvalue())
    back = pydicom.dcmread(io.BytesIO(buf.getvalue()))
    texts = [str(e.value) for e in back.iterall() if e.keyword in ("TextValue", "CodeMeaning")]
    assert "zmiana w płacie czołowym" in texts and "Komentarz: Łódź" in texts
    assert "glioma/metastasis" in texts and "glioma\\metastasis" in texts  # code + full text
    signed = pydicom.dcmread(io.BytesIO(_encode(nothing)))
    assert str(signed.VerifyingObserverSequence[0].VerifyingObserverName) == "Łukasiewicz^Jan"


def _encode(ds: pydicom.Dataset) -> bytes:
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    return buf.getvalue()


def test_encapsulated_pdf_carries_the_study_and_refuses_non_pdf(tmp_path: Path) -> None:
    study = make_study(tmp_path / "s", n_slices=1, classes=("T1",))
    src = pydicom.dcmread(study.files[0], stop_before_pixels=True)
    pdf_bytes = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n"
    ds = build_pdf(src, pdf_bytes, "NeuroSandbox AI checklist", 1)
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    assert_dciodvfy_clean(buf.getvalue())
    back = pydicom.dcmread(io.BytesIO(buf.getvalue()))
    assert back.SOPClassUID == "1.2.840.10008.5.1.4.1.1.104.1"
    assert back.StudyInstanceUID == study.study_uid and back.PatientID == study.patient_id
    assert back.EncapsulatedDocument[: back.EncapsulatedDocumentLength] == pdf_bytes
    assert "UNVERIFIED" in back.DocumentTitle and back.SeriesDescription.endswith("(UNVERIFIED)")
    assert "VerificationFlag" not in back  # the Encapsulated PDF IOD has none
    verified = build_pdf(
        src, pdf_bytes, "NeuroSandbox checklist VERIFIED by Jane Doe", 2, verified=True
    )
    assert_dciodvfy_clean(verified)
    assert "VerificationFlag" not in verified and verified.SeriesDescription.endswith("(VERIFIED)")
    assert verified.SeriesInstanceUID != back.SeriesInstanceUID
    with pytest.raises(ReportBuildError):
        build_pdf(src, b"<html>", "x", 1)


def test_metrics_render_prometheus_text() -> None:
    m = Metrics()
    m.inc("http_requests_total", route='/x"y', method="GET", status="200")
    m.inc("dicom_instances_received_total", 3)
    text = m.render()
    assert "# TYPE neurosandbox_dicom_instances_received_total counter" in text
    assert "neurosandbox_dicom_instances_received_total 3.0" in text
    assert 'neurosandbox_http_requests_total{method="GET",route="/x\\"y",status="200"} 1.0' in text


def test_generate_uid_is_used_for_new_objects() -> None:
    # The SR and PDF series are stable per study, so versions land together.
    from gateway.sr import series_uid_for

    uid = generate_uid()
    assert series_uid_for(uid, "sr") == series_uid_for(uid, "sr") != series_uid_for(uid, "pdf")
    assert os.sep not in series_uid_for(uid, "sr")


def test_a_non_image_object_in_the_study_never_hides_its_study_uid(tmp_path: Path) -> None:
    """XA30 carries a Phoenix protocol (SR, Raw Data) that the index lists as a NON_IMAGE series
    without a study UID, sorted first: the case must still be the study's ("study-" was)."""
    study = make_study(tmp_path / "study" / "mr", classes=("FLAIR",), n_slices=6)
    raw = pydicom.Dataset()
    raw.file_meta = pydicom.dataset.FileMetaDataset()
    raw.file_meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.66"  # Raw Data Storage
    raw.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    raw.file_meta.TransferSyntaxUID = pydicom.uid.ExplicitVRLittleEndian
    raw.SOPClassUID, raw.SOPInstanceUID = "1.2.840.10008.5.1.4.1.1.66", generate_uid()
    raw.StudyInstanceUID, raw.SeriesInstanceUID = study.study_uid, generate_uid()
    raw.Modality = "OT"
    (tmp_path / "study" / "phoenix").mkdir()
    raw.save_as(tmp_path / "study" / "phoenix" / "raw.dcm", enforce_file_format=True)
    route = Route(rule="t", models=["reference/image-rules"], tasks=[TaskFamily.LESION],
                  series_classes=["FLAIR"])  # fmt: skip
    work = tmp_path / "runs" / ("1" * 32)
    result = DefaultEvaluator(Settings(data_dir=tmp_path)).evaluate(tmp_path / "study", route, work)
    assert result.study_uid == study.study_uid
    assert result.run.cases[0].case_id == f"study-{study.study_uid[-16:]}"
    assert result.run.cases[0].provenance.study_uids == [study.study_uid]


def test_a_routing_rule_s_audit_flags_the_study_s_checklist(tmp_path: Path) -> None:
    """A rule that asks the grounding audit: the study's checklist (its page, JSON and PDF
    written back) is the study's alone, flagged with what the variants showed (here a model
    that answers the same without the images)."""
    from evaluation.robustness import VariantKind
    from gateway.runs.report import write_checklist

    make_study(tmp_path / "study", classes=("FLAIR",), n_slices=6, lesion="left")
    route = Route(rule="audit", models=["reference/text-prior"], tasks=[TaskFamily.DIFFERENTIAL],
                  series_classes=["FLAIR"], robustness=[VariantKind.NO_IMAGES])  # fmt: skip
    work = tmp_path / "runs" / ("2" * 32)
    result = DefaultEvaluator(Settings(data_dir=tmp_path)).evaluate(tmp_path / "study", route, work)
    assert len(result.run.cases) == 1 and result.run.audit  # the study; the variants' pairs
    checklist = write_checklist(result.run, tmp_path / "bundle", printer=None)
    (page,) = (tmp_path / "bundle" / "cases").glob("*.json")
    flags = json.loads(page.read_text())["flags"]
    assert any(f["kind"] == "same_answer_without_images" for f in flags), flags
    assert "Answered the same without the images" in checklist.html


def test_cache_and_runs_follow_the_out_folder_from_every_settings_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OUT/cache and OUT/runs unless set themselves, whether OUT comes from an argument, the
    environment or a ``.env`` file."""
    for key in ("OUT", "CACHE_DIR", "RUNS_DIR"):
        monkeypatch.delenv(f"NEUROSANDBOX_{key}", raising=False)
    monkeypatch.chdir(tmp_path)

    def folders() -> tuple[Path, Path]:
        s = Settings()
        return s.cache_dir, s.runs_dir

    assert folders() == (Path("out/cache"), Path("out/runs"))
    s = Settings(out=Path("/k"), runs_dir=Path("/r"))
    assert (s.cache_dir, s.runs_dir) == (Path("/k/cache"), Path("/r"))
    monkeypatch.setenv("NEUROSANDBOX_OUT", "/e")
    assert folders() == (Path("/e/cache"), Path("/e/runs"))
    monkeypatch.setenv("NEUROSANDBOX_RUNS_DIR", "/er")
    assert folders() == (Path("/e/cache"), Path("/er"))
    monkeypatch.delenv("NEUROSANDBOX_OUT")
    monkeypatch.delenv("NEUROSANDBOX_RUNS_DIR")
    (tmp_path / ".env").write_text("NEUROSANDBOX_OUT=/dotenv\nNEUROSANDBOX_CACHE_DIR=/dc\n")
    assert folders() == (Path("/dc"), Path("/dotenv/runs"))


def test_a_pid_file_names_our_service_only_while_it_runs_as_ours(tmp_path: Path) -> None:
    """Orthanc's and the demo gateway's PID files: a PID whose command line is another
    program's (a recycled PID), a zombie, or a broken file is not ours."""
    import signal
    import sys

    from gateway.pacs_local import LocalPacs, gateway_pid

    data = tmp_path / "data"
    pacs = LocalPacs(Settings(data_dir=data))
    pacs.pid_file.parent.mkdir(parents=True)
    sleep = "import time; time.sleep(60)"
    exe = tmp_path / "bin" / "neurosandbox"  # the gateway's console script, by its name
    exe.parent.mkdir()
    exe.symlink_to(sys.executable)
    orthanc = subprocess.Popen([sys.executable, "-c", sleep, str(pacs.config_file)])
    serve = subprocess.Popen([str(exe), "-c", sleep, "serve"])
    other = subprocess.Popen([sys.executable, "-c", sleep, "serve"])
    try:
        pacs.pid_file.write_text(f"{orthanc.pid}\n")
        (data / "gateway.pid").write_text(str(serve.pid))
        assert pacs.pid() == orthanc.pid and gateway_pid(data) == serve.pid
        pacs.pid_file.write_text(str(other.pid))  # a PID now another program's
        (data / "gateway.pid").write_text(str(other.pid))
        assert pacs.pid() is None and gateway_pid(data) is None
        (data / "gateway.pid").write_text("not a pid")
        assert gateway_pid(data) is None
        serve.send_signal(signal.SIGKILL)  # dead, not reaped yet: a zombie
        (data / "gateway.pid").write_text(str(serve.pid))
        until = time.monotonic() + 10
        while gateway_pid(data) is not None and time.monotonic() < until:
            time.sleep(0.05)
        assert gateway_pid(data) is None
    finally:
        for p in (orthanc, serve, other):
            p.kill()
            p.wait()


def test_a_restart_undoes_only_what_an_interrupted_association_left_staged(tmp_path: Path) -> None:
    """The forwarder's journal names each instance new to Orthanc with its staged file: a
    restart deletes those still staged (the association never committed them), never one
    moved into the spool (a committed association whose staging folder outlived its commit,
    as when a late journal line kept rmtree from removing it: the demo lost 69 instances)."""
    from gateway.forward import FORWARD_JOURNAL, Forwarder

    deleted: list[str] = []
    fwd = Forwarder(lambda data: ("x", True), deleted.append, threads=1)
    staging = tmp_path / "incoming" / "a1"
    (staging / "st" / "se").mkdir(parents=True)
    (staging / "st" / "se" / "0.dcm").write_bytes(b"staged")  # never committed
    committed, staged = (
        "0" * 8 + "-" + "-".join(["1" * 8] * 4),
        "2" * 8 + "-" + "-".join(["3" * 8] * 4),
    )
    (staging / FORWARD_JOURNAL).write_text(
        f"{committed} st/se/1.dcm\n{staged} st/se/0.dcm\n{staged[:20]}\nnot-an-id ../../x\n"
    )
    try:
        assert fwd.undo_journal(staging) == 1
        assert deleted == [staged]
    finally:
        fwd.close()
