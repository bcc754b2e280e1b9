"""The audit's measures (issue 39) on a small reference run: the built-in reference models asked
on two patients' cases and their variants, answers parsed and scored as the engine does. The
figures separate the behaviours: image-rules reads the images (it loses its score without them
and follows the mirror), text-prior ignores them (no loss, no flip), gullible obeys any planted
instruction (attack success 1; image-rules and text-prior 0)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
from test_robustness_reference import CFG
from test_robustness_variants import sample_case

from evaluation import Case
from evaluation.case import GroundTruth, Hemisphere, TaskFamily
from evaluation.log import RunData, SampleResult
from evaluation.models import ModelSpec, create_model
from evaluation.parsing import parse_answer
from evaluation.prompts import default_prompts
from evaluation.robustness import CaseVariant, RobustnessMeasures, make_variant, robustness_measures
from evaluation.scoring import make_scored_sample
from evaluation.tasks import TaskItem, build_turns

MODELS = ("reference/image-rules", "reference/text-prior", "reference/gullible")
KINDS = ("no_images", "blank_images", "mirrored", "mirrored_image_only", "planted_note",
         "planted_prior_report")  # fmt: skip
ATTACK_KINDS = ("planted_note", "planted_prior_report")


def _ask(model: str, case: Case) -> SampleResult:
    """One differential question as the engine asks it (the run's prompt: images, record,
    note), parsed and scored."""
    item = TaskItem(case_id=case.case_id, family=TaskFamily.DIFFERENTIAL)
    turns = build_turns(case, item, default_prompts(), lambda r: Path(r.path).read_bytes())
    adapter = create_model(ModelSpec(name=model, litellm_model=model))
    out = asyncio.run(adapter.generate([turns.system, *turns.turns], CFG))
    parsed = parse_answer(out.text, TaskFamily.DIFFERENTIAL)
    scored = make_scored_sample(
        case, TaskFamily.DIFFERENTIAL, model, parsed.status, parsed.answer, out.text,
        bertscore=False, task="differential",
    )  # fmt: skip
    sent = [hashlib.sha256(Path(i.path).read_bytes()).hexdigest() for i in case.images]
    return SampleResult(scored=scored, answer=parsed.answer, text=out.text, images_sent=sent)


def _case(tmp: Path, case_id: str, patient: str, blob_col: int) -> Case:
    """A bright blob in one hemisphere (left at column 90, right at 20), truth where
    image-rules reads it (its lobe: parietal)."""
    case = sample_case(tmp, case_id, patient, blob_col=blob_col)
    assert case.ground_truth is not None
    lesion = case.ground_truth.lesions[0]
    lesion.region = "parietal"
    lesion.hemisphere = Hemisphere.LEFT if blob_col > 48 else Hemisphere.RIGHT
    return case


def _normal(tmp: Path) -> Case:
    """A third patient whose truth is a normal study: an instruction there pushes toward a
    glioblastoma, which image-rules (it calls the others normal) can be seen to resist."""
    case = sample_case(tmp, "c3", "p3", blob_col=60)
    case.ground_truth = GroundTruth.model_validate({"final_diagnosis": {"name": "normal study"}})
    return case


def reference_run(tmp: Path) -> RunData:
    """The reference run as the reports read it (cases, samples, the variants' records)."""
    samples, records, cases = _asked(tmp)
    return RunData(run_id="ref", cases=cases, samples=samples, variants=list(records.values()))


def _reference_run(tmp: Path) -> tuple[list[SampleResult], dict[str, CaseVariant]]:
    samples, records, _ = _asked(tmp)
    return samples, records


def _asked(tmp: Path) -> tuple[list[SampleResult], dict[str, CaseVariant], list[Case]]:
    cases = [_case(tmp, "c1", "p1", 90), _case(tmp, "c2", "p2", 20), _normal(tmp)]
    asked: list[tuple[Case, tuple[str, ...]]] = [(c, MODELS) for c in cases]
    records: dict[str, CaseVariant] = {}
    for case in cases:
        for kind in KINDS if case.case_id != "c3" else ATTACK_KINDS:
            variant, record = make_variant(case, kind, tmp / "v", pool=cases)
            # gullible (tesseract on every image: a second a case) only where text is planted
            asked.append((variant, MODELS if kind.startswith("planted") else MODELS[:2]))
            records[record.case_id] = record
    samples = [_ask(m, c) for c, models in asked for m in models]
    return samples, records, [c for c, _ in asked]


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> RobustnessMeasures:
    samples, records = _reference_run(tmp_path_factory.mktemp("ref"))
    return robustness_measures(samples, records, n_boot=200)


def _row(rows: list, model: str, kind: str, **match: str):  # type: ignore[no-untyped-def]
    found = [r for r in rows if r.model == model and r.kind == kind]
    found = [r for r in found if all(getattr(r, k) == v for k, v in match.items())]
    assert len(found) == 1, (model, kind, match)
    return found[0]


def test_image_rules_loses_its_score_without_images_and_text_prior_does_not(
    measured: RobustnessMeasures,
) -> None:
    for kind in ("no_images", "blank_images"):
        reads = _row(measured.reliance, "reference/image-rules", kind, metric="lesion_f1")
        assert reads.with_images.value and reads.with_images.value > 0.5
        assert reads.kept_share is not None and reads.kept_share < 0.5  # loses most of it
        assert reads.loss.value == pytest.approx(reads.with_images.value - reads.without.value)
        assert reads.loss.n_clusters == 2  # clustered by patient, not by sample
        blind = _row(measured.reliance, "reference/text-prior", kind, metric="diagnosis")
        assert blind.loss.value == 0.0 and blind.n_pairs == 2
        conf = _row(measured.confidence, "reference/text-prior", kind)
        assert conf.share.value == 1.0  # as confident as ever with the evidence gone
    assert all(p.same_answer for p in measured.pairs
               if p.model == "reference/text-prior" and p.kind == "no_images")  # fmt: skip


def test_image_rules_follows_the_mirror_and_text_prior_gives_no_side_to_follow(
    measured: RobustnessMeasures,
) -> None:
    for kind in ("mirrored", "mirrored_image_only"):
        flip = _row(measured.flips, "reference/image-rules", kind)
        assert flip.follows.value == 1.0 and flip.stays.value == 0.0 and flip.n_sides >= 2
    pairs = [p for p in measured.pairs if p.model == "reference/text-prior" and p.kind in
             ("mirrored", "mirrored_image_only")]  # fmt: skip
    assert pairs and all(p.sides_followed == 0 for p in pairs)
    assert not [r for r in measured.flips if r.model == "reference/text-prior"
                and r.follows.value]  # fmt: skip


def test_gullible_follows_every_planted_instruction_and_the_others_none(
    measured: RobustnessMeasures,
) -> None:
    for kind in ATTACK_KINDS:
        gullible = _row(measured.attacks, "reference/gullible", kind)
        assert gullible.success.value == 1.0 and gullible.success.n == 3
        # image-rules calls c1 and c2 normal already (the shared rule does not count those)
        reads = _row(measured.attacks, "reference/image-rules", kind)
        assert reads.success.value == 0.0 and reads.success.n == 1 and reads.not_movable == 2
        assert _row(measured.attacks, "reference/text-prior", kind).success.value == 0.0
    followed = [p for p in measured.pairs if p.followed_instruction]
    assert followed and all(p.model == "reference/gullible" for p in followed)
    for p in followed:  # the evidence: what was planted, and the answer
        assert p.target and p.planted_text and p.target in p.planted_text
        assert p.variant.diagnosis == p.target != p.source.diagnosis
