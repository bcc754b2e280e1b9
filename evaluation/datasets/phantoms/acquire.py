"""Acquisition physics: noise-free images from a scene become stored pixel values.

MR: a smooth multiplicative coil-sensitivity (bias) field, Rician noise (magnitude of complex
Gaussian noise), vendor-like scaling to 12-bit integers. DWI: b=0 and b=1000 with their own
noise; the ADC map is computed from those noisy images the way a scanner does
(ln(S0/Sb)/b, background zeroed), in 10^-6 mm^2/s. CT: Hounsfield units with Gaussian noise,
stored as HU + 1024 with RescaleIntercept -1024.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from evaluation.datasets.phantoms.grids import Grid, bin_array
from evaluation.datasets.phantoms.scene import Scene
from evaluation.datasets.phantoms.tissue import Protocol, normal_tissues, signal

MAX_STORED = 4095  # 12 bits stored
CT_OFFSET = 1024

# Signal-to-noise of white matter per series at 3 T (1.5 T: x 0.65).
_SNR = {"t1_3d": 28.0, "t2": 32.0, "flair": 24.0, "swi": 26.0, "t1": 28.0, "t1c": 28.0, "dwi": 22.0}
# Where white matter lands in stored values, per series (vendor scaling).
_WM_LEVEL = {
    "t1_3d": 900.0,
    "t2": 550.0,
    "flair": 700.0,
    "swi": 900.0,
    "t1": 900.0,
    "t1c": 900.0,
    "dwi": 600.0,
}


@dataclass
class AcquiredVolume:
    """One stored 3D image of a series (i, j, k) plus per-volume header values."""

    data: np.ndarray  # uint16
    attrs: dict[str, object] = field(default_factory=dict)  # e.g. {"DiffusionBValue": 1000.0}


@dataclass
class Acquired:
    role: str
    grid: Grid
    volumes: list[AcquiredVolume]
    window: tuple[float, float]  # centre, width suggested in the header
    protocol: Protocol
    field_t: float


def bias_field(grid: Grid, rng: np.random.Generator, strength: float = 0.12) -> np.ndarray:
    """Smooth multiplicative field exp(quadratic in RAS), about +-strength over the head."""
    coords = [grid.coords(v).astype(np.float32) for v in range(3)]
    ras = [np.zeros(1, np.float32)] * 3
    for v in range(3):
        shape = [1, 1, 1]
        shape[v] = grid.shape[v]
        ras[grid.axes[v]] = (coords[v] / 90.0).reshape(shape)
    c = rng.normal(0.0, strength, 9).astype(np.float32)
    x, y, z = ras
    # Grouped so that only three full-size additions and one exp touch the whole grid.
    fx = c[0] * x + 0.5 * c[3] * x * x
    fy = c[1] * y + 0.5 * c[4] * y * y
    fz = c[2] * z + 0.5 * c[5] * z * z
    log_b = (fx + fy + 0.5 * c[6] * x * y) + (fz + 0.5 * c[7] * y * z) + 0.5 * c[8] * x * z
    return np.exp(log_b).astype(np.float32)


_BANK_SIZE = 12_000_000
_bank: np.ndarray | None = None


def gaussian(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Standard normal noise of ``shape``: a window at a random offset of a fixed bank.

    Drawing ~30 million normals per case costs more than everything else; windows of one
    12-million bank (built once per process from a fixed seed) are as Gaussian and cost nothing.
    """
    global _bank
    if _bank is None:
        _bank = np.random.default_rng(20240601).standard_normal(_BANK_SIZE, dtype=np.float32)
    n = int(np.prod(shape))
    if n > _BANK_SIZE:
        return rng.standard_normal(shape, dtype=np.float32)
    o = int(rng.integers(0, _BANK_SIZE - n + 1))
    sign = np.float32(1.0 if rng.random() < 0.5 else -1.0)
    return (_bank[o : o + n] * sign).reshape(shape)


