"""Re-issue attaches the VERIFIED SR to the evidence recorded at write-back (the study's one
index, ``evidence.json`` in the report bundle), not to headers read again from the PACS: against
a real Orthanc, the VERIFIED SR references exactly the instances (and carries exactly the
patient and study attributes) the UNVERIFIED one did, no source header is asked of Orthanc, and
a case whose source series are no longer in the PACS is still re-issued. The evidence file is
hostile input (it lives on disk): anything but a bounded list of DICOM JSON objects is refused
with ``NoEvidenceError`` naming the file."""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pydicom
import pytest
from dciodvfy import assert_dciodvfy_clean
from fastapi.testclient import TestClient
from orthanc_fixture import OrthancServer
from pydicom.dataset import Dataset
from pydicom.uid import generate_uid
from report_fixtures import GOOD, build_run
from review_server import bearer, build_context, instances

from dicom import index_path
from evaluation.answers import DifferentialItem
from evaluation.log import RunData
from evaluation.reports import write_report
from evaluation.review import report_blocks, unverified_content
from evaluation.review.sr_content import ReportContent
from gateway.api import GatewayContext, create_app
from gateway.sr import build_sr, series_uid_for
from gateway.writeback import (
    EVIDENCE_FILE,
    MAX_EVIDENCE_BYTES,
    MAX_EVIDENCE_ITEMS,
    NoEvidenceError,
    evidence,
    load_evidence,
    save_evidence,
)

API = "/review/api/runs"


@dataclass
class World:
    ctx: GatewayContext
    client: TestClient
    run: RunData  # the three-case run of the report tests
    src: Path  # its synthetic study (FLAIR + T2, six slices each)
    work: Path


@dataclass
class Published:
    """One case as the pipeline leaves it: study written back, bundle with its evidence."""

    report: str  # the bundle's folder name under the reports root
    study_uid: str
    headers: list[Dataset]  # the evidence the UNVERIFIED SRs were built from
    unverified: dict[str, str] = field(default_factory=dict)  # model -> SR SOP Instance UID


