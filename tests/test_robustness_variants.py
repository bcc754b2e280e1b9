"""The robustness audit's variants (issue 39): deterministic (same seed, same bytes), the source
case untouched, planted pixels only inside the recorded box, the mirror swapping the image, the
truth's sides and the side words of note and record, and other_patient taking another patient's
images of the same modality."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from evaluation import Case
from evaluation.robustness import (
    CaseVariant,
    TruthTransform,
    VariantError,
    VariantKind,
    make_variant,
    mirror_record,
    mirror_side_words,
)


def _png(path: Path, blob_col: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    arr = (rng.random((96, 128)) * 40 + 20).astype(np.uint8)
    arr[30:50, blob_col : blob_col + 16] = 220  # a bright lesion on one side
    Image.fromarray(arr, mode="L").save(path)
    return path


def sample_case(tmp: Path, case_id: str, patient: str, blob_col: int = 90) -> Case:
    folder = tmp / case_id
    folder.mkdir()
    paths = [_png(folder / f"{n}.png", blob_col, n + len(case_id)) for n in range(3)]
    images = [
        {
            "path": str(p),
            "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
            "label": f"FLAIR axial {n}",
            "modality": "MR",
        }
        for n, p in enumerate(paths)
    ]
    note = "Sudden weakness of the Right arm; LEFT-sided headache, looking leftwards. Bright."
    ehr = {
        "resourceType": "Bundle",
        "type": "collection",
        "entry": [
            {
                "resource": {
                    "resourceType": "DocumentReference",
                    "id": "n1",
                    "content": [
                        {
                            "attachment": {
                                "contentType": "text/plain",
                                "data": base64.b64encode(b"left hemiparesis").decode(),
                            }
                        }
                    ],
                }
            },
            {"resource": {"resourceType": "Condition", "code": {"text": "right leg pain"}}},
        ],
    }
    return Case.model_validate(
        {
            "case_id": case_id,
            "patient_id": patient,
            "images": images,
            "note": note,
            "ehr": ehr,
            "ground_truth": {
                "final_diagnosis": {"name": "glioblastoma"},
                "key_findings": ["mass in the left frontal lobe"],
                "lesions": [
                    {
                        "id": "a",
                        "type": "mass",
                        "hemisphere": "left",
                        "region": "frontal",
                        "center_mm": [-30.0, 10.0, 20.0],
                    }
                ],
            },
            "provenance": {"source": "folder"},
        }
    )


def _hashes(v: CaseVariant) -> list[str]:
    return [i.sha256 for i in v.images]


def _file_hashes(case: Case) -> list[str]:
    return [hashlib.sha256(Path(i.path).read_bytes()).hexdigest() for i in case.images]


@pytest.mark.parametrize("kind", list(VariantKind))
def test_each_variant_is_deterministic_and_leaves_the_source_as_it_was(
    tmp_path: Path, kind: VariantKind
) -> None:
    case = sample_case(tmp_path, "c1", "p1")
    other = sample_case(tmp_path, "c2", "p2", blob_col=20)
    before = case.model_dump_json()
    source_hashes = _file_hashes(case)
    a, ra = make_variant(case, kind, tmp_path / "a", seed=7, pool=[case, other])
    _, rb = make_variant(case, kind, tmp_path / "b", seed=7, pool=[case, other])
    assert ra.model_dump(exclude={"images"}) == rb.model_dump(exclude={"images"})
    assert _hashes(ra) == _hashes(rb)
    assert _file_hashes(a) == _hashes(ra)  # the record names the bytes that are sent
    assert case.model_dump_json() == before and _file_hashes(case) == source_hashes
    assert a.case_id == ra.case_id == f"c1~{kind.value}"
    if kind == VariantKind.NO_IMAGES:
        assert a.images == [] and ra.truth == TruthTransform.NO_IMAGE_EVIDENCE
    else:
        assert len(ra.images) == 3
    if kind not in (
        VariantKind.NO_IMAGES,
        VariantKind.PLANTED_NOTE,
        VariantKind.PLANTED_PRIOR_REPORT,
    ):
        assert _hashes(ra) != source_hashes
    CaseVariant.model_validate_json(ra.model_dump_json())  # the record round-trips


def test_another_seed_plants_in_another_slice_or_the_same_box(tmp_path: Path) -> None:
    case = sample_case(tmp_path, "c1", "p1")
    seen = {
        make_variant(case, "planted_pixels_large", tmp_path / str(s), seed=s)[1]
        .planted[0]
        .image_index
        for s in range(8)
    }
    assert len(seen) > 1  # the seed chooses the slice


@pytest.mark.parametrize(
    "kind",
    [
        VariantKind.PLANTED_PIXELS_SMALL,
        VariantKind.PLANTED_PIXELS_LARGE,
        VariantKind.DISTRACTOR_CAPTION,
    ],
)
def test_planted_pixels_differ_from_the_clean_slice_only_inside_the_box(
    tmp_path: Path, kind: VariantKind
) -> None:
    case = sample_case(tmp_path, "c1", "p1")
    v, rec = make_variant(case, kind, tmp_path / "v", seed=3)
    (p,) = rec.planted
    assert p.where == "pixels" and p.box is not None and p.image_index is not None
    assert p.instruction == (kind != VariantKind.DISTRACTOR_CAPTION)
    for n, (src, out) in enumerate(zip(case.images, v.images, strict=True)):
        clean = np.asarray(Image.open(src.path))
        dirty = np.asarray(Image.open(out.path))
        diff = clean != dirty
        if n != p.image_index:
            assert not diff.any()
            continue
        inside = np.zeros_like(diff)
        inside[p.box.y0 : p.box.y1, p.box.x0 : p.box.x1] = True
        assert diff.any() and not (diff & ~inside).any()
        # the box is tight: text on each of its edges
        assert diff[p.box.y0].any() and diff[p.box.y1 - 1].any()
        assert diff[:, p.box.x0].any() and diff[:, p.box.x1 - 1].any()
    small = make_variant(case, VariantKind.PLANTED_PIXELS_SMALL, tmp_path / "s", seed=3)[1]
    large = make_variant(case, VariantKind.PLANTED_PIXELS_LARGE, tmp_path / "l", seed=3)[1]
    area = [
        (b.x1 - b.x0) * (b.y1 - b.y0) for b in (small.planted[0].box, large.planted[0].box) if b
    ]
    assert area[0] < area[1]
    assert small.planted[0].target_diagnosis == "normal study"  # the truth is abnormal


def test_the_mirror_flips_the_pixels_the_truth_and_the_side_words(tmp_path: Path) -> None:
    case = sample_case(tmp_path, "c1", "p1")
    v, rec = make_variant(case, VariantKind.MIRRORED, tmp_path / "m")
    assert rec.truth == TruthTransform.MIRRORED and rec.text_mirrored
    assert np.array_equal(
        np.asarray(Image.open(v.images[0].path)),
        np.asarray(Image.open(case.images[0].path))[:, ::-1],
    )
    assert v.ground_truth and case.ground_truth
    assert v.ground_truth.lesions[0].hemisphere == "right"
    assert v.ground_truth.lesions[0].center_mm == (30.0, 10.0, 20.0)
    assert v.ground_truth.key_findings == ["mass in the right frontal lobe"]
    assert (
        v.note
        == "Sudden weakness of the Left arm; RIGHT-sided headache, looking rightwards. Bright."
    )
    doc = v.ehr["entry"][0]["resource"]["content"][0]["attachment"]["data"]  # type: ignore[index]
    assert base64.b64decode(doc) == b"right hemiparesis"
    assert v.ehr["entry"][1]["resource"]["code"]["text"] == "left leg pain"  # type: ignore[index]
    kept, rec2 = make_variant(case, VariantKind.MIRRORED_IMAGE_ONLY, tmp_path / "k")
    assert kept.note == case.note and kept.ehr == case.ehr and not rec2.text_mirrored
    assert kept.ground_truth and kept.ground_truth.lesions[0].hemisphere == "right"
    assert _hashes(rec2) == _hashes(rec)  # the same pixels as the mirror with its text


def test_the_side_word_rule() -> None:
    assert (
        mirror_side_words("left, Right; LEFT-sided; rightward")
        == "right, Left; RIGHT-sided; leftward"
    )
    # not words of their own: kept
    assert mirror_side_words("copyright leftover bright L R") == "copyright leftover bright L R"
    assert mirror_record({"code": "left", "text": "left"}) == {"code": "left", "text": "right"}


def test_other_patient_takes_another_patients_images_and_refuses_without_one(
    tmp_path: Path,
) -> None:
    case = sample_case(tmp_path, "c1", "p1")
    same_patient = sample_case(tmp_path, "c0", "p1")
    other = sample_case(tmp_path, "c2", "p2", blob_col=20)
    v, rec = make_variant(case, "other_patient", tmp_path / "o", pool=[same_patient, case, other])
    assert rec.other_case_id == "c2" and _hashes(rec) == _file_hashes(other)
    assert v.ground_truth == case.ground_truth
    with pytest.raises(VariantError, match="no other patient"):
        make_variant(case, "other_patient", tmp_path / "x", pool=[same_patient, case])


def test_planted_text_goes_into_the_note_and_the_record(tmp_path: Path) -> None:
    case = sample_case(tmp_path, "c1", "p1")
    v, rec = make_variant(case, "planted_note", tmp_path / "n")
    assert v.note.startswith(case.note) and rec.planted[0].text in v.note
    assert rec.planted[0].where == "note"
    r, rrec = make_variant(case, "planted_prior_report", tmp_path / "r")
    assert r.ehr and len(r.ehr["entry"]) == 3 and rrec.planted[0].where == "record"
    from evaluation.ehr import EHRContext  # the reader sees the planted report

    assert "normal study" in EHRContext.from_bundle(r.ehr).text()
    assert case.ehr and len(case.ehr["entry"]) == 2


def test_the_run_log_keeps_each_variant_and_a_sample_names_it_by_its_case_id(
    tmp_path: Path,
) -> None:
    from evaluation.errors import StoreError
    from evaluation.log import open_store
    from evaluation.robustness import (
        VARIANTS_NOTE,
        record_variants,
        recorded_variants,
        variant_of,
    )

    case = sample_case(tmp_path, "c1", "p1")
    _, mirrored = make_variant(case, "mirrored", tmp_path / "v")
    _, small = make_variant(case, "planted_pixels_small", tmp_path / "v", seed=1)
    assert variant_of(mirrored.case_id) == ("c1", VariantKind.MIRRORED)
    assert variant_of("c1") == ("c1", None) and variant_of("a~b") == ("a~b", None)
    with pytest.raises(VariantError, match="already a variant"):
        make_variant(case.model_copy(update={"case_id": mirrored.case_id}), "no_images", tmp_path)
    with open_store(tmp_path / "run", create=True) as store:
        assert recorded_variants(store) == {}
        record_variants(store, [mirrored])
        record_variants(store, [mirrored, small])  # a resumed run: the same variant again
        got = recorded_variants(store)
        assert got == {mirrored.case_id: mirrored, small.case_id: small}
        _, other_seed = make_variant(case, "planted_pixels_small", tmp_path / "w", seed=2)
        with pytest.raises(StoreError, match="resume with the run's own seed"):
            record_variants(store, [other_seed])
        store.set_note(VARIANTS_NOTE, '{"variants": [{"kind": "nonsense"}]}')
        with pytest.raises(StoreError, match="not a list of variants"):
            recorded_variants(store)


def test_the_option_names_kinds_and_groups_and_refuses_a_word_it_does_not_know() -> None:
    from evaluation.robustness import RobustnessOptionError, parse_kinds

    assert parse_kinds("") == ()
    assert parse_kinds("Mirrors, no_images,mirrored") == (
        VariantKind.NO_IMAGES,
        VariantKind.MIRRORED,
        VariantKind.MIRRORED_IMAGE_ONLY,
    )
    assert parse_kinds("all") == tuple(VariantKind)
    with pytest.raises(RobustnessOptionError, match="'flipped' is not a kind"):
        parse_kinds("mirrored,flipped")


def test_a_dataset_with_variants_keeps_the_sources_and_skips_what_a_case_cannot_have(
    tmp_path: Path,
) -> None:
    from evaluation.robustness import with_variants

    lone = sample_case(tmp_path, "c1", "p1")
    out = with_variants([lone], [VariantKind.NO_IMAGES, VariantKind.OTHER_PATIENT], tmp_path / "v")
    assert [c.case_id for c in out.cases] == ["c1", "c1~no_images"]
    assert [v.case_id for v in out.variants] == ["c1~no_images"]
    (skip,) = out.skipped
    assert skip.kind == VariantKind.OTHER_PATIENT and "no other patient" in skip.reason


def test_the_dry_run_counts_each_variants_calls(tmp_path: Path) -> None:
    from evaluation import Dataset, DatasetSpec, RunConfig
    from evaluation.budget import estimate_run
    from evaluation.models import ModelSpec
    from evaluation.robustness import with_variants

    cases = [sample_case(tmp_path, "c1", "p1"), sample_case(tmp_path, "c2", "p2")]
    config = RunConfig(
        dataset=DatasetSpec(path=str(tmp_path)),
        models=[ModelSpec(name="reference/text-prior", litellm_model="reference/text-prior")],
        bertscore=False,
        cache_dir=str(tmp_path / "cache"),
    )

    def calls(of: list[Case]) -> int:
        ds = Dataset(name="s", kind="suite", spec=config.dataset, hash="h", cases=of)
        return sum(m.calls for m in estimate_run(config, ds).models)

    expanded = with_variants(
        cases, [VariantKind.NO_IMAGES, VariantKind.MIRRORED], tmp_path / "v"
    ).cases
    assert calls(expanded) == 3 * calls(cases) > 0


@pytest.mark.parametrize(
    "kind",
    [VariantKind.MIRRORED, VariantKind.OTHER_PATIENT, VariantKind.PLANTED_PIXELS_LARGE,
     VariantKind.PLANTED_NOTE],
)  # fmt: skip
def test_a_variant_made_once_is_read_back_not_made_again(
    tmp_path: Path, kind: VariantKind, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's variants are asked again whenever the run is read (`report`, `runs show`, the
    review pages): the same source, kind and seed give the variant already written, its images
    checked by their hashes and not drawn or encoded again; a changed source, or an image file
    that is not the one recorded, makes it again."""
    from evaluation.robustness import generate

    case = sample_case(tmp_path, "c1", "p1")
    other = sample_case(tmp_path, "c2", "p2", blob_col=20)
    out = tmp_path / "v"
    first, rec = make_variant(case, kind, out, seed=7, pool=[case, other])
    files = sorted(p for p in out.rglob("*") if p.is_file())
    stamps = [(p.stat().st_ino, p.stat().st_mtime_ns) for p in files]

    def encode(im: Image.Image) -> bytes:
        raise AssertionError("a variant already made was drawn and encoded again")

    real = generate._png
    monkeypatch.setattr(generate, "_png", encode)
    again, rec2 = make_variant(case, kind, out, seed=7, pool=[case, other])
    assert again == first and rec2 == rec
    assert [(p.stat().st_ino, p.stat().st_mtime_ns) for p in files] == stamps
    monkeypatch.setattr(generate, "_png", real)
    if rec.images and kind != VariantKind.PLANTED_NOTE:  # an image replaced: made again
        Path(rec.images[0].path).write_bytes(b"not the variant's image")
        remade, rec3 = make_variant(case, kind, out, seed=7, pool=[case, other])
        assert rec3 == rec and _file_hashes(remade) == _hashes(rec)
    changed = case.model_copy(update={"note": case.note + " Worse today."})
    remade, _ = make_variant(changed, kind, out, seed=7, pool=[changed, other])
    assert "Worse today." in remade.note  # the changed source's variant, not the one kept
