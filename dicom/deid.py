"""De-identification of DICOM datasets before they leave the building.

Used per object by ``dicom.deid_study`` (a whole study into a folder, checked by reading it back),
which ``neurosandbox export-case`` calls to share a benchmark case with another site.

Implements the DICOM PS3.15 Annex E *Basic Application Level Confidentiality Profile*
(Table E.1-1) with two of its options:

* 113107 *Retain Longitudinal Temporal Information with Modified Dates*: every date is shifted
  by a per-patient constant number of days, so intervals and order are preserved.
* 113105 *Clean Descriptors*: series/study descriptions and the protocol name are kept but
  cleaned of the patient's name components and identifiers.

Deliberate deviations from the basic profile, because the models need them clinically:
PatientAge, PatientSex, PatientSize and PatientWeight are kept (Annex E removes or empties them).

Everything is deterministic under a project secret (``DeidPolicy.salt``): the same patient
always gets the same pseudonym and date shift, the same UID always maps to the same new UID, so
series, cross-references and longitudinal studies stay linkable on the remote side without the
original identifiers ever leaving.

Objects likely to carry identifying text in their pixels (burned-in annotation, secondary
captures, encapsulated documents) are refused unless the policy explicitly allows them: the
header can be cleaned, the pixels cannot.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import hmac
import re
from collections.abc import Iterable, Iterator, MutableSequence
from typing import Any, Literal

import pydantic
from pydicom.datadict import dictionary_VR, keyword_for_tag
from pydicom.dataelem import DataElement, RawDataElement
from pydicom.dataset import Dataset, FileDataset
from pydicom.sequence import Sequence
from pydicom.tag import BaseTag
from pydicom.valuerep import PersonName

from dicom.errors import ImagingError, UnreadableHeaderError

__all__ = [
    "BASIC_PROFILE",
    "MAX_SEQUENCE_DEPTH",
    "BurnedInAnnotationError",
    "DeidPolicy",
    "Deidentifier",
    "burned_in_reason",
]

Action = Literal["X", "Z", "D", "U", "K", "C"]

# A legitimate object nests a handful of levels (enhanced MR functional groups reach ~4);
# anything deeper is hostile or corrupt, and must not drive us into unbounded work.
MAX_SEQUENCE_DEPTH = 32

# PS3.15 Table E.1-1, basic profile column. Codes: X remove, Z replace with zero-length value,
# D replace with a dummy value, U remap UID consistently, K keep, C clean (Clean Descriptors
# option). Where Annex E allows a choice (X/Z, X/Z/D) we pick X unless the attribute is Type 1/2
# in the common image IODs, so the output stays a valid object.
# Temporal attributes listed here with Z/X are overridden by option 113107 (shifted) when
# DeidPolicy.keep_dates is set; see _NEVER_RETAINED_TEMPORAL for the ones that never are.
# Attributes not listed fall under the generic rules in Deidentifier._action_for (by VR).
BASIC_PROFILE: dict[str, Action] = {
    # --- patient identity: replaced by the pseudonym (D) or removed ---
    "PatientName": "D",
    "PatientID": "D",
    "IssuerOfPatientID": "X",
    "IssuerOfPatientIDQualifiersSequence": "X",
    "OtherPatientIDs": "X",
    "OtherPatientIDsSequence": "X",
    "OtherPatientNames": "X",
    "PatientBirthName": "X",
    "PatientMotherBirthName": "X",
    "PatientBirthDate": "Z",
    "PatientBirthTime": "X",
    "PatientAddress": "X",
    "PatientTelephoneNumbers": "X",
    "PatientTelecomInformation": "X",
    "CountryOfResidence": "X",
    "RegionOfResidence": "X",
    "MilitaryRank": "X",
    "BranchOfService": "X",
    "EthnicGroup": "X",
    "Occupation": "X",
    "PatientReligiousPreference": "X",
    "PatientInsurancePlanCodeSequence": "X",
    "InsurancePlanIdentification": "X",
    "PatientPrimaryLanguageCodeSequence": "X",
    "AdditionalPatientHistory": "X",
    "PatientComments": "X",
    "MedicalRecordLocator": "X",
    "MedicalAlerts": "X",
    "Allergies": "X",
    "SmokingStatus": "X",
    "PregnancyStatus": "X",
    "LastMenstrualDate": "X",
    "PatientState": "X",
    "SpecialNeeds": "X",
    "PatientTransportArrangements": "X",
    "ReferencedPatientSequence": "X",
    "ReferencedPatientAliasSequence": "X",
    "ResponsiblePerson": "X",
    "ResponsibleOrganization": "X",
    # Clinically needed by the models: a deliberate deviation from Annex E (X/Z there).
    "PatientAge": "K",
    "PatientSex": "K",
    "PatientSize": "K",
    "PatientWeight": "K",
    # --- people and places ---
    "ReferringPhysicianName": "Z",
    "ReferringPhysicianAddress": "X",
    "ReferringPhysicianTelephoneNumbers": "X",
    "ReferringPhysicianIdentificationSequence": "X",
    "PerformingPhysicianName": "X",
    "PerformingPhysicianIdentificationSequence": "X",
    "NameOfPhysiciansReadingStudy": "X",
    "PhysiciansReadingStudyIdentificationSequence": "X",
    "OperatorsName": "X",
    "OperatorIdentificationSequence": "X",
    "PhysiciansOfRecord": "X",
    "PhysiciansOfRecordIdentificationSequence": "X",
    "RequestingPhysician": "X",
    "RequestingService": "X",
    "ScheduledPerformingPhysicianName": "X",
    "HumanPerformerName": "X",
    "HumanPerformerOrganization": "X",
    "ReviewerName": "X",
    "VerifyingObserverName": "D",
    "VerifyingOrganization": "X",
    "PersonName": "D",
    "PersonAddress": "X",
    "PersonTelephoneNumbers": "X",
    "ContentCreatorName": "Z",
    "ContentCreatorIdentificationCodeSequence": "X",
    "InstitutionName": "X",
    "InstitutionAddress": "X",
    "InstitutionCodeSequence": "X",
    "InstitutionalDepartmentName": "X",
    "InstitutionalDepartmentTypeCodeSequence": "X",
    "StationName": "X",
    "DeviceSerialNumber": "X",
    "DetectorID": "X",
    "GantryID": "X",
    "GeneratorID": "X",
    "CassetteID": "X",
    "PlateID": "X",
    "PerformedStationAETitle": "X",
    "PerformedStationName": "X",
    "PerformedLocation": "X",
    "ScheduledStationAETitle": "X",
    "ScheduledStationName": "X",
    "ScheduledProcedureStepLocation": "X",
    "ScheduledStudyLocation": "X",
    "ScheduledStudyLocationAETitle": "X",
    "RequestedProcedureLocation": "X",
    "CurrentPatientLocation": "X",
    "CustodialOrganizationSequence": "X",
    "ModifyingDeviceID": "X",
    "ModifyingDeviceManufacturer": "X",
    # --- visit / order / procedure-step identifiers and free text ---
    "AccessionNumber": "Z",
    "StudyID": "Z",
    "StudyIDIssuer": "X",
    "AdmissionID": "X",
    "IssuerOfAdmissionID": "X",
    "ServiceEpisodeID": "X",
    "ServiceEpisodeDescription": "X",
    "AdmittingDiagnosesDescription": "X",
    "AdmittingDiagnosesCodeSequence": "X",
    "DischargeDiagnosisDescription": "X",
    "FillerOrderNumberImagingServiceRequest": "Z",
    "PlacerOrderNumberImagingServiceRequest": "Z",
    "OrderEnteredBy": "X",
    "OrderEntererLocation": "X",
    "OrderCallbackPhoneNumber": "X",
    "RequestAttributesSequence": "X",
    "RequestedProcedureID": "X",
    "RequestedProcedureDescription": "X",
    "RequestedProcedureComments": "X",
    "RequestedContrastAgent": "X",
    "ReasonForStudy": "X",
    "ReasonForTheRequestedProcedure": "X",
    "ReasonForTheImagingServiceRequest": "X",
    "ImagingServiceRequestComments": "X",
    "PerformedProcedureStepID": "X",
    "PerformedProcedureStepDescription": "X",
    "CommentsOnThePerformedProcedureStep": "X",
    "ReferencedPerformedProcedureStepSequence": "X",
    "ScheduledProcedureStepID": "X",
    "ScheduledProcedureStepDescription": "X",
    "ScheduledHumanPerformersSequence": "X",
    "ActualHumanPerformersSequence": "X",
    "ResultsIDIssuer": "X",
    "ResultsComments": "X",
    "ResultsDistributionListSequence": "X",
    "DistributionName": "X",
    "DistributionAddress": "X",
    "InterpretationText": "X",
    "InterpretationAuthor": "X",
    "InterpretationRecorder": "X",
    "InterpretationTranscriber": "X",
    "InterpretationDiagnosisDescription": "X",
    "InterpretationApproverSequence": "X",
    "PhysicianApprovingInterpretation": "X",
    "Impressions": "X",
    "VisitComments": "X",
    "StudyComments": "X",
    "ImageComments": "X",
    "FrameComments": "X",
    "AcquisitionComments": "X",
    "ImagePresentationComments": "X",
    "IdentifyingComments": "X",
    "TextComments": "X",
    "TextString": "X",
    "DerivationDescription": "X",
    "ContributionDescription": "X",
    "ModifiedImageDescription": "X",
    "AcquisitionDeviceProcessingDescription": "X",
    "AcquisitionProtocolDescription": "X",
    "PerformedProcedureTypeDescription": "X",
    "TopicTitle": "X",
    "TopicSubject": "X",
    "TopicAuthor": "X",
    "TopicKeywords": "X",
    "AuthorObserverSequence": "X",
    "ParticipantSequence": "X",
    "VerifyingObserverSequence": "X",
    "ContentSequence": "X",
    "AcquisitionContextSequence": "X",
    "GraphicAnnotationSequence": "X",
    "IconImageSequence": "X",
    "OverlayData": "X",
    "OverlayComments": "X",
    "CurveData": "X",
    "TimezoneOffsetFromUTC": "X",
    # Integrity/provenance blobs that would carry or certify the original values.
    "OriginalAttributesSequence": "X",
    "ModifiedAttributesSequence": "X",
    "EncryptedAttributesSequence": "X",
    "DigitalSignaturesSequence": "X",
    "ReferencedDigitalSignatureSequence": "X",
    "ReferencedSOPInstanceMACSequence": "X",
    "MAC": "X",
    "DataSetTrailingPadding": "X",
    # File meta attributes naming the sending system.
    "SourceApplicationEntityTitle": "X",
    "SendingApplicationEntityTitle": "X",
    "ReceivingApplicationEntityTitle": "X",
    "PrivateInformationCreatorUID": "X",
    "PrivateInformation": "X",
    # --- descriptors: removed in the basic profile, cleaned with option 113105 ---
    "SeriesDescription": "X",
    "StudyDescription": "X",
    "ProtocolName": "X",
    # --- UIDs: remapped consistently ---
    "StudyInstanceUID": "U",
    "SeriesInstanceUID": "U",
    "SOPInstanceUID": "U",
    "MediaStorageSOPInstanceUID": "U",
    "FrameOfReferenceUID": "U",
    "SynchronizationFrameOfReferenceUID": "U",
    "ReferencedSOPInstanceUID": "U",
    "ReferencedSOPInstanceUIDInFile": "U",
    "ReferencedFrameOfReferenceUID": "U",
    "RelatedFrameOfReferenceUID": "U",
    "IrradiationEventUID": "U",
    "ConcatenationUID": "U",
    "DimensionOrganizationUID": "U",
    "InstanceCreatorUID": "U",
    "StorageMediaFileSetUID": "U",
    "FailedSOPInstanceUIDList": "U",
    "RequestedSOPInstanceUID": "U",
    "TransactionUID": "U",
    "DeviceUID": "U",
    "FiducialUID": "U",
    "DoseReferenceUID": "U",
    "TargetUID": "U",
    "UID": "U",
    "SpecimenUID": "U",
    "CreatorVersionUID": "U",
    "LargePaletteColorLookupTableUID": "U",
    "PaletteColorLookupTableUID": "U",
    "TemplateExtensionOrganizationUID": "U",
    "TemplateExtensionCreatorUID": "U",
    "ContextGroupExtensionCreatorUID": "U",
    "ReferencedGeneralPurposeScheduledProcedureStepTransactionUID": "U",
    "AffectedSOPInstanceUID": "X",
    "DigitalSignatureUID": "X",
    # --- dates and times: emptied (basic) or shifted/kept (option 113107) ---
    "StudyDate": "Z",
    "StudyTime": "Z",
    "SeriesDate": "X",
    "SeriesTime": "X",
    "AcquisitionDate": "X",
    "AcquisitionTime": "X",
    "AcquisitionDateTime": "X",
    "ContentDate": "Z",
    "ContentTime": "Z",
    "InstanceCreationDate": "X",
    "InstanceCreationTime": "X",
    "PerformedProcedureStepStartDate": "X",
    "PerformedProcedureStepStartTime": "X",
    "PerformedProcedureStepEndDate": "X",
    "PerformedProcedureStepEndTime": "X",
    "ScheduledProcedureStepStartDate": "X",
    "ScheduledProcedureStepStartTime": "X",
    "ScheduledProcedureStepEndDate": "X",
    "ScheduledProcedureStepEndTime": "X",
    "AdmittingDate": "X",
    "AdmittingTime": "X",
    "OverlayDate": "X",
    "OverlayTime": "X",
    "CurveDate": "X",
    "CurveTime": "X",
    "FrameReferenceDateTime": "X",
    "FrameAcquisitionDateTime": "X",
}

# Temporal attributes that are removed even when dates are retained: they date the person, not
# the examination, and age is already carried by PatientAge.
_NEVER_RETAINED_TEMPORAL = frozenset({"PatientBirthDate", "PatientBirthTime", "LastMenstrualDate"})

# Descriptors kept (cleaned) under option 113105.
_CLEANED_DESCRIPTORS = frozenset({"SeriesDescription", "StudyDescription", "ProtocolName"})

# UI attributes that name a class, syntax or coding scheme, not an instance: they identify
# nothing about the patient and must stay intact for the object to be decodable.
NON_INSTANCE_UID_KEYWORDS = frozenset(
    {
        "TransferSyntaxUID",
        "ReferencedTransferSyntaxUIDInFile",
        "CodingSchemeUID",
        "MappingResourceUID",
        "ContextGroupIdentificationUID",
    }
)
# Well-known UIDs defined by the standard itself (classes, syntaxes, well-known frames of
# reference) carry no patient information.
DICOM_ROOT = "1.2.840.10008."

# Free-text VRs: values we keep are still scrubbed of the patient's name/ID as a second line of
# defence, because the basic profile cannot list every place a technologist may type a name.
_TEXT_VRS = frozenset({"LO", "SH", "ST", "LT", "UT", "UC"})
# Coded values must stay verbatim (a scrub could turn a valid code into an invalid one).
_NEVER_SCRUBBED = frozenset(
    {"CodeValue", "CodingSchemeDesignator", "CodingSchemeVersion", "LongCodeValue"}
)
_TEMPORAL_VRS = frozenset({"DA", "DT", "TM"})

# Name components shorter than this are not scrubbed from text: single letters (initials) would
# mutilate every description while identifying nobody.
_MIN_TERM_LEN = 2

_SECONDARY_CAPTURE = "1.2.840.10008.5.1.4.1.1.7"
_ENCAPSULATED_DOC_PREFIX = "1.2.840.10008.5.1.4.1.1.104."
# ConversionType values (SC Equipment module) for scanned paper.
_SCANNED_CONVERSION_TYPES = frozenset({"SD", "SI"})

_CODES: dict[str, str] = {
    "113100": "Basic Application Confidentiality Profile",
    "113105": "Clean Descriptors Option",
    "113107": "Retain Longitudinal Temporal Information Modified Dates Option",
}

DUMMY_TEXT = "ANONYMIZED"
_DA_RE = re.compile(r"^(\d{4})\.?(\d{2})\.?(\d{2})$")
_DT_RE = re.compile(r"^(\d{8})(\d{0,6}(?:\.\d{1,6})?)([+-]\d{4})?$")


class DeidPolicy(pydantic.BaseModel):
    """What the de-identifier keeps. Frozen so a policy cannot change between two datasets."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")

    keep_dates: bool = True
    """Keep dates, shifted per patient (option 113107); if False they are emptied."""
    allow_burned_in: bool = False
    """Accept objects whose pixels may carry identifying text (BurnedInAnnotation YES,
    secondary captures, encapsulated/scanned documents)."""
    keep_descriptions: bool = True
    """Keep series/study descriptions and protocol name, cleaned of the patient's name and ID
    (option 113105); if False they are removed."""
    salt: str = pydantic.Field(min_length=1, repr=False)
    """Project secret keying every pseudonym, UID and date shift. Use >= 32 random characters:
    patient IDs have little entropy, so a guessable salt makes pseudonyms reversible.
    Excluded from repr so it never lands in a log line."""

    @pydantic.field_validator("salt")
    @classmethod
    def _salt_not_blank(cls, value: str) -> str:
        """Reject whitespace-only salts, which are as good as no secret."""
        if not value.strip():
            raise ValueError("salt must not be blank")
        return value


