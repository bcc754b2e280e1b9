"""DICOM objects written back into the source study: a TID 1500 SR and an Encapsulated PDF.

Both carry the source study's patient and study modules, are marked UNVERIFIED (the SR by its
VerificationFlag; the PDF by the same attribute as a standard extension and in its title)
and live in one series per kind, so a re-evaluation adds a new instance (a new version, the SR
naming its predecessor) next to the old one. ``verify_sr`` makes the signed (VERIFIED) version.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path

import highdicom as hd
import pydicom
from highdicom.sr import (
    AlgorithmIdentification,
    CodedConcept,
    Comprehensive3DSR,
    DeviceObserverIdentifyingAttributes,
    FindingSite,
    MeasurementReport,
    MeasurementsAndQualitativeEvaluations,
    ObservationContext,
    ObserverContext,
    QualitativeEvaluation,
    TrackingIdentifier,
)
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.sequence import Sequence as DicomSequence
from pydicom.sr.codedict import codes
from pydicom.tag import Tag
from pydicom.uid import UID, ExplicitVRLittleEndian, generate_uid

from evaluation import Answer, Finding, TaskFamily
from gateway.cache import InvalidUIDError, check_uid

ENCAPSULATED_PDF_STORAGE = "1.2.840.10008.5.1.4.1.1.104.1"
MANUFACTURER = "NeuroSandbox"
LOCAL_SCHEME = "99NEUROSANDBOX"
DIAGNOSIS = CodedConcept("439401001", "SCT", "Diagnosis")
DEVICE_UID = generate_uid(entropy_srcs=["neurosandbox-device"])

# The atlas regions of evaluation.case.REGIONS; SNOMED CT where the code is in pydicom's
# dictionary, a local code otherwise (never a guessed SNOMED code).
_REGION_CODES: dict[str, tuple[str, str, str]] = {
    "frontal": ("83251001", "SCT", "Frontal lobe"),
    "parietal": ("16630005", "SCT", "Parietal lobe"),
    "temporal": ("78277001", "SCT", "Temporal lobe"),
    "occipital": ("31065004", "SCT", "Occipital lobe"),
    "insula": ("36169008", "SCT", "Insula"),
    "thalamus": ("42695009", "SCT", "Thalamus"),
    "internal capsule": ("85637007", "SCT", "Internal capsule"),
    "corpus callosum": ("88442005", "SCT", "Corpus callosum"),
    "periventricular white matter": ("68523003", "SCT", "Cerebral white matter"),
    "brainstem": ("119238007", "SCT", "Brain stem"),
    "cerebellum": ("113305005", "SCT", "Cerebellum"),
    "extra-axial": ("1231004", "SCT", "Meninges"),
}
_LATERALITY = {
    "left": codes.SCT.Left,
    "right": codes.SCT.Right,
    "bilateral": codes.SCT.Bilateral,
}
# Attributes highdicom reads from the first evidence dataset; missing ones become empty.
_PATIENT_STUDY = (
    "PatientName",
    "PatientID",
    "PatientBirthDate",
    "PatientSex",
    "AccessionNumber",
    "StudyID",
    "StudyDate",
    "StudyTime",
    "ReferringPhysicianName",
)


class ReportBuildError(ValueError):
    """The SR or PDF could not be built from the given study headers."""


def series_uid_for(study_uid: str, kind: str) -> str:
    """One stable series per study and kind ("sr", "pdf"), so versions stay together."""
    return generate_uid(entropy_srcs=[study_uid, f"neurosandbox-{kind}"])


def _local_code(text: str) -> CodedConcept:
    value = "N" + hashlib.sha256(text.lower().encode()).hexdigest()[:12].upper()
    return CodedConcept(value, LOCAL_SCHEME, text.strip()[:64] or "unspecified")


def region_code(region: str | None) -> CodedConcept:
    if not region:
        return CodedConcept("12738006", "SCT", "Brain")
    hit = _REGION_CODES.get(region.strip().lower())
    return CodedConcept(*hit) if hit else _local_code(region)


def diagnosis_code(answer: Answer) -> CodedConcept | None:
    """The final diagnosis coded: ICD-10 when the answer gives one, else a local code."""
    if not answer.final_diagnosis:
        return None
    name = answer.final_diagnosis.strip()
    icd = next(
        (
            d.icd10
            for d in answer.differential
            if d.icd10 and d.diagnosis.strip().lower() == name.lower()
        ),
        None,
    )
    if icd and len(icd) <= 16:
        return CodedConcept(icd.strip().upper(), "I10", name[:64])
    return _local_code(name)


def _finding_group(
    n: int, f: Finding | None, algorithm: AlgorithmIdentification
) -> MeasurementsAndQualitativeEvaluations:
    present = f is not None
    lat = _LATERALITY.get((f.hemisphere or "").strip().lower()) if f else None
    site = FindingSite(region_code(f.region if f else None), laterality=lat)
    return MeasurementsAndQualitativeEvaluations(
        tracking_identifier=TrackingIdentifier(uid=generate_uid(), identifier=f"finding {n}"),
        finding_type=codes.SCT.Lesion,
        finding_sites=[site],
        algorithm_id=algorithm,
        qualitative_evaluations=[
            QualitativeEvaluation(
                codes.DCM.PresenceOfProperty, codes.DCM.Present if present else codes.DCM.Absent
            )
        ],
    )


_EVIDENCE_KEYWORDS = (
    "SpecificCharacterSet",
    "SOPClassUID",
    "SOPInstanceUID",
    "SeriesInstanceUID",
    "StudyInstanceUID",
    *_PATIENT_STUDY,
)
_EVIDENCE_TAGS = tuple(Tag(kw) for kw in _EVIDENCE_KEYWORDS)


def _evidence(source: Sequence[Dataset]) -> list[Dataset]:
    """The few attributes highdicom needs of each source instance (elements shared, not copied:
    a study has hundreds of instances, and per-attribute assignment re-validates each value)."""
    out = []
    for ds in source:
        e = Dataset()
        for kw, tag in zip(_EVIDENCE_KEYWORDS, _EVIDENCE_TAGS, strict=True):
            elem = ds.get(tag)
            if kw == "SpecificCharacterSet" and (elem is None or not elem.value):
                continue  # empty = default repertoire; highdicom rejects an empty value
            if elem is not None:
                e[tag] = elem
            elif kw in _PATIENT_STUDY:
                setattr(e, kw, "" if kw != "PatientName" else None)
        out.append(e)
    return out


def build_sr(
    source: Sequence[Dataset],
    answer: Answer,
    model_name: str,
    model_version: str,
    instance_number: int,
    previous: Sequence[Dataset] = (),
    modality: str = "MR",
) -> Dataset:
    """A Comprehensive 3D SR (TID 1500) of one model's answer; UNVERIFIED, PRELIMINARY."""
    if not source:
        raise ReportBuildError("no source instance headers: cannot build an SR for the study")
    evidence = _evidence(source)
    study_uid = str(evidence[0].StudyInstanceUID)
    algorithm = AlgorithmIdentification(name=model_name[:64], version=model_version[:64])
    groups = [_finding_group(i + 1, f, algorithm) for i, f in enumerate(answer.findings)]
    if not groups:
        groups = [_finding_group(1, None, algorithm)]
    dx = diagnosis_code(answer)
    if dx is not None:
        groups.append(
            MeasurementsAndQualitativeEvaluations(
                tracking_identifier=TrackingIdentifier(uid=generate_uid(), identifier="diagnosis"),
                finding_type=DIAGNOSIS,
                finding_sites=[FindingSite(region_code(None))],
                algorithm_id=algorithm,
                qualitative_evaluations=[QualitativeEvaluation(DIAGNOSIS, dx)],
            )
        )
    observer = ObserverContext(
        observer_type=codes.DCM.Device,
        observer_identifying_attributes=DeviceObserverIdentifyingAttributes(
            uid=DEVICE_UID,
            name=MANUFACTURER,
            manufacturer_name=MANUFACTURER,
            model_name=model_name[:64],
        ),
    )
    procedure = (
        codes.SCT.ComputedTomographyOfHead if modality == "CT" else codes.SCT.ImagingProcedure
    )
    report = MeasurementReport(
        observation_context=ObservationContext(observer_device_context=observer),
        procedure_reported=procedure,
        imaging_measurements=groups,
    )
    try:
        sr = Comprehensive3DSR(
            evidence=evidence,
            content=report[0],
            series_instance_uid=series_uid_for(study_uid, "sr"),
            series_number=9901,
            sop_instance_uid=generate_uid(),
            instance_number=instance_number,
            manufacturer=MANUFACTURER,
            is_complete=True,
            is_final=False,
            is_verified=False,
            previous_versions=list(previous) or None,
            series_description="NeuroSandbox AI findings (UNVERIFIED)",
        )
    except (ValueError, TypeError, AttributeError) as exc:
        raise ReportBuildError(f"SR for study could not be built: {exc}") from exc
    return sr


