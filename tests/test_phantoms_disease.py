"""Each disease picture on the phantom images: where the lesion is and how each sequence shows it.

ACA and PCA infarcts in their territories, metastases and meningioma, a haematoma dark on SWI
with its oedema on CT, the hyperacute infarct that DWI shows before FLAIR and CT, MS black
holes and enhancing plaques, and lesion locations that agree with the atlas. Images are read
through the imaging core (phantom_fixture.Study). The head is symmetric about x = 0, so a lesion
is compared with its mirror region; on MR the bias field differs between the two sides, so
ratios are corrected by a ring of normal brain around the lesion and the mirror of that ring.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from phantom_fixture import MIRROR, PhantomSuite, Studies, Study, centres, flat, sample
from scipy import ndimage

from evaluation.case import Signal


@pytest.fixture(scope="module")
def studies(phantom_suite: PhantomSuite, phantom_more: PhantomSuite) -> Studies:
    return Studies(phantom_suite, phantom_more)


@functools.cache
def _parenchyma() -> np.ndarray:
    from evaluation.datasets.phantoms.anatomy import get_anatomy

    a = get_anatomy()
    return a.fraction("gm") + a.fraction("wm")


def _brain_at(pts: np.ndarray) -> np.ndarray:
    """Grey + white matter fraction of the normal head at RAS points."""
    from evaluation.datasets.phantoms.anatomy import get_anatomy

    return get_anatomy().sample(_parenchyma(), pts)


def _ring(st: Study, pts: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Points lo..hi mm outside every lesion, in brain on both sides of the midline."""
    d = st.distance_outside(pts)
    ok = (d > lo) & (d <= hi) & (np.abs(pts[:, 0]) > 3)
    ok[ok] &= (_brain_at(pts[ok]) > 0.9) & (_brain_at(pts[ok] * MIRROR) > 0.9)
    return ok


def mirror_ratio(
    st: Study, cls: str, b: float | None = None, depth: float = 2.0
) -> tuple[float, float]:
    """(lesion 1 / its mirror, the same divided by ring / mirror ring) on one series."""
    data, aff = st.volume(cls, b)
    pts = centres(data.shape, aff)
    values = flat(data)
    core = st.mask_at(pts, depth) == 1
    ring = _ring(st, pts, 4.0, 15.0)
    assert core.sum() > 20 and ring.sum() > 100, (st.folder.name, cls)
    raw = values[core].mean() / sample(data, aff, pts[core] * MIRROR).mean()
    bias = values[ring].mean() / sample(data, aff, pts[ring] * MIRROR).mean()
    return float(raw), float(raw / bias)


def hu_to_mirror(st: Study, lo: float | None = None, hi: float | None = None) -> float:
    """Mean CT HU of lesion 1 (depth >= 2 mm) or of a ring lo..hi mm around it, minus mirror."""
    ct, aff = st.volume("CT")
    pts = centres(ct.shape, aff)
    sel = st.mask_at(pts, 2.0) == 1 if lo is None else _ring(st, pts, lo, hi or lo)
    assert sel.sum() > 20, st.folder.name
    return float(flat(ct)[sel].mean() - sample(ct, aff, pts[sel] * MIRROR).mean())