class BurnedInAnnotationError(ImagingError):
    """The object may show identifying text in its pixels and the policy does not allow it."""


def _empty_audit() -> dict[str, Any]:
    return {
        "refused": None,
        "removed": [],
        "emptied": [],
        "replaced": [],
        "uids_remapped": [],
        "shifted": [],
        "cleaned": [],
        "private_tags_removed": 0,
        "unknown_tags_removed": 0,
        "method_codes": [],
        "temporal_information": None,
    }


def as_list(value: Any) -> list[Any]:
    """Values of an element as a list, whatever its VM."""
    if value is None:
        return []
    # MultiValue (multi-valued elements) and pydicom's Sequence are MutableSequences, not lists.
    if isinstance(value, MutableSequence | tuple):
        return list(value)
    return [value]


def _set_values(elem: DataElement, values: list[Any]) -> None:
    """Store values back with the VM they came with (scalar for one value)."""
    if not values:
        elem.value = elem.empty_value
    elif len(values) == 1:
        elem.value = values[0]
    else:
        elem.value = values


def _hmac(key: bytes, domain: str, *parts: str) -> bytes:
    """HMAC-SHA256 over length-prefixed parts; the domain keeps pseudonyms, UIDs and shifts
    independent even when fed the same string, the prefixes keep ("ab", "c") != ("a", "bc")."""
    message = b"".join(
        len(raw).to_bytes(4, "big") + raw for raw in (p.encode("utf-8") for p in (domain, *parts))
    )
    return hmac.new(key, message, hashlib.sha256).digest()


