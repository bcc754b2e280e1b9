"""Dataset loaders: phantom suite and case folders (rendered through the imaging core, cached),
hospital manifests, Neural-MedBench files (JSON, JSONL, Parquet; column map; answers file) and
NeuroVLM-Bench (image_mapping.csv + image root); the dataset hash."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import pytest
from engine_helpers import brain_png, data_uri, phantom_subset, write_nmb
from PIL import Image

from evaluation.case import (
    Case,
    Diagnosis,
    DiseaseGroup,
    GroundTruth,
    Hemisphere,
    LesionTruth,
    Provenance,
    Signal,
    TaskFamily,
)
from evaluation.datasets import DatasetSpec, ImageStore, detect_kind, load_dataset
from evaluation.errors import DatasetError
from evaluation.tasks import images_for, plan_tasks


def test_phantom_suite_renders_montages_and_a_classification_slice(
    phantom_suite, tmp_path: Path
) -> None:
    suite = phantom_subset(phantom_suite, ("stroke", "l3"), tmp_path / "suite")
    cache = tmp_path / "cache"
    ds = load_dataset(suite, cache)
    assert ds.kind == "suite" and len(ds.cases) == 2
    stroke = next(c for c in ds.cases if "stroke" in c.case_id)
    classes = {i.series_class for i in stroke.images if i.kind == "montage"}
    assert {"CT", "FLAIR", "DWI", "ADC"} <= classes
    for img in stroke.images:
        assert Path(img.path).is_file() and img.label and img.modality in ("CT", "MR")
        if img.kind == "montage":
            assert "patient right on image left" in img.label and len(img.slice_positions_mm) > 4
    single = images_for(stroke, TaskFamily.CLASSIFICATION)
    assert len(single) == 1 and single[0].kind == "slice"
    lesion_z = stroke.ground_truth.lesions[0].center_mm[2]  # type: ignore[union-attr,index]
    montage_zs = next(i for i in stroke.images if i.kind == "montage").slice_positions_mm
    step = abs(montage_zs[1] - montage_zs[0])
    assert abs(single[0].slice_positions_mm[0] - lesion_z) <= step  # the slice through the lesion
    l3 = next(c for c in ds.cases if c.turns)
    assert TaskFamily.MULTITURN in [i.family for i in plan_tasks(l3)]
    assert l3.note and l3.ehr and l3.ehr["resourceType"] == "Bundle"  # record and note loaded
    # The second load reads the renders back from the cache: same images, same hash.
    mtimes = {i.path: Path(i.path).stat().st_mtime_ns for i in stroke.images}
    again = load_dataset(suite, cache)
    assert again.hash == ds.hash
    assert {
        i.path: Path(i.path).stat().st_mtime_ns for i in again.case(stroke.case_id).images
    } == mtimes


def _brainix_case(folder: Path, study: Path) -> None:
    case = Case(
        case_id="brainix",
        study_path=str(study),
        ground_truth=GroundTruth(
            final_diagnosis=Diagnosis(name="glioblastoma", group=DiseaseGroup.TUMOUR),
            lesions=[
                LesionTruth(
                    id="L1",
                    type="mass",
                    hemisphere=Hemisphere.LEFT,
                    region="parietal",
                    center_mm=(36.0, 0.0, 50.0),
                    size_mm=40,
                    signal={"FLAIR": Signal.HYPER},
                )
            ],
        ),
        tasks=[TaskFamily.DIFFERENTIAL, TaskFamily.CLASSIFICATION],
        provenance=Provenance(source="folder"),
    )
    folder.mkdir(parents=True)
    (folder / "case.json").write_text(case.model_dump_json())


@pytest.mark.corpus
def test_case_folder_with_an_absolute_study_path_renders_the_real_study(
    corpus: Path, tmp_path: Path
) -> None:
    _brainix_case(tmp_path / "suite" / "brainix", corpus / "brainix" / "BRAINIX" / "DICOM")
    ds = load_dataset(tmp_path / "suite", tmp_path / "cache")
    case = ds.cases[0]
    assert sorted(i.series_class for i in case.images if i.kind == "montage") == [
        "FLAIR",
        "T1",
        "T2",
    ]
    single = images_for(case, TaskFamily.CLASSIFICATION)[0]
    assert single.series_class == "FLAIR" and 30 < single.slice_positions_mm[0] < 70


@pytest.mark.corpus
@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_hospital_manifest_with_folder_study_inline_record_and_note_file(
    corpus: Path, tmp_path: Path, fmt: str
) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "h1.txt").write_text("Headaches for six weeks, one seizure.")
    manifest = tmp_path / "pilot.yaml"
    manifest.write_text(
        f"""