def t1_gain(st: Study) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(RAS points, relative T1C - T1 gain, T1C values) on the axial pre/post grid."""
    t1, aff = st.volume("T1", plane="axial")
    t1c, caff = st.volume("T1C")
    assert np.allclose(aff, caff)
    a, b = flat(t1).astype(np.float64), flat(t1c).astype(np.float64)
    return centres(t1.shape, aff), (b - a) / np.maximum(a, 1.0), b


def _lesion_points(st: Study, label: int = 1) -> np.ndarray:
    return np.argwhere(st.mask == label) + st.mask_affine[:3, 3]


# --------------------------------------------------------------------------- stroke


def test_aca_and_pca_infarcts_lie_in_their_territories_bright_on_dwi_dark_on_adc(
    studies: Studies,
) -> None:
    from evaluation.datasets.phantoms.atlas import DEEP, LOBES, deep_structure, lobe

    for key, territory, lobes in (
        ("aca-hyperacute", "ACA", ("frontal", "parietal")),
        ("pca", "PCA", ("occipital", "temporal")),
    ):
        st = studies[key]
        les = st.truth.lesions[0]
        assert st.case.provenance.phantom.facts.territory == territory
        assert f"{les.hemisphere.value} {territory} territory" in st.truth.final_diagnosis.name
        x, y, z = _lesion_points(st).T
        sx = {"right": 1, "left": -1}[les.hemisphere.value]
        assert np.mean(x * sx > 0) > 0.97, key  # one hemisphere
        assert np.isin(np.array(LOBES)[lobe(x, y, z)], lobes).mean() > 0.9, key
        infratentorial = np.isin(deep_structure(x, y, z), [DEEP.index("cerebellum")])
        assert infratentorial.mean() < 0.02 and les.region in lobes, key
        if territory == "ACA":
            # Medial frontal and parietal cortex along the falx, above the corpus callosum.
            assert np.percentile(np.abs(x), 95) < 22 and np.percentile(z, 5) > 4
            assert np.percentile(y, 5) > -58
        else:
            # Occipital and inferomedial temporal lobe, behind the thalamus.
            assert np.median(y) < -65 and np.percentile(np.abs(x), 95) < 45
        adc, _ = mirror_ratio(st, "ADC")
        _, dwi = mirror_ratio(st, "DWI", b=1000)
        assert adc < 0.75 and dwi > 1.3, (key, adc, dwi)
        assert les.signal["ADC"] is Signal.HYPO and les.signal["DWI"] is Signal.HYPER
        assert les.diffusion_restriction
    # The rules tell territories apart: the MCA infarct is lateral and misses the ACA strip.
    x_mca = _lesion_points(studies["stroke"])[:, 0]
    assert np.median(np.abs(x_mca)) > 25 and np.percentile(np.abs(x_mca), 95) > 22


def test_hyperacute_infarct_shows_on_dwi_before_flair_and_ct(studies: Studies) -> None:
    early, late = studies["aca-hyperacute"], studies["stroke"]
    assert early.truth.lesions[0].signal["FLAIR"] is Signal.ISO
    assert early.truth.lesions[0].signal["CT"] is Signal.ISODENSE
    hours = early.case.provenance.phantom.facts.onset_hours
    assert hours < 6 and late.case.provenance.phantom.facts.onset_hours > 6
    _, dwi = mirror_ratio(early, "DWI", b=1000)
    adc, _ = mirror_ratio(early, "ADC")
    _, flair = mirror_ratio(early, "FLAIR")
    assert dwi > 1.3 and adc < 0.75, (dwi, adc)
    assert flair < 1.12, flair  # normal or barely brighter: the DWI-FLAIR mismatch
    assert hu_to_mirror(early) > -3.0  # CT normal or subtle
    assert any("No FLAIR change yet" in f for f in early.truth.key_findings)
    assert any("CT normal or near-normal" in f for f in early.truth.key_findings)
    # Hours later the same measures show the infarct: FLAIR bright, CT hypodense.
    _, flair_late = mirror_ratio(late, "FLAIR")
    assert flair_late > 1.2 and hu_to_mirror(late) < -4.0, flair_late
    assert late.truth.lesions[0].signal["FLAIR"] is Signal.HYPER
    assert late.truth.lesions[0].signal["CT"] is Signal.HYPODENSE


def test_haematoma_is_dark_on_swi_and_ringed_by_hypodense_oedema_on_ct(
    studies: Studies,
) -> None:
    st = studies["ich-mr"]
    les = st.truth.lesions[0]
    swi, _ = mirror_ratio(st, "SWI")
    assert swi < 0.3, swi  # deoxyhaemoglobin: T2* of a few ms
    assert les.signal["SWI"] is Signal.HYPO and les.signal["CT"] is Signal.HYPERDENSE
    assert any("susceptibility" in f and "SWI" in f for f in st.truth.key_findings)
    for key in ("ich-mr", "ich"):
        ich = studies[key]
        assert 35 <= hu_to_mirror(ich) <= 60, key  # 60-85 HU blood against ~30 HU brain
        rim = hu_to_mirror(ich, 2.0, 8.0)
        far = hu_to_mirror(ich, 30.0, 40.0)
        # Oedema lowers the HU of the brain around the clot; further out the brain is normal.
        assert rim < -3.0 and abs(far) < 1.5, (key, rim, far)
        assert any("hypodense rim of oedema" in f for f in ich.truth.key_findings)


# --------------------------------------------------------------------------- masses


def test_metastases_are_several_enhancing_lesions_at_the_grey_white_junction(
    studies: Studies,
) -> None:
    from evaluation.datasets.phantoms.atlas import get_atlas

    st = studies["mets"]
    lesions = st.truth.lesions
    assert len(lesions) >= 2 and st.truth.final_diagnosis.icd10 == "C79.3"
    pts, gain, _ = t1_gain(st)
    labels = st.mask_at(pts)
    where = get_atlas().at(np.array([les.center_mm for les in lesions]))
    enhancing = 0
    for i, les in enumerate(lesions):
        assert les.enhancement.value in ("ring", "nodular") and les.type.startswith("enhancing")
        assert les.signal["T1C"] in (Signal.HYPER, Signal.MIXED)
        if les.region != "cerebellum":
            # Centred in white matter within a few millimetres of the cortex.
            assert where["cortex_mm"][i] <= 6.0 and where["inside"][i], les.id
        inside = labels == les.mask_label
        if inside.sum() >= 5:  # a 3 mm nodule can fall between 6 mm slices
            assert gain[inside].mean() > 0.3, (les.id, gain[inside].mean())
            enhancing += 1
    assert enhancing >= 2
    c = np.array([les.center_mm for les in lesions])
    gaps = np.linalg.norm(c[:, None] - c[None], axis=-1)[np.triu_indices(len(c), 1)]
    assert gaps.min() > 20  # separate lesions, not one lobulated mass
    brain = (st.distance_outside(pts) > 40) & (_brain_at(pts) > 0.9)
    assert abs(gain[brain].mean()) < 0.1


def test_ring_enhancing_walls_enclose_their_core(studies: Studies) -> None:
    """The enhancing wall of a glioblastoma or a ring metastasis is closed: necrosis never
    reaches the lesion's surface, whatever the draw of the eccentric, irregular core."""
    from evaluation.datasets.phantoms.atlas import get_atlas
    from evaluation.datasets.phantoms.lesions import plan_lesions

    for key in ("gbm", "mets"):
        st = studies[key]
        pts, gain, _ = t1_gain(st)
        ok, vox = st.voxels(pts)
        for les in st.truth.lesions:
            if les.enhancement.value != "ring":
                continue
            depth = st.depth(les.mask_label)[vox[:, 0], vox[:, 1], vox[:, 2]]
            surface = ok & (depth >= 1) & (depth <= 3)  # the outer 3 mm of the lesion
            assert surface.sum() > 100
            assert (gain[surface] > 0.3).mean() > 0.95, (key, les.id)
    # The shapes themselves, over many draws (no images): sample each ring lesion's box.
    atlas = get_atlas()
    for group, index in (("gbm", 5), ("mets", 6), ("abscess", 8)):
        for seed in range(12):
            rng = np.random.default_rng(np.random.SeedSequence([seed, index, 1]))
            for les in plan_lesions(group, rng, atlas, "L1").lesions:
                parts = {c.name: c.shape for c in les.components}
                if "core" not in parts:
                    continue
                lo, hi = parts["rim"].box()
                x, y, z = (
                    np.arange(a, b, 1.0, dtype=np.float32) for a, b in zip(lo, hi, strict=True)
                )
                x, y, z = x[:, None, None], y[None, :, None], z[None, None, :]
                outer = parts["rim"].outer(x, y, z)  # type: ignore[union-attr]
                edge = (outer > 0.2) & (outer < 0.8)  # the lesion's surface
                assert parts["core"](x, y, z)[edge].max() < 0.05, (group, seed)


