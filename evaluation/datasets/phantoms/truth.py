"""Diagnoses, synonyms, reference differentials, key findings and rationale of phantom cases.

Everything here is written from facts the generator knows for certain: the lesions as
measured on the 1 mm label mask (location from the atlas, size, signal per sequence from the
tissue model), the acquired sequences and the clinical record.
"""

from __future__ import annotations

from evaluation.case import Diagnosis, DiseaseGroup, LesionTruth, Signal
from evaluation.datasets.phantoms.clinical import Clinical

G = DiseaseGroup

_GBM_ICD = {"frontal": "C71.1", "temporal": "C71.2", "parietal": "C71.3", "occipital": "C71.4"}
_ICH_ICD = {"deep": "I61.0", "lobar": "I61.1", "cerebellar": "I61.4"}

SYNONYMS: dict[str, list[str]] = {
    "normal": ["normal", "normal study", "no acute intracranial abnormality", "normal brain MRI"],
    "ms": [
        "multiple sclerosis",
        "MS",
        "relapsing-remitting multiple sclerosis",
        "demyelinating disease",
    ],
    "stroke": [
        "acute ischaemic stroke",
        "acute ischemic stroke",
        "cerebral infarction",
        "ischaemic stroke",
        "stroke",
    ],
    "ich": [
        "intracerebral haemorrhage",
        "intracerebral hemorrhage",
        "ICH",
        "haemorrhagic stroke",
        "hemorrhagic stroke",
        "intraparenchymal haemorrhage",
    ],
    "gbm": [
        "glioblastoma",
        "glioblastoma multiforme",
        "GBM",
        "high-grade glioma",
        "grade 4 glioma",
    ],
    "mets": ["brain metastases", "cerebral metastases", "metastatic disease", "metastases"],
    "meningioma": ["meningioma", "extra-axial meningioma"],
    "abscess": ["brain abscess", "cerebral abscess", "pyogenic abscess", "pyogenic brain abscess"],
}


def final_diagnosis(
    group: str, facts: dict[str, object], clinical: Clinical, lesions: list[LesionTruth]
) -> Diagnosis:
    if group == "normal":
        return Diagnosis(
            name="No structural intracranial abnormality (normal study)",
            icd10="Z03.3",
            group=G.NORMAL,
        )
    if group == "ms":
        return Diagnosis(name="Multiple sclerosis", icd10="G35", group=G.DEMYELINATING)
    if group.startswith("stroke-"):
        embolic = bool(clinical.facts.get("atrial_fibrillation"))
        return Diagnosis(
            name=f"Acute ischaemic stroke, {facts['side']} {facts['territory']} territory"
            + (" (cardioembolic, atrial fibrillation)" if embolic else ""),
            icd10="I63.4" if embolic else "I63.5",
            group=G.ISCHAEMIC_STROKE,
        )
    if group == "ich":
        site = str(facts["site"])
        anticoag = bool(clinical.facts.get("anticoagulated"))
        cause = (
            "anticoagulant-associated" if anticoag else ("hypertensive" if site != "lobar" else "")
        )
        detail = f"{site}, {cause}" if cause else site
        name = f"Acute intracerebral haemorrhage, {where(lesions[0])} ({detail})"
        return Diagnosis(name=name, icd10=_ICH_ICD[site], group=G.HAEMORRHAGIC_STROKE)
    if group == "gbm":
        lobe = lesions[0].lobe or ""
        return Diagnosis(
            name="Glioblastoma, IDH-wildtype (WHO grade 4)",
            icd10=_GBM_ICD.get(lobe, "C71.0"),
            group=G.TUMOUR,
        )
    if group == "mets":
        n = len(lesions)
        return Diagnosis(
            name=f"Brain metastas{'is' if n == 1 else 'es'} from {facts['primary']}",
            icd10="C79.3",
            group=G.TUMOUR,
        )
    if group == "meningioma":
        return Diagnosis(name="Meningioma (WHO grade 1)", icd10="D32.0", group=G.TUMOUR)
    if group == "abscess":
        return Diagnosis(name="Pyogenic brain abscess", icd10="G06.0", group=G.INFECTION)
    raise ValueError(f"unknown group {group!r}")


