"""The clinical story of each phantom case: presentation, history, vitals, labs, scores.

Values are drawn per case and are consistent with the diagnosis (a pyogenic abscess has fever
and a raised CRP; a glioblastoma does not); L2 cases carry the record facts that decide an
ambiguous picture, L3 cases hold the decisive facts back for the last turn. A few irrelevant
comorbidities and the odd typo make the record look written by a busy clinician.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Obs:
    name: str
    value: float | str
    unit: str | None = None
    loinc: str | None = None  # only codes we are sure of; others carry text only
    category: str = "laboratory"  # vital-signs | laboratory | survey | exam
    interpretation: str | None = None  # H / L / N


@dataclass
class Clinical:
    age: int
    sex: str
    complaint: str
    history: list[str]
    exam: str
    conditions: list[tuple[str, str | None]]
    medications: list[str]
    observations: list[Obs]
    later: list[Obs] = field(default_factory=list)  # held back to the last L3 turn
    later_text: str = ""
    reason: str = ""
    encounter_class: str = "EMER"
    facts: dict[str, object] = field(default_factory=dict)


def _r(rng: np.random.Generator, lo: float, hi: float, nd: int = 0) -> float:
    v = float(rng.uniform(lo, hi))
    return round(v, nd) if nd else float(round(v))


def vitals(
    rng: np.random.Generator,
    temp: tuple[float, float] = (36.4, 37.2),
    sbp: tuple[float, float] = (118, 142),
    hr: tuple[float, float] = (62, 88),
) -> list[Obs]:
    t = _r(rng, *temp, nd=1)
    s = _r(rng, *sbp)
    return [
        Obs("Body temperature", t, "Cel", "8310-5", "vital-signs", "H" if t >= 38.0 else None),
        Obs("Heart rate", _r(rng, *hr), "/min", "8867-4", "vital-signs"),
        Obs(
            "Systolic blood pressure",
            s,
            "mm[Hg]",
            "8480-6",
            "vital-signs",
            "H" if s >= 160 else None,
        ),
        Obs(
            "Diastolic blood pressure",
            _r(rng, s * 0.52, s * 0.6),
            "mm[Hg]",
            "8462-4",
            "vital-signs",
        ),
        Obs("Oxygen saturation (pulse oximetry)", _r(rng, 95, 99), "%", "59408-5", "vital-signs"),
    ]


def labs(
    rng: np.random.Generator,
    crp: tuple[float, float] = (0.5, 4.5),
    wbc: tuple[float, float] = (4.6, 9.5),
    inr: tuple[float, float] = (0.9, 1.1),
) -> list[Obs]:
    c = _r(rng, *crp, nd=1)
    w = _r(rng, *wbc, nd=1)
    i = _r(rng, *inr, nd=1)
    return [
        Obs("C reactive protein", c, "mg/L", "1988-5", interpretation="H" if c > 5 else "N"),
        Obs("Leukocytes", w, "10*9/L", "6690-2", interpretation="H" if w > 11 else "N"),
        Obs("Hemoglobin", _r(rng, 12.2, 15.6, nd=1), "g/dL", "718-7"),
        Obs("Platelets", _r(rng, 160, 380), "10*9/L", "777-3"),
        Obs("Glucose", _r(rng, 86, 138), "mg/dL", "2345-7"),
        Obs("Sodium", _r(rng, 136, 143), "mmol/L", "2951-2"),
        Obs("INR", i, None, "6301-6", interpretation="H" if i > 1.3 else "N"),
    ]


_NOISE = (
    ("Osteoarthritis of both knees", "M17.0"),
    ("Hypothyroidism, on replacement", "E03.9"),
    ("Gastro-oesophageal reflux disease", "K21.9"),
    ("Seasonal allergic rhinitis", "J30.2"),
    ("Lumbar back pain", "M54.5"),
)
_NOISE_MEDS = {"E03.9": "levothyroxine 75 mcg daily", "K21.9": "omeprazole 20 mg daily"}


def _noise(rng: np.random.Generator, c: Clinical) -> None:
    """One or two irrelevant comorbidities, as real records have."""
    for i in rng.choice(len(_NOISE), size=int(rng.integers(1, 3)), replace=False):
        text, code = _NOISE[int(i)]
        c.conditions.append((text, code))
        if code in _NOISE_MEDS:
            c.medications.append(_NOISE_MEDS[code])


def _side_words(side: str) -> tuple[str, str]:
    """(side of the lesion, side of the body deficit)."""
    return side, "left" if side == "right" else "right"


def scenario(
    group: str,
    difficulty: str,
    facts: dict[str, object],
    rng: np.random.Generator,
    age: int,
    sex: str,
) -> Clinical:
    """The clinical record of a case of ``group`` consistent with its lesion ``facts``."""
    v = vitals(rng)
    lab = labs(rng)
    side = str(facts.get("side", "right"))
    _, body = _side_words(side)
    if group == "normal":
        c = Clinical(
            age,
            sex,
            "recurrent headaches for six months",
            [
                "Bilateral pressing headaches, worse with stress and poor sleep.",
                "No vomiting, no visual loss, no weakness. Wakes normally.",
            ],
            "Alert and oriented. Cranial nerves intact. Power 5/5 throughout. No papilloedema.",
            [],
            ["ibuprofen 400 mg as needed"],
            v + lab,
            reason="Headache",
            encounter_class="AMB",
        )
        if difficulty == "L2":
            c.history.append(
                "Known migraine with aura since her twenties: zigzag lights then tingling "
                "of the hand for 20 minutes before the headache; today's episode identical."
            )
            c.conditions.append(("Migraine with aura", "G43.1"))
        c.later_text = "Blood tests are normal (CRP, full blood count, sodium, glucose)."
    elif group == "ms":
        edss = float(rng.choice([1.5, 2.0, 2.5, 3.0, 3.5]))
        c = Clinical(
            age,
            sex,
            "numbness and tingling of both legs for 10 days",
            [
                "Ascending numbness from the feet to the waist over a week; urinary urgency.",
                "Electric sensation down the spine on neck flexion (Lhermitte).",
            ],
            "Reduced vibration sense below T10, brisk reflexes in the legs, extensor plantars. "
            "Mild right relative afferent pupillary defect.",
            [],
            [],
            v + lab + [Obs("EDSS", edss, None, None, "survey")],
            reason="Sensory disturbance of the legs",
            encounter_class="AMB",
        )
        csf = [
            Obs("CSF oligoclonal bands (CSF-specific)", "positive", None, None, "laboratory", "A"),
            Obs("CSF white cell count", _r(rng, 2, 12), "/uL", None, "laboratory"),
        ]
        hist = "Two years ago: painful blurred vision of the right eye for three weeks that recovered (optic neuritis)."
        if difficulty == "L3":
            c.later = csf
            c.later_text = (
                "CSF: " + str(csf[0].value) + " CSF-specific oligoclonal bands, "
                f"{csf[1].value:g} white cells/uL. {hist}"
            )
        else:
            c.history.append(hist)
            c.conditions.append(("Optic neuritis (right), recovered", "H46"))
            c.observations += csf
    elif group.startswith("stroke-"):
        territory = str(facts.get("territory", "MCA"))
        hours = float(facts.get("onset_hours", 3.0))  # type: ignore[arg-type]
        deficit = {
            "MCA": f"{body} face and arm weakness"
            + (" with expressive aphasia" if side == "left" else " with neglect of the left side"),
            "ACA": f"{body} leg weakness, the arm much less affected, and apathy",
            "PCA": f"loss of the {body} half of the visual field (homonymous hemianopia)",
        }[territory]
        nihss = {"MCA": (8, 20), "ACA": (4, 10), "PCA": (3, 8)}[territory]
        af = rng.random() < 0.65
        c = Clinical(
            age,
            sex,
            f"sudden {deficit}",
            [
                f"Last known well {hours:.1f} hours before the scan; found by family.",
                "No headache, no seizure witnessed.",
            ],
            f"Alert. {deficit[0].upper() + deficit[1:]}. No neck stiffness.",
            [("Essential hypertension", "I10"), ("Hyperlipidaemia", "E78.5")],
            ["ramipril 5 mg daily", "atorvastatin 40 mg daily"],
            vitals(rng, sbp=(155, 190), hr=(78, 118) if af else (64, 90))
            + lab
            + [Obs("NIH Stroke Scale total score", _r(rng, *nihss), None, None, "survey")],
            reason="Suspected acute stroke",
        )
        ecg = Obs("ECG rhythm", "atrial fibrillation" if af else "sinus rhythm", None, None, "exam")
        if difficulty == "L3":
            c.later = [ecg]
            c.later_text = (
                f"ECG: {ecg.value}. Glucose and INR normal. Onset-to-scan time "
                f"{hours:.1f} h." + (" Not anticoagulated." if af else "")
            )
        else:
            c.observations.append(ecg)
            if af:
                c.conditions.append(("Atrial fibrillation, not anticoagulated", "I48.9"))
        c.facts["atrial_fibrillation"] = af
    elif group == "ich":
        anticoag = difficulty == "L2" or rng.random() < 0.4
        inr = (2.8, 4.2) if anticoag else (0.9, 1.1)
        c = Clinical(
            age,
            sex,
            f"sudden severe headache, vomiting and {body}-sided weakness",
            ["Collapsed at home one hour before arrival; drowsy."],
            f"GCS {int(rng.integers(11, 15))}. Dense {body} hemiparesis.",
            [("Essential hypertension, poorly controlled", "I10")],
            ["amlodipine 10 mg daily"],
            vitals(rng, sbp=(185, 225))
            + labs(rng, inr=inr)
            + [Obs("Glasgow coma score total", _r(rng, 11, 14), None, "9269-2", "survey")],
            reason="Sudden headache with weakness",
        )
        if anticoag:
            c.conditions.append(("Atrial fibrillation", "I48.9"))
            c.medications.append("warfarin (dose per INR clinic)")
        c.later_text = (
            "INR "
            + next(f"{o.value:g}" for o in c.observations if o.name == "INR")
            + (" on warfarin." if anticoag else "; no anticoagulant or antiplatelet drug.")
        )
        c.facts["anticoagulated"] = anticoag
    elif group in ("gbm", "abscess"):
        weeks = int(rng.integers(3, 9)) if group == "gbm" else int(rng.integers(1, 3))
        c = Clinical(
            age,
            sex,
            f"progressive {body}-sided weakness and headache over {weeks} weeks",
            [
                "Family report word-finding pauses and a change in personality."
                if group == "gbm"
                else "Confused for two days; partner reports night sweats."
            ],
            f"Mild {body}-sided pronator drift. Papilloedema not seen.",
            [],
            ["paracetamol 1 g as needed"],
            [],
            reason="Progressive focal deficit",
        )
        if group == "gbm":
            c.observations = vitals(rng) + labs(rng)
            c.medications.append("dexamethasone 4 mg twice daily (started by GP)")
            c.later_text = "Afebrile throughout, CRP and white cell count normal; no recent infection or dental work."
        else:
            source = [
                "dental abscess treated 3 weeks ago",
                "chronic otitis media",
                "frontal sinusitis",
            ][int(rng.integers(3))]
            c.observations = vitals(rng, temp=(38.2, 39.4), hr=(92, 118)) + labs(
                rng, crp=(60, 180), wbc=(12.5, 19.5)
            )
            c.history.append(f"Recent {source}.")
            c.conditions.append((source[0].upper() + source[1:], None))
            c.later_text = (
                f"Temperature {c.observations[0].value:g} C, CRP "
                f"{next(o.value for o in c.observations if o.name == 'C reactive protein')} mg/L, "
                f"white cells {next(o.value for o in c.observations if o.name == 'Leukocytes')} x10^9/L; recent {source}."
            )
            c.facts["source"] = source
    elif group == "mets":
        primary = str(facts.get("primary", "lung adenocarcinoma"))
        code = {"lung adenocarcinoma": "C34.9", "breast carcinoma": "C50.9", "melanoma": "C43.9"}[
            primary
        ]
        drug = {
            "lung adenocarcinoma": "pembrolizumab",
            "breast carcinoma": "letrozole",
            "melanoma": "nivolumab",
        }[primary]
        c = Clinical(
            age,
            sex,
            "headache for two weeks and unsteadiness",
            ["Headache worse in the mornings; one episode of vomiting."],
            "Mild truncal ataxia. No papilloedema.",
            [],
            [],
            vitals(rng) + labs(rng),
            reason="New headache",
        )
        history = f"{primary[0].upper() + primary[1:]} diagnosed two years ago, on {drug}."
        if difficulty == "L3":
            c.later_text = history
        else:
            c.history.append(history)
            c.conditions.append((primary[0].upper() + primary[1:], code))
            c.medications.append(f"{drug} (oncology)")
    elif group == "meningioma":
        c = Clinical(
            age,
            sex,
            "first generalised seizure" if rng.random() < 0.5 else "headaches for three months",
            ["No fever, no weight loss."],
            "Neurologically intact.",
            [],
            [],
            vitals(rng) + labs(rng),
            reason="Seizure / headache",
            encounter_class="AMB",
        )
        prior = "An outside MRI four years ago (for dizziness) reported a small extra-axial lesion at the same site, slightly smaller then."
        if difficulty == "L3":
            c.later_text = prior
        elif difficulty == "L2":
            c.history.append(prior)
    else:
        raise ValueError(f"no clinical scenario for group {group!r}")
    if difficulty == "L3":
        # The decisive record facts arrive at the last turn: labs and temperature held back.
        held = [o for o in c.observations if o.category == "laboratory" or o.loinc == "8310-5"]
        c.observations = [o for o in c.observations if o not in held]
        c.later = held + [o for o in c.later if o not in held]
    if not c.later_text:
        c.later_text = (
            "Routine blood tests: "
            + ", ".join(
                f"{o.name} {o.value:g} {o.unit or ''}".strip()
                for o in lab[:3]
                if isinstance(o.value, float)
            )
            + "."
        )
    _noise(rng, c)
    return c