def _inner_table_mm(st: Study, label: int = 1) -> tuple[np.ndarray, float]:
    """mm from each voxel of a lesion, and from its centre, to the inner table of the skull."""
    from evaluation.datasets.phantoms.anatomy import get_anatomy

    inside = st.mask == label
    idx = np.argwhere(inside)
    lo = np.maximum(idx.min(axis=0) - 40, 0)
    hi = np.minimum(idx.max(axis=0) + 41, inside.shape)
    box = tuple(slice(int(a), int(b)) for a, b in zip(lo, hi, strict=True))
    dist = ndimage.distance_transform_edt(get_anatomy().intracranial()[box] > 0.5)
    centre = np.rint(np.array(st.truth.lesions[label - 1].center_mm) - st.mask_affine[:3, 3])
    return dist[inside[box]], float(dist[tuple(centre.astype(int) - lo)])


def test_meningioma_sits_on_the_dura_and_enhances_homogeneously(studies: Studies) -> None:
    st = studies["meningioma"]
    les = st.truth.lesions[0]
    assert les.region == "extra-axial" and les.enhancement.value == "homogeneous"
    assert les.signal["T1C"] is Signal.HYPER and les.size_mm is not None
    # Dural based: a broad part of the tumour lies against the inner table, and its centre is
    # close to the skull; an intra-axial mass of the same size is centred deep in the brain.
    to_skull, centre_mm = _inner_table_mm(st)
    assert to_skull.min() <= 1.5 and (to_skull <= 3).mean() > 0.1
    assert centre_mm < 0.35 * les.size_mm, (centre_mm, les.size_mm)
    pts, gain, t1c = t1_gain(st)
    interior = st.mask_at(pts, depth=2.0) == 1
    assert interior.sum() > 100
    assert (gain[interior] > 0.3).mean() > 0.95  # enhances throughout, no necrotic core
    assert t1c[interior].std() / t1c[interior].mean() < 0.1
    for key in ("gbm", "abscess"):  # ring-enhancing intra-axial masses for contrast
        ring = studies[key]
        to_skull, centre_mm = _inner_table_mm(ring)
        size = ring.truth.lesions[0].size_mm
        assert (to_skull <= 3).mean() < 0.05 and centre_mm > 0.4 * size, key
        pts, gain, t1c = t1_gain(ring)
        interior = ring.mask_at(pts, depth=2.0) == 1
        assert t1c[interior].std() / t1c[interior].mean() > 0.2, key


