"""Surface normals survive every transform that moves points (issue 22: "normals survive every
transform that moves points: rotated with the points, renormalised after scaling").

A transform that moves a surface by an affine map ``p -> A p + t`` must map its unit normals to
``normalize(A^{-T} n)``: rotations rotate them with the points (``A^{-T} = A``), isotropic
scaling and translations keep them, anisotropic scaling tilts them and renormalises. The tests
recover ``A`` from the points alone (a least-squares affine fit per cloud, exact up to rounding
for these transforms), so they do not restate how a transform draws its parameters. Transforms
that are not affine keep normals (jitter: the normals of the noise-free surface, as the data
generator's position noise) or move them with their points (point dropout: a dropped point and
its normal are both replaced by the first point's).

Covered: every transform of :mod:`pointformers.data.augment`, every ``paper_augmentation``, the
shape tasks' training-augmentation path on padded mini-batches (classification and part
segmentation, as the model receives ``x`` = normals and ``pos``), and the rotated test split
(:func:`~pointformers.tasks.shapes.rotate_clouds`), on procedural shapes with exact normals.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from pointformers.data import augment as A
from pointformers.data.clouds import ShapeCloud, ShapeCloudSet
from pointformers.data.shapes import generate_shapes
from pointformers.tasks.shapes import (
    AUGMENTATIONS,
    PartSegmentationTask,
    ShapeClassificationTask,
    rotate_clouds,
    shape_pool,
)

CLASSES = ["torus", "mug", "cuboid", "cone", "chair"]


def _shapes(sizes=(48, 40, 56, 33, 48)) -> ShapeCloudSet:
    """Procedural shapes with exact normals (deformed surfaces), cut to different sizes so that
    mini-batches are padded."""
    cs = generate_shapes({"classes": CLASSES, "per_class": (1, 0, 0), "num_points": 64, "deform": 0.2}, "train", 3)
    clouds = [ShapeCloud(c.points[:n], c.normals[:n], c.label, None if c.parts is None else c.parts[:n], c.name)
              for c, n in zip(cs, sizes)]
    return ShapeCloudSet(clouds, cs.class_names, cs.part_names, cs.class_parts)


def _batch(dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    cs = _shapes((64,) * 5)
    p = torch.stack([torch.from_numpy(np.asarray(c.points, np.float64)) for c in cs]).to(dtype)
    n = torch.stack([torch.from_numpy(np.asarray(c.normals, np.float64)) for c in cs]).to(dtype)
    return p, n


def affine_fit(p: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The linear part ``A`` (3, 3) of the affine map taking points ``p`` (n, 3) to ``q`` (n, 3)
    by least squares, and the largest residual."""
    p, q = p.double(), q.double()
    X = torch.cat([p, torch.ones(len(p), 1, dtype=p.dtype)], 1)
    sol = torch.linalg.lstsq(X, q).solution            # (4, 3): q ≈ p @ A^T + t
    resid = float((X @ sol - q).abs().max())
    return sol[:3].T, resid


def assert_normals_follow(p: torch.Tensor, n: torch.Tensor, q: torch.Tensor, m: torch.Tensor,
                          tol: float = 1e-9) -> torch.Tensor:
    """``q = A p + t`` for one cloud, and ``m`` is the unit normal of the moved surface,
    ``normalize(A^{-T} n)``. Returns A."""
    Amat, resid = affine_fit(p, q)
    assert resid < tol * 100, f"the transform is not affine on this cloud (residual {resid:.2e})"
    want = torch.nn.functional.normalize(n.double() @ torch.linalg.inv(Amat), dim=-1)  # rows: (A^{-T} n)^T
    assert torch.allclose(m.double().norm(dim=-1), torch.ones(len(m), dtype=torch.float64), atol=tol * 100)
    err = float((m.double() - want).abs().max())
    assert err < tol * 1000, f"normals do not follow the points (max error {err:.2e})"
    return Amat


