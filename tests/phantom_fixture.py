"""A small phantom suite generated once per test session (registered in conftest.py).

Six cases chosen for what the tests need: MS (FLAIR plaques), MCA stroke (CT + DWI/ADC),
haemorrhage (CT), glioblastoma (T1 and T1C), abscess (restricted diffusion) and an L3 normal
case (CT then MRI, three turns).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

PHANTOM_SEED = 11
PHANTOM_CASES = {"ms": 2, "stroke": 3, "ich": 4, "gbm": 5, "abscess": 8, "l3": 21}


@dataclass
class PhantomSuite:
    root: Path
    seed: int
    manifest: object  # dicom.phantoms.SuiteManifest

    def case_dir(self, key: str) -> Path:
        from dicom.phantoms import case_spec

        return self.root / case_spec(PHANTOM_CASES[key]).case_id


@pytest.fixture(scope="session")
def phantom_suite(tmp_path_factory: pytest.TempPathFactory) -> PhantomSuite:
    from dicom.phantoms import generate_suite

    root = tmp_path_factory.mktemp("phantoms")
    manifest = generate_suite(
        root, max(PHANTOM_CASES.values()), PHANTOM_SEED, only=sorted(PHANTOM_CASES.values())
    )
    return PhantomSuite(root, PHANTOM_SEED, manifest)