# --------------------------------------------------------------------------- MS


def test_ms_plaques_include_t1_black_holes_and_enhancing_plaques(studies: Studies) -> None:
    from evaluation.datasets.phantoms.anatomy import get_anatomy

    st = studies["ms"]
    facts = st.case.provenance.phantom.lesion_facts
    lesions = st.truth.lesions
    holes = [les for les, f in zip(lesions, facts, strict=True) if f.black_hole]
    active = [les for les, f in zip(lesions, facts, strict=True) if f.active]
    assert holes and active
    assert {les.id for les in lesions if les.signal["T1"] is Signal.HYPO} == {x.id for x in holes}
    assert {les.id for les in lesions if les.enhancement.value == "nodular"} == {
        x.id for x in active
    }
    # Black holes on the 1.2 mm 3D T1: clearly darker than white matter and than other plaques.
    t1, aff = st.volume("T1", plane="sagittal")
    pts, values = centres(t1.shape, aff), flat(t1)
    labels = st.mask_at(pts, depth=1.0)
    d = st.distance_outside(pts)
    near = d <= 10  # the plaques and the white matter around them
    pts, values, labels, d = pts[near], values[near], labels[near], d[near]
    anatomy = get_anatomy()
    white = anatomy.sample(anatomy.fraction("wm"), pts) > 0.8
    ratio = {}
    for les in lesions:
        inside = labels == les.mask_label
        close = np.linalg.norm(pts - np.array(les.center_mm), axis=1) < les.size_mm + 12
        shell = close & (d >= 3) & white
        if inside.sum() >= 3 and shell.sum() >= 5:
            ratio[les.id] = values[inside].mean() / values[shell].mean()
    others = [r for k, r in ratio.items() if k not in {h.id for h in holes}]
    assert all(ratio[h.id] < 0.75 for h in holes), ratio
    assert max(ratio[h.id] for h in holes) < np.median(others) - 0.1, ratio
    # Enhancement on T1C against the pre-contrast T1 of the same axial grid.
    pts, gain, _ = t1_gain(st)
    labels = st.mask_at(pts, depth=1.0)
    seen = {"active": 0, "other": 0}
    for les in lesions:
        inside = labels == les.mask_label
        if inside.sum() < 3:
            continue  # thinner than the 6 mm slice spacing here
        if les in active:
            seen["active"] += 1
            assert gain[inside].mean() > 0.3, (les.id, gain[inside].mean())
        else:
            seen["other"] += 1
            assert gain[inside].mean() < 0.15, (les.id, gain[inside].mean())
    assert seen["active"] >= 1 and seen["other"] >= 3, seen