def differential(group: str, final: Diagnosis) -> list[Diagnosis]:
    """Reference differential, most likely first (the final diagnosis leads)."""
    d = Diagnosis
    rest = {
        "normal": [
            d(name="Migraine", icd10="G43.9"),
            d(name="Tension-type headache", icd10="G44.2"),
        ],
        "ms": [
            d(name="Acute disseminated encephalomyelitis", icd10="G04.0"),
            d(name="Neuromyelitis optica spectrum disorder", icd10="G36.0"),
            d(name="Small vessel ischaemic disease", icd10="I67.9"),
        ],
        "stroke": [
            d(name="Postictal (Todd) paresis after a seizure", icd10="G83.8"),
            d(name="Hypoglycaemia", icd10="E16.2"),
            d(name="Migraine with aura", icd10="G43.1"),
        ],
        "ich": [
            d(name="Haemorrhage into a tumour", icd10="C79.3"),
            d(name="Cerebral amyloid angiopathy-related haemorrhage", icd10="I68.0"),
            d(name="Arteriovenous malformation", icd10="Q28.2"),
        ],
        "gbm": [
            d(name="Brain metastasis", icd10="C79.3"),
            d(name="Brain abscess", icd10="G06.0"),
            d(name="Primary CNS lymphoma", icd10="C83.3"),
            d(name="Tumefactive demyelination", icd10="G35"),
        ],
        "mets": [
            d(name="Glioblastoma (multifocal)", icd10="C71.9"),
            d(name="Brain abscesses (septic emboli)", icd10="G06.0"),
            d(name="Neurocysticercosis", icd10="B69.0"),
        ],
        "meningioma": [
            d(name="Dural metastasis", icd10="C79.3"),
            d(name="Solitary fibrous tumour of the dura"),
            d(name="Dural lymphoma", icd10="C83.3"),
        ],
        "abscess": [
            d(name="Glioblastoma", icd10="C71.9"),
            d(name="Brain metastasis", icd10="C79.3"),
            d(name="Tumefactive demyelination", icd10="G35"),
        ],
    }
    key = "stroke" if group.startswith("stroke-") else group
    return [final, *rest[key]]


def synonyms(group: str) -> list[str]:
    return list(SYNONYMS["stroke" if group.startswith("stroke-") else group])


def where(lt: LesionTruth) -> str:
    """'right frontal lobe', 'left periventricular white matter', ..."""
    hemi = {"left": "left ", "right": "right ", "bilateral": "bilateral ", "midline": ""}[
        lt.hemisphere.value
    ]
    if lt.region in ("frontal", "parietal", "temporal", "occipital"):
        return f"{hemi}{lt.region} lobe"
    if lt.region == "juxtacortical":
        return f"{hemi}{lt.lobe} juxtacortical white matter"
    if lt.region == "extra-axial":
        return f"{hemi}{lt.lobe} convexity (extra-axial)"
    return f"{hemi}{lt.region}"


def signal_text(lt: LesionTruth) -> str:
    groups: dict[str, list[str]] = {}
    for seq, sig in lt.signal.items():
        groups.setdefault(sig.value, []).append(seq)
    return "; ".join(f"{k} on {'/'.join(v)}" for k, v in groups.items())