AFFINE = {
    "scale (isotropic, SFT)": lambda p, n, g: A.random_scale(p, n, g, 0.6, 1.4),
    "scale (anisotropic)": lambda p, n, g: A.random_scale(p, n, g, 0.5, 2.0, anisotropic=True),
    "translate": lambda p, n, g: A.translate(p, n, g, 0.2),
    "scale_and_translate (Point-BERT)": A.scale_and_translate,
    "rotate_up x": lambda p, n, g: A.rotate_up(p, n, g, "x"),
    "rotate_up y": lambda p, n, g: A.rotate_up(p, n, g, "y"),
    "rotate_up z": lambda p, n, g: A.rotate_up(p, n, g, "z"),
    "rotate_so3": A.rotate_so3,
    **{f"paper_augmentation({name})": A.paper_augmentation(name)
       for name in ("sft", "sampled", "samsa", "so3", "up")},
    "compose(sampled, so3, anisotropic scale)": A.Compose([
        A.scale_and_translate, A.rotate_so3, lambda p, n, g: A.random_scale(p, n, g, 0.7, 1.5, anisotropic=True)]),
}


@pytest.mark.parametrize("name", list(AFFINE))
def test_affine_transforms_map_normals_by_the_inverse_transpose(name: str) -> None:
    p, n = _batch()
    q, m = AFFINE[name](p.clone(), n.clone(), torch.Generator().manual_seed(11))
    assert m is not None and m.shape == n.shape
    kinds = set()
    for b in range(p.shape[0]):
        Amat = assert_normals_follow(p[b], n[b], q[b], m[b])
        sv = torch.linalg.svdvals(Amat)
        if torch.allclose(sv, sv[0].expand(3), atol=1e-9):
            kinds.add("similarity")
            if torch.allclose(sv, torch.ones(3, dtype=sv.dtype), atol=1e-9) and float(torch.linalg.det(Amat)) > 0:
                kinds.add("rotation" if not torch.allclose(Amat, torch.eye(3, dtype=Amat.dtype)) else "identity")
        else:
            kinds.add("anisotropic")
    # the geometry the transform is meant to have (guards the test against a vacuous pass)
    if "rotate" in name or "so3" in name or name.endswith("(up)"):
        assert "rotation" in kinds or "anisotropic" in kinds
    if name.startswith(("scale (anisotropic", "scale_and_translate", "paper_augmentation(sampled")):
        assert kinds == {"anisotropic"}
    if name in ("scale (isotropic, SFT)", "translate", "paper_augmentation(sft)", "paper_augmentation(samsa)"):
        assert "anisotropic" not in kinds and torch.equal(m, n)   # similarity: the normals are unchanged


def test_rotations_rotate_the_normals_with_the_points() -> None:
    p, n = _batch()
    for f in (A.rotate_so3, lambda p, n, g: A.rotate_up(p, n, g, "y")):
        q, m = f(p, n, torch.Generator().manual_seed(5))
        for b in range(p.shape[0]):
            R = assert_normals_follow(p[b], n[b], q[b], m[b])
            assert torch.allclose(R @ R.T, torch.eye(3, dtype=R.dtype), atol=1e-9)
            assert torch.allclose(m[b], n[b] @ R.T, atol=1e-9)            # n' = R n
            assert torch.allclose((q[b] * m[b]).sum(-1), (p[b] * n[b]).sum(-1), atol=1e-9)


def test_jitter_keeps_normals_and_point_dropout_moves_them_with_their_points() -> None:
    p, n = _batch()
    q, m = A.jitter(p, n, torch.Generator().manual_seed(2))
    assert not torch.equal(q, p) and torch.equal(m, n)
    q, m = A.point_dropout(p, n, torch.Generator().manual_seed(3), max_ratio=0.8)
    dropped = (q != p).any(-1)
    assert dropped.any()
    first_p, first_n = p[:, :1].expand_as(p), n[:, :1].expand_as(n)
    assert torch.equal(q[dropped], first_p[dropped]) and torch.equal(m[dropped], first_n[dropped])
    assert torch.equal(m[~dropped], n[~dropped])
    # PointNet++'s composite: isotropic scale, shift and jitter keep the normals exactly
    q, m = A.paper_augmentation("pointnet2")(p, n, torch.Generator().manual_seed(4))
    assert not torch.equal(q, p) and torch.equal(m, n)


