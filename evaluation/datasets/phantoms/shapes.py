"""Lesion shapes in RAS millimetres: soft irregular ellipsoids, shells, territories, deformations.

Every shape maps coordinate arrays (broadcastable float32) to a fraction in 0..1 with a soft
edge about one millimetre wide, so partial volume comes out of the geometry itself. Shapes
know their bounding box, so they are only evaluated where they can be non-zero.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

Coords = tuple[np.ndarray, np.ndarray, np.ndarray]


def rotation(rng: np.random.Generator, spread: float = np.pi) -> np.ndarray:
    """A random rotation matrix (angles up to ``spread``)."""
    a, b, c = rng.uniform(-spread, spread, 3)
    rx = np.array([[1, 0, 0], [0, np.cos(a), -np.sin(a)], [0, np.sin(a), np.cos(a)]])
    ry = np.array([[np.cos(b), 0, np.sin(b)], [0, 1, 0], [-np.sin(b), 0, np.cos(b)]])
    rz = np.array([[np.cos(c), -np.sin(c), 0], [np.sin(c), np.cos(c), 0], [0, 0, 1]])
    return rz @ ry @ rx


def align(axis: np.ndarray) -> np.ndarray:
    """A rotation whose third column (the ellipsoid's long axis) is ``axis``."""
    w = axis / (np.linalg.norm(axis) + 1e-9)
    helper = np.array([1.0, 0.0, 0.0]) if abs(w[0]) < 0.9 else np.array([0.0, 1.0, 0.0])
    u = np.cross(helper, w)
    u /= np.linalg.norm(u)
    v = np.cross(w, u)
    return np.stack([u, v, w], axis=1)


@dataclass(frozen=True)
class BlobShape:
    """Irregular ellipsoid: radii along the columns of ``rot``, radius wobble by direction."""

    centre: tuple[float, float, float]
    radii: tuple[float, float, float]
    rot: tuple[tuple[float, ...], ...] = ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0))
    wobble: float = 0.0  # relative radius variation, 0..0.4
    wobble_dirs: tuple[tuple[float, float, float, float, float], ...] = ()  # (vx,vy,vz,freq,phase)
    edge: float = 1.0  # mm of the soft edge

    @staticmethod
    def make(
        rng: np.random.Generator,
        centre: np.ndarray,
        radii: tuple[float, float, float],
        rot: np.ndarray | None = None,
        wobble: float = 0.0,
        edge: float = 1.0,
    ) -> BlobShape:
        dirs = []
        for _ in range(5 if wobble > 0 else 0):
            v = rng.normal(size=3)
            v /= np.linalg.norm(v)
            dirs.append(
                (
                    float(v[0]),
                    float(v[1]),
                    float(v[2]),
                    float(rng.uniform(1.5, 3.5)),
                    float(rng.uniform(0, 2 * np.pi)),
                )
            )
        r = np.eye(3) if rot is None else rot
        return BlobShape(
            (float(centre[0]), float(centre[1]), float(centre[2])),
            (float(radii[0]), float(radii[1]), float(radii[2])),
            tuple(tuple(float(v) for v in row) for row in r),
            wobble,
            tuple(dirs),
            edge,
        )

    def scaled(self, factor: float, wobble: float | None = None) -> BlobShape:
        return BlobShape(
            self.centre,
            (self.radii[0] * factor, self.radii[1] * factor, self.radii[2] * factor),
            self.rot,
            self.wobble if wobble is None else wobble,
            self.wobble_dirs,
            self.edge,
        )

    def box(self) -> tuple[np.ndarray, np.ndarray]:
        r = max(self.radii) * (1 + self.wobble) + 2 * self.edge + 1.0
        c = np.array(self.centre)
        return c - r, c + r

    def __call__(self, x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
        rot = np.array(self.rot, dtype=np.float32)
        dx, dy, dz = x - self.centre[0], y - self.centre[1], z - self.centre[2]
        # Coordinates in the ellipsoid frame, scaled by the radii.
        u = [(dx * rot[0, a] + dy * rot[1, a] + dz * rot[2, a]) / self.radii[a] for a in range(3)]
        q = np.sqrt(u[0] ** 2 + u[1] ** 2 + u[2] ** 2) + np.float32(1e-6)
        rmin = min(self.radii)
        # Signed distance (mm) to the surface, approximated along the scaled radius.
        w = np.clip((1.0 - q) * rmin / self.edge + 0.5, 0.0, 1.0).astype(np.float32)
        if self.wobble > 0 and self.wobble_dirs:
            # The wobble only matters near the surface: evaluate it in that band alone.
            amp = self.wobble * np.sqrt(len(self.wobble_dirs))
            band = np.abs(q - 1.0) < amp + self.edge / rmin
            qb = q[band]
            ub = [np.broadcast_to(a, q.shape)[band] for a in u]
            acc = np.zeros_like(qb)
            for vx, vy, vz, f, ph in self.wobble_dirs:
                acc += np.cos(f * (ub[0] * vx + ub[1] * vy + ub[2] * vz) / qb + ph)
            g = 1.0 + self.wobble * acc / np.sqrt(len(self.wobble_dirs))
            w[band] = np.clip((g - qb) * rmin / self.edge + 0.5, 0.0, 1.0)
        return w


@dataclass(frozen=True)
class Within:
    """``inner`` cut back to lie inside ``bound`` (a necrotic core kept inside its wall)."""

    inner: BlobShape
    bound: BlobShape

    def box(self) -> tuple[np.ndarray, np.ndarray]:
        return self.inner.box()

    def __call__(self, x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
        return np.minimum(self.inner(x, y, z), self.bound(x, y, z))


@dataclass(frozen=True)
class Shell:
    """The part of ``outer`` outside ``inner`` (a rim)."""

    outer: BlobShape
    inner: BlobShape | Within

    def box(self) -> tuple[np.ndarray, np.ndarray]:
        return self.outer.box()

    def __call__(self, x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
        return np.clip(self.outer(x, y, z) - self.inner(x, y, z), 0.0, 1.0)


@dataclass(frozen=True)
class Masked:
    """A blob limited by a soft coordinate rule (a vascular territory, a dural layer...)."""

    blob: BlobShape
    rule: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray] = field(compare=False)

    def box(self) -> tuple[np.ndarray, np.ndarray]:
        return self.blob.box()

    def __call__(self, x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
        return (self.blob(x, y, z) * self.rule(x, y, z)).astype(np.float32)


Shape = BlobShape | Shell | Masked | Within


@dataclass(frozen=True)
class MassEffect:
    """Tissue pushed radially away from ``centre``: within r_out, the tissue that was at
    distance s now sits at d with s = d - r_in * (1 - t)^2, t = (d - r_in) / (r_out - r_in)."""

    centre: tuple[float, float, float]
    r_in: float
    r_out: float

    def box(self) -> tuple[np.ndarray, np.ndarray]:
        c = np.array(self.centre)
        return c - self.r_out, c + self.r_out

    def source(self, x: np.ndarray, y: np.ndarray, z: np.ndarray) -> Coords:
        """Where the tissue now at (x, y, z) came from."""
        dx, dy, dz = x - self.centre[0], y - self.centre[1], z - self.centre[2]
        d = np.sqrt(dx * dx + dy * dy + dz * dz) + 1e-6
        t = np.clip((d - self.r_in) / (self.r_out - self.r_in), 0.0, 1.0)
        s = np.where(d >= self.r_in, d - self.r_in * (1.0 - t) ** 2, 0.0)
        k = s / d
        return (self.centre[0] + dx * k, self.centre[1] + dy * k, self.centre[2] + dz * k)

    def displacement_at(self, distance: float) -> float:
        """How far (mm) tissue originally ``distance`` mm from the centre has moved outward."""
        lo, hi = self.r_in, self.r_out
        if distance >= hi:
            return 0.0
        # s(d) is monotonic on [r_in, r_out]: bisect for the d whose source is ``distance``.
        a, b = lo, hi
        for _ in range(40):
            m = 0.5 * (a + b)
            t = (m - lo) / (hi - lo)
            if m - lo * (1 - t) ** 2 < distance:
                a = m
            else:
                b = m
        return 0.5 * (a + b) - distance