def _check_depth(root: Dataset) -> None:
    """Reject nesting deeper than MAX_SEQUENCE_DEPTH, iteratively, before anything recurses.

    Runs on the input before the deep copy: copy.deepcopy recurses once per level and would hit
    RecursionError on a hostile file. A reference cycle shows up as infinite depth, so it is
    caught too.
    """
    stack: list[tuple[Dataset, int]] = [(root, 0)]
    while stack:
        current, depth = stack.pop()
        for elem in current.elements():
            # Only sequences nest; converting just those leaves the input's raw elements alone.
            if not _may_be_sequence(elem):
                continue
            value = current[elem.tag].value
            if not isinstance(value, Sequence):
                continue
            if depth + 1 > MAX_SEQUENCE_DEPTH:
                raise UnreadableHeaderError(
                    f"sequence nesting deeper than {MAX_SEQUENCE_DEPTH} levels at "
                    f"{elem.tag}; refusing to process a pathologically nested dataset"
                )
            stack.extend((item, depth + 1) for item in value if isinstance(item, Dataset))


def _may_be_sequence(elem: DataElement | RawDataElement) -> bool:
    """Whether an element is, or would convert to, a sequence."""
    if isinstance(elem, DataElement):
        return elem.VR == "SQ"
    if elem.tag.is_private:
        return False  # raw private elements are deleted unconverted, so they never nest
    if elem.VR in (None, "UN"):
        # Implicit VR, or UN that pydicom will replace by the dictionary VR on access.
        try:
            return dictionary_VR(elem.tag) == "SQ"
        except KeyError:
            return False
    return elem.VR == "SQ"


