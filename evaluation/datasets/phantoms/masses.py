"""Masses: glioblastoma, metastases, meningioma and the great mimic, brain abscess.

Ring lesions are a shell around a core with their own irregularity (a thick nodular wall for
glioblastoma, a thin smooth capsule for an abscess); masses push the brain away (mass effect);
a meningioma is a dome on the dura with a dural tail.
"""

from __future__ import annotations

import numpy as np

from evaluation.datasets.phantoms.atlas import Atlas
from evaluation.datasets.phantoms.placement import (
    Plan,
    candidates,
    in_lobes,
    oedema,
    on_side,
    pick,
    side,
)
from evaluation.datasets.phantoms.scene import Component, Lesion
from evaluation.datasets.phantoms.shapes import (
    BlobShape,
    MassEffect,
    Shell,
    Within,
    align,
    rotation,
)
from evaluation.datasets.phantoms.tissue import Modifier


def _ring_tumour(
    rng: np.random.Generator,
    centre: np.ndarray,
    r: float,
    core_scale: float,
    wobble: float,
    rim: Modifier,
    core: Modifier,
    oedema_scale: float,
    wall: float,
) -> list[Component]:
    outer = BlobShape.make(
        rng, centre, (r, r * float(rng.uniform(0.85, 1.0)), r * 0.9), rotation(rng), wobble=wobble
    )
    # An eccentric core with its own irregularity gives a wall of uneven, nodular thickness;
    # the core is cut back to the outline shrunk by ``wall`` (a fraction of the radius) so the
    # wall stays closed: necrosis or pus never reaches the surface of the lesion.
    shift = rng.normal(0, 1, 3) * r * wobble * 0.5
    rc = r * core_scale
    inner = Within(
        BlobShape.make(
            rng, centre + shift, (rc, rc * 0.9, rc * 0.85), rotation(rng), wobble=wobble * 1.2
        ),
        outer.scaled(1.0 - wall),
    )
    return [
        oedema(outer.scaled(oedema_scale, 0.3)),
        Component("rim", Shell(outer, inner), "replace", rim, base="gm"),
        Component("core", inner, "replace", core, base="wm"),
    ]


def glioblastoma(rng: np.random.Generator, atlas: Atlas, difficulty: str) -> Plan:
    sx = side(rng)
    where = on_side(sx, in_lobes("frontal", "parietal", "temporal"))
    centre = pick(rng, candidates(atlas, "deep_wm"), where)
    r = float(rng.uniform(14, 22))
    rim = Modifier(t1=1.1, t2=1.25, pd=1.05, adc=1.2, hu=-3, gd=0.45)
    necrosis = Modifier(t1=2.6, t2=4.5, pd=1.3, adc=3.0, hu=-10)
    comps = _ring_tumour(rng, centre, r, 0.55, 0.3, rim, necrosis, 2.0, wall=0.2)
    bleed = rng.random() < 0.5
    if bleed:
        for _ in range(2):
            p = centre + rng.normal(0, 1, 3) / np.sqrt(3) * r * 0.8
            comps.append(
                Component(
                    "susceptibility focus",
                    BlobShape.make(rng, p, (2.0, 2.0, 2.0)),
                    "replace",
                    Modifier(t2s=0.1, t2=0.6, hu=20, gd=0.2),
                    base="gm",
                )
            )
    lesion = Lesion(
        "glioblastoma",
        "ring-enhancing intra-axial mass with central necrosis",
        comps,
        (float(centre[0]), float(centre[1]), float(centre[2])),
        mass_effect=MassEffect(tuple(float(v) for v in centre), 0.9 * r, 2.5 * r),  # type: ignore[arg-type]
        enhancement="ring",
        facts={"radius_mm": round(r, 1), "intratumoural_haemorrhage": bleed},
    )
    return Plan("gbm", [lesion], {"side": "right" if sx > 0 else "left"})


def abscess(rng: np.random.Generator, atlas: Atlas, difficulty: str) -> Plan:
    sx = side(rng)
    centre = pick(
        rng, candidates(atlas, "deep_wm"), on_side(sx, in_lobes("frontal", "parietal", "temporal"))
    )
    r = float(rng.uniform(11, 17))
    capsule = Modifier(t1=0.8, t2=0.55, t2s=0.5, pd=1.0, adc=1.1, hu=0, gd=0.45)
    pus = Modifier(t1=1.7, t2=3.0, pd=1.3, adc=0.6, hu=-6)
    comps = _ring_tumour(rng, centre, r, 0.8, 0.03, capsule, pus, 2.2, wall=0.1)
    lesion = Lesion(
        "abscess",
        "ring-enhancing lesion with central diffusion restriction",
        comps,
        (float(centre[0]), float(centre[1]), float(centre[2])),
        mass_effect=MassEffect(tuple(float(v) for v in centre), 0.6 * r, 2.2 * r),  # type: ignore[arg-type]
        enhancement="ring",
        facts={"radius_mm": round(r, 1)},
    )
    return Plan("abscess", [lesion], {"side": "right" if sx > 0 else "left"})


PRIMARIES = ("lung adenocarcinoma", "breast carcinoma", "melanoma")


