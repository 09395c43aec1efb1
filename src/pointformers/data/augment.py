"""The papers' point-cloud augmentations, seeded by a ``torch.Generator``.

Every transform takes ``points`` (N, 3) or (B, N, 3), optional ``normals`` of the same shape
and a generator, draws independent parameters per cloud, and returns ``(points, normals)``
(``normals`` None when none were given). Normals follow the geometry exactly: rotations
rotate them; an anisotropic scaling ``diag(s)`` maps them by ``diag(1/s)`` then renormalises
(the normal of the scaled surface); translations, isotropic scaling and jitter keep them.

Defaults, by source:

* SFT (SFT paper, App. D.3): coordinates times one scalar ~ U[0.6, 1.4] -> :func:`random_scale`
  (``low=0.6, high=1.4``, isotropic). :func:`paper_augmentation("sft")`.
* Sampled Transformer fine-tuning = Point-BERT's ``PointcloudScaleAndTranslate``: per-axis
  scale ~ U[2/3, 3/2] and shift ~ U[-0.2, 0.2] -> :func:`scale_and_translate`.
* SAMSA: no augmentation (``paper_augmentation("samsa")`` is the identity).
* PointNet/PointNet++ (common baselines): jitter σ = 0.01 clipped at 0.05
  (:func:`jitter`), scale U[0.8, 1.25], shift U[-0.1, 0.1], rotation about the up axis
  (:func:`rotate_up`), random point dropout with ratio ~ U[0, 0.875] where dropped points are
  replaced by the first point (:func:`point_dropout`), and random SO(3) rotations
  (:func:`rotate_so3`, the "SO(3)" protocol of SFT's Table 1).
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

__all__ = ["random_scale", "scale_and_translate", "translate", "jitter", "rotate_up", "rotate_so3",
           "random_rotation_matrices", "point_dropout", "Compose", "paper_augmentation", "AXES"]

AXES = {"x": 0, "y": 1, "z": 2}
Pair = tuple[torch.Tensor, "torch.Tensor | None"]


def _prep(points: torch.Tensor, normals: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
    if not isinstance(points, torch.Tensor) or points.dim() not in (2, 3) or points.shape[-1] != 3:
        raise ValueError(f"points: expected a tensor of shape (N, 3) or (B, N, 3), got "
                         f"{tuple(points.shape) if isinstance(points, torch.Tensor) else type(points).__name__}")
    if not points.is_floating_point():
        raise ValueError(f"points: expected a floating-point tensor, got {points.dtype}")
    if not torch.isfinite(points).all():
        raise ValueError("points: expected finite coordinates, got NaN or inf")
    if normals is not None and (not isinstance(normals, torch.Tensor) or normals.shape != points.shape):
        raise ValueError(f"normals: expected the shape of points {tuple(points.shape)}, got "
                         f"{tuple(normals.shape) if isinstance(normals, torch.Tensor) else type(normals).__name__}")
    single = points.dim() == 2
    if single:
        points = points.unsqueeze(0)
        normals = None if normals is None else normals.unsqueeze(0)
    return points, normals, single


def _out(points: torch.Tensor, normals: torch.Tensor | None, single: bool) -> Pair:
    if single:
        return points[0], None if normals is None else normals[0]
    return points, normals


def _uniform(shape: Sequence[int], low: float, high: float, g: torch.Generator | None, like: torch.Tensor) -> torch.Tensor:
    u = torch.rand(*shape, generator=g, dtype=torch.float64)
    return (low + (high - low) * u).to(device=like.device, dtype=like.dtype)


def _range(name: str, low: float, high: float, positive: bool = False) -> None:
    if not (math.isfinite(low) and math.isfinite(high) and low <= high) or (positive and low <= 0):
        raise ValueError(f"{name}: expected finite low <= high{' with low > 0' if positive else ''}, got ({low}, {high})")


def random_scale(points: torch.Tensor, normals: torch.Tensor | None = None, generator: torch.Generator | None = None,
                 low: float = 0.6, high: float = 1.4, anisotropic: bool = False) -> Pair:
    """Multiply coordinates by s ~ U[low, high] (one scalar, or one per axis if ``anisotropic``)."""
    _range("low/high", low, high, positive=True)
    p, n, single = _prep(points, normals)
    s = _uniform((p.shape[0], 1, 3 if anisotropic else 1), low, high, generator, p)
    p = p * s
    if n is not None and anisotropic:
        n = torch.nn.functional.normalize(n / s, dim=-1)
    return _out(p, n, single)


def translate(points: torch.Tensor, normals: torch.Tensor | None = None, generator: torch.Generator | None = None,
              shift: float = 0.2) -> Pair:
    """Add a per-cloud offset ~ U[-shift, shift]^3."""
    _range("shift", -shift, shift)
    p, n, single = _prep(points, normals)
    return _out(p + _uniform((p.shape[0], 1, 3), -shift, shift, generator, p), n, single)


def scale_and_translate(points: torch.Tensor, normals: torch.Tensor | None = None,
                        generator: torch.Generator | None = None, low: float = 2 / 3, high: float = 3 / 2,
                        shift: float = 0.2) -> Pair:
    """Point-BERT's ``PointcloudScaleAndTranslate``: ``p * U[low, high]^3 + U[-shift, shift]^3``."""
    _range("low/high", low, high, positive=True)
    _range("shift", -shift, shift)
    p, n, single = _prep(points, normals)
    s = _uniform((p.shape[0], 1, 3), low, high, generator, p)
    t = _uniform((p.shape[0], 1, 3), -shift, shift, generator, p)
    if n is not None:
        n = torch.nn.functional.normalize(n / s, dim=-1)
    return _out(p * s + t, n, single)