def _name_terms(values: Iterable[Any]) -> set[str]:
    """Every name component (and word of a component) worth scrubbing from free text."""
    terms: set[str] = set()
    for value in values:
        name = value if isinstance(value, PersonName) else PersonName(str(value))
        # components holds the decoded alphabetic, ideographic and phonetic groups.
        for group in name.components:
            for component in group.split("^"):
                candidates = [component.strip(), *component.split()]
                terms.update(c for c in candidates if len(c) >= _MIN_TERM_LEN)
    return terms


_PATIENT_NAME_KEYWORDS = frozenset({"PatientName", "OtherPatientNames", "PatientBirthName"})


def walk_elements(ds: Dataset) -> Iterator[tuple[Dataset, Any]]:
    """Every (dataset, element) of `ds`, its file meta and every nested item, iteratively."""
    stack: list[Dataset] = [ds]
    meta = getattr(ds, "file_meta", None)
    if isinstance(meta, Dataset):
        stack.append(meta)
    while stack:
        current = stack.pop()
        for elem in current:
            yield current, elem
            if elem.VR == "SQ":
                stack.extend(i for i in as_list(elem.value) if isinstance(i, Dataset))


def _other_person_names(root: Dataset) -> list[Any]:
    """Values of every PN attribute at any depth, but the patient's own (the caller has
    bounded the depth already)."""
    return [
        v
        for _parent, elem in walk_elements(root)
        if elem.VR == "PN"
        and elem.keyword not in _PATIENT_NAME_KEYWORDS
        and not BaseTag(elem.tag).is_private
        for v in as_list(elem.value)
    ]