def build_pdf(
    source: Dataset, pdf: bytes, title: str, instance_number: int, unverified: bool = True
) -> Dataset:
    """An Encapsulated PDF instance in the source study (patient and study modules copied)."""
    if not pdf.startswith(b"%PDF"):
        raise ReportBuildError("the checklist is not a PDF document (no %PDF header)")
    now = datetime.now()
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    sop = generate_uid()
    ds.file_meta.MediaStorageSOPClassUID = UID(ENCAPSULATED_PDF_STORAGE)
    ds.file_meta.MediaStorageSOPInstanceUID = sop
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    if source.get("SpecificCharacterSet"):
        ds.SpecificCharacterSet = source.SpecificCharacterSet
    for kw in (*_PATIENT_STUDY, "StudyInstanceUID", "StudyDescription", "IssuerOfPatientID"):
        if kw in source:
            setattr(ds, kw, source.data_element(kw).value)  # type: ignore[union-attr]
        elif kw in _PATIENT_STUDY:
            setattr(ds, kw, None)
    ds.SOPClassUID = ENCAPSULATED_PDF_STORAGE
    ds.SOPInstanceUID = sop
    ds.Modality = "DOC"
    ds.SeriesInstanceUID = series_uid_for(str(source.StudyInstanceUID), "pdf")
    ds.SeriesNumber = 9902
    ds.SeriesDescription = "NeuroSandbox AI checklist (UNVERIFIED)"
    ds.Manufacturer = MANUFACTURER
    ds.ConversionType = "WSD"
    ds.InstanceNumber = instance_number
    ds.ContentDate = now.strftime("%Y%m%d")
    ds.ContentTime = now.strftime("%H%M%S")
    ds.AcquisitionDateTime = now.strftime("%Y%m%d%H%M%S")
    ds.BurnedInAnnotation = "NO"  # the checklist names no patient
    ds.DocumentTitle = (title + (" (UNVERIFIED)" if unverified else ""))[:64]
    ds.ConceptNameCodeSequence = DicomSequence()
    ds.VerificationFlag = "UNVERIFIED" if unverified else "VERIFIED"  # standard extended
    ds.MIMETypeOfEncapsulatedDocument = "application/pdf"
    ds.EncapsulatedDocument = pdf + (b"\0" if len(pdf) % 2 else b"")
    ds.EncapsulatedDocumentLength = len(pdf)
    return ds


