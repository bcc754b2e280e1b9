"""One phantom case: plan lesions, simulate and write every series, the mask, record and truth.

Layout of a case folder: ``dicom/<MR|CT>_<nn>_<role>/IM0001.dcm...``, ``masks/lesions.nii.gz``,
``ehr.json`` (FHIR R4 Bundle), ``note.txt`` and ``case.json`` (evaluation.case.Case).
All randomness comes from (seed, case index), so the same seed gives the same bytes.
"""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import nibabel as nib
import numpy as np

from evaluation.case import (
    Case,
    GroundTruth,
    PhantomFacts,
    PhantomLesionFacts,
    PhantomProvenance,
    PhantomSeries,
    PlantedPHI,
    Provenance,
    TaskFamily,
)
from evaluation.datasets.phantoms import truth
from evaluation.datasets.phantoms.acquire import Acquired, acquire_ct, acquire_diffusion, acquire_mr
from evaluation.datasets.phantoms.anatomy import get_anatomy
from evaluation.datasets.phantoms.atlas import get_atlas
from evaluation.datasets.phantoms.clinical import scenario
from evaluation.datasets.phantoms.ehr import build_bundle, note_text
from evaluation.datasets.phantoms.grids import (
    CT_AXIAL,
    MR_AXIAL,
    SAG_T1,
    anatomy_tissues,
    grid_tissues,
)
from evaluation.datasets.phantoms.identity import make_identity
from evaluation.datasets.phantoms.lesions import plan_lesions
from evaluation.datasets.phantoms.measure import (
    lesion_patch,
    lesion_signals,
    lesion_truth,
    restricted_diffusion,
)
from evaluation.datasets.phantoms.scene import Lesion, Scene, build_scene, label_map
from evaluation.datasets.phantoms.series import (
    GENERATOR,
    GENERATOR_VERSION,
    SERIES,
    StudyHeader,
    write_series,
)
from evaluation.datasets.phantoms.spec import CaseSpec, sequences_for, turns_for
from evaluation.datasets.phantoms.tissue import protocols

_AGE = {
    "normal": (22, 62),
    "ms": (21, 44),
    "stroke": (56, 87),
    "ich": (52, 84),
    "gbm": (48, 78),
    "mets": (44, 78),
    "meningioma": (42, 76),
    "abscess": (24, 70),
}
_FEMALE = {"ms": 0.72, "meningioma": 0.7}
_MR_ROLE_CLASS = {r: SERIES[r].seq_class for r in SERIES}


@dataclass
class GeneratedCase:
    case: Case
    folder: Path
    files: dict[str, str]  # path relative to the case folder -> sha256
    series: list[PhantomSeries]  # intended class of every series written


def _rng(seed: int, index: int, stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, index, stream]))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_json(path: Path, obj: object) -> None:
    path.write_text(
        json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )


def write_mask(path: Path, labels: np.ndarray, affine: np.ndarray) -> None:
    """Label mask as NIfTI-1, gzip with mtime 0 so identical labels give identical bytes."""
    img = nib.Nifti1Image(labels.astype(np.uint8), affine)
    img.header.set_xyzt_units("mm")
    img.set_qform(affine, code=1)
    img.set_sform(affine, code=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(img.to_bytes(), compresslevel=6, mtime=0))


def _midline_shift(lesions: list[Lesion]) -> float:
    """How far the midline is pushed by the largest mass effect (mm)."""
    shift = 0.0
    for les in lesions:
        me = les.mass_effect
        if me is not None:
            shift = max(shift, me.displacement_at(abs(me.centre[0])))
    return shift