def test_float32_and_single_clouds_keep_unit_normals() -> None:
    p, n = _batch(torch.float32)
    for name, f in AFFINE.items():
        q, m = f(p[0], n[0], torch.Generator().manual_seed(1))
        assert q.shape == m.shape == (64, 3) and m.dtype == torch.float32
        assert torch.allclose(m.norm(dim=-1), torch.ones(64), atol=1e-5), name
        assert_normals_follow(p[0], n[0], q, m, tol=1e-5)


class Recorder(nn.Module):
    """Records what the task feeds a point model: x (normals), pos and mask; outputs zeros."""

    def __init__(self, num_out: int, per_point: bool) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))
        self.num_out, self.per_point = num_out, per_point
        self.calls: list[tuple] = []

    def forward(self, x, pos, mask=None, category=None):
        self.calls.append((None if x is None else x.detach().clone(), pos.detach().clone(), mask.clone()))
        shape = (*pos.shape[:2], self.num_out) if self.per_point else (pos.shape[0], self.num_out)
        return torch.zeros(shape) * self.w


@pytest.mark.parametrize("task_cls", [ShapeClassificationTask, PartSegmentationTask])
@pytest.mark.parametrize("augment", [*AUGMENTATIONS, ["sampled", "so3"]])
def test_task_augmentation_moves_normals_with_the_points(task_cls, augment) -> None:
    """The training path of the shape tasks: padded mini-batches, the augmentation drawn from the
    engine's generator, normals delivered to the model as ``x``."""
    cs = _shapes()
    per_point = task_cls is PartSegmentationTask
    pool = shape_pool(cs, normals=True, parts=per_point)
    sample = pool.batches(5)[0]
    own = sample.tensors()
    task = task_cls(augment=augment, model_name="sft-cls")
    model = Recorder(len(cs.part_names) if per_point else len(cs.class_names), per_point)
    task.loss(model, sample, torch.Generator().manual_seed(7))
    x, pos, mask = model.calls[-1]
    assert x is not None and x.shape == pos.shape and torch.equal(mask, own["mask"])
    assert mask.sum(1).tolist() == [48, 40, 56, 33, 48]            # padded
    moved = False
    for b in range(5):
        keep = mask[b]
        p, n, q, m = own["points"][b][keep], own["normals"][b][keep], pos[b][keep], x[b][keep]
        if augment == "pointnet2":  # isotropic scale, shift and jitter: the normals are unchanged
            assert torch.equal(m, n)
        else:
            assert_normals_follow(p, n, q, m, tol=1e-6)
        moved |= not torch.equal(q, p)
    assert moved or augment == "samsa"
    task.evaluate(model, [sample])                                 # evaluation: no augmentation
    x, pos, _ = model.calls[-1]
    assert torch.equal(x, own["normals"]) and torch.equal(pos, own["points"])


@pytest.mark.parametrize("rotation", ["so3", "up"])
def test_rotated_test_split_rotates_the_normals_with_the_points(rotation: str) -> None:
    cs = _shapes()
    rot = rotate_clouds(cs, rotation, seed=4, up_axis="y")
    for a, b in zip(cs, rot):
        p, n = torch.from_numpy(np.asarray(a.points, np.float64)), torch.from_numpy(np.asarray(a.normals, np.float64))
        q, m = torch.from_numpy(np.asarray(b.points, np.float64)), torch.from_numpy(np.asarray(b.normals, np.float64))
        R = assert_normals_follow(p, n, q, m, tol=1e-6)            # stored as float32
        assert torch.allclose(R @ R.T, torch.eye(3, dtype=R.dtype), atol=1e-5)
        assert not torch.allclose(R, torch.eye(3, dtype=R.dtype), atol=1e-3)
        if rotation == "up":
            assert math.isclose(float(R[1, 1]), 1.0, abs_tol=1e-5)
