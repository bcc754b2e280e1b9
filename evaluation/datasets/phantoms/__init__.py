"""Synthetic neuro phantom cases: multi-sequence MRI and CT with lesions, record and exact truth.

Public API::

    from evaluation.datasets.phantoms import generate_suite, generate_case, case_specs
    manifest = generate_suite("out/phantoms", n_cases=30, seed=0)
    result = generate_case("out/phantoms", 7, seed=0)   # or a CaseSpec

Modules: anatomy (MNI152 head), atlas (coordinate atlas), tissue (properties, signal
equations), shapes, placement, lesions, vascular, masses (disease generators), grids, scene,
acquire (simulation), series and dicomio (DICOM writing), identity, clinical, ehr (record and
planted PHI), measure and truth (ground truth), spec (the case schedule), case and suite
(assembly), cli (``neurosandbox phantoms``).
"""

from __future__ import annotations

from evaluation.datasets.phantoms.case import GeneratedCase, generate_case
from evaluation.datasets.phantoms.lesions import GROUPS
from evaluation.datasets.phantoms.reference import reference_answer
from evaluation.datasets.phantoms.spec import SCHEDULE, CaseSpec, case_spec, case_specs
from evaluation.datasets.phantoms.suite import SuiteCase, SuiteManifest, generate_suite

__all__ = [
    "GROUPS",
    "SCHEDULE",
    "CaseSpec",
    "GeneratedCase",
    "SuiteCase",
    "SuiteManifest",
    "case_spec",
    "case_specs",
    "generate_case",
    "generate_suite",
    "reference_answer",
]
