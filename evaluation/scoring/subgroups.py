"""Results by subgroup: each headline figure by vendor, scanner model, field strength, age band
and sex, with n and a bootstrap CI clustered by patient.

Where each attribute comes from (the case as the run recorded it):

- vendor, scanner model, field strength: the scanners the study's DICOM headers name
  (``Provenance.identity.scanners``: Manufacturer, ManufacturerModelName, MagneticFieldStrength
  of each series' first header); a study naming several takes the one most of its series name.
  A phantom case recorded without them falls back to the generator's field strength.
- age band and sex: the patient record (FHIR Patient: age at the encounter, gender; a run's case
  snapshot keeps these two as ``Provenance.patient``, not the record); where the record says
  nothing, the DICOM header (PatientAge, else PatientBirthDate at StudyDate;
  PatientSex). Each case's source is counted (``SubgroupTable.sources``).

Hostile values, and the rules that read them (one place):

- vendor: a known company by its names and old names ("SIEMENS", "Siemens Healthineers",
  "Siemens HealthCare GmbH" -> Siemens; "GE MEDICAL SYSTEMS" -> GE; "UIH" -> United Imaging;
  "TOSHIBA" -> Canon (Toshiba)); any other: control characters dropped, whitespace collapsed,
  corporate suffixes dropped, at most 40 characters, grouped without regard to case.
- field strength: the standard writes tesla. A value up to 12 is tesla; from 100 up, gauss (some
  scanners write 15000 for 1.5 T), divided by 10,000, kept when that is 12 T or less; anything
  else (0, negative, 12-100, not a number) is "not readable". The figure is then named by the
  nearest nominal strength within 5% (a Trio's 2.89362 is 3 T), else to one decimal.
- age: whole years; a PatientAge of zero ("000Y", which anonymisers write) is taken as not
  recorded, not as a newborn; ages over 130 are not readable. Bands: under 18, 18-39, 40-59,
  60-79, 80 and over.

A subgroup resting on fewer than ``min_patients`` patients (default ``stats.MIN_PATIENTS``) is
reported with ``too_small`` set: its row is kept (never hidden), and pages show "too small (n=3)"
(n: patients) instead of a figure its interval cannot support.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Literal

from pydantic import BaseModel, Field

from evaluation.case import Case, StudyScanner
from evaluation.scoring.scored import ScoredSample
from evaluation.scoring.stats import DEFAULT_BOOT, DEFAULT_SEED, MIN_PATIENTS, Estimate
from evaluation.scoring.summary import HEADLINE_METRICS, headline_metrics

Attribute = Literal["vendor", "scanner_model", "field_strength", "age_band", "sex"]
ATTRIBUTES: tuple[Attribute, ...] = ("vendor", "scanner_model", "field_strength", "age_band", "sex")
ATTRIBUTE_TITLES: dict[str, str] = {
    "vendor": "Vendor",
    "scanner_model": "Scanner model",
    "field_strength": "Field strength",
    "age_band": "Age band",
    "sex": "Sex",
}
METRIC_TITLES: dict[str, str] = {
    "accuracy": "Accuracy",
    "strict_accuracy": "Strict accuracy",
    "ranked_pass_at_1": "ranked pass@1",
    "lesion_f1": "Lesion F1",
}
NOT_RECORDED = "not recorded"
NOT_READABLE = "not readable"
MAX_VALUE_CHARS = 40
AGE_BANDS = ((0, 18, "under 18"), (18, 40, "18-39"), (40, 60, "40-59"), (60, 80, "60-79"))
MAX_TESLA = 12.0
GAUSS_FROM = 100.0
NOMINAL_TESLA = (0.064, 0.2, 0.23, 0.3, 0.35, 0.5, 0.55, 0.6, 1.0, 1.2, 1.5, 3.0, 5.0, 7.0, 9.4,
                 10.5, 11.7)  # fmt: skip
NOMINAL_TOLERANCE = 0.05

# Known vendors: (a pattern over the cleaned Manufacturer, upper case) -> the name shown.
_VENDORS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), name)
    for p, name in (
        (r"\bSIEMENS\b", "Siemens"),
        (r"\bGE\b|\bGENERAL ELECTRIC\b|\bGEMS\b", "GE"),
        (r"\bPHILIPS\b", "Philips"),
        (r"\bCANON\b", "Canon"),
        (r"\bTOSHIBA\b", "Canon (Toshiba)"),
        (r"\bUIH\b|\bUNITED IMAGING\b", "United Imaging"),
        (r"\bHITACHI\b|\bFUJIFILM\b", "Fujifilm (Hitachi)"),
        (r"\bESAOTE\b", "Esaote"),
        (r"\bNEUSOFT\b", "Neusoft"),
        (r"\bHYPERFINE\b", "Hyperfine"),
        (r"\bBRUKER\b", "Bruker"),
    )
)
_SUFFIXES = re.compile(
    r"[\s,.]+(medical systems?|medical|healthcare|healthineers|health care|gmbh|ag|inc|ltd|"
    r"co|corp|corporation|company|b\.?v|n\.?v|s\.?p\.?a|limited)\.?$",
    re.IGNORECASE,
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_AS = re.compile(r"^(\d{3})([DWMY])$")


class CaseAttributes(BaseModel):
    """The subgroup each attribute puts a case in, and where age and sex were read."""

    case_id: str
    vendor: str = NOT_RECORDED
    scanner_model: str = NOT_RECORDED
    field_strength: str = NOT_RECORDED
    age_band: str = NOT_RECORDED
    sex: str = NOT_RECORDED
    age_source: str = NOT_RECORDED  # "record", "DICOM PatientAge", "DICOM birth and study date"
    sex_source: str = NOT_RECORDED  # "record", "DICOM PatientSex"
    scanner_source: str = NOT_RECORDED  # "DICOM headers", "phantom generator"


class SubgroupRow(BaseModel):
    """One figure of one model on one subgroup of cases."""

    attribute: Attribute
    value: str
    model: str
    metric: str  # scoring.summary.HEADLINE_METRICS
    n: int  # answers the figure counts
    n_patients: int  # the independent units behind it (the bootstrap resamples them)
    n_cases: int
    estimate: float | None
    ci_low: float | None
    ci_high: float | None
    unscored: int = 0  # answers of the subgroup the figure could not count
    too_small: bool  # fewer patients than the minimum: shown as such, never hidden

    @property
    def too_small_text(self) -> str:
        """As the contract between the reports words it; n counts patients (pages say so)."""
        return f"too small (n={self.n_patients})"


class SubgroupTable(BaseModel):
    """The subgroup rows of a run, the minimum size, and where each attribute was read."""

    min_patients: int
    rows: list[SubgroupRow] = Field(default_factory=list)
    # attribute -> source -> cases ("record": 40, "DICOM PatientAge": 12, "not recorded": 8)
    sources: dict[str, dict[str, int]] = Field(default_factory=dict)

    def attributes(self) -> list[str]:
        return [a for a in ATTRIBUTES if any(r.attribute == a for r in self.rows)]

    def metrics(self) -> list[str]:
        return [m for m in HEADLINE_METRICS if any(r.metric == m for r in self.rows)]

    def grid(self, attribute: str) -> list[tuple[str, str, dict[str, SubgroupRow]]]:
        """(subgroup, model, metric -> row) of one attribute, in the table's order."""
        out: dict[tuple[str, str], dict[str, SubgroupRow]] = {}
        for r in self.rows:
            if r.attribute == attribute:
                out.setdefault((r.value, r.model), {})[r.metric] = r
        ordered = sorted(out, key=lambda vm: (value_order(vm[0]), vm[1]))  # models side by side
        return [(v, m, out[(v, m)]) for v, m in ordered]


