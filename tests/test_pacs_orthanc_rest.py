"""An Orthanc as a PacsClient (gateway/pacs/orthanc_rest.py), against a real Orthanc."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path

import pydicom
import pytest
from pydicom.uid import generate_uid

from gateway.orthanc import OrthancClient
from gateway.pacs import StudyMatch, StudyQuery
from gateway.pacs.orthanc_rest import OrthancRestClient
from tests.gateway_synth import make_study
from tests.orthanc_fixture import OrthancServer, orthanc_server  # noqa: F401

pytestmark = pytest.mark.usefixtures("orthanc_server")


@pytest.fixture(scope="module")
def loaded(orthanc_server: OrthancServer, tmp_path_factory: pytest.TempPathFactory):  # noqa: F811
    """Two studies of two patients, and a third patient's file under the first study's UID."""
    ep = orthanc_server.endpoints
    orthanc = OrthancClient(ep.orthanc_url, ep.username, orthanc_server.password, timeout_s=60)
    tag = uuid.uuid4().hex[:8].upper()
    root = tmp_path_factory.mktemp("rest")
    a = make_study(root / "a", classes=("FLAIR",), n_slices=3, patient_id=f"A{tag}")
    b = make_study(root / "b", classes=("T2",), n_slices=2, patient_id=f"B{tag}")
    c = make_study(root / "c", classes=("T1",), n_slices=1, patient_id=f"C{tag}",
                   study_uid=a.study_uid)  # fmt: skip
    for study, acc, date, desc in (
        (a, f"A{tag}", "20240305", "MRI Head w/o"),
        (b, f"B{tag}", "20240412", "MR SPINE"),
        (c, f"C{tag}", "20240305", "MRI Head w/o"),
    ):
        for f in study.files:
            ds = pydicom.dcmread(f)
            ds.AccessionNumber, ds.StudyDate, ds.StudyDescription = acc, date, desc
            ds.save_as(f)
            orthanc.upload(f)
    client = OrthancRestClient("research", orthanc)
    yield client, tag, a, b
    client.close()


def test_found_by_accession_patient_date_and_description(loaded) -> None:
    client, tag, a, _ = loaded
    (m,) = client.find_studies(StudyQuery(accession_numbers=[f"A{tag}"]))
    assert (m.study_uid, m.patient_id, m.accession) == (a.study_uid, f"A{tag}", f"A{tag}")
    assert m.modalities == ["MR"] and m.n_series == 1 and m.n_instances == 3
    assert m.study_date == dt.date(2024, 3, 5) and m.description == "MRI Head w/o"
    both = client.find_studies(StudyQuery(patient_ids=[f"A{tag}", f"B{tag}"]))
    assert {x.patient_id for x in both} == {f"A{tag}", f"B{tag}"}
    # one UID, two patients: two studies, never one
    same_uid = client.find_studies(StudyQuery(study_uids=[a.study_uid]))
    assert sorted(x.patient_id for x in same_uid) == [f"A{tag}", f"C{tag}"]
    march = client.find_studies(
        StudyQuery(
            patient_ids=[f"A{tag}", f"B{tag}"],
            date_from=dt.date(2024, 3, 1),
            date_to=dt.date(2024, 3, 31),
            description="mri head*",
        )
    )
    assert [x.patient_id for x in march] == [f"A{tag}"]
    assert client.find_studies(StudyQuery(accession_numbers=[f"A{tag}"], modalities=["CT"])) == []


def test_a_pulled_study_is_the_patients_only(loaded, tmp_path: Path) -> None:
    client, tag, a, _ = loaded
    (m,) = client.find_studies(StudyQuery(accession_numbers=[f"A{tag}"]))
    seen: list[tuple[int, int | None]] = []
    got = client.retrieve(m, tmp_path / "pulled", lambda done, total: seen.append((done, total)))
    assert got.n_files == 3 and not got.failed and not got.rejected
    assert seen[-1] == (3, 3)
    uids = {str(pydicom.dcmread(p).PatientID) for p in (tmp_path / "pulled").iterdir()}
    assert uids == {f"A{tag}"}  # patient C's file under the same UID did not come along
    # a match whose patient the archive does not hold under that UID is refused by name
    wrong = StudyMatch(pacs="research", study_uid=a.study_uid, patient_id="NOBODY")
    with pytest.raises(Exception, match="research"):
        client.retrieve(wrong, tmp_path / "none")


def test_a_stored_object_is_found_again(loaded, tmp_path: Path) -> None:
    client, tag, _, b = loaded
    ds = pydicom.dcmread(b.files[0])
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.SeriesInstanceUID = generate_uid()
    (res,) = client.store([ds])
    assert res.stored and res.sop_instance_uid == ds.SOPInstanceUID
    (m,) = client.find_studies(StudyQuery(accession_numbers=[f"B{tag}"]))
    assert m.n_series == 2 and m.n_instances == 3