def key_findings(
    group: str,
    lesions: list[LesionTruth],
    facts: dict[str, object],
    lfacts: list[dict[str, object]],
    sequences: set[str],
    midline_shift_mm: float,
) -> list[str]:
    out: list[str] = []
    if group == "normal" or not lesions:
        return [
            "No focal parenchymal lesion, haemorrhage, mass or abnormal enhancement",
            "Ventricles, sulci and extra-axial spaces normal for age",
            "No restricted diffusion" if "DWI" in sequences else "No acute abnormality on CT",
        ]
    shift = f"; midline shift about {midline_shift_mm:.0f} mm" if midline_shift_mm >= 2 else ""
    if group == "ms":
        # Counted from the atlas regions of the measured lesions (what the mask shows).
        regions = [lt.region for lt in lesions]
        n_pv = regions.count("periventricular white matter") + regions.count("corpus callosum")
        n_jc = regions.count("juxtacortical")
        n_it = sum(r in ("brainstem", "cerebellum") for r in regions)
        out.append(
            f"{len(lesions)} ovoid T2/FLAIR-hyperintense white-matter lesions: "
            f"{n_pv} periventricular or callosal, {n_jc} juxtacortical, {n_it} infratentorial, "
            f"{len(lesions) - n_pv - n_jc - n_it} elsewhere in the white matter (dissemination in space)"
        )
        if n_pv:
            out.append(
                "Periventricular lesions oriented perpendicular to the lateral ventricles (Dawson's fingers)"
            )
        active = sum(1 for f in lfacts if f.get("active"))
        if active and "T1C" in sequences:
            out.append(
                f"{active} enhancing (active) lesion(s) alongside non-enhancing ones: dissemination in time"
            )
        holes = sum(1 for lt in lesions if lt.signal.get("T1") is Signal.HYPO)
        if holes:
            out.append(f"{holes} lesion(s) T1-hypointense (black holes)")
        return out
    lt = lesions[0]
    size = f"{lt.size_mm:.0f} mm"
    if group.startswith("stroke-"):
        out.append(
            f"Acute infarct in the {facts['side']} {facts['territory']} territory ({facts['branch']}), "
            f"centred on the {where(lt)}, {size}"
        )
        if "DWI" in sequences:
            out.append("Restricted diffusion: DWI hyperintense with low ADC")
        if "FLAIR" in sequences:
            out.append(
                "FLAIR hyperintense"
                if lt.signal.get("FLAIR") is Signal.HYPER
                else "No FLAIR change yet (DWI-FLAIR mismatch: onset probably within 4.5 h)"
            )
        if "CT" in sequences:
            out.append(
                "CT hypodense with loss of grey-white differentiation"
                if lt.signal.get("CT") is Signal.HYPODENSE
                else "CT normal or near-normal at this early stage"
            )
        out.append("No haemorrhage")
    elif group == "ich":
        out.append(
            f"Acute {facts['site']} intraparenchymal haematoma in the {where(lt)}, about {facts['volume_ml']} mL ({size})"
        )
        if "CT" in sequences:
            out.append("Hyperdense on CT (fresh clotted blood) with a hypodense rim of oedema")
        if "SWI" in sequences:
            out.append("Marked susceptibility (blooming) on SWI")
        out.append("Local mass effect" + shift)
    elif group == "gbm":
        out += [
            f"Intra-axial mass in the {where(lt)}, {size}, with thick irregular ring enhancement and central necrosis",
            "Extensive surrounding vasogenic oedema (FLAIR hyperintense)",
            "Mass effect with sulcal effacement and compression of the lateral ventricle" + shift,
        ]
        if "DWI" in sequences:
            out.append("No central restricted diffusion (necrotic core ADC high)")
        if lfacts[0].get("intratumoural_haemorrhage") and "SWI" in sequences:
            out.append("Intratumoural susceptibility foci on SWI")
    elif group == "mets":
        locs = ", ".join(where(x) for x in lesions)
        out += [
            f"{len(lesions)} enhancing lesion(s) at the grey-white junction: {locs}",
            "Vasogenic oedema disproportionate to lesion size",
        ]
        if any(x.enhancement.value == "ring" for x in lesions):
            out.append("Larger lesion(s) ring-enhancing with a necrotic centre")
    elif group == "meningioma":
        out += [
            f"Extra-axial dural-based mass over the {where(lt)}, {size}, with a broad dural base",
            "Homogeneous avid enhancement with a dural tail",
            "Isointense to grey matter on T1 and T2; inward displacement of the cortex" + shift,
        ]
        if "CT" in sequences:
            out.append(
                "Slightly hyperdense on CT"
                + (" with calcification" if lfacts[0].get("calcified") else "")
            )
    elif group == "abscess":
        out += [
            f"Ring-enhancing lesion in the {where(lt)}, {size}, with a thin smooth wall",
            "T2-hypointense rim and surrounding vasogenic oedema",
        ]
        if "DWI" in sequences:
            out.append("Central restricted diffusion (DWI bright, ADC low): pus")
        out.append("Mass effect" + shift)
    return out


def rationale(
    group: str, final: Diagnosis, findings: list[str], clinical: Clinical, difficulty: str
) -> str:
    parts = [f"Imaging: {'; '.join(findings)}."]
    clues = {
        "normal": "The record describes a benign headache pattern without red flags, and imaging shows no structural cause.",
        "ms": "Clinically a young adult with episodes separated in time (prior optic neuritis, now a spinal cord syndrome); "
        "CSF-specific oligoclonal bands support MS over ADEM or vascular white-matter disease.",
        "ich": "Sudden onset with severe hypertension; the INR and drug history tell whether anticoagulation contributed.",
        "gbm": "Weeks of progressive deficit without fever or raised inflammatory markers favour a high-grade glioma "
        "over an abscess; the thick irregular wall and necrotic core without restricted diffusion fit glioblastoma.",
        "mets": "A known primary cancer and multiple lesions at the grey-white junction make metastases the leading diagnosis.",
        "meningioma": "An extra-axial dural-based mass with homogeneous enhancement and a dural tail, slowly growing, "
        "is typical of meningioma.",
        "abscess": "Fever, raised CRP and white cells with a recent infective source, and a thin smooth ring with "
        "central restricted diffusion, indicate abscess rather than necrotic tumour.",
    }
    key = "stroke" if group.startswith("stroke-") else group
    if key == "stroke":
        af = clinical.facts.get("atrial_fibrillation")
        parts.append(
            "Sudden focal deficit matching an arterial territory with restricted diffusion is an acute "
            "infarct" + ("; atrial fibrillation suggests a cardioembolic cause." if af else ".")
        )
    else:
        parts.append(clues[key])
    parts.append(f"Conclusion: {final.name} (ICD-10 {final.icd10}).")
    return " ".join(parts)
