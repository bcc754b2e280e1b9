"""Tissue properties and the signal equations that turn them into MR signal or CT density.

Relaxation times are literature-typical values (ms) at 1.5 T and 3 T; ADC in 10^-3 mm^2/s;
CT in Hounsfield units. A lesion either replaces tissue with its own properties or modifies
the grey/white matter it sits in (``Modifier``), so an infarct in cortex and in white matter
keeps the difference between the two.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from functools import lru_cache

import numpy as np


@dataclass(frozen=True)
class TissueParams:
    t1: float  # ms
    t2: float  # ms
    t2s: float  # T2*, ms
    pd: float  # proton density, 0..1
    adc: float  # 10^-3 mm^2/s
    hu: float  # CT density
    gd: float = 0.0  # gadolinium concentration after injection, mM (0: intact barrier)
    fat: bool = False  # suppressed by fat saturation (DWI)


@dataclass(frozen=True)
class Modifier:
    """Multiplicative change of grey/white matter properties (oedema, infarct, plaque)."""

    t1: float = 1.0
    t2: float = 1.0
    t2s: float = 1.0
    pd: float = 1.0
    adc: float = 1.0
    hu: float = 0.0  # additive, HU
    gd: float = 0.0

    def apply(self, p: TissueParams) -> TissueParams:
        return replace(
            p,
            t1=p.t1 * self.t1,
            t2=p.t2 * self.t2,
            t2s=p.t2s * self.t2s,
            pd=min(1.0, p.pd * self.pd),
            adc=p.adc * self.adc,
            hu=p.hu + self.hu,
            gd=p.gd + self.gd,
        )


# Normal compartments of the head, in the order of the anatomy arrays.
TISSUES: tuple[str, ...] = ("csf", "gm", "wm", "bone", "marrow", "fat", "muscle")
BRAIN_TISSUES: tuple[str, ...] = ("csf", "gm", "wm")

_NORMAL: dict[float, dict[str, TissueParams]] = {
    3.0: {
        "csf": TissueParams(4200, 1800, 1000, 1.00, 3.0, 5),
        "gm": TissueParams(1550, 100, 55, 0.82, 0.85, 38),
        "wm": TissueParams(900, 72, 48, 0.70, 0.72, 27),
        "bone": TissueParams(300, 1.0, 0.5, 0.05, 0.1, 1450),
        "marrow": TissueParams(380, 100, 8, 0.60, 0.1, 500, fat=True),
        "fat": TissueParams(380, 130, 40, 0.95, 0.02, -100, fat=True),
        "muscle": TissueParams(1400, 40, 28, 0.75, 1.5, 50, gd=0.05),
    },
    1.5: {
        "csf": TissueParams(4000, 1800, 1100, 1.00, 3.0, 5),
        "gm": TissueParams(1200, 100, 65, 0.82, 0.85, 38),
        "wm": TissueParams(750, 78, 60, 0.70, 0.72, 27),
        "bone": TissueParams(250, 1.0, 0.6, 0.05, 0.1, 1450),
        "marrow": TissueParams(300, 100, 12, 0.60, 0.1, 500, fat=True),
        "fat": TissueParams(280, 130, 50, 0.95, 0.02, -100, fat=True),
        "muscle": TissueParams(1050, 42, 32, 0.75, 1.5, 50, gd=0.05),
    },
}
# Gadolinium relaxivities, 1/(mM s): r1 and r2 of a macrocyclic agent.
_R1 = {1.5: 4.5, 3.0: 4.0}
_R2 = {1.5: 5.5, 3.0: 5.0}


def normal_tissues(field_t: float) -> dict[str, TissueParams]:
    """Properties of the normal head compartments at 1.5 T or 3 T."""
    try:
        return _NORMAL[field_t]
    except KeyError:
        raise ValueError(f"field strength {field_t} T not modelled (use 1.5 or 3.0)") from None


class Weighting(StrEnum):
    T1_MPRAGE = "t1_mprage"
    T1_SE = "t1_se"
    T2_TSE = "t2_tse"
    FLAIR = "flair"
    SWI = "swi"
    DWI = "dwi"
    CT = "ct"


@dataclass(frozen=True)
class Protocol:
    """Acquisition parameters that the signal equation uses and the DICOM header reports."""

    weighting: Weighting
    tr: float = 0.0
    te: float = 0.0
    ti: float | None = None
    flip: float = 90.0
    b: float = 0.0
    contrast: bool = False  # acquired after gadolinium


def protocols(field_t: float) -> dict[str, Protocol]:
    """Siemens-like neuro protocol at the given field strength, keyed by series role."""
    three = field_t >= 2.0
    return {
        "t1_3d": Protocol(
            Weighting.T1_MPRAGE,
            tr=2300 if three else 2000,
            te=2.3 if three else 3.0,
            ti=900 if three else 1000,
            flip=8,
        ),
        "t2": Protocol(Weighting.T2_TSE, tr=5000, te=95),
        "flair": Protocol(Weighting.FLAIR, tr=9000, te=90, ti=2500 if three else 2400),
        "dwi": Protocol(Weighting.DWI, tr=5000, te=80 if three else 90, b=1000),
        "swi": Protocol(Weighting.SWI, tr=27 if three else 49, te=20 if three else 40, flip=15),
        "t1": Protocol(Weighting.T1_SE, tr=550 if three else 500, te=9),
        "t1c": Protocol(Weighting.T1_SE, tr=550 if three else 500, te=9, contrast=True),
        "ct": Protocol(Weighting.CT),
    }


def _post_contrast(p: TissueParams, field_t: float) -> tuple[float, float]:
    """T1, T2 after gadolinium: 1/T = 1/T0 + r * C (relaxivity in 1/(mM s), T in ms)."""
    if p.gd <= 0:
        return p.t1, p.t2
    t1 = 1.0 / (1.0 / p.t1 + _R1[field_t] * p.gd / 1000.0)
    t2 = 1.0 / (1.0 / p.t2 + _R2[field_t] * p.gd / 1000.0)
    return t1, t2


@lru_cache(maxsize=4096)
def _mprage_mz(
    t1: float, tr: float, ti: float, flip: float, n: int = 176, esp: float = 7.0
) -> float:
    """Longitudinal magnetisation at the centre of k-space of an MPRAGE, in steady state.

    Bloch simulation of the inversion, the gradient-echo train (``n`` pulses of ``flip``
    degrees, ``esp`` ms apart, centred on TI) and the recovery to the next inversion (TR).
    """
    ca = float(np.cos(np.deg2rad(flip)))
    t0 = ti - n / 2 * esp
    rest = tr - t0 - n * esp
    e_esp, e_t0, e_rest = np.exp(-esp / t1), np.exp(-t0 / t1), np.exp(-rest / t1)
    mz, centre = 1.0, 0.0
    for _ in range(6):  # a few repetitions reach the steady state
        mz = 1 - (1 + mz) * e_t0  # inversion, then recovery until the readout starts
        for m in range(n):
            if m == n // 2:
                centre = mz
            mz = 1 - (1 - mz * ca) * e_esp
        mz = 1 - (1 - mz) * e_rest
    return float(centre)


def signal(p: TissueParams, proto: Protocol, field_t: float, b: float | None = None) -> float:
    """Noise-free signal of pure tissue ``p`` (MR: arbitrary units; CT: HU)."""
    w = proto.weighting
    if w is Weighting.CT:
        return p.hu
    t1, t2 = _post_contrast(p, field_t) if proto.contrast else (p.t1, p.t2)
    tr, te = proto.tr, proto.te
    if w is Weighting.T1_MPRAGE:
        mz = _mprage_mz(round(t1, 3), tr, proto.ti or 0.0, proto.flip)
        return float(p.pd * abs(mz) * np.sin(np.deg2rad(proto.flip)) * np.exp(-te / p.t2s))
    if w in (Weighting.T1_SE, Weighting.T2_TSE):
        return float(p.pd * (1 - np.exp(-tr / t1)) * np.exp(-te / t2))
    if w is Weighting.FLAIR:
        # Magnitude inversion recovery: TI chosen so that CSF recovers through zero.
        ti = proto.ti or 0.0
        mz = abs(1 - 2 * np.exp(-ti / t1) + np.exp(-tr / t1))
        return float(p.pd * mz * np.exp(-te / t2))
    if w is Weighting.SWI:
        # Spoiled gradient echo (Ernst equation); blood products shorten T2* to a few ms.
        a = np.deg2rad(proto.flip)
        e1 = np.exp(-tr / t1)
        return float(p.pd * np.sin(a) * (1 - e1) / (1 - np.cos(a) * e1) * np.exp(-te / p.t2s))
    if w is Weighting.DWI:
        # Spin-echo EPI with fat saturation; b in s/mm^2, ADC in 10^-3 mm^2/s.
        s0 = p.pd * (1 - np.exp(-tr / t1)) * np.exp(-te / t2) * (0.04 if p.fat else 1.0)
        bval = proto.b if b is None else b
        return float(s0 * np.exp(-bval * p.adc / 1000.0))
    raise ValueError(f"no signal equation for {w}")


def air_value(proto: Protocol) -> float:
    """What empty space gives: no MR signal, -1000 HU."""
    return -1000.0 if proto.weighting is Weighting.CT else 0.0
