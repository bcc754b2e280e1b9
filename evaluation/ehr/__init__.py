"""The EHR: a FHIR R4 Bundle read once into one typed record, ``EHRContext``, that the prompt's
record block (``EHRContext.text``), the PHI gate's identifying terms (``identifying_terms``) and
case sharing all read.

* ``record``: the typed record, its reader (every person the record names, found whatever
  element names them; hostile input bounded, skipped and noted, never fatal) and the record
  block a prompt shows (no names, identifiers or dates);
* ``spec``: what the FHIR R4B definitions say (``fhir.resources``): validation, reference targets;
* ``terms``: the strings by which free text may name someone the record names;
* ``values``: the bounded readers of hostile JSON values.
"""

from evaluation.ehr.record import (
    MAX_BLOCK_CHARS,
    PERSON_RESOURCES,
    Address,
    ClinicalNote,
    Condition,
    EHRContext,
    Encounter,
    Entity,
    HumanName,
    Medication,
    Observation,
    Patient,
    Person,
    ehr_text,
    resources,
)
from evaluation.ehr.terms import (
    NOT_NAMES,
    address_terms,
    ascii_fold,
    display_terms,
    identifying_terms,
    long_enough,
    person_terms,
    word_set,
)

__all__ = [
    "MAX_BLOCK_CHARS",
    "NOT_NAMES",
    "PERSON_RESOURCES",
    "Address",
    "ClinicalNote",
    "Condition",
    "EHRContext",
    "Encounter",
    "Entity",
    "HumanName",
    "Medication",
    "Observation",
    "Patient",
    "Person",
    "address_terms",
    "ascii_fold",
    "display_terms",
    "ehr_text",
    "identifying_terms",
    "long_enough",
    "person_terms",
    "resources",
    "word_set",
]