# --------------------------------------------------------------------------- the rules


def clean_value(text: object, limit: int = MAX_VALUE_CHARS) -> str:
    """A header or record value as a bounded, single-line label ("" when nothing is left)."""
    out = " ".join(_CONTROL.sub(" ", str(text if text is not None else "")).split())
    return out if len(out) <= limit else out[: limit - 1] + "…"


def vendor_name(manufacturer: object) -> str:
    """The vendor a Manufacturer value names: a known company by its one name, else the value
    cleaned of corporate suffixes; "not recorded" when empty."""
    text = clean_value(manufacturer, 200)
    if not text:
        return NOT_RECORDED
    upper = text.upper()
    for pattern, name in _VENDORS:
        if pattern.search(upper):
            return name
    stripped = text
    for _ in range(3):  # "Foo Medical Systems, Inc." -> "Foo"
        shorter = _SUFFIXES.sub("", stripped).strip(" ,.")
        if shorter == stripped or not shorter:
            break
        stripped = shorter
    return clean_value(stripped) or NOT_RECORDED


def scanner_model_name(vendor: str, model: object) -> str:
    """The scanner model, named with its vendor ("Siemens MAGNETOM Prisma Fit")."""
    text = clean_value(model, 200)
    if not text:
        return NOT_RECORDED
    if vendor == NOT_RECORDED or text.upper().startswith(vendor.upper()):
        return clean_value(text)
    return clean_value(f"{vendor} {text}")