name: pilot
cases:
  - case_id: H1
    patient_id: P77
    study: {corpus / "brainix" / "BRAINIX" / "DICOM" / "FLAIR"}
    note: notes/h1.txt
    ehr: {{resourceType: Bundle, entry: [{{resource: {{resourceType: Patient, gender: male}}}}]}}
    ground_truth: {{final_diagnosis: {{name: glioblastoma, icd10: C71.9}}}}
    tasks: [differential, lesion]
  - case_id: H2
    study: does/not/exist
"""
    )
    if fmt == "json":  # the same manifest as JSON
        import json

        import yaml

        manifest = manifest.rename(tmp_path / "pilot.json")
        manifest.write_text(json.dumps(yaml.safe_load(manifest.read_text())))
    assert detect_kind(manifest) == "manifest"
    ds = load_dataset(manifest, tmp_path / "cache")
    assert [c.case_id for c in ds.cases] == ["H1"]
    assert any("H2" in w or "case 2" in w for w in ds.warnings)
    h1 = ds.cases[0]
    assert h1.note.startswith("Headaches") and h1.patient_id == "P77"
    assert [i.series_class for i in h1.images if i.kind == "montage"] == ["FLAIR"]
    assert [t.family for t in plan_tasks(h1)] == [TaskFamily.DIFFERENTIAL, TaskFamily.LESION]


@pytest.mark.parametrize("fmt", ["json", "jsonl", "parquet"])
def test_neural_medbench_records_with_answers(fmt: str, tmp_path: Path) -> None:
    data, answers = write_nmb(tmp_path, 3, fmt=fmt)
    ds = load_dataset(DatasetSpec(path=str(data), answers=str(answers)), tmp_path / "cache")
    assert ds.kind == "neural-medbench" and [c.case_id for c in ds.cases] == [
        "nmb-000",
        "nmb-001",
        "nmb-002",
    ]
    c = ds.cases[0]
    assert len(c.images) == 2 and c.images[0].label == "Image 1"
    assert ImageStore()(c.images[1]) == brain_png(1)  # decoded bytes, as given
    assert c.ground_truth.final_diagnosis.name == "multiple sclerosis"  # type: ignore[union-attr]
    assert c.questions[0].family is TaskFamily.DIFFERENTIAL and "optic neuritis" in c.note


def test_neural_medbench_column_map_question_families_and_l3_turns(tmp_path: Path) -> None:
    rec = {
        "id": "X1",
        "history": "Fever and headache.",
        "pics": json.dumps([data_uri(brain_png(3))]),
        "qs": [
            {"no": 1, "q": "Where is the lesion located?"},
            {"no": 2, "q": "Explain why this is not a tumour."},
        ],
    }
    rec2 = {
        **rec,
        "id": "X2",
        "qs": [{"no": 1, "q": "First impression?"}, {"no": 2, "q": "And now?"}],
    }
    data = tmp_path / "nmb.json"
    data.write_text(json.dumps({"data": [rec, rec2]}))
    ans = tmp_path / "ans.csv"
    with ans.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["cid", "dx", "level", "synonyms"])
        w.writerow(["X1", "cerebral abscess", "L2", "brain abscess; pyogenic abscess"])
        w.writerow(["X2", "cerebral abscess", "L3 multi-turn", ""])
    cols = "case_id=id,text=history,images=pics,questions=qs,question_number=no,question_text=q,answer_case_id=cid,answer=dx,difficulty=level"
    spec = DatasetSpec(
        path=str(data), answers=str(ans), columns=dict(p.split("=") for p in cols.split(","))
    )
    ds = load_dataset(spec, tmp_path / "cache")
    x1, x2 = ds.cases
    assert [q.family for q in x1.questions] == [TaskFamily.LESION, TaskFamily.RATIONALE]
    assert x1.ground_truth.synonyms == ["brain abscess", "pyogenic abscess"]  # type: ignore[union-attr]
    assert [i.key for i in plan_tasks(x1)] == ["lesion#q1", "rationale#q2"]
    assert [t.question for t in x2.turns] == ["First impression?", "And now?"]
    assert [i.family for i in plan_tasks(x2)] == [TaskFamily.MULTITURN]
    with pytest.raises(DatasetError, match="column map"):
        load_dataset(DatasetSpec(path=str(data)), tmp_path / "cache")


def test_neural_medbench_bad_image_skips_only_that_record(tmp_path: Path) -> None:
    data, _ = write_nmb(tmp_path, 2)
    lines = data.read_text().splitlines()
    bad = json.loads(lines[0])
    bad["images"] = ["data:image/png;base64,@@@@"]
    data.write_text(json.dumps(bad) + "\n" + lines[1] + "\n")
    ds = load_dataset(data, tmp_path / "cache")
    assert [c.case_id for c in ds.cases] == ["nmb-001"] and "nmb-000" in ds.warnings[0]


def _neurovlm(tmp_path: Path) -> Path:
    root = tmp_path / "images"
    (root / "stroke").mkdir(parents=True)
    (root / "stroke" / "a.png").write_bytes(brain_png(1, lesion=(40, 30)))
    buf = io.BytesIO()
    Image.open(io.BytesIO(brain_png(2))).save(buf, format="JPEG")
    (root / "stroke" / "b.jpg").write_bytes(buf.getvalue())
    mapping = tmp_path / "image_mapping.csv"
    with mapping.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(
            [
                "dataset",
                "file_path",
                "class",
                "original_class",
                "subclass",
                "modality",
                "modality_subtype",
                "plane",
            ]
        )
        w.writerow(
            [
                "kaggle-stroke",
                "stroke/a.png",
                "stroke",
                "Hemorrhagic",
                "hemorrhagic",
                "CT",
                "",
                "axial",
            ]
        )
        w.writerow(
            ["kaggle-stroke", "stroke/b.jpg", "tumor", "glioma", "glioma", "MRI", "T1C+", "Coronal"]
        )
        w.writerow(["x", "../escape.png", "normal", "", "", "MRI", "", "axial"])
        w.writerow(["x", "missing.png", "normal", "", "", "MRI", "", "axial"])
    return mapping


def test_neurovlm_mapping_and_image_root(tmp_path: Path) -> None:
    mapping = _neurovlm(tmp_path)
    ds = load_dataset(
        DatasetSpec(path=str(mapping), image_root=str(tmp_path / "images")), tmp_path / "cache"
    )
    assert ds.kind == "neurovlm" and len(ds.cases) == 2 and len(ds.warnings) == 2
    a, b = ds.cases
    assert a.tasks == [TaskFamily.CLASSIFICATION] and a.ground_truth.modality == "CT"  # type: ignore[union-attr]
    assert a.ground_truth.final_diagnosis.group is DiseaseGroup.HAEMORRHAGIC_STROKE  # type: ignore[union-attr]
    assert a.images[0].path == str(
        (tmp_path / "images" / "stroke" / "a.png").resolve()
    )  # clean PNG: used as is
    assert b.images[0].path.endswith(".png") and "cache" in b.images[0].path  # JPEG converted
    assert b.ground_truth.plane == "coronal"  # type: ignore[union-attr]
    assert b.provenance.neurovlm is not None and b.provenance.neurovlm.modality_subtype == "T1C+"
    assert any("outside" in w for w in ds.warnings)


def test_neurovlm_labels_reach_the_scorer_as_the_loader_read_them(tmp_path: Path) -> None:
    """One typed label record from loader to scorer: sequence and subtype are scored."""
    from evaluation.scoring.neurovlm import neurovlm_truth

    mapping = _neurovlm(tmp_path)
    ds = load_dataset(
        DatasetSpec(path=str(mapping), image_root=str(tmp_path / "images")), tmp_path / "cache"
    )
    a, b = ds.cases
    truth_b = neurovlm_truth(b)
    assert (truth_b.cls, truth_b.subclass, truth_b.sequence) == ("tumor", "glioma", "T1C+")
    truth_a = neurovlm_truth(a)
    assert (truth_a.cls, truth_a.subclass, truth_a.modality) == ("stroke", "hemorrhagic", "CT")


def test_old_case_snapshots_keep_their_untyped_provenance_labels() -> None:
    """A case stored before the typed record (provenance.extra) loads into the typed fields."""
    from evaluation.case import Case

    case = Case.model_validate(
        {
            "case_id": "c1",
            "provenance": {
                "source": "neurovlm-bench",
                "extra": {
                    "neurovlm": {"class": "tumor", "subclass": "glioma"},
                    "burned_in_series": ["1.2"],
                },
            },
        }
    )
    assert case.provenance.neurovlm is not None and case.provenance.neurovlm.subclass == "glioma"
    assert case.provenance.burned_in_series == ["1.2"]


def test_dataset_hash_follows_image_bytes_and_case_content(tmp_path: Path) -> None:
    mapping = _neurovlm(tmp_path)
    spec = DatasetSpec(path=str(mapping), image_root=str(tmp_path / "images"))
    h1 = load_dataset(spec, tmp_path / "cache").hash
    assert load_dataset(spec, tmp_path / "cache").hash == h1
    (tmp_path / "images" / "stroke" / "a.png").write_bytes(brain_png(1, lesion=(41, 30)))
    h2 = load_dataset(spec, tmp_path / "cache").hash
    assert h2 != h1
    text = mapping.read_text().replace("hemorrhagic,CT", "ischemic,CT")
    mapping.write_text(text)
    assert load_dataset(spec, tmp_path / "cache").hash != h2


def test_image_store_refuses_an_image_changed_after_loading(tmp_path: Path) -> None:
    data, answers = write_nmb(tmp_path, 1)
    ds = load_dataset(DatasetSpec(path=str(data), answers=str(answers)), tmp_path / "cache")
    ref = ds.cases[0].images[0]
    shutil.copyfile(ds.cases[0].images[1].path, ref.path)
    with pytest.raises(DatasetError, match="changed"):
        ImageStore()(ref)


@pytest.mark.integration
@pytest.mark.corpus
def test_manifest_study_fetched_from_orthanc(
    orthanc_server, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx
    import pydicom
    from pydicom.uid import generate_uid

    flair = sorted((corpus / "brainix" / "BRAINIX" / "DICOM" / "FLAIR").iterdir())
    url = orthanc_server.endpoints.orthanc_url.rstrip("/")
    auth = (orthanc_server.endpoints.username, orthanc_server.password)
    # a study of its own: the session's Orthanc may hold BRAINIX whole (another module's)
    study_uid, series_uid = generate_uid(), generate_uid()
    with httpx.Client(base_url=url, auth=auth, timeout=60) as client:
        for f in flair:
            ds = pydicom.dcmread(f)
            ds.StudyInstanceUID, ds.SeriesInstanceUID = study_uid, series_uid
            ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
            buf = io.BytesIO()
            ds.save_as(buf, enforce_file_format=True)
            client.post("/instances", content=buf.getvalue()).raise_for_status()
    monkeypatch.setenv("NSBX_TEST_ORTHANC_PW", orthanc_server.password)
    manifest = tmp_path / "m.json"
    manifest.write_text(
        json.dumps(
            {
                "cases": [
                    {
                        "case_id": "from-pacs",
                        "study": {
                            "orthanc": {
                                "url": url,
                                "study_uid": study_uid,
                                "username": auth[0],
                                "password_env": "NSBX_TEST_ORTHANC_PW",
                            }
                        },
                        "ground_truth": {"final_diagnosis": {"name": "glioblastoma"}},
                    }
                ]
            }
        )
    )
    ds = load_dataset(DatasetSpec(path=str(manifest), kind="manifest"), tmp_path / "cache")
    (case,) = ds.cases
    assert case.provenance.source == "orthanc" and case.provenance.study_uids == [study_uid]
    assert [i.series_class for i in case.images if i.kind == "montage"] == ["FLAIR"]
    assert list((tmp_path / "cache" / "orthanc").glob("*.zip"))  # fetched once, kept in the cache
