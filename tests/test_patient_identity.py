"""A UID is not an identity: one patient per study, per series, per case, per cached instance.

Real parts throughout: dcmtk's storescu as the sender, the gateway's DICOM node and pipeline,
a real Orthanc. Each test sends what real archives produce (copies, re-sends, badly
anonymised exports) and checks that no patient's images end up under another patient's
identity, record or SR.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pydicom
import pytest
from gateway_inproc import finished_runs, rules_file, start_gateway
from gateway_process import send
from gateway_synth import SynthStudy, make_study
from orthanc_fixture import OrthancServer

from gateway.orthanc import OrthancClient
from gateway.routing import Route
from gateway.runs import RunRecord, RunStatus
from gateway.serve import Gateway

pytestmark = pytest.mark.integration
QUIET = 1.0


def _gateway(orthanc_server: OrthancServer, data: Path, **extra: object) -> Gateway:
    routing = rules_file(data.parent / "rules.yaml", ["differential"], "r")
    return start_gateway(orthanc_server, data, routing, QUIET, **extra)


def _runs(gw: Gateway, study_uid: str, n: int) -> list[RunRecord]:
    return finished_runs(gw, n, study_uid)


def _srs(client: OrthancClient, study_uid: str) -> dict[str, list[pydicom.Dataset]]:
    """The SR objects in Orthanc under this StudyInstanceUID, by the PatientID they name."""
    out: dict[str, list[pydicom.Dataset]] = {}
    for st in client.studies_by_uid(study_uid):
        for s in client.list_series(st.orthanc_id, classify=False):
            if s.modality != "SR":
                continue
            for key in client.series_instances(s.orthanc_id):
                r = client.api.get(f"{client.url}/instances/{key.instance_id}/file")
                ds = pydicom.dcmread(io.BytesIO(r.content))
                out.setdefault(st.patient_id, []).append(ds)
    return out


def _restamp(study: SynthStudy, folder: Path, **tags: str) -> list[Path]:
    """Copies of a study's files with some header values changed (the UIDs kept)."""
    folder.mkdir(parents=True)
    out = []
    for p in study.files:
        ds = pydicom.dcmread(p)
        for k, v in tags.items():
            setattr(ds, k, v)
        dest = folder / p.name
        ds.save_as(dest)
        out.append(dest)
    return out


