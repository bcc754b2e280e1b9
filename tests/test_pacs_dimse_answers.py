"""What a DICOM archive answers to C-FIND, read by gateway/pacs/dimse.py: answers dcmqrscp and
Orthanc cannot be made to give (they key a patient by its ID alone) come from a scripted archive,
a pynetdicom C-FIND SCP on a loopback port answering what the test says."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from pydicom.dataset import Dataset
from pynetdicom import AE, evt
from pynetdicom.sop_class import (  # type: ignore[attr-defined]
    StudyRootQueryRetrieveInformationModelFind,
)

from gateway.pacs import DimsePacs, PacsRequestError, StudyQuery
from gateway.pacs.dimse import DimseClient
from gateway.pacs_local import free_port

UID = "1.2.826.0.1.3680043.8.498.1"


def _study(issuer: str, n_series: int, **more: str) -> Dataset:
    ds = Dataset()
    ds.QueryRetrieveLevel = "STUDY"
    ds.StudyInstanceUID = UID
    ds.PatientID, ds.IssuerOfPatientID = "P1", issuer
    ds.PatientName, ds.PatientBirthDate, ds.AccessionNumber = "A^B", "19700101", "ACC1"
    ds.StudyDate, ds.ModalitiesInStudy, ds.StudyDescription = "20240101", "MR", "MRI HEAD"
    ds.NumberOfStudyRelatedSeries, ds.NumberOfStudyRelatedInstances = n_series, 10 * n_series
    for k, v in more.items():
        setattr(ds, k, v)
    return ds


@pytest.fixture
def archive() -> Iterator[tuple[int, list[Dataset], list[Dataset]]]:
    """A C-FIND SCP answering the datasets in the list it yields, whatever was asked, and
    the requests it was asked."""
    answers: list[Dataset] = []
    asked: list[Dataset] = []  # the requests received (after the answers, in the same list)

    def on_find(event: Any) -> Iterator[tuple[int | Dataset, Dataset | None]]:
        asked.append(event.identifier)
        for ds in answers:
            if "Status" in ds:  # a final status (with its ErrorComment) the test chose
                yield ds, None
                return
            yield 0xFF00, ds
        yield 0x0000, None

    ae = AE(ae_title="SCRIPTED")
    ae.add_supported_context(StudyRootQueryRetrieveInformationModelFind)
    port = free_port()
    server = ae.start_server(
        ("127.0.0.1", port), block=False, evt_handlers=[(evt.EVT_C_FIND, on_find)]
    )
    try:
        yield port, answers, asked
    finally:
        server.shutdown()


def _client(port: int) -> DimseClient:
    cfg = DimsePacs(kind="dimse", ae_title="SCRIPTED", host="127.0.0.1", port=port, timeout_s=10)
    return DimseClient("scripted", cfg)


def test_one_uid_and_patient_id_under_two_issuers_are_two_studies(archive) -> None:
    port, answers, _ = archive
    answers += [_study("HOSP-A", 1), _study("HOSP-B", 2)]
    found = _client(port).find_studies(StudyQuery(patient_ids=["P1"]))
    assert sorted((m.issuer, m.n_series) for m in found) == [("HOSP-A", 1), ("HOSP-B", 2)]


def test_what_an_archive_returns_is_bounded_and_a_study_without_a_uid_left_out(archive) -> None:
    port, answers, _ = archive
    hostile = _study("", 1, PatientName="X" * 5000 + "\x1b[31m", StudyDescription="MRI\x00HEAD")
    no_uid = _study("", 1)
    no_uid.StudyInstanceUID = "not a uid/../../etc"
    answers += [hostile, no_uid]
    (m,) = _client(port).find_studies(StudyQuery(patient_ids=["P1"]))
    assert m.study_uid == UID and len(m.patient_name) <= 256
    assert all(c.isprintable() for c in m.patient_name + m.description), m


def test_a_failure_status_is_an_error_naming_the_pacs_and_the_status(archive) -> None:
    port, answers, _ = archive
    failure = Dataset()
    failure.Status, failure.ErrorComment = 0xA700, "index full \x1b[2J" + "y" * 1000
    answers += [_study("", 1), failure]
    with pytest.raises(PacsRequestError) as err:
        _client(port).find_studies(StudyQuery(patient_ids=["P1"]))
    text = str(err.value)
    assert text.startswith("PACS 'scripted' (SCRIPTED@127.0.0.1:") and "0xA700" in text, text
    assert "Out of Resources" in text and "index full" in text and len(text) < 600, text
    assert "\x1b" not in text


def test_accession_numbers_and_patient_ids_together_are_not_their_product_of_requests(
    archive,
) -> None:
    """Each listed value is its own C-FIND, but with both lists given only the shorter is asked
    (the other is checked here): 12 accession numbers and 8 patient IDs were 96 requests."""
    port, answers, asked = archive
    answers.append(_study("", 1))
    query = StudyQuery(accession_numbers=["ACC1", *(f"X{i}" for i in range(11))],
                       patient_ids=["P1", *(f"Y{i}" for i in range(7))])  # fmt: skip
    (m,) = _client(port).find_studies(query)
    assert (m.accession, m.patient_id) == ("ACC1", "P1")
    assert len(asked) == 8 and {str(a.PatientID) for a in asked} == set(query.patient_ids)
    assert {str(a.AccessionNumber) for a in asked} == {""}
    answers[0].AccessionNumber = "OTHER"  # the key not asked is still checked here
    assert _client(port).find_studies(query) == []


def test_the_association_sends_each_pdu_at_once(archive) -> None:
    """TCP_NODELAY: a DIMSE message is two PDUs, and Nagle's algorithm held the second until the
    peer's delayed ACK (a C-FIND took twice as long on loopback)."""
    client = _client(archive[0])
    ae = client._ae()
    ae.add_requested_context(StudyRootQueryRetrieveInformationModelFind)
    with client._associate(ae) as assoc:
        sock = assoc.dul.socket.socket  # type: ignore[union-attr]
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