@pytest.fixture(scope="module")
def world(orthanc_server: OrthancServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:  # fmt: skip
    tmp = tmp_path_factory.mktemp("reissue-evidence")
    ep = orthanc_server.endpoints
    ctx = build_context(tmp / "data", ep.orthanc_url, (ep.username, orthanc_server.password),
                        verifying_organization="Test Hospital")  # fmt: skip
    run = build_run(tmp / "src")
    with TestClient(create_app(ctx)) as client:
        yield World(ctx, client, run, tmp / "src" / "dicom", tmp)


def _upload(ctx: GatewayContext, ds: Dataset) -> None:
    buf = io.BytesIO()
    pydicom.dcmwrite(buf, ds, enforce_file_format=True)
    ctx.orthanc.upload(buf.getvalue())


def _spool(src: Path, spool: Path, study_uid: str) -> dict[str, str]:
    """A copy of the study in ``src`` with its own UIDs, spooled as the DICOM node does (a folder
    per series, files named by SOP Instance UID); returns old -> new SeriesInstanceUID."""
    series: dict[str, str] = {}
    for f in sorted(src.glob("*.dcm")):
        ds = pydicom.dcmread(f)
        ds.StudyInstanceUID = study_uid
        series.setdefault(ds.SeriesInstanceUID, generate_uid())
        ds.SeriesInstanceUID = series[ds.SeriesInstanceUID]
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
        path = spool / ds.SeriesInstanceUID / f"{ds.SOPInstanceUID}.dcm"
        path.parent.mkdir(parents=True, exist_ok=True)
        ds.save_as(path, enforce_file_format=True)
    return series


def _publish(w: World, case_id: str, report: str, *, source_in_pacs: bool) -> Published:
    """A copy of the study spooled and indexed once; the UNVERIFIED SRs built from that index's
    evidence go to Orthanc, the evidence into the report bundle (what the pipeline does)."""
    study_uid = generate_uid()
    spool = w.work / report / "study"
    series = _spool(w.src, spool, study_uid)
    if source_in_pacs:
        for f in sorted(spool.rglob("*.dcm")):
            w.ctx.orthanc.upload(f.read_bytes())
    headers = evidence(index_path(spool, workers=1, keep_headers=True), series.values())
    assert len({str(h.SeriesInstanceUID) for h in headers}) == 2  # FLAIR and T2
    out = Published(report, study_uid, headers)
    case = w.run.case(case_id)
    case = case.model_copy(update={
        "provenance": case.provenance.model_copy(update={"study_uids": [study_uid]}),
        "images": [i.model_copy(update={"series_uid": series.get(i.series_uid or "", i.series_uid)})
                   for i in case.images],
    })  # fmt: skip
    for block in report_blocks(w.run.samples_of(case_id)):
        sr = build_sr(headers, unverified_content(block), block.model, "test", 1)
        _upload(w.ctx, sr)
        out.unverified[block.model] = str(sr.SOPInstanceUID)
    run = w.run.model_copy(update={
        "run_id": report,
        "cases": [case],
        "samples": w.run.samples_of(case_id),
        "config": {**w.run.config, "gateway": {"run_id": report, "unverified_sr": out.unverified}},
    })  # fmt: skip
    bundle = w.ctx.settings.data_dir / "reports" / report
    write_report(run, bundle, pdf=False)
    save_evidence(headers, bundle)
    return out


def _sign_off_and_reissue(w: World, report: str, slug: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    auth = bearer(w.ctx, f"Dr {report}", "Verify^Dana")
    url = f"{API}/{report}/cases/{slug}"
    for b in w.client.get(url, headers=auth).json()["blocks"]:
        r = w.client.post(f"{url}/accept-remaining", headers=auth, json={"model": b["model"]})
        assert r.status_code == 200, r.text
    digest = w.client.get(f"{url}/signoff", headers=auth).json()["digest"]
    assert w.client.post(f"{url}/signoff", headers=auth, json={"digest": digest}).status_code == 200
    r = w.client.post(f"{url}/reissue", headers=auth)
    return r.status_code, r.json()


def _referenced(sr: Dataset) -> set[tuple[str, str]]:
    """(series, SOP instance) of every instance an SR names as its evidence."""
    return {
        (str(s.SeriesInstanceUID), str(r.ReferencedSOPInstanceUID))
        for e in sr.CurrentRequestedProcedureEvidenceSequence
        for s in e.ReferencedSeriesSequence
        for r in s.ReferencedSOPSequence
    }


PATIENT_STUDY = ("PatientName", "PatientID", "PatientBirthDate", "PatientSex", "StudyInstanceUID",
                 "AccessionNumber", "StudyID", "StudyDate", "StudyTime")  # fmt: skip


def _spy_source_headers(w: World, monkeypatch: pytest.MonkeyPatch, study_uid: str) -> list[str]:
    """Series whose headers re-issue asks of Orthanc, other than NeuroSandbox's own SR series."""
    ours = {series_uid_for(study_uid, k) for k in ("sr", "sr-verified")}
    asked: list[str] = []
    real = w.ctx.orthanc.series_metadata

    def spy(study: str, series: str) -> list[Dataset]:
        if series not in ours:
            asked.append(series)
        return real(study, series)

    monkeypatch.setattr(w.ctx.orthanc, "series_metadata", spy)
    return asked


@pytest.mark.integration
def test_the_verified_sr_carries_the_evidence_recorded_at_write_back(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both evaluated series, every instance: what the UNVERIFIED SR named, not one series'
    headers read again from Orthanc."""
    case = _publish(world, "ms-1", "run-evidence", source_in_pacs=True)
    recorded = load_evidence(world.ctx.settings.data_dir / "reports" / case.report)
    asked = _spy_source_headers(world, monkeypatch, case.study_uid)
    status, body = _sign_off_and_reissue(world, case.report, "ms-1")
    assert status == 200, body
    assert asked == [], "re-issue read source headers from Orthanc"
    srs = instances(world.ctx, case.study_uid, body["sr_sop_instance_uids"])
    assert len(srs) == 2
    unverified = instances(world.ctx, case.study_uid, list(case.unverified.values()))
    expected = {(str(h.SeriesInstanceUID), str(h.SOPInstanceUID)) for h in recorded}
    assert len(expected) == 12  # two series of six slices
    for sr in srs:
        assert sr.VerificationFlag == "VERIFIED"
        assert _referenced(sr) == expected
        assert all(_referenced(u) == expected for u in unverified)
        for kw in PATIENT_STUDY:
            assert str(sr.get(kw, "")) == str(recorded[0].get(kw, "")), kw
        assert_dciodvfy_clean(sr)
        named = {
            str(r.ReferencedSOPInstanceUID)
            for p in sr.PredecessorDocumentsSequence
            for s in p.ReferencedSeriesSequence
            for r in s.ReferencedSOPSequence
        }
        assert named & set(case.unverified.values())
    (pdf,) = instances(world.ctx, case.study_uid, [body["pdf_sop_instance_uid"]])
    for kw in PATIENT_STUDY:
        assert str(pdf.get(kw, "")) == str(recorded[0].get(kw, "")), kw


@pytest.mark.integration
def test_a_case_whose_source_series_left_the_pacs_is_still_reissued(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the UNVERIFIED SRs are in the PACS (the images were routed on, or deleted): the
    recorded evidence is enough, and the VERIFIED SR references the same instances."""
    case = _publish(world, "normal-1", "run-gone", source_in_pacs=False)
    asked = _spy_source_headers(world, monkeypatch, case.study_uid)
    status, body = _sign_off_and_reissue(world, case.report, "normal-1")
    assert status == 200, body
    assert asked == []
    srs = instances(world.ctx, case.study_uid, body["sr_sop_instance_uids"])
    expected = {(str(h.SeriesInstanceUID), str(h.SOPInstanceUID)) for h in case.headers}
    assert srs and all(_referenced(sr) == expected for sr in srs)
    assert all(str(sr.PatientID) == str(case.headers[0].PatientID) for sr in srs)


@pytest.mark.integration
def test_a_bundle_with_an_unreadable_evidence_file_is_refused_not_read_from_pacs(
    world: World,
) -> None:
    case = _publish(world, "stroke-1", "run-garbage", source_in_pacs=True)
    (world.ctx.settings.data_dir / "reports" / case.report / EVIDENCE_FILE).write_text("{oops")
    status, body = _sign_off_and_reissue(world, case.report, "stroke-1")
    assert status == 409
    assert EVIDENCE_FILE in body["detail"]


# ------------------------------------------------------------------- the file itself


def _headers(tmp: Path) -> list[Dataset]:
    from gateway_synth import make_study

    make_study(tmp / "src", n_slices=3, size=16)
    _spool(tmp / "src", tmp / "study", generate_uid())
    return evidence(index_path(tmp / "study", workers=1, keep_headers=True), [])


@pytest.mark.parametrize("study", ["uih_umr770", "brainix"])
def test_evidence_names_each_instance_by_its_own_uids_whatever_its_file_is_called(
    corpus: Path, study: str
) -> None:
    """Real studies whose files are not named by SOP Instance UID (United Imaging's 00000001.dcm
    reads as a UID; BRAINIX's names do not): the SR's evidence names every indexed instance by
    the UIDs its header carries, nothing else."""
    folder = corpus / study
    index = index_path(folder, workers=1, keep_headers=True)
    truth = {}  # SOP Instance UID -> (series, SOP class), from each file's own header
    for s in index.series:
        for f in {f.path for v in s.volumes for f in v}:
            ds = pydicom.dcmread(f, stop_before_pixels=True)
            truth[str(ds.SOPInstanceUID)] = (str(ds.SeriesInstanceUID), str(ds.SOPClassUID))
    headers = evidence(index, [])
    named = {str(h.SOPInstanceUID): (str(h.SeriesInstanceUID), str(h.SOPClassUID)) for h in headers}
    assert len(truth) > 1 and named == truth
    assert len(headers) == len(truth)  # each instance once


def test_evidence_round_trip_keeps_what_the_sr_needs_and_drops_bulk_data(tmp_path: Path) -> None:
    headers = _headers(tmp_path)
    first = headers[0]
    first.PixelData = b"\0" * 512
    first.add_new(0x00291010, "OB", b"\1" * 100_000)  # a private binary header (CSA-like)
    first.add_new(0x00291011, "OB", b"\1\2")  # small: kept
    first.ImageComments = "x" * 5_000  # text over the bound
    item = Dataset()
    item.CodeValue, item.CodeMeaning = "1", "one"
    first.ProcedureCodeSequence = [item]
    path = save_evidence(headers, tmp_path / "bundle")
    assert path == tmp_path / "bundle" / EVIDENCE_FILE
    assert path.stat().st_size < 20_000
    assert not list((tmp_path / "bundle").glob(".*"))  # no temporary file left
    loaded = load_evidence(tmp_path / "bundle")
    assert len(loaded) == len(headers) == 6
    for a, b in zip(headers, loaded, strict=True):
        for kw in ("SOPClassUID", "SOPInstanceUID", "SeriesInstanceUID", "StudyInstanceUID"):
            assert str(a[kw].value) == str(b[kw].value)
    got = loaded[0]
    for kw in (*PATIENT_STUDY, "Modality", "SeriesDescription", "SpecificCharacterSet"):
        assert str(got.get(kw, "")) == str(first.get(kw, "")), kw
    assert "PixelData" not in got and 0x00291010 not in got and "ImageComments" not in got
    assert got[0x00291011].value == b"\1\2"
    assert got.ProcedureCodeSequence[0].CodeMeaning == "one"
    # the SR built from the file references what the one built from the index does
    content = ReportContent(final_diagnoses=[DifferentialItem(diagnosis="Multiple sclerosis")])
    a = build_sr(headers, content, GOOD, "1", 1)
    b = build_sr(loaded, content, GOOD, "1", 1)
    assert _referenced(a) == _referenced(b)
    assert all(str(a.get(kw, "")) == str(b.get(kw, "")) for kw in PATIENT_STUDY)


def _item(sop: str = "1.2.3.4") -> dict[str, object]:
    return {
        "00080016": {"vr": "UI", "Value": ["1.2.840.10008.5.1.4.1.1.4"]},
        "00080018": {"vr": "UI", "Value": [sop]},
        "0020000D": {"vr": "UI", "Value": ["1.2.3"]},
        "0020000E": {"vr": "UI", "Value": ["1.2.3.1"]},
    }


def _with(tag: str, vr: str, value: object) -> list[dict[str, object]]:
    return [{**_item(), tag: {"vr": vr, "Value": [value]}}]


HOSTILE: dict[str, bytes | object] = {  # bytes as written, anything else as its JSON
    "an object, not a list": {"0": _item()},
    "a list of numbers": [1, 2, 3],
    "an empty list": [],
    "garbage bytes": b"\xff\xfe\x00garbage",
    "truncated JSON": b'[{"00080018": {"vr": "UI", "Val',
    "nested beyond recursion": b"[" * 200_000 + b"]" * 200_000,
    "too many items": [_item(f"1.2.3.{i}") for i in range(MAX_EVIDENCE_ITEMS + 1)],
    "an unknown VR": _with("00100010", "XX", "1"),
    "a value of the wrong type": _with("00280010", "US", {"a": 1}),
    "a UID that is not one": _with("00080018", "UI", "../x"),
    "no SOP Instance UID": [{k: v for k, v in _item().items() if k != "00080018"}],
    "two studies": [_item(), _with("0020000D", "UI", "9.9")[0]],
}


@pytest.mark.parametrize("what", list(HOSTILE))
def test_a_hostile_evidence_file_is_refused(tmp_path: Path, what: str) -> None:
    content = HOSTILE[what]
    raw = content if isinstance(content, bytes) else json.dumps(content).encode()
    (tmp_path / EVIDENCE_FILE).write_bytes(raw)
    with pytest.raises(NoEvidenceError, match=EVIDENCE_FILE.replace(".", r"\.")):
        load_evidence(tmp_path)


def test_an_evidence_file_over_the_size_bound_is_refused_unread(tmp_path: Path) -> None:
    with (tmp_path / EVIDENCE_FILE).open("wb") as fh:
        fh.truncate(MAX_EVIDENCE_BYTES + 1)  # sparse: no disk used
    with pytest.raises(NoEvidenceError, match="MiB"):
        load_evidence(tmp_path)


def test_a_missing_or_unreadable_evidence_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(NoEvidenceError, match=EVIDENCE_FILE.replace(".", r"\.")):
        load_evidence(tmp_path)
    (tmp_path / EVIDENCE_FILE).mkdir()
    with pytest.raises(NoEvidenceError, match=EVIDENCE_FILE.replace(".", r"\.")):
        load_evidence(tmp_path)
    shutil.rmtree(tmp_path / EVIDENCE_FILE)


def test_a_case_naming_two_studies_takes_the_evidence_of_the_one_written_back(
    tmp_path: Path,
) -> None:
    """A registered case may name a baseline and a follow-up study; the gateway evaluates and
    writes back to the one it received (the follow-up here): its evidence is the case's."""
    from evaluation import Case, Provenance
    from gateway.review.reissue import ReissueError, _recorded_headers

    headers = _headers(tmp_path)
    received = str(headers[0].StudyInstanceUID)
    save_evidence(headers, tmp_path / "bundle")
    case = Case(
        case_id="stroke-1",
        provenance=Provenance(source="gateway", study_uids=["1.2.3.9", received]),
    )
    got = _recorded_headers(tmp_path / "bundle", case)
    assert str(got[0].StudyInstanceUID) == received
    stranger = Case(
        case_id="other", provenance=Provenance(source="gateway", study_uids=["1.2.3.9"])
    )
    with pytest.raises(ReissueError, match="not of a study the case names"):
        _recorded_headers(tmp_path / "bundle", stranger)


def test_an_evidence_file_that_is_a_named_pipe_is_refused_unopened(tmp_path: Path) -> None:
    (tmp_path / "bundle").mkdir()
    os.mkfifo(tmp_path / "bundle" / EVIDENCE_FILE)  # opening it would block forever
    with pytest.raises(NoEvidenceError, match="named pipe"):
        load_evidence(tmp_path / "bundle")