def generate_case(out_dir: str | Path, spec_or_index: CaseSpec | int, seed: int) -> GeneratedCase:
    """Generate one case into ``out_dir/<case_id>`` and return its Case record and file hashes."""
    from evaluation.datasets.phantoms.spec import case_spec

    spec = spec_or_index if isinstance(spec_or_index, CaseSpec) else case_spec(spec_or_index)
    folder = Path(out_dir) / spec.case_id
    if folder.exists():
        shutil.rmtree(folder)  # no stale files from an earlier run may enter the hashes
    anatomy, atlas = get_anatomy(), get_atlas()
    r_case = _rng(seed, spec.index, 0)
    family = "stroke" if spec.group.startswith("stroke-") else spec.group
    age = int(r_case.integers(*_AGE[family]))
    sex = "F" if r_case.random() < _FEMALE.get(family, 0.45) else "M"
    field_t = 3.0 if r_case.random() < 0.6 else 1.5
    day = dt.date(2024, 1, 1) + dt.timedelta(days=int(r_case.integers(0, 366)))
    start = dt.datetime.combine(
        day, dt.time(int(r_case.integers(7, 20)), int(r_case.integers(0, 60)))
    )
    plan = plan_lesions(spec.group, _rng(seed, spec.index, 1), atlas, spec.difficulty)
    mr_roles, has_ct = sequences_for(spec.group, spec.difficulty)
    r_clin = _rng(seed, spec.index, 2)
    clinical = scenario(spec.group, spec.difficulty, plan.facts, r_clin, age, sex)
    identity = make_identity(r_clin, age, sex, day)
    note = note_text(identity, clinical, start, r_clin)
    bundle, ehr_phi = build_bundle(identity, clinical, start, note, seed, spec.case_id)

    # --- images -------------------------------------------------------------------------
    protos = protocols(field_t)
    scenes: dict[str, Scene] = {}

    def scene(grid):  # type: ignore[no-untyped-def]
        if grid.name not in scenes:
            scenes[grid.name] = build_scene(
                grid_tissues(anatomy, grid), plan.lesions, slab=3 if grid.thickness >= 3 else 1
            )
        return scenes[grid.name]

    acquisitions: list[tuple[str, Acquired]] = []
    if has_ct:
        acquisitions.append(
            ("CT", acquire_ct(scene(CT_AXIAL), protos["ct"], _rng(seed, spec.index, 100)))
        )
    for role in mr_roles:
        r = _rng(seed, spec.index, 100 + SERIES[role].number)
        if role == "adc":
            continue
        if role == "dwi":
            dwi, adc = acquire_diffusion(scene(MR_AXIAL), protos["dwi"], field_t, r)
            acquisitions += [("MR", dwi), ("MR", adc)]
        else:
            grid = SAG_T1 if role == "t1_3d" else MR_AXIAL
            acquisitions.append(("MR", acquire_mr(scene(grid), role, protos[role], field_t, r)))

    headers: dict[str, StudyHeader] = {}
    mr_start = start + dt.timedelta(minutes=int(r_case.integers(35, 95))) if has_ct else start
    for modality in sorted({m for m, _ in acquisitions}):
        headers[modality] = StudyHeader(
            seed=seed,
            case_id=spec.case_id,
            modality=modality,
            charset=identity.charset,
            patient_name=identity.dicom_name,
            patient_id=identity.mrn,
            other_patient_id=identity.other_id,
            birth_date=identity.birth_date,
            sex=identity.sex,
            age_years=age,
            address=identity.address,
            phone=identity.phone,
            referring=identity.referring,
            institution=identity.institution,
            accession=identity.accession + ("C" if modality == "CT" else "M"),
            when=start if modality == "CT" else mr_start,
            field_t=field_t,
        )
    series_info: list[PhantomSeries] = []
    for n, (modality, acq) in enumerate(acquisitions):
        h = headers[modality]
        sd = SERIES[acq.role]
        t = h.when + dt.timedelta(minutes=3 * n + 2)
        write_series(h, acq, folder / "dicom" / f"{modality}_{sd.number:02d}_{acq.role}", t)
        series_info.append(
            PhantomSeries(
                role=acq.role,
                modality=modality,
                series_class=sd.seq_class,
                series_uid=h.series_uid(acq.role),
                description=sd.description,
            )
        )

    # --- mask and measured ground truth -----------------------------------------------------
    mask_scene = build_scene(anatomy_tissues(anatomy), plan.lesions, slab=1, mass_effect=False)
    labels = label_map(mask_scene, len(plan.lesions))
    counts = np.bincount(labels.ravel(), minlength=len(plan.lesions) + 1)
    if (counts[1:] == 0).any():  # a lesion thinner than half a voxel everywhere
        labels = label_map(mask_scene, len(plan.lesions), threshold=0.3)
    write_mask(folder / "masks" / "lesions.nii.gz", labels, anatomy.affine)
    acquired_classes = {d.series_class for d in series_info}
    gt_protos = {
        "T1": protos["t1_3d"],
        "T2": protos["t2"],
        "FLAIR": protos["flair"],
        "DWI": protos["dwi"],
        "ADC": None,
        "SWI": protos["swi"],
        "T1C": protos["t1c"],
        "CT": protos["ct"],
    }
    lesion_truths = []
    for li, les in enumerate(plan.lesions):
        sig, raw = lesion_signals(mask_scene, labels, li, gt_protos, field_t, les.extra_axial)
        shown = {k: v for k, v in sig.items() if k in acquired_classes}
        patch = lesion_patch(mask_scene, li)
        lesion_truths.append(
            lesion_truth(
                les,
                li,
                labels,
                anatomy.affine,
                atlas,
                shown,
                restricted_diffusion(raw),
                patch.box if patch is not None else None,
            )
        )

    final = truth.final_diagnosis(spec.group, plan.facts, clinical, lesion_truths)
    findings = truth.key_findings(
        spec.group,
        lesion_truths,
        plan.facts,
        [les.facts for les in plan.lesions],
        acquired_classes,
        _midline_shift(plan.lesions),
    )
    dicom_phi = [
        PlantedPHI(where=f"dicom:{k}", value=v)
        for k, v in (
            ("PatientName", identity.dicom_name),
            ("PatientID", identity.mrn),
            ("OtherPatientIDs", identity.other_id),
            ("PatientBirthDate", identity.birth_date.strftime("%Y%m%d")),
            ("PatientAddress", identity.address),
            ("PatientTelephoneNumbers", identity.phone),
            ("ReferringPhysicianName", identity.referring),
            ("InstitutionName", identity.institution),
        )
    ] + [PlantedPHI(where="dicom:AccessionNumber", value=h.accession) for h in headers.values()]
    gt = GroundTruth(
        final_diagnosis=final,
        synonyms=truth.synonyms(spec.group),
        differential=truth.differential(spec.group, final),
        lesions=lesion_truths,
        key_findings=findings,
        rationale=truth.rationale(spec.group, final, findings, clinical, spec.difficulty),
        difficulty=spec.difficulty,
        modality="CT" if acquired_classes == {"CT"} else "MRI",
        plane="axial",
        phi=dicom_phi + ehr_phi,
    )
    tasks = [
        TaskFamily.DIFFERENTIAL,
        TaskFamily.LESION,
        TaskFamily.RATIONALE,
        TaskFamily.CLASSIFICATION,
    ]
    turns = []
    if spec.difficulty == "L3":
        tasks.append(TaskFamily.MULTITURN)
        turns = turns_for(
            spec.group, clinical, acquired_classes, has_ct, age, sex, mr_start - start
        )
    case = Case(
        case_id=spec.case_id,
        patient_id=identity.mrn,
        images=[],
        study_path="dicom",
        ehr=bundle,
        note=note,
        ground_truth=gt,
        tasks=tasks,
        turns=turns,
        provenance=Provenance(
            source="phantom",
            study_uids=[h.study_uid for h in headers.values()],
            generator=f"{GENERATOR} {GENERATOR_VERSION}",
            seed=seed,
            phantom=PhantomProvenance(
                group=spec.group,
                difficulty=spec.difficulty,
                case_index=spec.index,
                field_strength_t=field_t,
                series=series_info,
                facts=drawn(PhantomFacts, plan.facts),
                lesion_facts=[drawn(PhantomLesionFacts, les.facts) for les in plan.lesions],
            ),
        ),
    )
    _write_json(folder / "ehr.json", bundle)
    (folder / "note.txt").write_text(note, encoding="utf-8")
    _write_json(folder / "case.json", json.loads(case.model_dump_json()))
    files = {
        p.relative_to(folder).as_posix(): _sha256(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }
    return GeneratedCase(case=case, folder=folder, files=files, series=series_info)


R = TypeVar("R", PhantomFacts, PhantomLesionFacts)


def drawn(record: type[R], facts: dict[str, object]) -> R:
    """The generator's drawn facts as their provenance record. Every key the generator draws is
    a field of the record: one it does not declare is an error here, not a silent extra."""
    got = record.model_validate(json.loads(json.dumps(facts, default=str)))
    if got.extra:
        raise ValueError(f"{record.__name__} has no field for the drawn facts {sorted(got.extra)}")
    return got
