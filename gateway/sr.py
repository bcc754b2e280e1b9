"""DICOM objects written back into the source study: a TID 1500 SR and an Encapsulated PDF.

Both carry the source study's patient and study modules. What a model reported goes into the
"(UNVERIFIED)" series of its kind (the SR's VerificationFlag says UNVERIFIED; the PDF's title
does, its IOD having no flag); what a clinician verified goes into the "(VERIFIED)" series, the
SR naming the UNVERIFIED one as predecessor and the clinicians as Verifying Observers. A
re-evaluation adds a new instance (a new version) next to the old one. The content of every SR
is a ``ReportContent``: a model's review block (evaluation.review.sr_content), as the model gave it
or as the clinician verified it.
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import highdicom as hd
import numpy as np
import pydicom
from highdicom.sr import (
    AlgorithmIdentification,
    CodeContentItem,
    CodedConcept,
    Comprehensive3DSR,
    ContainerContentItem,
    DeviceObserverIdentifyingAttributes,
    FindingSite,
    GraphicTypeValues,
    GraphicTypeValues3D,
    ImageRegion,
    ImageRegion3D,
    MeasurementReport,
    MeasurementsAndQualitativeEvaluations,
    ObservationContext,
    ObserverContext,
    PlanarROIMeasurementsAndQualitativeEvaluations,
    QualitativeEvaluation,
    RelationshipTypeValues,
    SourceImageForRegion,
    TextContentItem,
    TrackingIdentifier,
)
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.sequence import Sequence as DicomSequence
from pydicom.sr.codedict import codes
from pydicom.sr.coding import Code
from pydicom.tag import Tag
from pydicom.uid import UID, ExplicitVRLittleEndian, generate_uid
from pydicom.valuerep import DA, TM

from dicom import PersonNameError, checked_attributes, person_name
from evaluation import DifferentialItem, Finding
from evaluation.review import FindingRegion, ReportContent, diagnosis_concept, site_of

ENCAPSULATED_PDF_STORAGE = "1.2.840.10008.5.1.4.1.1.104.1"
MANUFACTURER = "NeuroSandbox"
LOCAL_SCHEME = "99NEUROSANDBOX"
DIAGNOSIS = CodedConcept("439401001", "SCT", "Diagnosis")
DIFFERENTIAL = CodedConcept("111023", "DCM", "Differential Diagnosis/Impression")
QUALITATIVE_EVALUATIONS = CodedConcept("C0034375", "UMLS", "Qualitative Evaluations")
FINDING_TEXT = CodedConcept("FINDING-TEXT", LOCAL_SCHEME, "Finding description")
ERROR_CATEGORY = CodedConcept("ERROR-CATEGORY", LOCAL_SCHEME, "AI error category")
NOTHING_KEPT = CodedConcept("NO-AI-FINDING", LOCAL_SCHEME, "No AI finding or diagnosis kept")
MAX_TEXT = 4000
UTF8 = "ISO_IR 192"
_ICD10 = re.compile(r"^[A-Z][0-9][0-9A-Z](\.[0-9A-Z]{1,4})?$")
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
_LATERALITY = {  # CID 244; a midline site has none
    "left": codes.SCT.Left,
    "right": codes.SCT.Right,
    "bilateral": codes.SCT.Bilateral,
}
# How the SR names the groups of a block's items (evaluation.review.sr_content item ids)
_GROUP_NAMES = {"finding": "finding", "dx": "differential", "final": "diagnosis"}
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


# ... and the other study attributes the PDF carries (type 3: left out when invalid)
_PATIENT_STUDY_COPIED = (*_PATIENT_STUDY, "StudyDescription", "IssuerOfPatientID")


class ReportBuildError(ValueError):
    """The SR or PDF could not be built from the given study headers."""


def series_uid_for(study_uid: str, kind: str) -> str:
    """One stable series per study and kind ("sr", "pdf"), so versions stay together."""
    return generate_uid(entropy_srcs=[study_uid, f"neurosandbox-{kind}"])


def _meaning(text: str) -> str:
    """A Code Meaning (LO, 64 characters) from free text: one value (no backslash), printable."""
    clean = "".join(ch if ch.isprintable() else " " for ch in text.replace("\\", "/"))
    return " ".join(clean.split())[:64]


def _local_code(text: str) -> CodedConcept:
    value = "N" + hashlib.sha256(text.lower().encode()).hexdigest()[:12].upper()
    return CodedConcept(value, LOCAL_SCHEME, _meaning(text) or "unspecified")


def region_code(region: str | None) -> CodedConcept:
    """An atlas region (``case.REGIONS``) coded; no region: the brain."""
    if not region:
        return CodedConcept("12738006", "SCT", "Brain")
    hit = _REGION_CODES.get(region.strip().lower())
    return CodedConcept(*hit) if hit else _local_code(region)


def finding_sites(f: Finding | None) -> list[FindingSite]:
    """A finding's sites: each atlas region its region field names, as the answers are read
    (``evaluation.site_of``: "left frontal lobe" is the frontal region), with the side it
    names as laterality. A region the vocabulary cannot read keeps its text as a local code;
    none given: the brain."""
    if f is None:
        return [FindingSite(region_code(None))]
    site = site_of(f)
    lat = _LATERALITY.get(site.side or "")
    if site.regions:
        return [FindingSite(region_code(r), laterality=lat) for r in site.regions]
    return [FindingSite(region_code((f.region or "").strip() or None), laterality=lat)]


def diagnosis_code(item: DifferentialItem) -> CodedConcept:
    """A diagnosis coded: the ICD-10 code the item gives, else the one of the lexicon concept
    its text names (``evaluation.diagnosis_concept``; ICD-10-CM where WHO's ICD-10 has none),
    else (no concept, or a hedge between concepts) a local code of its text."""
    name = item.diagnosis.strip()
    icd = (item.icd10 or "").strip().upper()
    if icd and len(icd) <= 16 and _ICD10.match(icd):
        return CodedConcept(icd, "I10", _meaning(name) or icd)
    concept = diagnosis_concept(name)
    if concept is not None:
        meaning = _meaning(concept.name[:1].upper() + concept.name[1:])  # a heading's case
        return CodedConcept(concept.icd10, "I10C" if concept.cm else "I10", meaning)
    return _local_code(name)


def _tracking(label: str, seed: str, model: str) -> TrackingIdentifier:
    """A group's tracking identifier: with ``seed`` (the run), the same UID for the same item of
    the same model in every SR of the run, UNVERIFIED and VERIFIED; without, a new one."""
    uid = generate_uid(entropy_srcs=[seed, model, label]) if seed else generate_uid()
    return TrackingIdentifier(uid=uid, identifier=label)


def group_label(item_id: str | None, kind: str, n: int) -> str:
    """How the SR names a block item's group: "finding 2", "differential 1", "diagnosis" (the
    block's item number; ``n``, its place in the report, when the content names no item)."""
    prefix, _, number = (item_id or "").partition(".")
    name = _GROUP_NAMES.get(prefix) if item_id else None
    if name is None:
        name, number = _GROUP_NAMES[kind], str(n)
    if name == "diagnosis" and number in ("", "1"):
        return "diagnosis"
    return f"{name} {number}"


def _region(
    region: FindingRegion | None, evidence: dict[str, Dataset]
) -> ImageRegion | ImageRegion3D | None:
    """Where the model pointed, as an SR coordinate: a SCOORD POINT on the acquired slice's
    instance when the study's evidence holds it, else a SCOORD3D POINT in the series' frame of
    reference (patient LPS mm); None when neither can be named."""
    if region is None:
        return None
    ds = evidence.get(region.sop_instance_uid) if region.sop_instance_uid else None
    if ds is not None and region.pixel is not None:
        return ImageRegion(
            graphic_type=GraphicTypeValues.POINT,
            graphic_data=np.array([region.pixel], dtype=float),
            source_image=SourceImageForRegion(
                referenced_sop_class_uid=str(ds.SOPClassUID),
                referenced_sop_instance_uid=region.sop_instance_uid,
                referenced_frame_numbers=[region.frame] if region.frame else None,
            ),
        )
    frame = next(
        (
            str(d.FrameOfReferenceUID)
            for d in evidence.values()
            if d.get("SeriesInstanceUID") == region.series_uid and d.get("FrameOfReferenceUID")
        ),
        None,
    )
    if frame is None:
        return None
    x, y, z = region.ras_mm
    return ImageRegion3D(
        graphic_type=GraphicTypeValues3D.POINT,
        graphic_data=np.array([[-x, -y, z]], dtype=float),  # RAS -> LPS
        frame_of_reference_uid=frame,
    )


def _finding_group(
    tracking: TrackingIdentifier,
    f: Finding | None,
    algorithm: AlgorithmIdentification,
    where: ImageRegion | ImageRegion3D | None = None,
) -> MeasurementsAndQualitativeEvaluations | PlanarROIMeasurementsAndQualitativeEvaluations:
    present = f is not None
    common: dict[str, Any] = {
        "tracking_identifier": tracking,
        "finding_type": codes.SCT.Lesion,
        "finding_sites": finding_sites(f),
        "algorithm_id": algorithm,
        "qualitative_evaluations": [
            QualitativeEvaluation(
                codes.DCM.PresenceOfProperty, codes.DCM.Present if present else codes.DCM.Absent
            )
        ],
    }
    # a finding the model pointed at is a planar ROI group (TID 1410): its region is drawn
    group: MeasurementsAndQualitativeEvaluations | PlanarROIMeasurementsAndQualitativeEvaluations
    if where is not None and f is not None:
        group = PlanarROIMeasurementsAndQualitativeEvaluations(referenced_region=where, **common)
    else:
        group = MeasurementsAndQualitativeEvaluations(**common)
    if f is not None:  # TID 1501 row 12: a coded question with a text answer
        text = "; ".join(
            x
            for x in (
                f.description.strip(),
                f"sequence {f.sequence}" if f.sequence else "",
                f"signal {f.signal}" if f.signal else "",
                f"{f.size_mm:g} mm" if f.size_mm else "",
                f"enhancement {f.enhancement}" if f.enhancement else "",
            )
            if x
        )
        group[0].ContentSequence.append(_text(FINDING_TEXT, text or "lesion"))
    return group


def _diagnosis_group(
    tracking: TrackingIdentifier,
    concept: CodedConcept,
    item: DifferentialItem,
    algorithm: AlgorithmIdentification,
) -> MeasurementsAndQualitativeEvaluations:
    code = diagnosis_code(item)
    group = MeasurementsAndQualitativeEvaluations(
        tracking_identifier=tracking,
        finding_type=concept,
        finding_sites=[FindingSite(region_code(None))],
        algorithm_id=algorithm,
        qualitative_evaluations=[QualitativeEvaluation(concept, code)],
    )
    if code.meaning != item.diagnosis.strip():  # the words differ from the code's meaning
        group[0].ContentSequence.append(_text(concept, item.diagnosis.strip()))
    return group


def _text(name: CodedConcept | Code, value: str) -> TextContentItem:
    return TextContentItem(
        name=name, value=value[:MAX_TEXT], relationship_type=RelationshipTypeValues.CONTAINS
    )


def _report_level(content: ReportContent) -> ContainerContentItem | None:
    """TID 1500 row 12: the report's own qualitative evaluations (error categories, reviewers'
    diagnoses and comments)."""
    items: list[Dataset] = [
        CodeContentItem(
            name=ERROR_CATEGORY,
            value=CodedConcept(f"ERR-{cat.upper()}"[:16], LOCAL_SCHEME, cat.replace("_", " ")[:64]),
            relationship_type=RelationshipTypeValues.CONTAINS,
        )
        for cat in content.error_categories
    ]
    items += [_text(codes.DCM.Comment, c) for c in content.comments if c.strip()]
    if not items:
        return None
    container = ContainerContentItem(
        name=QUALITATIVE_EVALUATIONS, relationship_type=RelationshipTypeValues.CONTAINS
    )
    container.ContentSequence = DicomSequence(items)
    return container


@dataclass(frozen=True)
class Verifier:
    """A clinician who verified a report: DICOM person name (family^given), organisation, when."""

    person: str
    organization: str
    at: datetime


_EVIDENCE_KEYWORDS = (
    "SpecificCharacterSet",
    "SOPClassUID",
    "SOPInstanceUID",
    "SeriesInstanceUID",
    "StudyInstanceUID",
    *_PATIENT_STUDY,
)
_EVIDENCE_TAGS = tuple(Tag(kw) for kw in _EVIDENCE_KEYWORDS)


def _patient_study(source: Dataset) -> tuple[Dataset, list[str]]:
    """The patient and study attributes of ``source`` as the SR and PDF carry them: a value
    outside the standard (PatientSex '0000', an impossible date) becomes the standard's empty
    form, with a warning; a missing one is empty (type 2)."""
    values, warnings = checked_attributes(source, _PATIENT_STUDY_COPIED)
    out = Dataset()
    for kw in _PATIENT_STUDY_COPIED:
        if values.get(kw) is not None:
            out[kw] = source[kw]  # the element as read: its value is valid
        elif kw in _PATIENT_STUDY:
            setattr(out, kw, None)
    return out, warnings


def header_warnings(source: Dataset) -> list[str]:
    """What the SR and PDF of this study leave out of its patient and study attributes, and why."""
    return _patient_study(source)[1]


def _evidence(source: Sequence[Dataset]) -> list[Dataset]:
    """The few attributes highdicom needs of each source instance (elements shared, not copied:
    a study has hundreds of instances, and per-attribute assignment re-validates each value).
    The patient and study attributes are the first instance's, checked (``_patient_study``)."""
    patient, _ = _patient_study(source[0])
    out = []
    for ds in source:
        e = Dataset()
        for kw, tag in zip(_EVIDENCE_KEYWORDS, _EVIDENCE_TAGS, strict=True):
            if kw in _PATIENT_STUDY:
                if tag in patient:
                    e[tag] = patient[tag]
                continue
            elem = ds.get(tag)
            if kw == "SpecificCharacterSet" and (elem is None or not elem.value):
                continue  # empty = default repertoire; highdicom rejects an empty value
            if elem is not None:
                e[tag] = elem
        out.append(e)
    return out


def _procedure(source: Sequence[Dataset]) -> Code:
    """The procedure an SR reports, from its evidence (the first header of every evaluated
    series): a head CT when any evaluated series is CT, whatever the order, else an imaging
    procedure. The one rule, so an UNVERIFIED SR and the VERIFIED one re-issued from the same
    recorded evidence report the same procedure."""
    if any(str(ds.get("Modality", "")).strip() == "CT" for ds in source):
        return codes.SCT.ComputedTomographyOfHead
    return codes.SCT.ImagingProcedure


def build_sr(
    source: Sequence[Dataset],
    content: ReportContent,
    model_name: str,
    model_version: str,
    instance_number: int,
    previous: Sequence[Dataset] = (),
    verifiers: Sequence[Verifier] = (),
    tracking: str = "",
) -> Dataset:
    """A Comprehensive 3D SR (TID 1500) of one model's report content.

    Without ``verifiers``: UNVERIFIED, PRELIMINARY, in the study's "(UNVERIFIED)" series. With
    them: VERIFIED, FINAL, in the "(VERIFIED)" series, every verifier a Verifying Observer;
    ``previous`` (the documents it replaces) are named as predecessors either way. The
    procedure it reports follows its ``source`` (see ``_procedure``). Each group is named after
    its block item ("finding 2" stays finding 2 when finding 1 is rejected); ``tracking``
    (the run's id) makes its Tracking UID the same in every SR of the run.
    """
    if not source:
        raise ReportBuildError("no source instance headers: cannot build an SR for the study")
    evidence = _evidence(source)
    study_uid = str(evidence[0].StudyInstanceUID)
    algorithm = AlgorithmIdentification(name=model_name[:64], version=model_version[:64])
    entries: list[tuple[str, int, Finding | DifferentialItem]] = [
        *(("finding", i, f) for i, f in enumerate(content.findings, start=1)),
        *(("dx", i, d) for i, d in enumerate(content.differential, start=1)),
        *(("final", i, d) for i, d in enumerate(content.final_diagnoses, start=1)),
    ]
    ids: list[str | None] = list(content.item_ids)
    if len(ids) != len(entries):  # content not made from a block: numbered by place
        ids = [None] * len(entries)
    groups: list[Any] = []
    by_uid = {str(ds.SOPInstanceUID): ds for ds in source if "SOPInstanceUID" in ds}
    regions = list(content.regions) + [None] * (len(content.findings) - len(content.regions))
    for (kind, n, entry), item_id in zip(entries, ids, strict=True):
        track = _tracking(group_label(item_id, kind, n), tracking, model_name)
        if isinstance(entry, Finding):
            where = _region(regions[n - 1], by_uid) if n - 1 < len(regions) else None
            groups.append(_finding_group(track, entry, algorithm, where))
        else:
            concept = DIFFERENTIAL if kind == "dx" else DIAGNOSIS
            groups.append(_diagnosis_group(track, concept, entry, algorithm))
    if content.no_findings and not content.findings:
        none = _tracking("finding 1", tracking, model_name)
        groups.insert(0, _finding_group(none, None, algorithm))
    if not groups:  # every item rejected (or none given): the report says so, and nothing else
        groups.append(
            MeasurementsAndQualitativeEvaluations(
                tracking_identifier=TrackingIdentifier(uid=generate_uid(), identifier="none"),
                finding_type=NOTHING_KEPT,
                algorithm_id=algorithm,
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
    procedure = _procedure(source)
    verified = bool(verifiers)
    try:
        for v in verifiers:
            person_name(v.person)
        report = MeasurementReport(
            observation_context=ObservationContext(observer_device_context=observer),
            procedure_reported=procedure,
            imaging_measurements=groups or None,
        )
        extra = _report_level(content)
        if extra is not None:
            report[0].ContentSequence.append(extra)
        kind = "sr-verified" if verified else "sr"
        sr = Comprehensive3DSR(
            evidence=evidence,
            content=report[0],
            series_instance_uid=series_uid_for(study_uid, kind),
            series_number=9903 if verified else 9901,
            sop_instance_uid=generate_uid(),
            instance_number=instance_number,
            manufacturer=MANUFACTURER,
            is_complete=True,
            is_final=verified,
            is_verified=verified,
            verifying_observer_name=verifiers[0].person if verified else None,
            verifying_organization=verifiers[0].organization[:64] if verified else None,
            previous_versions=list(previous) or None,
            series_description=f"NeuroSandbox AI findings ({'VERIFIED' if verified else 'UNVERIFIED'})",
        )
    except (ValueError, TypeError, AttributeError, PersonNameError) as exc:
        raise ReportBuildError(f"SR for study could not be built: {exc}") from exc
    if verified:
        sr.VerifyingObserverSequence = [_observer(v) for v in verifiers]
        last = max(v.at for v in verifiers)
        sr.ContentDate = DA(last.strftime("%Y%m%d"))
        sr.ContentTime = TM(last.strftime("%H%M%S"))
    if any(_uses_local(ds) for ds in sr.ContentSequence):
        sr.CodingSchemeIdentificationSequence = [_local_scheme()]
    # Model and clinician text is any script: UTF-8 (the patient module is re-encoded with it)
    sr.SpecificCharacterSet = UTF8
    return sr


def _observer(v: Verifier) -> Dataset:
    item = Dataset()
    item.VerifyingObserverName = v.person
    item.VerifyingObserverIdentificationCodeSequence = DicomSequence()
    item.VerifyingOrganization = v.organization[:64]
    item.VerificationDateTime = v.at.strftime("%Y%m%d%H%M%S")
    return item


def _uses_local(ds: Dataset) -> bool:
    for kw in ("ConceptNameCodeSequence", "ConceptCodeSequence"):
        if any(c.get("CodingSchemeDesignator") == LOCAL_SCHEME for c in ds.get(kw, [])):
            return True
    return any(_uses_local(child) for child in ds.get("ContentSequence", []))


def _local_scheme() -> Dataset:
    item = Dataset()
    item.CodingSchemeDesignator = LOCAL_SCHEME
    item.CodingSchemeName = "NeuroSandbox local codes"
    item.CodingSchemeResponsibleOrganization = MANUFACTURER
    return item


def build_pdf(
    source: Dataset, pdf: bytes, title: str, instance_number: int, verified: bool = False
) -> Dataset:
    """An Encapsulated PDF instance in the source study (patient and study modules copied).

    The checklist of a run goes into the "(UNVERIFIED)" series; a signed case's verified report
    into the "(VERIFIED)" one, its title saying by whom and when. The IOD has no verification
    flag: the series, the document title and the PDF's own first page say which it is."""
    if not pdf.startswith(b"%PDF"):
        raise ReportBuildError("the checklist is not a PDF document (no %PDF header)")
    now = datetime.now()
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    sop = generate_uid()
    ds.file_meta.MediaStorageSOPClassUID = UID(ENCAPSULATED_PDF_STORAGE)
    ds.file_meta.MediaStorageSOPInstanceUID = sop
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.SpecificCharacterSet = UTF8  # the source's values are decoded; written back as UTF-8
    patient, _ = _patient_study(source)
    for elem in patient:
        ds[elem.tag] = elem
    ds.StudyInstanceUID = source.StudyInstanceUID
    ds.SOPClassUID = ENCAPSULATED_PDF_STORAGE
    ds.SOPInstanceUID = sop
    ds.Modality = "DOC"
    kind = "VERIFIED" if verified else "UNVERIFIED"
    ds.SeriesInstanceUID = series_uid_for(
        str(source.StudyInstanceUID), "pdf-verified" if verified else "pdf"
    )
    ds.SeriesNumber = 9904 if verified else 9902
    ds.SeriesDescription = f"NeuroSandbox AI checklist ({kind})"
    ds.Manufacturer = MANUFACTURER
    ds.ConversionType = "WSD"
    ds.InstanceNumber = instance_number
    ds.ContentDate = now.strftime("%Y%m%d")
    ds.ContentTime = now.strftime("%H%M%S")
    ds.AcquisitionDateTime = now.strftime("%Y%m%d%H%M%S")
    ds.BurnedInAnnotation = "NO"  # the checklist names no patient
    ds.DocumentTitle = (title if verified else f"{title} (UNVERIFIED)")[:64]
    ds.ConceptNameCodeSequence = DicomSequence()
    ds.MIMETypeOfEncapsulatedDocument = "application/pdf"
    ds.EncapsulatedDocument = pdf + (b"\0" if len(pdf) % 2 else b"")
    ds.EncapsulatedDocumentLength = len(pdf)
    return ds


def encode(ds: Dataset) -> bytes:
    """A dataset as a DICOM Part 10 file in memory (what Orthanc's upload takes)."""
    buf = io.BytesIO()
    pydicom.dcmwrite(buf, ds, enforce_file_format=True)
    return buf.getvalue()


def load_sr(ds: Dataset) -> hd.sr.Comprehensive3DSR:
    """Parse an SR dataset with highdicom (raises when it is not a valid Comprehensive 3D SR)."""
    return Comprehensive3DSR.from_dataset(ds)


def model_of(sr: Dataset) -> str:
    """The model named in an SR we wrote (Device Observer Model Name)."""
    for item in sr.get("ContentSequence", []):
        name = (
            item.ConceptNameCodeSequence[0].CodeMeaning if "ConceptNameCodeSequence" in item else ""
        )
        if name == "Device Observer Model Name":
            return str(item.get("TextValue", ""))
    return ""
