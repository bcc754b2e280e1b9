"""The phantom suite's own reference answers pass its own scoring: full credit, no error label.

A reference answer states the truth (diagnosis, reference differential with its ICD-10 codes,
one finding per lesion, every image's sequence); when the scorers disagree with the truth the
generator wrote (a code the lexicon gives otherwise, a lesion the matcher cannot place), this
fails for that case.
"""

from __future__ import annotations

import pytest
from phantom_fixture import PhantomSuite

from evaluation.answers import Finding
from evaluation.case import Case, TaskFamily
from evaluation.datasets.phantoms import GROUPS
from evaluation.datasets.phantoms.reference import reference_answer
from evaluation.scores import ParseStatus
from evaluation.scoring import make_scored_sample

FAMILIES = (TaskFamily.DIFFERENTIAL, TaskFamily.LESION, TaskFamily.RATIONALE)


@pytest.fixture(scope="module")
def phantom_cases(
    phantom_suite: PhantomSuite,
    phantom_more: PhantomSuite,
    tmp_path_factory: pytest.TempPathFactory,
) -> list[Case]:
    """The cases as a run loads them (images rendered), from both session suites."""
    from evaluation.datasets import load_dataset

    cache = tmp_path_factory.mktemp("reference-cache")
    return [c for s in (phantom_suite, phantom_more) for c in load_dataset(s.root, cache).cases]


def test_the_cases_checked_cover_every_disease_group(phantom_cases: list[Case]) -> None:
    seen = {c.provenance.phantom.group for c in phantom_cases if c.provenance.phantom}
    assert seen == set(GROUPS), set(GROUPS) - seen


def test_every_reference_answer_scores_full_credit_with_no_label(
    phantom_cases: list[Case],
) -> None:
    problems = []
    for c in phantom_cases:
        ans = reference_answer(c)
        for family in FAMILIES:
            s = make_scored_sample(
                c, family, "reference", ParseStatus.OK, ans, ans.model_dump_json(), bertscore=False
            )
            if s.error is not None:
                problems.append(
                    f"{c.case_id} {family.value}: {s.error.category} {s.error.evidence}"
                )
            want = {
                "diagnosis_match": 1.0,
                "diagnosis_credit": 1.0,
                "differential_rank": 1.0,
                "sequence_recognition": 1.0,
            }
            for name, value in want.items():
                if s.value(name) != value:
                    problems.append(f"{c.case_id} {family.value}: {name}={s.value(name)}")
            if s.value("knowledge_consistency") == 0.0:
                problems.append(f"{c.case_id}: {s.score('knowledge_consistency').explanation}")  # type: ignore[union-attr]
            gt = c.ground_truth
            assert gt is not None
            if gt.lesions:
                for name in ("lesion_f1", "lesion_precision", "lesion_recall"):
                    if s.value(name) != 1.0:
                        problems.append(
                            f"{c.case_id}: {name}={s.value(name)} {s.score(name).explanation}"
                        )  # type: ignore[union-attr]
            elif s.value("normal_control_false_positive") not in (None, 0.0):
                problems.append(f"{c.case_id}: findings on a normal control")
    assert not problems, "\n".join(problems)


def test_every_reference_differential_item_is_coded_as_the_lexicon_codes_it(
    phantom_cases: list[Case],
) -> None:
    from evaluation.scoring.lexicon import default_lexicon

    lex = default_lexicon()
    wrong = []
    for c in phantom_cases:
        assert c.ground_truth is not None
        for d in c.ground_truth.differential:
            found = lex.lookup(d.name)
            cid = found.concept_id
            if (
                d.icd10
                and cid
                and not found.alternatives
                and not lex.icd10_consistent(cid, d.icd10)
            ):
                wrong.append(f"{c.case_id}: {d.name} {d.icd10} vs {lex[found.concept_id].icd10}")
    assert not wrong, wrong


# The digest of the generated truth of the session suite (seed 11), per generator version: a
# change to what the generator writes as truth must come with a new GENERATOR_VERSION (old runs
# name the version they were scored against). Add a line when you bump the version.
TRUTH_DIGESTS = {
    "4": "75fe430c1a6b272459d9a0a1508c6ba3583df7889be41b01c48c8cb7c3c95cfe",
}


def _rounded(value: object) -> object:
    if isinstance(value, float):
        return round(value, 1)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def test_a_change_to_generated_truth_bumps_the_generator_version(
    phantom_suite: PhantomSuite,
) -> None:
    import hashlib
    import json

    from evaluation.datasets.phantoms.series import GENERATOR_VERSION

    truths = []
    for key in sorted(phantom_suite.cases):
        case = json.loads((phantom_suite.case_dir(key) / "case.json").read_text(encoding="utf-8"))
        truths.append(_rounded(case["ground_truth"]))
    digest = hashlib.sha256(json.dumps(truths, sort_keys=True).encode()).hexdigest()
    assert GENERATOR_VERSION in TRUTH_DIGESTS, (
        f"generator version {GENERATOR_VERSION} has no pinned truth digest: add {digest!r}"
    )
    assert TRUTH_DIGESTS[GENERATOR_VERSION] == digest, (
        "the generated truth changed without a new GENERATOR_VERSION "
        f"(evaluation/datasets/phantoms/series.py); digest now {digest}"
    )