def jitter(points: torch.Tensor, normals: torch.Tensor | None = None, generator: torch.Generator | None = None,
           sigma: float = 0.01, clip: float = 0.05) -> Pair:
    """Add per-point noise ``clip(N(0, sigma²), -clip, clip)`` (PointNet ``jitter_point_cloud``)."""
    if not (sigma >= 0 and clip > 0 and math.isfinite(sigma) and math.isfinite(clip)):
        raise ValueError(f"sigma/clip: expected sigma >= 0 and clip > 0, got ({sigma}, {clip})")
    p, n, single = _prep(points, normals)
    e = torch.randn(p.shape, generator=generator, dtype=torch.float64).to(p) * sigma
    return _out(p + e.clamp(-clip, clip), n, single)


def _axis_rotation(angle: torch.Tensor, axis: int) -> torch.Tensor:
    """(B, 3, 3) rotations by ``angle`` (B,) about coordinate ``axis`` (right-handed)."""
    c, s = torch.cos(angle), torch.sin(angle)
    i, j = [(1, 2), (2, 0), (0, 1)][axis]  # the plane rotated: x->(y, z), y->(z, x), z->(x, y)
    R = torch.zeros(angle.shape[0], 3, 3, dtype=angle.dtype, device=angle.device)
    R[:, axis, axis] = 1
    R[:, i, i], R[:, i, j], R[:, j, i], R[:, j, j] = c, -s, s, c
    return R


def rotate_up(points: torch.Tensor, normals: torch.Tensor | None = None, generator: torch.Generator | None = None,
              axis: str = "y", max_angle: float = 2 * math.pi) -> Pair:
    """Rotate each cloud about the up ``axis`` ("y" for ModelNet40/ShapeNetPart) by U[0, max_angle)."""
    if axis not in AXES:
        raise ValueError(f"axis: expected one of {list(AXES)}, got {axis!r}")
    p, n, single = _prep(points, normals)
    R = _axis_rotation(_uniform((p.shape[0],), 0.0, max_angle, generator, p), AXES[axis])
    return _out(p @ R.transpose(1, 2), None if n is None else n @ R.transpose(1, 2), single)


def random_rotation_matrices(batch: int, generator: torch.Generator | None = None,
                             dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(batch, 3, 3) rotations uniform on SO(3) (Haar): normalised Gaussian quaternions."""
    q = torch.randn(batch, 4, generator=generator, dtype=torch.float64)
    q = q / q.norm(dim=1, keepdim=True)
    w, x, y, z = q.unbind(1)
    R = torch.stack([
        1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w),
        2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w),
        2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)], 1).view(batch, 3, 3)
    return R.to(dtype)


def rotate_so3(points: torch.Tensor, normals: torch.Tensor | None = None,
               generator: torch.Generator | None = None) -> Pair:
    """Rotate each cloud (and its normals) by a uniformly random rotation."""
    p, n, single = _prep(points, normals)
    R = random_rotation_matrices(p.shape[0], generator, p.dtype).to(p.device)
    return _out(p @ R.transpose(1, 2), None if n is None else n @ R.transpose(1, 2), single)


def point_dropout(points: torch.Tensor, normals: torch.Tensor | None = None, generator: torch.Generator | None = None,
                  max_ratio: float = 0.875) -> Pair:
    """PointNet++ ``random_point_dropout``: ratio r ~ U[0, max_ratio] per cloud; each point is
    dropped with probability r and replaced by the cloud's first point (shape unchanged)."""
    if not 0 <= max_ratio < 1:
        raise ValueError(f"max_ratio: expected a number in [0, 1), got {max_ratio!r}")
    p, n, single = _prep(points, normals)
    r = _uniform((p.shape[0], 1), 0.0, max_ratio, generator, p)
    drop = (torch.rand(p.shape[:2], generator=generator, dtype=torch.float64).to(p.device) <= r.double())
    drop = drop.unsqueeze(-1)
    p = torch.where(drop, p[:, :1], p)
    if n is not None:
        n = torch.where(drop, n[:, :1], n)
    return _out(p, n, single)


class Compose:
    """Apply transforms in order: ``Compose([f, g])(p, n, generator)``."""

    def __init__(self, transforms: Sequence[Callable[..., Pair]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, points: torch.Tensor, normals: torch.Tensor | None = None,
                 generator: torch.Generator | None = None) -> Pair:
        for t in self.transforms:
            points, normals = t(points, normals, generator)
        return points, normals


def paper_augmentation(name: str, up_axis: str = "y") -> Compose:
    """The training augmentation of a paper: "sft", "sampled" (Point-BERT), "samsa" (none),
    "pointnet2" (scale 0.8–1.25, shift 0.1, jitter), "so3" (random SO(3) rotation)."""
    table: dict[str, list[Callable[..., Pair]]] = {
        "sft": [lambda p, n, g: random_scale(p, n, g, 0.6, 1.4)],
        "sampled": [scale_and_translate],
        "samsa": [],
        "pointnet2": [lambda p, n, g: random_scale(p, n, g, 0.8, 1.25), lambda p, n, g: translate(p, n, g, 0.1), jitter],
        "so3": [rotate_so3],
        "up": [lambda p, n, g: rotate_up(p, n, g, up_axis)],
    }
    if name not in table:
        raise ValueError(f"name: expected one of {sorted(table)}, got {name!r}")
    return Compose(table[name])