def verify_sr(
    sr: Dataset,
    observer_name: str,
    organization: str,
    when: datetime | None = None,
    replaces: Sequence[Dataset] | None = None,
    instance_number: int | None = None,
) -> Dataset:
    """The signed version of an SR: VERIFIED, FINAL, with the verifying observer; new instance
    (numbered ``instance_number``, by default the one after ``sr``'s).

    Its predecessor documents are ``replaces`` (the stored documents it supersedes; empty: none),
    by default ``sr`` itself. ``sr`` is left as it was.
    """
    when = when or datetime.now()
    new = copy.deepcopy(sr)  # Dataset.copy() is shallow: the new UID would also change ``sr``
    new.file_meta = FileMetaDataset(sr.file_meta) if hasattr(sr, "file_meta") else FileMetaDataset()
    new.SOPInstanceUID = generate_uid()
    new.file_meta.MediaStorageSOPInstanceUID = new.SOPInstanceUID
    new.InstanceNumber = (
        instance_number
        if instance_number is not None
        else int(sr.get("InstanceNumber", 1) or 1) + 1
    )
    new.ContentDate = when.strftime("%Y%m%d")
    new.ContentTime = when.strftime("%H%M%S")
    new.VerificationFlag = "VERIFIED"
    new.PreliminaryFlag = "FINAL"
    observer = Dataset()
    observer.VerifyingObserverName = observer_name
    observer.VerifyingOrganization = organization[:64]
    observer.VerificationDateTime = when.strftime("%Y%m%d%H%M%S")
    observer.VerifyingObserverIdentificationCodeSequence = DicomSequence()
    new.VerifyingObserverSequence = DicomSequence([observer])
    earlier = [sr] if replaces is None else list(replaces)
    if "PredecessorDocumentsSequence" in new:
        del new.PredecessorDocumentsSequence
    if earlier:
        new.PredecessorDocumentsSequence = DicomSequence(_references(earlier))
    return Comprehensive3DSR.from_dataset(new, copy=False)


