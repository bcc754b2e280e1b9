"""Synthetic neuro phantom cases: multi-sequence MRI and CT with lesions, record and exact truth.

Public API::

    from dicom.phantoms import generate_suite, generate_case, case_specs
    manifest = generate_suite("out/phantoms", n_cases=30, seed=0)
    result = generate_case("out/phantoms", 7, seed=0)   # or a CaseSpec

Modules: anatomy (MNI152 head), atlas (coordinate atlas), tissue (properties, signal
equations), shapes, placement, lesions, vascular, masses (disease generators), grids, scene,
acquire (simulation), series and dicomio (DICOM writing), identity, clinical, ehr (record and
planted PHI), measure and truth (ground truth), spec (the case schedule), case and suite
(assembly), cli (``neurosandbox phantoms``).
"""

from __future__ import annotations

from dicom.phantoms.case import CaseResult, generate_case
from dicom.phantoms.lesions import GROUPS
from dicom.phantoms.spec import SCHEDULE, CaseSpec, case_spec, case_specs
from dicom.phantoms.suite import SuiteCase, SuiteManifest, generate_suite

__all__ = [
    "GROUPS",
    "SCHEDULE",
    "CaseResult",
    "CaseSpec",
    "SuiteCase",
    "SuiteManifest",
    "case_spec",
    "case_specs",
    "generate_case",
    "generate_suite",
]