def rician(image: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """|image + n1 + i n2| with n1, n2 ~ N(0, sigma): magnitude MR noise."""
    s = np.float32(sigma)
    re = image + gaussian(image.shape, rng) * s
    im = gaussian(image.shape, rng) * s
    return np.sqrt(re * re + im * im)


def _store(img: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(img), 0, MAX_STORED).astype(np.uint16)


def _window(data: np.ndarray) -> tuple[float, float]:
    """A display window from robust percentiles of the non-background voxels."""
    sample = data.reshape(-1)[::7]  # a fixed subsample: same answer, a seventh of the work
    vals = sample[sample > 20]
    if vals.size == 0:
        return 500.0, 1000.0
    lo, hi = np.percentile(vals, [1.0, 99.5])
    return float(round((lo + hi) / 2)), float(round(max(hi - lo, 1.0)))


def _wm(proto: Protocol, field_t: float, b: float | None = None) -> float:
    return signal(normal_tissues(field_t)["wm"], proto, field_t, b)


def acquire_mr(
    scene: Scene, role: str, proto: Protocol, field_t: float, rng: np.random.Generator
) -> Acquired:
    """A structural MR series (T1, T2, FLAIR, SWI, T1C) from ``scene``."""
    clean = scene.signal(proto, field_t)
    wm = _wm(proto, field_t)
    snr = _SNR[role] * (1.0 if field_t >= 2 else 0.65)
    img = rician(clean * bias_field(scene.grid, rng), wm / snr, rng)
    data = _store(img * np.float32(_WM_LEVEL[role] / wm))
    return Acquired(role, scene.grid, [AcquiredVolume(data)], _window(data), proto, field_t)


def acquire_diffusion(
    scene: Scene, proto: Protocol, field_t: float, rng: np.random.Generator, factor: int = 2
) -> tuple[Acquired, Acquired]:
    """DWI (b=0 and b=1000 volumes of one series) and the ADC map computed from them."""
    b0 = bin_array(scene.signal(proto, field_t, b=0.0), factor)
    b1 = bin_array(scene.signal(proto, field_t, b=proto.b), factor)
    from evaluation.datasets.phantoms.grids import binned

    grid = binned(scene.grid, factor)
    bias = bias_field(grid, rng)
    wm0 = _wm(proto, field_t, 0.0)
    snr = _SNR["dwi"] * (1.0 if field_t >= 2 else 0.65)
    sigma = wm0 / snr
    n0 = rician(b0 * bias, sigma, rng)
    n1 = rician(b1 * bias, sigma, rng)
    scale = np.float32(_WM_LEVEL["dwi"] / wm0)
    d0, d1 = _store(n0 * scale), _store(n1 * scale)
    # Scanner-style ADC: log ratio where the b=0 image has signal, zero in the background.
    fg = n0 > 4.0 * sigma
    with np.errstate(divide="ignore", invalid="ignore"):
        adc = np.log(np.maximum(n0, 1e-6) / np.maximum(n1, 1e-6)) / proto.b * 1e6
    adc = np.where(fg, np.clip(adc, 0.0, MAX_STORED), 0.0)
    adc_data = _store(adc)
    dwi = Acquired(
        "dwi",
        grid,
        [
            AcquiredVolume(
                d0,
                {
                    "DiffusionBValue": 0.0,
                    "SequenceName": "*ep_b0",
                    "DiffusionDirectionality": "NONE",
                },
            ),
            AcquiredVolume(
                d1,
                {
                    "DiffusionBValue": float(proto.b),
                    "SequenceName": f"*ep_b{int(proto.b)}t",
                    "DiffusionDirectionality": "ISOTROPIC",
                },
            ),
        ],
        _window(d1),
        proto,
        field_t,
    )
    adc_acq = Acquired("adc", grid, [AcquiredVolume(adc_data)], (1200.0, 2400.0), proto, field_t)
    return dwi, adc_acq


def acquire_ct(scene: Scene, proto: Protocol, rng: np.random.Generator) -> Acquired:
    """Non-contrast head CT in HU with quantum noise (about 4 HU at 5 mm)."""
    hu = scene.signal(proto, 3.0)
    noisy = hu + gaussian(hu.shape, rng) * np.float32(4.0)
    data = np.clip(np.rint(noisy + CT_OFFSET), 0, MAX_STORED).astype(np.uint16)
    return Acquired("ct", scene.grid, [AcquiredVolume(data)], (40.0, 80.0), proto, 0.0)