def _references(docs: Sequence[Dataset]) -> list[Dataset]:
    """Hierarchical SOP instance references (study > series > instance) to ``docs``."""
    studies: dict[str, dict[str, list[Dataset]]] = {}
    for doc in docs:
        ref = Dataset()
        ref.ReferencedSOPClassUID = doc.SOPClassUID
        ref.ReferencedSOPInstanceUID = doc.SOPInstanceUID
        series = studies.setdefault(str(doc.StudyInstanceUID), {})
        series.setdefault(str(doc.SeriesInstanceUID), []).append(ref)
    out = []
    for study_uid, by_series in studies.items():
        study = Dataset()
        study.StudyInstanceUID = study_uid
        items = []
        for series_uid, refs in by_series.items():
            item = Dataset()
            item.SeriesInstanceUID = series_uid
            item.ReferencedSOPSequence = DicomSequence(refs)
            items.append(item)
        study.ReferencedSeriesSequence = DicomSequence(items)
        out.append(study)
    return out


def load_sr(ds: Dataset) -> hd.sr.Comprehensive3DSR:
    """Parse an SR dataset with highdicom (raises when it is not a valid Comprehensive 3D SR)."""
    return Comprehensive3DSR.from_dataset(ds)


def merged_answer(answers: Iterable[tuple[TaskFamily, Answer]]) -> Answer | None:
    """One model's answer for its SR (``answers``: its (task, answer) pairs in run order, the
    first of each task counts): the findings from the lesion task, else the first answer's; the
    diagnosis and differential from the differential task, else the first answer's. The
    UNVERIFIED SR written back after a run and the VERIFIED one a clinician re-issues are built
    by this one rule."""
    by_task: dict[TaskFamily, Answer] = {}
    for task, answer in answers:
        by_task.setdefault(task, answer)
    if not by_task:
        return None
    first = next(iter(by_task.values()))
    findings = by_task.get(TaskFamily.LESION, first)
    dx = by_task.get(TaskFamily.DIFFERENTIAL, first)
    return dx.model_copy(update={"findings": findings.findings or dx.findings})


def model_of(sr: Dataset) -> str:
    """The model named in an SR we wrote (Device Observer Model Name)."""
    for item in sr.get("ContentSequence", []):
        name = (
            item.ConceptNameCodeSequence[0].CodeMeaning if "ConceptNameCodeSequence" in item else ""
        )
        if name == "Device Observer Model Name":
            return str(item.get("TextValue", ""))
    return ""


def evidence_from_files(files: list[Path], series: set[str]) -> list[Dataset]:
    """The SR's evidence: one entry per instance of the evaluated series.

    Files sit in ``<SeriesInstanceUID>/<SOPInstanceUID>.dcm`` (spool and task folders alike), so
    only the first file of each series is read (SOP class, patient and study modules); the
    other entries are built from the names. Reading 800 headers would cost seconds.
    """
    by_series: dict[str, list[Path]] = {}
    for p in files:
        by_series.setdefault(p.parent.name, []).append(p)
    out: list[Dataset] = []
    for uid, paths in sorted(by_series.items()):
        if series and uid not in series:
            continue
        first = None
        for p in paths:
            try:
                first = pydicom.dcmread(p, stop_before_pixels=True)
                break
            except Exception:
                continue
        if first is None or str(first.get("SeriesInstanceUID", "")) != uid:
            continue
        out.append(first)
        for p in paths:
            if p.stem == str(first.SOPInstanceUID):
                continue
            try:
                sop = check_uid(p.stem)
            except InvalidUIDError:
                continue
            ds = Dataset()
            ds.SOPClassUID = first.SOPClassUID
            ds.SOPInstanceUID = sop
            ds.SeriesInstanceUID = uid
            ds.StudyInstanceUID = first.StudyInstanceUID
            out.append(ds)
    return out
