"""Phantom suite contract: schedule, determinism, files and hashes, DICOM validity, PHI, Orthanc."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pydicom
import pytest
from phantom_fixture import PHANTOM_CASES, PhantomSuite
from pydicom.dataset import Dataset
from pydicom.uid import UID, ExplicitVRLittleEndian

from evaluation.case import Case
from evaluation.datasets.phantoms import GROUPS, case_specs, generate_suite
from evaluation.datasets.phantoms.spec import sequences_for

ROOT = Path(__file__).resolve().parents[1]


def _files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_thirty_cases_cover_every_group_and_difficulty_with_stable_ids() -> None:
    specs = case_specs(30)
    assert {s.group for s in specs} == set(GROUPS)
    for g in GROUPS:
        assert {s.difficulty for s in specs if s.group == g} == {"L1", "L2", "L3"}, g
    ids = [s.case_id for s in specs]
    assert len(set(ids)) == 30 and all(re.fullmatch(r"ph-\d{3}-[a-z-]+", i) for i in ids)
    assert ids[6] == "ph-007-meningioma" and case_specs(40)[30].case_id == "ph-031-normal"
    # Which sequences a case has follows the disease.
    assert sequences_for("stroke-mca", "L1")[1] and "dwi" in sequences_for("stroke-mca", "L1")[0]
    assert sequences_for("ich", "L1") == ([], True)
    assert "t1c" in sequences_for("gbm", "L1")[0] and "t1c" not in sequences_for("normal", "L1")[0]
    assert (
        "dwi" not in sequences_for("abscess", "L2")[0]
        and "dwi" in sequences_for("abscess", "L1")[0]
    )
    assert all("t1_3d" in sequences_for(g, "L1")[0] for g in GROUPS if g != "ich")


def test_same_seed_gives_byte_identical_files_and_another_seed_differs(tmp_path: Path) -> None:
    a = generate_suite(tmp_path / "a", 4, 5, only=[4])
    b = generate_suite(tmp_path / "b", 4, 5, only=[4])
    c = generate_suite(tmp_path / "c", 4, 6, only=[4])
    fa, fb, fc = _files(tmp_path / "a"), _files(tmp_path / "b"), _files(tmp_path / "c")
    assert fa == fb and a == b
    assert "suite.json" in fa and any(k.endswith(".dcm") for k in fa)
    assert set(fa) == set(fc)  # same layout, other content
    differing = [k for k in fa if fa[k] != fc[k]]
    assert "ph-004-ich/case.json" in differing and "ph-004-ich/masks/lesions.nii.gz" in differing
    assert sum(k.endswith(".dcm") for k in differing) == sum(k.endswith(".dcm") for k in fa)
    assert c.cases[0].case_id == a.cases[0].case_id


def test_a_fresh_process_on_the_cli_reproduces_the_same_bytes(
    phantom_suite: PhantomSuite, tmp_path: Path
) -> None:
    """Nothing depends on process state (caches, noise bank, import order)."""
    idx = PHANTOM_CASES["l3"]
    out = tmp_path / "cli"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from gateway.cli import app; app()",
            "phantoms",
            "--cases",
            str(idx),
            "--only",
            str(idx),
            "--seed",
            str(phantom_suite.seed),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    name = phantom_suite.case_dir("l3").name
    assert _files(out / name) == _files(phantom_suite.root / name)


def test_manifest_hashes_every_file_of_every_case(phantom_suite: PhantomSuite) -> None:
    data = json.loads((phantom_suite.root / "suite.json").read_text(encoding="utf-8"))
    assert data["seed"] == phantom_suite.seed and data["generator"] == "neurosandbox-phantoms"
    listed: dict[str, str] = {}
    for case in data["cases"]:
        listed.update(case["files"])
        assert case["case_id"].startswith("ph-") and case["difficulty"] in ("L1", "L2", "L3")
    on_disk = {
        p.relative_to(phantom_suite.root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in phantom_suite.root.rglob("*")
        if p.is_file() and p.name != "suite.json"
    }
    assert listed == on_disk
    text = (phantom_suite.root / "suite.json").read_text(encoding="utf-8")
    assert text == json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    case_text = (phantom_suite.case_dir("gbm") / "case.json").read_text(encoding="utf-8")
    assert (
        case_text
        == json.dumps(json.loads(case_text), sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    )


def test_every_file_is_part10_explicit_little_endian_with_unique_valid_uids(
    phantom_suite: PhantomSuite,
) -> None:
    seen: set[str] = set()
    for key in PHANTOM_CASES:
        folder = phantom_suite.case_dir(key)
        case = Case.model_validate_json((folder / "case.json").read_text(encoding="utf-8"))
        for path in sorted((folder / "dicom").rglob("*.dcm")):
            raw = path.read_bytes()
            assert raw[128:132] == b"DICM", path
            ds = pydicom.dcmread(io.BytesIO(raw), stop_before_pixels=True)
            assert ds.file_meta.TransferSyntaxUID == ExplicitVRLittleEndian
            assert ds.file_meta.MediaStorageSOPInstanceUID == ds.SOPInstanceUID
            for u in (
                ds.SOPInstanceUID,
                ds.SeriesInstanceUID,
                ds.StudyInstanceUID,
                ds.FrameOfReferenceUID,
            ):
                assert UID(u).is_valid, u
            assert ds.SOPClassUID in ("1.2.840.10008.5.1.4.1.1.4", "1.2.840.10008.5.1.4.1.1.2")
            assert ds.StudyInstanceUID in case.provenance.study_uids
            assert ds.SOPInstanceUID not in seen
            seen.add(ds.SOPInstanceUID)
            for kw in (
                "PatientID",
                "PatientName",
                "StudyDate",
                "SeriesNumber",
                "InstanceNumber",
                "ImagePositionPatient",
                "ImageOrientationPatient",
                "PixelSpacing",
                "Modality",
            ):
                assert kw in ds, (path, kw)
            if ds.Modality == "CT":
                assert ds.RescaleIntercept == -1024 and ds.RescaleSlope == 1
    assert len(seen) > 1500


def test_the_fast_writer_writes_exactly_what_pydicom_writes(phantom_suite: PhantomSuite) -> None:
    from evaluation.datasets.phantoms.dicomio import SeriesWriter, full_dataset

    for series in sorted((phantom_suite.case_dir("l3") / "dicom").iterdir()):
        path = sorted(series.glob("*.dcm"))[-1]
        buf = io.BytesIO()
        pydicom.dcmwrite(buf, pydicom.dcmread(path), enforce_file_format=True)
        assert buf.getvalue() == path.read_bytes(), series.name
    fixed = Dataset()
    fixed.SpecificCharacterSet = "ISO_IR 126"
    fixed.SOPClassUID = "1.2.840.10008.5.1.4.1.1.4"
    fixed.PatientName = "Παπαδόπουλος^Γιώργος"
    fixed.ImageType = ["DERIVED", "PRIMARY", "SWI"]
    fixed.Rows, fixed.Columns = 2, 2
    var = Dataset()
    var.SOPInstanceUID = "2.25.12345"
    var.ImagePositionPatient = [1.5, -2.25, 3.0]
    var.InstanceNumber = 7
    pixels = bytes(range(8))
    buf = io.BytesIO()
    pydicom.dcmwrite(buf, full_dataset(fixed, var, pixels), enforce_file_format=True)
    assert SeriesWriter(fixed, [e.tag for e in var]).encode(var, pixels) == buf.getvalue()


def test_planted_phi_is_where_the_ground_truth_says(phantom_suite: PhantomSuite) -> None:
    for key in PHANTOM_CASES:
        folder = phantom_suite.case_dir(key)
        case = Case.model_validate_json((folder / "case.json").read_text(encoding="utf-8"))
        assert case.ground_truth is not None
        first = {}
        for series in sorted((folder / "dicom").iterdir()):
            ds = pydicom.dcmread(sorted(series.glob("*.dcm"))[0], stop_before_pixels=True)
            first.setdefault(ds.Modality, ds)
        bundle = json.dumps(case.ehr, ensure_ascii=False)
        wheres = {p.where for p in case.ground_truth.phi}
        assert {
            "dicom:PatientName",
            "dicom:PatientID",
            "dicom:PatientBirthDate",
            "note",
            "ehr:Patient.name",
        } <= wheres
        for p in case.ground_truth.phi:
            if p.where.startswith("dicom:"):
                kw = p.where.split(":", 1)[1]
                values = {str(ds.get(kw, "")) for ds in first.values()}
                assert p.value in values, (key, kw, p.value, values)
            elif p.where == "note":
                assert p.value in case.note, (key, p.value)
            else:
                assert p.value in bundle or p.value.replace(" ", "") in bundle, (key, p.where)


def test_patient_names_round_trip_in_their_character_sets() -> None:
    from evaluation.datasets.phantoms.identity import _NAMES

    charsets = {cs for cs, *_ in _NAMES}
    assert {"ISO_IR 100", "ISO_IR 126", "ISO_IR 144", "ISO_IR 192", ""} <= charsets
    for cs, pn, _, _ in _NAMES:
        ds = Dataset()
        if cs:
            ds.SpecificCharacterSet = cs
        ds.PatientName = pn
        ds.SOPClassUID = "1.2.840.10008.5.1.4.1.1.4"
        ds.SOPInstanceUID = "2.25.1"
        buf = io.BytesIO()
        pydicom.dcmwrite(buf, ds, implicit_vr=False, little_endian=True)
        back = pydicom.dcmread(io.BytesIO(buf.getvalue()), force=True)
        assert str(back.PatientName) == pn, cs
        codec = {
            "ISO_IR 100": "latin-1",
            "ISO_IR 126": "iso8859-7",
            "ISO_IR 144": "iso8859-5",
            "ISO_IR 192": "utf-8",
            "": "ascii",
        }[cs]
        assert pn.encode(codec) in buf.getvalue()


def test_mask_is_gzip_with_a_zero_timestamp(phantom_suite: PhantomSuite) -> None:
    raw = (phantom_suite.case_dir("gbm") / "masks" / "lesions.nii.gz").read_bytes()
    assert raw[:2] == b"\x1f\x8b" and raw[4:8] == b"\x00\x00\x00\x00"
    assert gzip.decompress(raw)[344:348] == b"n+1\x00"


def test_atlas_names_known_mni_points() -> None:
    import numpy as np

    from evaluation.datasets.phantoms.atlas import DEEP, LOBES, deep_structure, lobe

    pts = {
        (30, 30, 30): ("frontal", ""),
        (-35, -45, 45): ("parietal", ""),
        (50, -20, -10): ("temporal", ""),
        (-20, -88, 10): ("occipital", ""),
        (11, -18, 6): (None, "thalamus"),
        (-24, 2, 1): (None, "basal ganglia"),
        (3, -28, -30): (None, "brainstem"),
        (-22, -65, -35): (None, "cerebellum"),
        (38, 0, 5): (None, "insula"),
    }
    for (x, y, z), (lob, deep) in pts.items():
        a = [np.array([float(v)]) for v in (x, y, z)]
        if lob:
            assert LOBES[int(lobe(*a)[0])] == lob, (x, y, z)
        assert DEEP[int(deep_structure(*a)[0])] == deep, (x, y, z)


def test_tissue_contrasts_follow_the_physics() -> None:
    from evaluation.datasets.phantoms.tissue import normal_tissues, protocols, signal

    for field_t in (1.5, 3.0):
        t, p = normal_tissues(field_t), protocols(field_t)

        def s(name: str, role: str, t=t, p=p, field_t=field_t) -> float:  # type: ignore[no-untyped-def]
            return signal(t[name], p[role], field_t)

        assert s("csf", "flair") < 0.1 * s("wm", "flair") and s("gm", "flair") > s("wm", "flair")
        assert s("csf", "t2") > s("gm", "t2") > s("wm", "t2")
        assert s("wm", "t1_3d") > s("gm", "t1_3d") > s("csf", "t1_3d")
        assert s("fat", "t1_3d") > s("wm", "t1_3d")
        assert signal(t["csf"], p["dwi"], field_t, b=1000) < 0.2 * signal(
            t["csf"], p["dwi"], field_t, b=0
        )
    hu = {k: v.hu for k, v in normal_tissues(3.0).items()}
    assert 0 <= hu["csf"] <= 10 and 20 <= hu["wm"] <= 30 and 35 <= hu["gm"] <= 40
    assert hu["bone"] >= 700 and hu["fat"] == -100


@pytest.mark.integration
def test_orthanc_accepts_every_file_of_a_ct_plus_mr_case(
    phantom_suite: PhantomSuite, orthanc_server
) -> None:  # type: ignore[no-untyped-def]
    folder = phantom_suite.case_dir("l3")
    case = Case.model_validate_json((folder / "case.json").read_text(encoding="utf-8"))
    ep = orthanc_server.endpoints
    files = sorted((folder / "dicom").rglob("*.dcm"))
    with httpx.Client(
        base_url=ep.orthanc_url, auth=(ep.username, orthanc_server.password), timeout=30
    ) as cli:
        created = []
        try:
            for path in files:
                r = cli.post(
                    "/instances",
                    content=path.read_bytes(),
                    headers={"Content-Type": "application/dicom"},
                )
                assert r.status_code == 200, (path, r.text)
                assert r.json()["Status"] in ("Success", "AlreadyStored")
                created.append(r.json()["ParentStudy"])
            studies = {
                cli.post("/tools/lookup", content=u).json()[0]["ID"]
                for u in case.provenance.study_uids
            }
            assert studies == set(created)
            n = sum(len(cli.get(f"/studies/{s}/instances").json()) for s in studies)
            assert n == len(files)
            name = cli.get(f"/studies/{next(iter(studies))}").json()["PatientMainDicomTags"][
                "PatientName"
            ]
            assert name == str(pydicom.dcmread(files[0], stop_before_pixels=True).PatientName)
        finally:
            for s in set(created):
                cli.delete(f"/studies/{s}")


def test_every_group_and_difficulty_plans_lesions_and_a_record_over_many_seeds() -> None:
    """Cheap (no images): every branch of the generators runs and stays consistent."""
    import datetime as dt

    import numpy as np

    from evaluation.datasets.phantoms.atlas import get_atlas
    from evaluation.datasets.phantoms.clinical import scenario
    from evaluation.datasets.phantoms.ehr import build_bundle, note_text
    from evaluation.datasets.phantoms.identity import make_identity
    from evaluation.datasets.phantoms.lesions import plan_lesions
    from evaluation.datasets.phantoms.spec import turns_for

    atlas = get_atlas()
    seen_sites: set[str] = set()
    for seed in range(8):
        for spec in case_specs(30):
            rng = np.random.default_rng([seed, spec.index])
            plan = plan_lesions(spec.group, rng, atlas, spec.difficulty)
            assert (plan.lesions == []) == (spec.group == "normal"), spec
            for les in plan.lesions:
                lo, hi = les.box()
                assert np.all(hi - lo > 2) and les.components
                assert all(c.mode in ("replace", "modify") for c in les.components)
                seen_sites.add(str(les.facts.get("site", les.kind)))
            c = scenario(spec.group, spec.difficulty, plan.facts, rng, 50, "F")
            idn = make_identity(rng, 50, "F", dt.date(2024, 5, 1))
            note = note_text(idn, c, dt.datetime(2024, 5, 1, 9), rng)
            bundle, phi = build_bundle(idn, c, dt.datetime(2024, 5, 1, 9), note, seed, spec.case_id)
            assert all(p.value in note or p.where.startswith("ehr:") for p in phi)
            assert (
                idn.note_name in note
                and bundle["entry"][0]["resource"]["resourceType"] == "Patient"
            )
            if spec.difficulty == "L3":
                assert c.later_text
                assert not any(o.category == "laboratory" for o in c.observations), spec
                turns = turns_for(
                    spec.group,
                    c,
                    {"CT", "T2", "FLAIR", "DWI"},
                    True,
                    50,
                    "F",
                    dt.timedelta(minutes=40),
                )
                assert len(turns) == 3 and turns[-1].reveal_text == c.later_text
    assert {"deep", "lobar", "cerebellar", "convexity", "parasagittal"} <= seen_sites
