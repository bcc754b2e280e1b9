"""Vascular lesions: acute ischaemic infarcts in an arterial territory, and haematomas.

Side, territory branch, size and age (hours since onset) are drawn per case; the age decides
which sequences show the infarct (ADC falls first; T2/FLAIR and CT change after hours).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from evaluation.datasets.phantoms.atlas import Atlas
from evaluation.datasets.phantoms.placement import (
    GREY_AND_WHITE,
    Plan,
    candidates,
    in_lobes,
    oedema,
    on_side,
    pick,
    side,
)
from evaluation.datasets.phantoms.scene import Component, Lesion
from evaluation.datasets.phantoms.shapes import BlobShape, Masked, MassEffect, rotation
from evaluation.datasets.phantoms.tissue import Modifier


def _territory(name: str, sx: int) -> Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    """Soft indicator of an arterial territory in one hemisphere (MNI mm)."""

    def aca(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
        hx = sx * x
        return (
            np.clip(hx - 0.5, 0, 1)
            * np.clip((20.0 - hx) / 4.0, 0, 1)
            * np.clip((z - 6.0) / 4.0, 0, 1)
            * np.clip((y + 55.0) / 5.0, 0, 1)
        )

    def pca(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
        hx = sx * x
        tent = np.where(y < -50, -12.0 + 0.4 * (y + 50.0), -12.0)
        supra = np.clip((z - tent) / 3.0, 0, 1)
        occipital = np.clip((-62.0 - y) / 5.0, 0, 1)
        inferomedial = (
            np.clip((-2.0 - z) / 4.0, 0, 1)
            * np.clip((-15.0 - y) / 5.0, 0, 1)
            * np.clip((36.0 - hx) / 4.0, 0, 1)
        )
        return np.clip(hx - 0.5, 0, 1) * supra * np.maximum(occipital, inferomedial)

    def mca(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
        hx = sx * x
        tent = np.where(y < -50, -12.0 + 0.4 * (y + 50.0), -12.0)
        lateral = np.clip((hx - 14.0) / 4.0, 0, 1) * np.clip((z - tent) / 3.0, 0, 1)
        return lateral * (1.0 - aca(x, y, z)) * (1.0 - pca(x, y, z))

    return {"mca": mca, "aca": aca, "pca": pca}[name]


_STROKE_CENTRES = {
    # territory -> branch -> (centre (hx, y, z), radius range)
    "mca": {
        "M1 (proximal)": ((36.0, -2.0, 8.0), (32.0, 40.0)),
        "M2 superior division": ((52.0, 8.0, 32.0), (22.0, 30.0)),
        "M2 inferior division": ((56.0, -38.0, 4.0), (20.0, 27.0)),
    },
    "aca": {"A2": ((4.0, 10.0, 50.0), (22.0, 30.0))},
    "pca": {"P2": ((12.0, -86.0, 6.0), (22.0, 30.0))},
}


def stroke_modifier(hours: float) -> Modifier:
    """Cytotoxic oedema by age: ADC falls first; T2/FLAIR and CT change after hours."""
    if hours < 6:
        return Modifier(t1=1.02, t2=1.04, pd=1.0, adc=0.55, hu=-1.5)
    if hours < 48:
        return Modifier(t1=1.12, t2=1.35, pd=1.05, adc=0.5, hu=-6)
    return Modifier(t1=1.2, t2=1.5, pd=1.08, adc=0.65, hu=-9)


def ischaemic_stroke(
    rng: np.random.Generator, atlas: Atlas, territory: str, difficulty: str
) -> Plan:
    sx = side(rng)
    branch, ((hx, cy, cz), (rlo, rhi)) = list(_STROKE_CENTRES[territory].items())[
        int(rng.integers(len(_STROKE_CENTRES[territory])))
    ]
    hours = float(rng.uniform(1.5, 4.0) if difficulty == "L2" else rng.uniform(8.0, 36.0))
    if difficulty == "L3":
        hours = float(rng.uniform(2.0, 5.0))
    centre = np.array([sx * hx, cy, cz]) + rng.normal(0, 3.0, 3)
    r = float(rng.uniform(rlo, rhi))
    blob = BlobShape.make(
        rng, centre, (r, r * 0.85, r * 0.8), rotation(rng, 0.5), wobble=0.2, edge=2.0
    )
    shape = Masked(blob, _territory(territory, sx))
    comp = Component("infarct", shape, "modify", stroke_modifier(hours))
    lesion = Lesion(
        "infarct",
        "acute ischaemic infarct",
        [comp],
        (float(centre[0]), float(centre[1]), float(centre[2])),
        facts={"territory": territory.upper(), "branch": branch, "onset_hours": round(hours, 1)},
    )
    return Plan(
        f"stroke-{territory}",
        [lesion],
        {
            "territory": territory.upper(),
            "branch": branch,
            "side": "right" if sx > 0 else "left",
            "onset_hours": round(hours, 1),
        },
    )


def haemorrhage(rng: np.random.Generator, atlas: Atlas, difficulty: str) -> Plan:
    sx = side(rng)
    site = ["deep", "lobar", "deep", "cerebellar"][int(rng.integers(4))]
    if difficulty == "L2":
        site = "lobar"
    if site == "deep":
        centre = np.array([sx * 24.0, 2.0, 3.0]) + rng.normal(0, 2.0, 3)
    elif site == "cerebellar":
        centre = np.array([sx * 22.0, -62.0, -34.0]) + rng.normal(0, 2.0, 3)
    else:
        centre = pick(
            rng,
            candidates(atlas, "deep_wm"),
            on_side(sx, in_lobes("frontal", "parietal", "temporal")),
        )
    volume_ml = float(rng.uniform(8, 18) if site == "cerebellar" else rng.uniform(12, 45))
    r = float((3 * volume_ml * 1000 / (4 * np.pi)) ** (1 / 3))
    radii = (r * float(rng.uniform(0.85, 1.1)), r * float(rng.uniform(1.0, 1.2)), r * 0.85)
    blob = BlobShape.make(rng, centre, radii, rotation(rng, 0.6), wobble=0.2, edge=1.0)
    clot = Modifier(t1=1.0, t2=0.45, t2s=0.08, pd=1.0, adc=0.7, hu=float(rng.uniform(30, 38)))
    comps = [
        oedema(blob.scaled(1.45, 0.2), GREY_AND_WHITE),
        Component("haematoma", blob, "replace", clot, base="gm"),
    ]
    lesion = Lesion(
        "haematoma",
        "acute intraparenchymal haematoma",
        comps,
        (float(centre[0]), float(centre[1]), float(centre[2])),
        mass_effect=MassEffect(tuple(float(v) for v in centre), 0.55 * r, 2.1 * r),  # type: ignore[arg-type]
        facts={"site": site, "volume_ml": round(volume_ml, 1)},
    )
    return Plan(
        "ich",
        [lesion],
        {"site": site, "volume_ml": round(volume_ml, 1), "side": "right" if sx > 0 else "left"},
    )