class Deidentifier:
    """Applies a DeidPolicy to datasets; keeps an audit of the last one processed.

    Not safe for concurrent use of deidentify() from several threads (the audit is per
    instance); create one Deidentifier per worker, they produce identical mappings.
    """

    def __init__(self, policy: DeidPolicy) -> None:
        """Bind the policy; the salt becomes the HMAC key for all derived identifiers."""
        self.policy = policy
        self._key = policy.salt.encode("utf-8")
        self._audit: dict[str, Any] = _empty_audit()
        # Per-call state of deidentify(), reset at the start of each call.
        self._pseudonym = ""
        self._shift = 0
        self._scrub: re.Pattern[str] | None = None
        self._sets: dict[str, set[str]] = {}

    # ------------------------------------------------------------------ derived identifiers

    def pseudonym(self, patient_id: str, issuer: str = "") -> str:
        """Stable pseudonym for a patient: "NS-" + 16 hex chars of HMAC-SHA256(salt, issuer, id).

        64 bits keeps accidental collisions negligible even across millions of patients (40 bits
        would collide with ~40% probability at one million).
        """
        digest = _hmac(self._key, "pseudonym", issuer.strip(), patient_id.strip())
        return "NS-" + digest.hex()[:16]

    def map_uid(self, uid: str) -> str:
        """Stable replacement UID: "2.25." + a UUID-shaped integer derived by HMAC from `uid`.

        The 128-bit value gets the RFC 9562 version-8 (custom) and variant bits so the result is
        a conformant UUID-derived UID; at most 39 digits, so at most 44 characters in all.
        An empty UID stays empty (Type 2 attributes may legitimately be empty).
        """
        cleaned = uid.strip().rstrip("\x00")
        if not cleaned:
            return ""
        raw = bytearray(_hmac(self._key, "uid", cleaned)[:16])
        raw[6] = (raw[6] & 0x0F) | 0x80  # version 8
        raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122/9562 variant
        return f"2.25.{int.from_bytes(raw, 'big')}"

    def date_shift_days(self, patient_id: str) -> int:
        """Stable per-patient date offset in days, between -365 and -1 inclusive.

        Constant for a patient, so every date of that patient moves together and intervals and
        order between them are preserved; never zero, so no date survives unchanged.
        """
        digest = _hmac(self._key, "date-shift", patient_id.strip())
        return -(int.from_bytes(digest[:8], "big") % 365) - 1

    def subject(self, ds: Dataset) -> tuple[str, int]:
        """The pseudonym and the date shift (days) deidentify() gives the patient of `ds`.

        For whoever de-identifies the patient's record alongside the images (a case export), so
        both carry one pseudonym and move their dates together. Never write the shift out.
        """
        patient_key, issuer = self._patient_key(ds)
        return self.pseudonym(patient_key, issuer), self.date_shift_days(patient_key)

    # ------------------------------------------------------------------ main entry point

    def deidentify(self, ds: Dataset) -> Dataset:
        """Return a de-identified deep copy of `ds`; `ds` itself is not modified.

        Raises BurnedInAnnotationError for objects that may show identifying text in their
        pixels (unless the policy allows them) and UnreadableHeaderError for sequences nested
        deeper than MAX_SEQUENCE_DEPTH.
        """
        self._audit = _empty_audit()
        self._refuse_burned_in(ds)
        try:
            _check_depth(ds)
            out = copy.deepcopy(ds)
        except RecursionError as exc:  # belt and braces: pydicom parses nested bytes recursively
            raise UnreadableHeaderError("dataset nesting exhausted the stack") from exc
        patient_key, issuer = self._patient_key(out)
        self._pseudonym = self.pseudonym(patient_key, issuer)
        self._shift = self.date_shift_days(patient_key)
        self._scrub = self._scrub_pattern(out)
        sets: dict[str, set[str]] = {
            k: set()
            for k in ("removed", "emptied", "replaced", "uids_remapped", "shifted", "cleaned")
        }
        self._sets = sets

        file_meta = getattr(out, "file_meta", None)
        if isinstance(file_meta, Dataset):
            self._process_dataset(file_meta, is_file_meta=True)
        # Iterative walk: depth is bounded already, but an explicit stack keeps the cost of a
        # wide-and-deep (still legal) object off the interpreter stack.
        stack: list[Dataset] = [out]
        while stack:
            stack.extend(self._process_dataset(stack.pop(), is_file_meta=False))

        self._mark(out)
        self._drop_file_provenance(out)
        for name, values in sets.items():
            self._audit[name] = sorted(values)
        return out

    def audit_record(self) -> dict[str, Any]:
        """What was done to the last dataset: attribute keywords per action, counts, codes.

        Never contains original values, the pseudonym or the date shift (which would let a
        reader undo the shift).
        """
        return copy.deepcopy(self._audit)

    # ------------------------------------------------------------------ steps

    def _refuse_burned_in(self, ds: Dataset) -> None:
        """Raise unless the object is free of likely pixel-borne identifiers or allowed."""
        if self.policy.allow_burned_in:
            return
        reason = burned_in_reason(ds)
        if not reason:
            return
        self._audit["refused"] = reason
        # Locate the object by its instance and position only: the message goes to local logs
        # and must not name the patient.
        # Values are truncated: a hostile header must not be able to flood or forge log lines.
        position = ", ".join(
            f"{kw} {str(ds.get(kw))[:12]!r}"
            for kw in ("SeriesNumber", "InstanceNumber")
            if kw in ds
        )
        where = f"SOP Instance UID {str(ds.get('SOPInstanceUID', '<missing>'))[:64]!r}"
        if position:
            where += f" ({position})"
        raise BurnedInAnnotationError(
            f"refusing to send {where}: {reason}, so its pixels may show identifying text "
            "that header de-identification cannot remove; set DeidPolicy.allow_burned_in=True "
            "only after the pixels have been reviewed or cleaned"
        )

    def _patient_key(self, ds: Dataset) -> tuple[str, str]:
        """The identifier pseudonyms and date shifts derive from (and its issuer).

        Falls back to the decoded name, then the study, when PatientID is empty, so distinct
        anonymous-ID patients do not all collapse onto one pseudonym.
        """
        issuer = str(ds.get("IssuerOfPatientID", "") or "")
        patient_id = str(ds.get("PatientID", "") or "").strip()
        if patient_id:
            return patient_id, issuer
        name = ds.get("PatientName")
        if name:
            return "name:" + "=".join(PersonName(name).components), issuer
        return "study:" + str(ds.get("StudyInstanceUID", "") or ""), issuer

    def _scrub_pattern(self, ds: Dataset) -> re.Pattern[str] | None:
        """Case-insensitive pattern matching the patient's name components and identifiers."""
        names: list[Any] = []
        for keyword in ("PatientName", "OtherPatientNames", "PatientBirthName"):
            names.extend(as_list(ds.get(keyword)))
        terms = _name_terms(names)
        ids: list[Any] = [*as_list(ds.get("PatientID")), *as_list(ds.get("OtherPatientIDs"))]
        for item in as_list(ds.get("OtherPatientIDsSequence")):
            if isinstance(item, Dataset):
                ids.extend(as_list(item.get("PatientID")))
        terms.update(s for s in (str(v).strip() for v in ids) if len(s) >= _MIN_TERM_LEN)
        # Every other person the object names (referring, performing, operators, observers in
        # nested items): whole words only, and 3+ letters, so "Rao" never cuts "paraorbital".
        others = {t for t in _name_terms(_other_person_names(ds)) if len(t) > _MIN_TERM_LEN}
        others -= terms
        if not terms and not others:
            return None
        # Longest first so "Smith-Jones" is removed whole before "Smith" is tried.
        alternatives = [re.escape(t) for t in sorted(terms, key=lambda t: (-len(t), t))]
        alternatives += [
            rf"(?<![^\W_]){re.escape(t)}(?![^\W_])"
            for t in sorted(others, key=lambda t: (-len(t), t))
        ]
        return re.compile("|".join(alternatives), re.IGNORECASE)

    def _clean_text(self, text: str) -> str:
        """Remove name/ID terms; tidy the separators they leave behind."""
        if self._scrub is None or not self._scrub.search(text):
            return text
        cleaned = self._scrub.sub(" ", text)
        cleaned = re.sub(r"\s{2,}", " ", cleaned)
        return cleaned.strip(" \t^_-,;:")

    def _action_for(self, keyword: str, elem: DataElement) -> Action | Literal["T"]:
        """The action for one element: table entry, option overrides, then VR-based defaults.

        "T" (internal) means temporal handling: shift/keep under option 113107, else empty.
        """
        vr = elem.VR
        if vr in _TEMPORAL_VRS and keyword not in _NEVER_RETAINED_TEMPORAL:
            # Option 113107 overrides the basic-profile X/Z for every examination date/time; the
            # basic action on unlisted temporal attributes is emptying, which "T" also does.
            return "T"
        if keyword in _CLEANED_DESCRIPTORS and self.policy.keep_descriptions:
            return "C"
        action = BASIC_PROFILE.get(keyword)
        if action is not None:
            return action
        if vr == "UI":
            if "ClassUID" in keyword or keyword in NON_INSTANCE_UID_KEYWORDS:
                return "K"
            # Unlisted instance UIDs still embed scanner serials and timestamps.
            return "U"
        if vr == "PN":
            # Any person name the table does not know about is somebody's name.
            return "Z"
        return "K"

    def _process_dataset(self, ds: Dataset, *, is_file_meta: bool) -> list[Dataset]:
        """Apply actions to the top level of `ds`; return the items of kept sequences."""
        children: list[Dataset] = []
        sets = self._sets
        for tag in list(ds.keys()):
            btag = BaseTag(tag)
            if btag.is_private:
                del ds[btag]
                self._audit["private_tags_removed"] += 1
                continue
            group = btag.group
            # Curves (50xx) and overlays (60xx) are graphics/text planes: the overlay bitmap can
            # carry burned-in annotation even when the image pixels do not.
            keyword = keyword_for_tag(btag)
            if 0x5000 <= group <= 0x50FF or 0x6000 <= group <= 0x60FF:
                del ds[btag]
                sets["removed"].add(keyword or "Overlay/Curve")
                continue
            if not keyword or (btag.element == 0 and group != 0x0002):
                # Unknown standard attribute: its confidentiality cannot be judged. Group
                # lengths are retired and would be stale after the edits anyway.
                del ds[btag]
                self._audit["unknown_tags_removed"] += 1
                continue
            if keyword == "SpecificCharacterSet":
                continue  # rewritten in _mark once every value has been decoded
            elem = ds[btag]  # converts raw -> decoded value with the original character set
            action = self._action_for(keyword, elem)
            if action == "X":
                del ds[btag]
                sets["removed"].add(keyword)
            elif action == "Z":
                elem.value = elem.empty_value
                sets["emptied"].add(keyword)
            elif action == "D":
                self._replace_dummy(ds, btag, keyword, elem)
            elif action == "U":
                values = as_list(elem.value)
                _set_values(elem, [self._map_one_uid(str(v)) for v in values])
                if values:
                    sets["uids_remapped"].add(keyword)
            elif action == "T":
                self._temporal(elem, keyword)
            elif action == "C":
                self._clean_element(elem, keyword)
            elif elem.VR == "SQ":
                children.extend(i for i in as_list(elem.value) if isinstance(i, Dataset))
            elif elem.VR in _TEXT_VRS and keyword not in _NEVER_SCRUBBED and not is_file_meta:
                self._clean_element(elem, keyword)
        return children

    def _map_one_uid(self, uid: str) -> str:
        """Remap an instance UID, leaving standard well-known UIDs alone."""
        return uid if uid.startswith(DICOM_ROOT) else self.map_uid(uid)

    def _replace_dummy(self, ds: Dataset, tag: BaseTag, keyword: str, elem: DataElement) -> None:
        """D action: pseudonym for the patient, a fixed dummy by VR otherwise."""
        if keyword in ("PatientName", "PatientID"):
            elem.value = self._pseudonym
        elif elem.VR == "SQ":
            # A dummy item would have to be invented per IOD; removing is the safe choice.
            del ds[tag]
            self._sets["removed"].add(keyword)
            return
        elif elem.VR in ("PN", "LO", "SH", "ST", "LT", "UT", "UC", "CS", "AE"):
            elem.value = DUMMY_TEXT
        elif elem.VR in ("IS", "DS", "US", "SS", "UL", "SL", "FL", "FD", "UV", "SV"):
            elem.value = 0
        else:
            elem.value = elem.empty_value
        self._sets["replaced"].add(keyword)

    def _temporal(self, elem: DataElement, keyword: str) -> None:
        """Shift dates by the patient's offset (keep_dates) or empty them; times ride along."""
        values = as_list(elem.value)
        if not values:
            return
        if not self.policy.keep_dates:
            elem.value = elem.empty_value
            self._sets["emptied"].add(keyword)
            return
        if elem.VR == "TM":
            return  # whole-day shifts leave the time of day valid; kept only with dates
        shift = dt.timedelta(days=self._shift)
        shifted: list[str] = []
        for value in values:
            new = _shift_da(str(value), shift) if elem.VR == "DA" else _shift_dt(str(value), shift)
            if new is None:
                # Unparseable or partial (YYYY, YYYYMM): cannot be shifted faithfully.
                elem.value = elem.empty_value
                self._sets["emptied"].add(keyword)
                return
            shifted.append(new)
        _set_values(elem, shifted)
        self._sets["shifted"].add(keyword)

    def _clean_element(self, elem: DataElement, keyword: str) -> None:
        """Scrub the patient's name/ID out of each string value of a text element."""
        values = as_list(elem.value)
        cleaned = [self._clean_text(v) if isinstance(v, str) else v for v in values]
        if cleaned != values:
            _set_values(elem, cleaned)
            self._sets["cleaned"].add(keyword)

    def _mark(self, ds: Dataset) -> None:
        """Record what was done in the object itself (PS3.15 E.1.1) and switch it to UTF-8."""
        codes = ["113100"]
        if self.policy.keep_descriptions:
            codes.append("113105")
        if self.policy.keep_dates:
            codes.append("113107")
        items = []
        for code in codes:
            item = Dataset()
            item.CodeValue = code
            item.CodingSchemeDesignator = "DCM"
            item.CodeMeaning = _CODES[code]
            items.append(item)
        # Always present, even when the input lacked them: the remote side keys on them.
        ds.PatientName = self._pseudonym
        ds.PatientID = self._pseudonym
        ds.PatientIdentityRemoved = "YES"
        method = "NeuroSandbox PS3.15 E basic; dates " + (
            "shifted" if self.policy.keep_dates else "removed"
        )
        if self.policy.keep_descriptions:
            method += "; clean descriptors"
        ds.DeidentificationMethod = method  # LO: fits in 64 characters by construction
        ds.DeidentificationMethodCodeSequence = Sequence(items)
        ds.LongitudinalTemporalInformationModified = (
            "MODIFIED" if self.policy.keep_dates else "REMOVED"
        )
        # Every value was decoded with the original character set during the walk; declaring
        # UTF-8 now makes the writer re-encode all of them, so no byte of the original
        # (possibly ISO 2022 escaped) encoding survives.
        ds.SpecificCharacterSet = "ISO_IR 192"
        nested: list[Dataset] = [ds]
        while nested:
            current = nested.pop()
            for elem in current:
                if elem.VR == "SQ":
                    for item in as_list(elem.value):
                        if isinstance(item, Dataset):
                            if "SpecificCharacterSet" in item:
                                del item.SpecificCharacterSet  # inherit UTF-8 from the top
                            nested.append(item)
        self._audit["method_codes"] = codes
        self._audit["temporal_information"] = ds.LongitudinalTemporalInformationModified

    @staticmethod
    def _drop_file_provenance(ds: Dataset) -> None:
        """Forget where the copy came from: the path or buffer may itself name the patient,
        and the preamble is 128 arbitrary bytes from the sender."""
        if isinstance(ds, FileDataset):
            ds.filename = None
            ds.buffer = None
            ds.timestamp = None
            if ds.preamble is not None:
                ds.preamble = b"\x00" * 128