def metastases(rng: np.random.Generator, atlas: Atlas, difficulty: str) -> Plan:
    primary = PRIMARIES[int(rng.integers(len(PRIMARIES)))]
    n = {"L1": int(rng.integers(2, 6)), "L2": 1, "L3": int(rng.integers(2, 5))}[difficulty]
    placed: list[np.ndarray] = []
    lesions = []
    for i in range(n):
        kind = "cerebellar" if (i > 0 and rng.random() < 0.2) else "gw_junction"
        c = pick(rng, candidates(atlas, kind), avoid=placed, spacing=30.0)
        placed.append(c)
        r = float(rng.uniform(8, 13) if (n == 1 or i == 0) else rng.uniform(3, 10))
        melanoma = primary == "melanoma"
        solid = Modifier(
            t1=0.55 if melanoma else 1.05,
            t2=1.1,
            t2s=0.3 if melanoma else 1.0,
            pd=1.0,
            adc=1.15,
            hu=2,
            gd=0.4,
        )
        if r >= 7:
            necrosis = Modifier(t1=2.2, t2=3.5, pd=1.25, adc=2.4, hu=-8)
            comps = _ring_tumour(rng, c, r, 0.5, 0.12, solid, necrosis, 3.0, wall=0.2)
            enh = "ring"
        else:
            blob = BlobShape.make(rng, c, (r, r, r * 0.9), wobble=0.08)
            comps = [
                oedema(blob.scaled(3.0, 0.3)),
                Component("nodule", blob, "replace", solid, base="gm"),
            ]
            enh = "nodular"
        me = (
            MassEffect((float(c[0]), float(c[1]), float(c[2])), 0.5 * r, 2.0 * r)
            if r >= 8
            else None
        )
        lesions.append(
            Lesion(
                "metastasis",
                "enhancing metastasis at the grey-white junction",
                comps,
                (float(c[0]), float(c[1]), float(c[2])),
                mass_effect=me,
                enhancement=enh,
                facts={"radius_mm": round(r, 1)},
            )
        )
    return Plan("mets", lesions, {"primary": primary, "n_lesions": n})


def _dura_point(atlas: Atlas, direction: np.ndarray, origin: np.ndarray) -> np.ndarray:
    """Where a ray from ``origin`` leaves the cranial cavity (inner table of the skull)."""
    d = direction / np.linalg.norm(direction)
    steps = np.arange(0, 120, 0.5)
    pts = origin[None] + steps[:, None] * d[None]
    inside = atlas.anatomy.sample(atlas.anatomy.intracranial(), pts)
    out = np.flatnonzero(inside < 0.5)
    return pts[out[0] - 1] if len(out) else pts[-1]


def meningioma(rng: np.random.Generator, atlas: Atlas, difficulty: str) -> Plan:
    sx = side(rng)
    site = ["convexity", "parasagittal", "convexity"][int(rng.integers(3))]
    origin = np.array([0.0, -15.0, 15.0])
    if site == "parasagittal":
        direction = np.array([sx * 0.25, rng.uniform(-0.4, 0.5), 1.0])
    else:
        direction = np.array([sx * 1.0, rng.uniform(-0.6, 0.8), rng.uniform(0.1, 0.7)])
    d = direction / np.linalg.norm(direction)
    dura = _dura_point(atlas, d, origin)
    r = float(rng.uniform(15, 24))
    # A dome on the dura: flattened along the ray, centred just inside the inner table, so the
    # part inside the skull has a broad dural base.
    centre = dura - d * 0.3 * r
    blob = BlobShape.make(rng, centre, (r, r * 0.95, r * 0.8), align(d), wobble=0.06)
    tumour = Modifier(t1=0.97, t2=1.08, pd=1.02, adc=0.95, hu=10, gd=0.5)
    tail = BlobShape.make(rng, dura - d * 1.5, (2.1 * r, 2.1 * r, 1.3), align(d))
    comps = []
    has_oedema = rng.random() < 0.35
    if has_oedema:
        comps.append(oedema(blob.scaled(1.7, 0.3)))
    comps += [
        Component(
            "dural tail",
            tail,
            "replace",
            Modifier(t1=0.8, t2=0.7, gd=0.3),
            base="gm",
            in_mask=False,
        ),
        Component("tumour", blob, "replace", tumour, base="gm"),
    ]
    calcified = rng.random() < 0.3
    if calcified:
        comps.append(
            Component(
                "calcification",
                BlobShape.make(rng, centre - d * 0.3 * r, (3.0, 3.0, 3.0)),
                "replace",
                Modifier(t2=0.3, t2s=0.1, pd=0.3, hu=250, gd=0.1),
                base="gm",
            )
        )
    lesion = Lesion(
        "meningioma",
        "extra-axial dural-based enhancing mass",
        comps,
        (float(centre[0]), float(centre[1]), float(centre[2])),
        mass_effect=MassEffect(tuple(float(v) for v in centre), 1.0 * r, 2.4 * r),  # type: ignore[arg-type]
        enhancement="homogeneous",
        extra_axial=True,
        facts={
            "site": site,
            "calcified": calcified,
            "oedema": has_oedema,
            "radius_mm": round(r, 1),
        },
    )
    return Plan("meningioma", [lesion], {"site": site, "side": "right" if sx > 0 else "left"})