def field_strength_tesla(value: object) -> float | None:
    """MagneticFieldStrength in tesla by the module's rule (None: not readable)."""
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    if not math.isfinite(v) or v <= 0:
        return None
    if v <= MAX_TESLA:
        return v
    if v >= GAUSS_FROM and v / 10_000 <= MAX_TESLA:
        return v / 10_000
    return None


def field_strength_label(tesla: float | None) -> str:
    """The subgroup of a field strength: the nearest nominal strength within 5%, else one
    decimal ("1.5 T", "3 T")."""
    if tesla is None:
        return NOT_READABLE
    near = min(NOMINAL_TESLA, key=lambda n: abs(n - tesla))
    v = near if abs(near - tesla) <= NOMINAL_TOLERANCE * near else round(tesla, 1)
    return f"{v:g} T"


def age_band(years: int | None) -> str:
    if years is None:
        return NOT_RECORDED
    if not 0 <= years <= 130:
        return NOT_READABLE
    for lo, hi, name in AGE_BANDS:
        if lo <= years < hi:
            return name
    return "80 and over"


def age_of_header(age: str) -> int | None:
    """Whole years from a PatientAge (AS) value; None when empty, malformed or zero."""
    m = _AS.match(age.strip())
    if not m:
        return None
    n, unit = int(m[1]), m[2]
    if n == 0:
        return None  # "000Y": what anonymisers write, not a newborn
    return {"Y": n, "M": n // 12, "W": n // 52, "D": n // 365}[unit]


def _age_at(birth: str, when: str) -> int | None:
    try:
        b, w = dt.date.fromisoformat(birth), dt.date.fromisoformat(when)
    except ValueError:
        return None
    years = w.year - b.year - ((w.month, w.day) < (b.month, b.day))
    return years if 0 <= years <= 130 else None


_SEXES = {
    "male": "male",
    "m": "male",
    "female": "female",
    "f": "female",
    "other": "other",
    "o": "other",
    "unknown": NOT_RECORDED,
}


def sex_name(value: object) -> str | None:
    """FHIR gender or DICOM PatientSex as one word (None: says nothing)."""
    key = clean_value(value, 20).lower()
    if not key:
        return None
    return _SEXES.get(key, NOT_READABLE)


def _study_scanner(scanners: Sequence[StudyScanner]) -> StudyScanner | None:
    """The study's scanner: the one most series name (the first among equals)."""
    named = [s for s in scanners if s.manufacturer or s.model_name or s.field_strength]
    return max(named, key=lambda s: s.n_series) if named else None


def _record_patient(case: Case) -> tuple[int | None, str | None]:
    """Age and sex from the case's record, else from what a run's snapshot kept of it."""
    if not case.ehr:
        kept = case.provenance.patient
        return (kept.age, sex_name(kept.sex)) if kept is not None else (None, None)
    from evaluation.ehr import EHRContext

    try:
        patient = EHRContext.from_bundle(case.ehr).patient
    except (ValueError, TypeError, KeyError, RecursionError):
        return None, None
    if patient is None:
        return None, None
    return patient.age, sex_name(patient.sex)


def case_attributes(case: Case) -> CaseAttributes:
    """The subgroup of each attribute for one case, by the module's rules."""
    out = CaseAttributes(case_id=case.case_id)
    ident = case.provenance.identity
    scanner = _study_scanner(ident.scanners) if ident is not None else None
    if scanner is not None:
        out.vendor = vendor_name(scanner.manufacturer)
        out.scanner_model = scanner_model_name(out.vendor, scanner.model_name)
        out.field_strength = (
            field_strength_label(field_strength_tesla(scanner.field_strength))
            if scanner.field_strength is not None
            else NOT_RECORDED
        )
        out.scanner_source = "DICOM headers"
    elif case.provenance.phantom is not None:
        t = field_strength_tesla(case.provenance.phantom.field_strength_t)
        out.field_strength = field_strength_label(t)
        out.scanner_source = "phantom generator"
    if out.field_strength == NOT_RECORDED and _is_ct(case):
        out.field_strength = "not applicable (CT)"
    age, sex = _record_patient(case)
    if age is not None:
        out.age_band, out.age_source = age_band(age), "record"
    elif ident is not None and (a := age_of_header(ident.age)) is not None:
        out.age_band, out.age_source = age_band(a), "DICOM PatientAge"
    elif ident is not None and (a := _age_at(ident.birth_date, ident.study_date)) is not None:
        out.age_band, out.age_source = age_band(a), "DICOM birth and study date"
    if sex is not None:
        out.sex, out.sex_source = sex, "record"
    elif ident is not None and (s := sex_name(ident.sex)) is not None:
        out.sex, out.sex_source = s, "DICOM PatientSex"
    return out


def _is_ct(case: Case) -> bool:
    mods = {(i.modality or "").upper() for i in case.images}
    if ident := case.provenance.identity:
        mods |= {m.upper() for m in ident.modalities}
    return "CT" in mods and not mods & {"MR", "MRI"}


# --------------------------------------------------------------------------- the table


def subgroup_table(
    cases: Iterable[Case],
    samples: Sequence[ScoredSample],
    *,
    min_patients: int = MIN_PATIENTS,
    n_boot: int = DEFAULT_BOOT,
    seed: int = DEFAULT_SEED,
) -> SubgroupTable:
    """Every headline figure of every model by each attribute's subgroups, with where each
    attribute was read. A sample whose case is not among ``cases`` is in "not recorded"."""
    attrs = {c.case_id: case_attributes(c) for c in cases}
    sources: dict[str, dict[str, int]] = {
        "vendor": dict(Counter(a.scanner_source for a in attrs.values())),
        "age_band": dict(Counter(a.age_source for a in attrs.values())),
        "sex": dict(Counter(a.sex_source for a in attrs.values())),
    }
    sources["scanner_model"] = sources["field_strength"] = sources["vendor"]
    by_model: dict[str, list[ScoredSample]] = defaultdict(list)
    for s in samples:
        by_model[s.model].append(s)
    rows: list[SubgroupRow] = []
    for attribute in ATTRIBUTES:
        for model, ss in sorted(by_model.items()):
            groups: dict[str, list[ScoredSample]] = defaultdict(list)
            for s in ss:
                known = attrs.get(s.case_id)
                groups[str(getattr(known, attribute)) if known else NOT_RECORDED].append(s)
            applies = set()  # a metric shown for a model only where it applies to its answers
            figures = {}
            for value, g in groups.items():
                figures[value] = headline_metrics(g, n_boot=n_boot, seed=seed)
                applies |= {m for m, e in figures[value].items() if e is not None}
            for value in sorted(groups, key=value_order):
                for metric in HEADLINE_METRICS:
                    if metric in applies:
                        e = figures[value][metric]
                        rows.append(_row(attribute, value, model, metric, e, groups[value],
                                         min_patients))  # fmt: skip
    return SubgroupTable(min_patients=min_patients, rows=rows, sources=sources)


def subgroup_results(
    cases: Iterable[Case],
    samples: Sequence[ScoredSample],
    *,
    min_patients: int = MIN_PATIENTS,
    n_boot: int = DEFAULT_BOOT,
    seed: int = DEFAULT_SEED,
) -> list[SubgroupRow]:
    """The subgroup rows of a run's ``cases`` and scored ``samples`` (``subgroup_table``'s)."""
    table = subgroup_table(cases, samples, min_patients=min_patients, n_boot=n_boot, seed=seed)
    return table.rows


def _row(
    attribute: Attribute,
    value: str,
    model: str,
    metric: str,
    e: Estimate | None,
    g: list[ScoredSample],
    min_patients: int,
) -> SubgroupRow:
    counted = e.patients if e is not None and e.value is not None else 0
    return SubgroupRow(
        attribute=attribute,
        value=value,
        model=model,
        metric=metric,
        n=e.n if e is not None else 0,
        n_patients=counted,
        n_cases=len({s.case_id for s in g}),
        estimate=e.value if e is not None else None,
        ci_low=e.low if e is not None else None,
        ci_high=e.high if e is not None else None,
        unscored=(e.unscored or 0) if e is not None else len(g),
        too_small=counted < min_patients,
    )


def value_order(value: str) -> tuple[int, str]:
    """Subgroups in a reading order: age bands youngest first, the unknowns last."""
    bands = [name for _, _, name in AGE_BANDS] + ["80 and over"]
    if value in bands:
        return (0, f"{bands.index(value):02d}")
    if value in (NOT_RECORDED, NOT_READABLE) or value.startswith("not applicable"):
        return (2, value)
    return (1, value.casefold())