# --------------------------------------------------------------------------- injected errors
# The phantom reference answers with one error injected by rule, on every generated case it
# applies to: the labels must not depend on the hand-written cases of the conformance module.

_MIRROR = {"left": "right", "right": "left"}


def _place(les) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    return (les.hemisphere.value, les.region)


def _mirrored(finding, les):  # type: ignore[no-untyped-def]
    from evaluation.case import Hemisphere
    from evaluation.datasets.phantoms.truth import where

    other = les.model_copy(update={"hemisphere": Hemisphere(_MIRROR[les.hemisphere.value])})
    return finding.model_copy(
        update={
            "hemisphere": other.hemisphere.value,
            "region": where(other),
            "description": f"{where(other)} {les.type}",
        }
    )


def _injected(c: Case):  # type: ignore[no-untyped-def]
    """(kind, answer, images_shown, category, sub-label) for every error that applies to c."""
    from evaluation.answers import DifferentialItem
    from evaluation.case import DiseaseGroup
    from evaluation.scores import ErrorCategory as C

    gt = c.ground_truth
    assert gt is not None
    ref = reference_answer(c)
    out = []
    other = (
        "glioblastoma"
        if gt.final_diagnosis.group is not DiseaseGroup.TUMOUR
        else "multiple sclerosis"
    )
    out.append(
        (
            "wrong diagnosis",
            ref.model_copy(
                update={
                    "final_diagnosis": other,
                    "differential": [DifferentialItem(diagnosis=other)],
                }
            ),
            None,
            C.REASONING,
            "wrong_diagnosis",
        )
    )
    wrong_code = (
        "I63.9" if gt.final_diagnosis.group is not DiseaseGroup.ISCHAEMIC_STROKE else "C71.9"
    )
    diff = [
        d.model_copy(update={"icd10": wrong_code}) if i == 0 else d
        for i, d in enumerate(ref.differential)
    ]
    out.append(
        (
            "contradicting ICD-10",
            ref.model_copy(update={"differential": diff}),
            None,
            C.KNOWLEDGE_GAP,
            "icd10_contradiction",
        )
    )
    if not gt.lesions:
        extra = Finding(
            description="left frontal FLAIR hyperintense focus",
            sequence="FLAIR",
            signal="hyperintense",
            region="left frontal lobe",
            hemisphere="left",
        )
        out.append(
            (
                "finding on a normal control",
                ref.model_copy(update={"findings": [extra]}),
                None,
                C.VISUAL_HALLUCINATION,
                "hallucinated_finding",
            )
        )
        return out
    places = [_place(les) for les in gt.lesions]
    lateral = [i for i, les in enumerate(gt.lesions) if les.hemisphere.value in _MIRROR]
    for i in lateral:  # a lesion alone at its place, with nothing at its mirror image
        les = gt.lesions[i]
        mirror = (_MIRROR[les.hemisphere.value], les.region)
        if (
            places.count(_place(les)) != 1
            or mirror in places
            or (
                les.lobe
                and any(
                    (h, r) == mirror or (h == mirror[0] and x.lobe == les.lobe)
                    for x in gt.lesions
                    for h, r in [_place(x)]
                )
            )
        ):
            continue
        kept = [f for j, f in enumerate(ref.findings) if j != i]
        out.append(
            (
                "lesion omitted",
                ref.model_copy(update={"findings": kept}),
                None,
                C.PERCEPTUAL,
                "missed_lesion",
            )
        )
        beside = [*ref.findings, _mirrored(ref.findings[i], les)]
        out.append(
            (
                "mirrored extra finding",
                ref.model_copy(update={"findings": beside}),
                None,
                C.VISUAL_HALLUCINATION,
                "hallucinated_finding",
            )
        )
        if len(gt.lesions) == 1:
            swapped = [_mirrored(ref.findings[i], les)]
            out.append(
                (
                    "hemisphere swapped",
                    ref.model_copy(update={"findings": swapped}),
                    None,
                    C.GROUNDING,
                    "localisation_error",
                )
            )
        invented = [_mirrored(ref.findings[i], les)]
        out.append(
            (
                "text only, invented and missed",
                ref.model_copy(update={"findings": invented}),
                0,
                C.REASONING,
                "fabricated_without_images",
            )
        )
        break
    return out


def test_injected_errors_on_every_phantom_case_get_their_label(phantom_cases: list[Case]) -> None:
    tally: dict[str, list[int]] = {}
    wrong = []
    for c in phantom_cases:
        for kind, ans, shown, category, sub in _injected(c):
            s = make_scored_sample(
                c,
                TaskFamily.LESION,
                "m",
                ParseStatus.OK,
                ans,
                "",
                bertscore=False,
                images_shown=shown,
            )
            ok = s.error is not None and s.error.category is category and sub in s.error.sub_labels
            if shown == 0 and s.error is not None:
                ok = ok and "missed_lesion" not in s.error.sub_labels
            t = tally.setdefault(kind, [0, 0])
            t[0] += ok
            t[1] += 1
            if not ok:
                got = (
                    f"{s.error.category} {s.error.sub_labels} {s.error.evidence}"
                    if s.error
                    else None
                )
                wrong.append(f"{c.case_id} {kind}: {got}")
    print({k: f"{a}/{n}" for k, (a, n) in tally.items()})
    assert len(tally) == 7 and all(n >= 1 for _, n in tally.values()), tally
    assert not wrong, "\n".join(wrong)