def burned_in_reason(ds: Dataset) -> str:
    """Why the pixels of `ds` may show identifying text (empty when nothing says so).

    BurnedInAnnotation YES, a Secondary Capture, an encapsulated document or a scanned
    document/image: the header can be cleaned, the pixels cannot. The reason names standard
    values only (a SOP class, never an instance), so it may be shown or written anywhere.
    """
    burned = str(ds.get("BurnedInAnnotation", "") or "").strip().upper()
    meta = getattr(ds, "file_meta", None)
    sop_class = str(ds.get("SOPClassUID", "") or "").strip()
    if not sop_class and isinstance(meta, Dataset):
        sop_class = str(meta.get("MediaStorageSOPClassUID", "") or "").strip()
    conversion = str(ds.get("ConversionType", "") or "").strip().upper()
    if burned == "YES":
        return "BurnedInAnnotation is YES"
    if sop_class == _SECONDARY_CAPTURE or sop_class.startswith(_SECONDARY_CAPTURE + "."):
        return f"SOP class {sop_class} is a Secondary Capture"
    if sop_class.startswith(_ENCAPSULATED_DOC_PREFIX):
        return f"SOP class {sop_class} is an encapsulated document"
    if conversion in _SCANNED_CONVERSION_TYPES:
        return f"ConversionType {conversion} is a scanned document/image"
    return ""


def _shift_da(value: str, shift: dt.timedelta) -> str | None:
    """Shift a DA value (also the ACR-NEMA YYYY.MM.DD form); None if it cannot be."""
    match = _DA_RE.match(value.strip())
    if not match:
        return None
    try:
        day = dt.date(int(match[1]), int(match[2]), int(match[3])) + shift
    except (ValueError, OverflowError):
        return None
    return day.strftime("%Y%m%d")


def _shift_dt(value: str, shift: dt.timedelta) -> str | None:
    """Shift the date part of a DT value, keeping time and UTC offset; None if it cannot be."""
    match = _DT_RE.match(value.strip())
    if not match:
        return None
    day = _shift_da(match[1], shift)
    if day is None:
        return None
    return day + (match[2] or "") + (match[3] or "")
