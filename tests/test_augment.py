"""The papers' augmentations: parameter ranges, exact normal handling, seeding, bad input."""
from __future__ import annotations

import math

import pytest
import torch

from pointformers.data import augment as A


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def plane_cloud(b: int = 4, n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Points on tilted planes through the origin with their exact normals."""
    g = gen(9)
    normal = torch.nn.functional.normalize(torch.randn(b, 1, 3, generator=g, dtype=torch.float64), dim=-1)
    p = torch.randn(b, n, 3, generator=g, dtype=torch.float64)
    p = p - (p * normal).sum(-1, keepdim=True) * normal
    return p, normal.expand(b, n, 3).clone()


def test_isotropic_scale_in_sft_range_and_seeded() -> None:
    p, n = plane_cloud()
    q, m = A.random_scale(p, n, gen(1), 0.6, 1.4)
    s = q / p
    assert torch.allclose(s, s[:, :1, :1].expand_as(s))  # one scalar per cloud
    assert ((s[:, 0, 0] >= 0.6) & (s[:, 0, 0] <= 1.4)).all() and s[:, 0, 0].std() > 0
    assert torch.equal(m, n)  # isotropic scaling keeps normals
    q2, _ = A.random_scale(p, n, gen(1), 0.6, 1.4)
    assert torch.equal(q, q2)


def test_anisotropic_scaling_gives_the_exact_normal_of_the_scaled_surface() -> None:
    p, n = plane_cloud()
    for f in (lambda p, n, g: A.random_scale(p, n, g, 0.5, 2.0, anisotropic=True), A.scale_and_translate):
        q, m = f(p, n, gen(2))
        assert torch.allclose(m.norm(dim=-1), torch.ones(m.shape[:2], dtype=m.dtype))
        # Every in-plane difference vector of the transformed cloud is orthogonal to the new normal.
        d = q[:, 1:] - q[:, :1]
        assert (d * m[:, 1:]).sum(-1).abs().max() < 1e-10
        assert (m * n).sum(-1).min() > 0  # orientation kept


def test_scale_and_translate_matches_point_bert_ranges() -> None:
    p = torch.ones(500, 10, 3, dtype=torch.float64)
    q, _ = A.scale_and_translate(p.clone(), None, gen(3))
    # p = 1 everywhere, so q = s + t with s ∈ [2/3, 3/2] and t ∈ [-0.2, 0.2], constant per cloud and axis.
    assert torch.allclose(q, q[:, :1].expand_as(q))
    assert q.min() >= 2 / 3 - 0.2 - 1e-12 and q.max() <= 1.5 + 0.2 + 1e-12
    assert q.min() < 2 / 3 - 0.1 and q.max() > 1.5 + 0.1


def test_jitter_is_clipped_gaussian() -> None:
    p = torch.zeros(20, 1000, 3)
    q, _ = A.jitter(p, None, gen(4), sigma=0.01, clip=0.05)
    assert q.abs().max() <= 0.05 + 1e-7
    assert abs(q.std().item() - 0.01) < 5e-4
    q, _ = A.jitter(p, None, gen(4), sigma=0.1, clip=0.05)
    assert q.abs().max() <= 0.05 + 1e-7 and (q.abs() == 0.05).float().mean() > 0.5


def test_up_rotation_keeps_up_coordinate_norms_and_point_normal_geometry() -> None:
    p, n = plane_cloud()
    for axis, i in A.AXES.items():
        q, m = A.rotate_up(p, n, gen(5), axis=axis)
        assert torch.allclose(q[..., i], p[..., i])
        assert torch.allclose(q.norm(dim=-1), p.norm(dim=-1))
        assert torch.allclose((q * m).sum(-1), (p * n).sum(-1))
    # Angle covers the circle: the first point's azimuth changes by various amounts.
    x = torch.tensor([[[1.0, 0.0, 0.0]]]).expand(200, 1, 3)
    q, _ = A.rotate_up(x, None, gen(6), axis="y")
    ang = torch.atan2(q[:, 0, 2], q[:, 0, 0])
    assert ang.min() < -2.5 and ang.max() > 2.5


def test_so3_rotations_are_proper_and_uniform() -> None:
    R = A.random_rotation_matrices(4000, gen(7), torch.float64)
    eye = torch.eye(3, dtype=torch.float64).expand(4000, 3, 3)
    assert torch.allclose(R @ R.transpose(1, 2), eye, atol=1e-12)
    assert torch.allclose(torch.linalg.det(R), torch.ones(4000, dtype=torch.float64))
    # Haar measure: E[R] = 0 and E[R_ij²] = 1/3.
    assert R.mean(0).abs().max() < 0.05
    assert ((R ** 2).mean(0) - 1 / 3).abs().max() < 0.03
    p, n = plane_cloud()
    q, m = A.rotate_so3(p, n, gen(8))
    dist = lambda x: (x[:, :, None] - x[:, None]).norm(dim=-1)
    assert torch.allclose(dist(q), dist(p)) and torch.allclose((q * m).sum(-1), (p * n).sum(-1))


def test_point_dropout_replaces_by_first_point() -> None:
    p = torch.arange(1, 3001, dtype=torch.float64).view(1, 1000, 3).repeat(300, 1, 1)
    q, _ = A.point_dropout(p, None, gen(9), max_ratio=0.875)
    dropped = (q != p).any(-1)
    assert torch.equal(q[dropped], p[:, :1].expand_as(p)[dropped])
    frac = dropped.double().mean(1)
    assert frac.max() <= 0.92 and abs(frac.mean().item() - 0.875 / 2) < 0.05


def test_single_cloud_compose_and_bad_input() -> None:
    p, n = plane_cloud(1)
    q, m = A.paper_augmentation("sft")(p[0], n[0], gen(0))
    assert q.shape == (64, 3) and m.shape == (64, 3)
    q, m = A.paper_augmentation("samsa")(p[0], n[0], gen(0))
    assert torch.equal(q, p[0])
    with pytest.raises(ValueError, match="points"):
        A.jitter(torch.zeros(5, 2))
    with pytest.raises(ValueError, match="NaN"):
        A.rotate_so3(torch.full((3, 3), math.nan))
    with pytest.raises(ValueError, match="normals"):
        A.rotate_up(torch.zeros(5, 3), torch.zeros(4, 3))
    with pytest.raises(ValueError, match="name"):
        A.paper_augmentation("nope")
    with pytest.raises(ValueError, match="low"):
        A.random_scale(torch.zeros(5, 3), None, None, 1.5, 0.5)
