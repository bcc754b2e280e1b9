"""Disease groups and their lesion generators: where lesions go, their shape and their tissue.

Each generator (here: multiple sclerosis; vascular.py: stroke and haemorrhage; masses.py:
tumours and abscess) draws side, territory, size, count and age from the case's random generator
and returns Lesions plus facts (onset hours, territory, primary tumour...) that the ground
truth and the record are written from. Placement uses the coordinate atlas, so a
periventricular plaque really touches a ventricle and a metastasis sits at the grey-white
junction.
"""

from __future__ import annotations

import numpy as np

from evaluation.datasets.phantoms.atlas import Atlas
from evaluation.datasets.phantoms.masses import abscess, glioblastoma, meningioma, metastases
from evaluation.datasets.phantoms.placement import Plan, candidates, pick
from evaluation.datasets.phantoms.scene import Component, Lesion
from evaluation.datasets.phantoms.shapes import BlobShape, align, rotation
from evaluation.datasets.phantoms.tissue import Modifier
from evaluation.datasets.phantoms.vascular import haemorrhage, ischaemic_stroke

GROUPS: tuple[str, ...] = (
    "normal",
    "ms",
    "stroke-mca",
    "stroke-aca",
    "stroke-pca",
    "ich",
    "gbm",
    "mets",
    "meningioma",
    "abscess",
)


def multiple_sclerosis(rng: np.random.Generator, atlas: Atlas, difficulty: str) -> Plan:
    """Ovoid plaques: periventricular, juxtacortical, infratentorial.

    Every case has at least one T1 black hole (a chronic periventricular plaque); L1 and L3
    cases have one or two enhancing (active) plaques. L2 has none on purpose: without
    enhancement the images cannot show dissemination in time, and the record decides.
    """
    counts = {"L1": (4, 3, 1), "L2": (2, 1, 0), "L3": (3, 2, 1)}[difficulty]
    n_pv, n_jc, n_it = counts
    n_pv += int(rng.integers(0, 3))
    n_it += int(rng.integers(0, 2))
    kinds = ["periventricular"] * n_pv + ["juxtacortical"] * n_jc + ["infratentorial"] * n_it
    n_active = 0 if difficulty == "L2" else int(rng.integers(1, 3))
    active = set(rng.choice(len(kinds), size=min(n_active, len(kinds)), replace=False).tolist())
    placed: list[np.ndarray] = []
    drawn: list[tuple[str, np.ndarray, float, BlobShape, bool]] = []
    for i, kind in enumerate(kinds):
        c = pick(rng, candidates(atlas, kind), avoid=placed, spacing=14.0)
        placed.append(c)
        r = float(rng.uniform(3.5, 5.5) if kind == "periventricular" else rng.uniform(3.0, 4.5))
        if kind == "periventricular":
            # Ovoid with its long axis perpendicular to the ventricle wall (Dawson's finger).
            g = np.array(
                [
                    atlas.anatomy.sample(atlas.ventricle_dist, (c + d)[None])[0]
                    - atlas.anatomy.sample(atlas.ventricle_dist, (c - d)[None])[0]
                    for d in np.eye(3) * 2.0
                ]
            )
            rot = align(g if np.linalg.norm(g) > 0.1 else np.array([0.0, 0.0, 1.0]))
            radii = (r, r * 0.9, r * float(rng.uniform(1.7, 2.3)))
        else:
            rot = rotation(rng)
            radii = (r, r * 0.85, r * 1.2)
        blob = BlobShape.make(rng, c, radii, rot, wobble=0.08, edge=0.8)
        # Black holes (T1-dark chronic plaques) in deep white matter, where they are typical.
        black_hole = i not in active and kind == "periventricular" and rng.random() < 0.35
        drawn.append((kind, c, r, blob, black_hole))
    if not any(bh for *_, bh in drawn):
        # No draw gave one: the largest chronic periventricular plaque becomes the black hole
        # (decided after all draws, so the other plaques stay as the seed made them).
        chronic = [i for i, d in enumerate(drawn) if d[0] == "periventricular" and i not in active]
        j = max(chronic, key=lambda i: drawn[i][2])
        kind, c, r, blob, _ = drawn[j]
        drawn[j] = (kind, c, r, blob, True)
    lesions = []
    for i, (kind, c, _, blob, black_hole) in enumerate(drawn):
        if i in active:
            mod = Modifier(t1=1.15, t2=2.3, pd=1.08, adc=1.25, hu=-3, gd=0.25)
        elif black_hole:
            mod = Modifier(t1=1.6, t2=2.6, pd=1.12, adc=1.8, hu=-6)
        else:
            mod = Modifier(t1=1.1, t2=2.2, pd=1.06, adc=1.45, hu=-4)
        comp = Component("plaque", blob, "modify", mod, strength=(("gm", 0.4), ("wm", 1.0)))
        enh = "nodular" if i in active else "none"  # solid enhancement of the whole plaque
        lesions.append(
            Lesion(
                "ms_plaque",
                "demyelinating plaque" + (" (active, enhancing)" if i in active else ""),
                [comp],
                (float(c[0]), float(c[1]), float(c[2])),
                enhancement=enh,
                fine_region=True,
                facts={"placement": kind, "active": i in active, "black_hole": black_hole},
            )
        )
    return Plan("ms", lesions, {"n_lesions": len(lesions), "n_active": len(active)})


def plan_lesions(group: str, rng: np.random.Generator, atlas: Atlas, difficulty: str) -> Plan:
    """The lesions of one case of ``group`` (see GROUPS)."""
    if group == "normal":
        return Plan("normal", [])
    if group == "ms":
        return multiple_sclerosis(rng, atlas, difficulty)
    if group.startswith("stroke-"):
        return ischaemic_stroke(rng, atlas, group.split("-", 1)[1], difficulty)
    if group == "ich":
        return haemorrhage(rng, atlas, difficulty)
    if group == "gbm":
        return glioblastoma(rng, atlas, difficulty)
    if group == "mets":
        return metastases(rng, atlas, difficulty)
    if group == "meningioma":
        return meningioma(rng, atlas, difficulty)
    if group == "abscess":
        return abscess(rng, atlas, difficulty)
    raise ValueError(f"unknown disease group {group!r}; known: {', '.join(GROUPS)}")