def test_two_patients_under_one_study_uid_in_one_association_are_held_never_one_run(
    orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    """Both patients' series arrive in one association: neither part is evaluated, no SR is
    written, and the queue shows each part held with both identities."""
    a = make_study(tmp_path / "a", classes=("FLAIR",), n_slices=4, patient_id="NSBX-ID-A",
                   patient_name="Alpha^Ann")  # fmt: skip
    b = make_study(tmp_path / "b", classes=("T2",), n_slices=4, patient_id="NSBX-ID-B",
                   patient_name="Beta^Bob", study_uid=a.study_uid)  # fmt: skip
    gw = _gateway(orthanc_server, tmp_path / "data")
    try:
        send(gw.scp.port, [*a.files, *b.files])
        runs = _runs(gw, a.study_uid, 2)
        assert sorted(r.status for r in runs) == [RunStatus.HELD, RunStatus.HELD], runs
        for r in runs:
            assert "NSBX-ID-A" in (r.error or "") and "NSBX-ID-B" in (r.error or ""), r.error
            assert any("NSBX-ID-A" in i for i in r.identities)
            assert any("NSBX-ID-B" in i for i in r.identities)
            assert not r.sr_sop_uids and r.pdf_sop_uid is None
        assert _srs(gw.ctx.orthanc, a.study_uid) == {}
        from gateway.review.queue import CaseStatus, failed_rows

        rows = [row for row in failed_rows(gw.ctx.runs) if row.study_uid == a.study_uid]
        assert [row.status for row in rows] == [CaseStatus.HELD, CaseStatus.HELD]
        assert all(len(row.identities) == 2 for row in rows)
    finally:
        gw.stop()


def test_a_second_patient_arriving_later_under_the_uid_is_held_and_the_first_sr_untouched(
    orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    """The other order: the second patient's series come after the first patient's study was
    evaluated. Its part is held; the first patient's SR is not recomputed from both."""
    a = make_study(tmp_path / "a", classes=("FLAIR",), n_slices=4, patient_id="NSBX-LATE-A")
    b = make_study(tmp_path / "b", classes=("T2",), n_slices=4, patient_id="NSBX-LATE-B",
                   study_uid=a.study_uid, first_series_number=7)  # fmt: skip
    gw = _gateway(orthanc_server, tmp_path / "data")
    try:
        send(gw.scp.port, a.files)
        [first] = _runs(gw, a.study_uid, 1)
        assert first.status is RunStatus.DONE, first
        send(gw.scp.port, b.files)
        later, _ = _runs(gw, a.study_uid, 2)
        assert later.status is RunStatus.HELD, later
        assert "NSBX-LATE-A" in (later.error or "")
        srs = _srs(gw.ctx.orthanc, a.study_uid)
        assert list(srs) == ["NSBX-LATE-A"] and len(srs["NSBX-LATE-A"]) == 1
        # the one SR cites only the first patient's series
        cited = {
            item.ReferencedSOPInstanceUID
            for item in srs["NSBX-LATE-A"][0].iterall()
            if item.keyword == "ReferencedSOPSequence"
            for item in item.value
        }
        b_sops = {pydicom.dcmread(p, stop_before_pixels=True).SOPInstanceUID for p in b.files}
        assert cited and not cited & b_sops
    finally:
        gw.stop()


def test_a_series_whose_files_disagree_on_the_birth_date_is_held(
    orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    """One PatientID, but every other file carries another birth date and name: two people
    filed under one ID (a badly merged export). Held, naming both identities."""
    s = make_study(tmp_path / "s", classes=("FLAIR",), n_slices=6, patient_id="NSBX-MERGED")
    for p in s.files[1::2]:
        ds = pydicom.dcmread(p)
        ds.PatientBirthDate, ds.PatientName = "19511224", "Other^Person"
        ds.save_as(p)
    gw = _gateway(orthanc_server, tmp_path / "data")
    try:
        send(gw.scp.port, s.files)
        [run] = _runs(gw, s.study_uid, 1)
        assert run.status is RunStatus.HELD, run
        assert "19511224" in (run.error or "") and "19700101" in (run.error or "")
        assert _srs(gw.ctx.orthanc, s.study_uid) == {}
    finally:
        gw.stop()


def _register(folder: Path, case_id: str, patient_id: str, study_uid: str) -> Path:
    case = {
        "case_id": case_id,
        "patient_id": patient_id,
        "tasks": ["differential"],
        "note": "Registered patient's note: sudden aphasia.",
        "ground_truth": {"final_diagnosis": {"name": "ischaemic stroke"}},
        "provenance": {"source": "hospital", "study_uids": [study_uid]},
    }
    (folder / case_id).mkdir(parents=True)
    (folder / case_id / "case.json").write_text(json.dumps(case))
    return folder


def test_another_patients_study_under_a_registered_case_uid_is_not_that_case(
    orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    """A study stored in Orthanc directly (the Orthanc-triggered path, as an API request) under
    a registered case's UID but of another patient: held, never given the case's record,
    note and truth."""
    s = make_study(tmp_path / "s", classes=("FLAIR",), n_slices=4, patient_id="NSBX-ARRIVING")
    suite = _register(tmp_path / "suite", "case-7", "NSBX-REGISTERED", s.study_uid)
    gw = _gateway(orthanc_server, tmp_path / "data", cases=suite)
    try:
        for p in s.files:
            gw.ctx.orthanc.upload(p)
        sid = gw.ctx.orthanc.find_study_of(s.study_uid, "NSBX-ARRIVING")
        assert sid is not None
        route = Route(rule="api", models=["reference/image-rules"], tasks=["differential"],
                      series_classes=["FLAIR"])  # fmt: skip
        gw.pipeline.request(sid, route)
        [run] = _runs(gw, s.study_uid, 1)
        assert run.status is RunStatus.HELD, run
        assert "case-7" in (run.error or "") and "NSBX-ARRIVING" in (run.error or "")
        assert not (gw.ctx.runs.reports_dir / run.run_id).exists()  # no checklist made
    finally:
        gw.stop()


def test_the_instance_cache_serves_each_study_its_own_pixels_under_reused_sop_uids(
    orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    """Two patients' series with the same SOP (and series) UIDs but other pixels, fetched
    from Orthanc through one cache: each is evaluated on its own bytes."""
    from gateway.cache import InstanceCache

    a = make_study(tmp_path / "a", classes=("FLAIR",), n_slices=3, patient_id="NSBX-CACHE-A")
    b_files = _restamp(a, tmp_path / "b", PatientID="NSBX-CACHE-B", StudyInstanceUID="1.2.3.4.5.77")
    for p in b_files:  # other pixels
        ds = pydicom.dcmread(p)
        arr = ds.pixel_array
        ds.PixelData = (arr[::-1]).tobytes()
        ds.save_as(p)
    ep = orthanc_server.endpoints
    client = OrthancClient(ep.orthanc_url, ep.username, orthanc_server.password, timeout_s=60)
    for p in [*a.files, *b_files]:
        client.upload(p)
    cache = InstanceCache(tmp_path / "cache")
    got = {}
    for pid, uid in (("NSBX-CACHE-A", a.study_uid), ("NSBX-CACHE-B", "1.2.3.4.5.77")):
        sid = client.find_study_of(uid, pid)
        assert sid is not None
        [series] = client.list_series(sid, classify=False)
        files = client.fetch_series(series.orthanc_id, cache, tmp_path / "task" / pid)
        got[pid] = {pydicom.dcmread(f).SOPInstanceUID: pydicom.dcmread(f).PixelData for f in files}
    sent_b = {pydicom.dcmread(p).SOPInstanceUID: pydicom.dcmread(p).PixelData for p in b_files}
    assert got["NSBX-CACHE-B"] == sent_b
    assert got["NSBX-CACHE-A"] != got["NSBX-CACHE-B"]


def test_a_study_stored_in_orthanc_beside_another_patients_under_its_uid_is_held(
    orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    """The Orthanc-triggered path (a StableStudy event): two patients' studies stored in the
    PACS directly under one StudyInstanceUID. Orthanc keeps them apart (PatientID and UID);
    the sandbox evaluates neither as the study of that UID."""
    a = make_study(tmp_path / "a", classes=("FLAIR",), n_slices=3, patient_id="NSBX-PACS-A")
    b = make_study(tmp_path / "b", classes=("FLAIR",), n_slices=3, patient_id="NSBX-PACS-B",
                   study_uid=a.study_uid)  # fmt: skip
    gw = _gateway(orthanc_server, tmp_path / "data")
    try:
        for p in [*a.files, *b.files]:
            gw.ctx.orthanc.upload(p)
        sid = gw.ctx.orthanc.find_study_of(a.study_uid, "NSBX-PACS-B")
        assert sid is not None
        gw.pipeline.on_stable(sid)
        [run] = _runs(gw, a.study_uid, 1)
        assert run.status is RunStatus.HELD, run
        assert "NSBX-PACS-A" in (run.error or "") and "NSBX-PACS-B" in (run.error or "")
        assert _srs(gw.ctx.orthanc, a.study_uid) == {}
    finally:
        gw.stop()


@pytest.mark.corpus
def test_a_real_scanner_series_whose_files_name_two_patients_is_held(
    orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    """The same rule on a real study (BRAINIX, as a scanner wrote it): every other FLAIR file
    re-labelled with another PatientID, as a bad merge of two exports leaves them. The study is
    held naming both IDs; no SR is written."""
    from conftest import corpus_path

    src = sorted((corpus_path() / "brainix" / "BRAINIX" / "DICOM" / "FLAIR").glob("*.dcm"))
    assert src, "BRAINIX FLAIR missing"
    out = tmp_path / "flair"
    out.mkdir()
    # under a StudyInstanceUID of its own: the session's PACS must not end up holding another
    # patient under the real BRAINIX study's UID (the other tests send that study as it is)
    study_uid = pydicom.uid.generate_uid()
    for i, p in enumerate(src):
        ds = pydicom.dcmread(p)
        ds.StudyInstanceUID = study_uid
        if i % 2:
            ds.PatientID = "OTHER-PATIENT-7"
        ds.save_as(out / p.name)
    first = pydicom.dcmread(out / src[0].name, stop_before_pixels=True)
    gw = _gateway(orthanc_server, tmp_path / "data")
    try:
        send(gw.scp.port, sorted(out.glob("*.dcm")))
        runs = _runs(gw, str(first.StudyInstanceUID), 2)
        assert {r.status for r in runs} == {RunStatus.HELD}, runs
        assert all(
            str(first.PatientID) in (r.error or "") and "OTHER-PATIENT-7" in (r.error or "")
            for r in runs
        )
        assert _srs(gw.ctx.orthanc, str(first.StudyInstanceUID)) == {}
    finally:
        gw.stop()


def test_each_series_is_classified_from_its_own_patients_headers(
    orthanc_server: OrthancServer, tmp_path: Path
) -> None:
    """Another patient's study in the PACS holds a series under the same SeriesInstanceUID
    (another study UID, other headers): each study's series is classified from its own
    instances (Orthanc's ids, which name the patient), never found by its UIDs alone
    (DICOMweb answered "inexistent series", or the other patient's headers)."""
    a = make_study(tmp_path / "a", classes=("FLAIR",), n_slices=3, patient_id="NSBX-CLS-A")
    b = make_study(tmp_path / "b", classes=("T1",), n_slices=3, patient_id="NSBX-CLS-B")
    b_files = _restamp(b, tmp_path / "b2", SeriesInstanceUID=a.series_uids["FLAIR"])
    ep = orthanc_server.endpoints
    client = OrthancClient(ep.orthanc_url, ep.username, orthanc_server.password, timeout_s=60)
    for p in [*b_files, *a.files]:  # the other patient's first
        client.upload(p)
    for pid, uid, cls in (("NSBX-CLS-A", a.study_uid, "FLAIR"), ("NSBX-CLS-B", b.study_uid, "T1")):
        sid = client.find_study_of(uid, pid)
        assert sid is not None
        [series] = client.list_series(sid)
        assert series.series_uid == a.series_uids["FLAIR"]
        assert series.series_class == cls, (pid, series)