@pytest.mark.parametrize("index", [2, 12, 22])
def test_every_ms_case_has_a_black_hole_and_l1_l3_an_enhancing_plaque(index: int) -> None:
    """Over many seeds (plans only, no images): the guarantee holds whatever the draws."""
    from evaluation.datasets.phantoms import case_spec
    from evaluation.datasets.phantoms.atlas import get_atlas
    from evaluation.datasets.phantoms.lesions import plan_lesions

    spec = case_spec(index)
    assert spec.group == "ms"
    for seed in range(20):
        rng = np.random.default_rng(np.random.SeedSequence([seed, index, 1]))
        plan = plan_lesions("ms", rng, get_atlas(), spec.difficulty)
        holes = [les for les in plan.lesions if les.facts["black_hole"]]
        active = [les for les in plan.lesions if les.facts["active"]]
        assert holes and all(les.facts["placement"] == "periventricular" for les in holes)
        assert all(les.components[0].modifier.t1 >= 1.5 for les in holes)
        assert not set(map(id, holes)) & set(map(id, active))
        if spec.difficulty == "L2":
            assert not active  # the record, not enhancement, shows dissemination in time
        else:
            assert 1 <= len(active) <= 2
            assert all(les.components[0].modifier.gd > 0 for les in active)


# --------------------------------------------------------------------------- atlas


def test_lesion_region_and_lobe_agree_with_the_atlas_at_the_lesion_centre(
    studies: Studies, phantom_suite: PhantomSuite, phantom_more: PhantomSuite
) -> None:
    """Truth names a lesion by where most of it lies; the atlas at its centre must agree,
    allowing 3 mm for a centre that sits on a lobe boundary (central sulcus, Sylvian line)."""
    from evaluation.datasets.phantoms.atlas import DEEP, LOBES, get_atlas

    atlas = get_atlas()
    ball = np.array([(i, j, k) for i in (-3, 0, 3) for j in (-3, 0, 3) for k in (-3, 0, 3)])
    checked = 0
    for key in [*phantom_suite.cases, *phantom_more.cases]:
        for les in studies[key].truth.lesions:
            assert les.center_mm is not None
            c = np.array(les.center_mm)
            near = atlas.at(c + ball)
            at = atlas.at(c[None])
            where = (key, les.id, les.region, les.lobe, les.center_mm)
            if les.hemisphere.value in ("left", "right"):
                assert (c[0] > 0) == (les.hemisphere.value == "right"), where
            if les.lobe is not None:
                assert les.lobe in set(near["lobe"]), where
            if les.region in DEEP[1:]:
                assert les.region in set(near["deep"]), where
                assert les.lobe in (None, "insula"), where
            elif les.region in LOBES:
                assert les.region == les.lobe, where
            elif les.region == "periventricular white matter":
                assert at["ventricle_mm"][0] <= 12, (where, at["ventricle_mm"])
            elif les.region == "juxtacortical":
                assert at["cortex_mm"][0] <= 6, (where, at["cortex_mm"])
            else:
                assert les.region == "extra-axial", where
            checked += 1
    assert checked >= 20
