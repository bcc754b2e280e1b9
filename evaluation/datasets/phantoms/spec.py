"""Which cases a suite holds (group x difficulty schedule), their sequences and L3 scripts.

The schedule is fixed and independent of the seed, so case ids are stable (``ph-007-gbm``);
the seed changes everything inside a case (side, size, count, age, patient). Thirty cases
cover every group at L1, L2 and L3; larger suites repeat the cycle with new draws.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from evaluation.case import Turn
from evaluation.datasets.phantoms.clinical import Clinical
from evaluation.datasets.phantoms.lesions import GROUPS

_ORDER = (
    "normal",
    "ms",
    "stroke-mca",
    "ich",
    "gbm",
    "mets",
    "meningioma",
    "abscess",
    "stroke-aca",
    "stroke-pca",
)
SCHEDULE: tuple[tuple[str, str], ...] = tuple((g, d) for d in ("L1", "L2", "L3") for g in _ORDER)
assert {g for g, _ in SCHEDULE} == set(GROUPS)


@dataclass(frozen=True)
class CaseSpec:
    index: int  # 1-based position in the suite
    group: str
    difficulty: str

    @property
    def case_id(self) -> str:
        return f"ph-{self.index:03d}-{self.group}"


def case_spec(index: int) -> CaseSpec:
    """The spec of case ``index`` (1-based) of any suite."""
    if index < 1:
        raise ValueError(f"case index starts at 1, got {index}")
    group, difficulty = SCHEDULE[(index - 1) % len(SCHEDULE)]
    return CaseSpec(index, group, difficulty)


def case_specs(n_cases: int) -> list[CaseSpec]:
    return [case_spec(i) for i in range(1, n_cases + 1)]


MR_BASE = ("t1_3d", "t2", "flair", "dwi", "adc", "swi")
CONTRAST = ("t1", "t1c")


def sequences_for(group: str, difficulty: str) -> tuple[list[str], bool]:
    """(MR series roles, whether a head CT is acquired) for a case; follows the disease."""
    ct = difficulty == "L3"
    if group == "normal":
        roles = list(MR_BASE)
    elif group == "ms":
        roles = ["t1_3d", "t2", "flair", "dwi", "adc", *CONTRAST]
        ct = False  # MS work-up is MRI from the start
    elif group.startswith("stroke-"):
        roles, ct = list(MR_BASE), True
    elif group == "ich":
        roles, ct = (list(MR_BASE), True) if difficulty == "L3" else ([], True)
    else:  # tumours and abscess
        roles = [*MR_BASE, *CONTRAST]
        if difficulty == "L2" and group in ("gbm", "abscess"):
            # Without diffusion the ring-enhancing lesion is ambiguous: the record decides.
            roles = [r for r in roles if r not in ("dwi", "adc")]
    return roles, ct


_Q_CT = (
    "A non-contrast head CT was done on arrival. Describe the findings, give your "
    "differential diagnosis and say what you would do next."
)
_Q_MR = (
    "MRI of the head is now available. How does it change your assessment? Localise and "
    "characterise the lesion(s) and update your ranked differential."
)
_Q_FINAL = "Given this information, what is your final diagnosis (with ICD-10 code), and the most important next step?"


def turns_for(
    group: str,
    c: Clinical,
    classes: set[str],
    has_ct: bool,
    age: int,
    sex: str,
    delay: dt.timedelta,
) -> list[Turn]:
    """The L3 script: imaging and record facts revealed over three turns."""
    who = f"{age}-year-old {'woman' if sex == 'F' else 'man'} with {c.complaint}."
    mr = [s for s in ("T1", "T2", "FLAIR", "DWI", "ADC", "SWI", "T1C") if s in classes]
    if has_ct:
        first = Turn(reveal_text=who, reveal_series=["CT"], question=_Q_CT)
        second = Turn(
            reveal_text=f"MRI performed {int(delay.total_seconds() // 60)} minutes after the CT.",
            reveal_series=mr,
            question=_Q_MR,
        )
    else:
        early = [s for s in ("T2", "FLAIR") if s in classes]
        first = Turn(
            reveal_text=who,
            reveal_series=early,
            question="Describe the lesions on these T2-weighted and FLAIR images and give your differential.",
        )
        second = Turn(
            reveal_text="Pre- and post-contrast T1 and diffusion images follow.",
            reveal_series=[s for s in mr if s not in early],
            question="Does this change your differential? What do the contrast images add?",
        )
    return [first, second, Turn(reveal_text=c.later_text, reveal_series=[], question=_Q_FINAL)]
