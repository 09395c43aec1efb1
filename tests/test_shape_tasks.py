"""Shape classification and part segmentation tasks: mini-batches, loss, metrics, augmentation, rotation, readers."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pointformers.data.clouds import ShapeCloud, ShapeCloudSet
from pointformers.tasks import metrics
from pointformers.tasks.minibatch import ItemPool, MiniBatch
from pointformers.tasks.registry import get_task
from pointformers.tasks.shapes import (
    PartSegmentationTask,
    ShapeClassificationTask,
    auto_augmentation,
    build_augmentation,
    rotate_clouds,
    shape_pool,
)


def _cloud(label: int, n: int, shift: float, seed: int, parts=None) -> ShapeCloud:
    g = np.random.default_rng(seed)
    p = g.standard_normal((n, 3)).astype(np.float32)
    p[:, 0] += shift
    nrm = g.standard_normal((n, 3))
    nrm /= np.linalg.norm(nrm, axis=1, keepdims=True)
    return ShapeCloud(p, nrm.astype(np.float32), label, parts, f"s{seed}")


def _set(parts: bool = False) -> ShapeCloudSet:
    # 5 clouds of different sizes; classes 0/1/2; part blocks {0,1}, {2,3}, {4}
    sizes, labels, shifts = [7, 5, 9, 6, 8], [0, 1, 1, 2, 0], [5.0, -5.0, 5.0, -5.0, -5.0]
    blocks = ((0, 1), (2, 3), (4,))
    clouds = []
    for i, (n, c, s) in enumerate(zip(sizes, labels, shifts)):
        pr = None
        if parts:
            pr = np.array([blocks[c][j % len(blocks[c])] for j in range(n)], np.int64)
        clouds.append(_cloud(c, n, s, i, pr))
    return ShapeCloudSet(clouds, ("a", "b", "c"), ("a/0", "a/1", "b/0", "b/1", "c/0") if parts else (),
                         blocks if parts else ())


class MeanX(nn.Module):
    """Logits from the mean x coordinate of the real points: class 0 if > 0 else class 1 (3 classes)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(1.0))
        self.seen: list[torch.Tensor] = []

    def forward(self, x, pos, mask=None):
        self.seen.append(pos.detach().clone())
        m = (pos[..., 0] * mask).sum(1) / mask.sum(1)
        return torch.stack([self.w * m, -self.w * m, torch.zeros_like(m) - 100], -1)


# ------------------------------------------------------------------------------- mini-batches
def test_pool_batches_partition_every_item_once_and_pad_with_a_mask():
    pool = shape_pool(_set())
    batches = pool.batches(2)
    assert [len(b) for b in batches] == [2, 2, 1]
    assert sorted(torch.cat([b.index for b in batches]).tolist()) == [0, 1, 2, 3, 4]
    t = batches[1].tensors()
    assert t["points"].shape == (2, 9, 3) and t["mask"].sum(1).tolist() == [9, 6]
    assert torch.equal(t["points"][0, :9], torch.from_numpy(_set()[2].points))
    assert bool((t["points"][1, 6:] == 0).all())
    assert t["labels"].tolist() == [1, 2]


def test_resampled_membership_is_seeded_and_changes_between_steps():
    pool = shape_pool(_set())
    b = pool.batches(2, resample=True)[0]
    draw = lambda seed: b.members(torch.Generator().manual_seed(seed))["labels"]  # noqa: E731
    assert torch.equal(draw(3), draw(3))
    g = torch.Generator().manual_seed(0)
    memberships = {tuple(pool.draw(2, g).tolist()) for _ in range(20)}
    assert len(memberships) > 3                        # not the fixed partition
    assert torch.equal(b.members(None)["labels"], b.tensors()["labels"])  # no generator: own items
    with pytest.raises(ValueError, match="empty"):
        ItemPool({"points": [torch.zeros(0, 3)]})


# ------------------------------------------------------------------------------- classification
def test_classification_metrics_equal_the_metrics_module_and_a_hand_count():
    task = ShapeClassificationTask(augment="none")
    samples = shape_pool(_set()).batches(2)
    out = task.evaluate(MeanX(), samples)
    # mean x > 0 for clouds 0, 2 (shift +5) -> class 0; others -> class 1. Labels 0, 1, 1, 2, 0.
    pred = torch.tensor([0, 1, 0, 1, 1])
    target = torch.tensor([0, 1, 1, 2, 0])
    assert out["oa"] == pytest.approx(2 / 5)
    assert out["macc"] == pytest.approx((1 / 2 + 1 / 2 + 0) / 3)
    assert out["oa"] == metrics.overall_accuracy(pred, target)
    assert out["macc"] == metrics.mean_class_accuracy(pred, target)
    logits, labels = task.predict(MeanX(), samples)
    assert out["loss"] == pytest.approx(float(F.cross_entropy(logits, labels)))


def test_classification_loss_is_cross_entropy_and_reaches_the_model():
    task = ShapeClassificationTask(augment="none")
    sample = shape_pool(_set()).batches(5)[0]
    model = MeanX()
    loss = task.loss(model, sample, None)
    t = sample.tensors()
    with torch.no_grad():
        ref = F.cross_entropy(MeanX()(None, t["points"], t["mask"]), t["labels"])
    assert float(loss.detach()) == pytest.approx(float(ref), rel=1e-6)
    loss.backward()
    assert model.w.grad is not None and model.w.grad.abs() > 0


def test_training_augmentation_follows_the_model_family_and_is_seeded():
    assert auto_augmentation("sft-cls") == ["sft"] and auto_augmentation("full-cls") == ["sft"]
    assert auto_augmentation("sampled-hier-cls") == ["sampled"] and auto_augmentation("samsa-cls") == []
    assert auto_augmentation("mlp-cls") == ["pointnet2"]
    assert len(build_augmentation("auto", "mlp-cls").transforms) == 3
    with pytest.raises(ValueError, match="unknown augmentation 'flip'"):
        build_augmentation(["sft", "flip"], None)
    task = ShapeClassificationTask(augment="auto", model_name="sft-cls")
    sample = shape_pool(_set()).batches(5)[0]
    model = MeanX()
    task.loss(model, sample, torch.Generator().manual_seed(1))
    seen, own = model.seen[-1], sample.tensors()["points"]
    # SFT's augmentation: one scalar s ~ U[0.6, 1.4] per cloud; here no resampling, so the same clouds
    ratio = seen[sample.tensors()["mask"]] / own[sample.tensors()["mask"]]
    for b in range(5):
        r = (seen[b] / own[b])[sample.tensors()["mask"][b]]
        assert torch.allclose(r, r[0, 0].expand_as(r), rtol=1e-5) and 0.6 <= float(r[0, 0]) <= 1.4
    assert ratio.std() > 0                                                     # different clouds, different s
    task.loss(model, sample, torch.Generator().manual_seed(1))
    assert torch.equal(model.seen[-1], seen)                                   # same generator, same draw
    task.evaluate(model, [sample])
    assert torch.equal(model.seen[-1], own)                                    # no augmentation in evaluation


def test_rotate_test_preserves_distances_and_normal_products_and_is_seeded():
    cs = _set()
    rot = rotate_clouds(cs, "so3", seed=5)
    again = rotate_clouds(cs, "so3", seed=5)
    for a, b, c in zip(cs, rot, again):
        assert np.array_equal(b.points, c.points)
        assert not np.allclose(a.points, b.points, atol=1e-3)
        da = np.linalg.norm(a.points[:, None] - a.points[None], axis=-1)
        db = np.linalg.norm(b.points[:, None] - b.points[None], axis=-1)
        assert np.allclose(da, db, atol=1e-4)
        assert np.allclose(a.normals @ a.normals.T, b.normals @ b.normals.T, atol=1e-5)
    up = rotate_clouds(cs, "up", seed=5, up_axis="y")
    assert all(np.allclose(a.points[:, 1], b.points[:, 1], atol=1e-5) for a, b in zip(cs, up))
    assert rotate_clouds(cs, "none", 5) is cs
    with pytest.raises(ValueError, match="rotation"):
        rotate_clouds(cs, "xyz", 5)


# ------------------------------------------------------------------------------- part segmentation
class PartByX(nn.Module):
    """Part logits: part 0 scores x, part 1 scores -x, every other part 0.5 (segmenter signature)."""

    def __init__(self, num_parts: int = 5) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(1.0))
        self.P = num_parts

    def forward(self, x, pos, mask=None, category=None):
        out = torch.full((*pos.shape[:2], self.P), 0.5) * self.w
        out[..., 0] = self.w * pos[..., 0]
        out[..., 1] = -self.w * pos[..., 0]
        return out.masked_fill(~mask[..., None], 0.0)


def test_part_segmentation_mious_equal_the_metrics_module_and_padding_is_ignored():
    cs = _set(parts=True)
    task = PartSegmentationTask(augment="none")
    samples = shape_pool(cs, parts=True).batches(2)
    out = task.evaluate(PartByX(), samples)
    preds, targets = [], []
    for c in cs:
        pos = torch.from_numpy(c.points)[None]
        logits = PartByX()(None, pos, torch.ones(1, c.num_points, dtype=torch.bool))
        preds.append(metrics.restricted_part_predictions(logits.detach(), torch.tensor([c.label]), cs.class_parts)[0])
        targets.append(torch.from_numpy(c.parts))
    ref = metrics.part_segmentation_mious(preds, targets, torch.tensor([c.label for c in cs]), cs.class_parts)
    assert out["instance_miou"] == pytest.approx(ref["instance_miou"])
    assert out["class_miou"] == pytest.approx(ref["class_miou"])
    n = sum(c.num_points for c in cs)
    assert out["point_acc"] == pytest.approx(sum(int((p == t).sum()) for p, t in zip(preds, targets)) / n)
    # loss: cross-entropy over the 35 real points only (zero logits of padded rows would change it)
    sample = shape_pool(cs, parts=True).batches(5)[0]
    loss = task.loss(PartByX(), sample, None)
    flat_logits = torch.cat([PartByX()(None, torch.from_numpy(c.points)[None],
                                       torch.ones(1, c.num_points, dtype=torch.bool))[0] for c in cs])
    flat_parts = torch.cat([torch.from_numpy(c.parts) for c in cs])
    assert float(loss.detach()) == pytest.approx(float(F.cross_entropy(flat_logits, flat_parts).detach()), rel=1e-6)


def test_wrong_model_outputs_and_samples_raise_value_errors():
    task = ShapeClassificationTask(augment="none")
    samples = shape_pool(_set()).batches(5)

    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(1))

        def forward(self, x, pos, mask=None):
            return self.w * torch.zeros(pos.shape[0], 2)

    with pytest.raises(ValueError, match="C >= 3"):
        task.loss(Two(), samples[0])
    with pytest.raises(ValueError, match="sample: expected a shape MiniBatch"):
        task.loss(MeanX(), {"points": torch.zeros(1, 3, 3)})
    with pytest.raises(ValueError, match="part labels"):
        PartSegmentationTask(augment="none").loss(PartByX(), samples[0])
    with pytest.raises(ValueError, match="normals"):
        shape_pool(ShapeCloudSet([ShapeCloud(np.zeros((3, 3)), None, 0)], ("a",)), normals=True)


# ------------------------------------------------------------------------------- config / registry
def _cfg(**data):
    return {"data": {"preset": "tiny", "num_points": 16, "classes": ["cone", "cuboid", "torus"], "per_class": [2, 1, 1],
                     **data},
            "model": {"name": "mlp-cls", "options": {"num_classes": 3}}, "task": {"name": "shape-classification"}}


def test_validate_names_the_bad_key(tmp_path):
    spec = get_task("shape-classification")
    spec.validate(_cfg())
    bad = [({"format": "off"}, "data.format"), ({"format": "modelnet40-txt"}, "data.root"),
           ({"format": "modelnet40-txt", "root": str(tmp_path / "nope")}, "data.root"),
           ({"classes": ["cone", "spaceship"]}, "data.classes"), ({"mini_batch": 0}, "data.mini_batch"),
           ({"preset": "huge"}, "data.preset"), ({"val_fraction": 1.0}, "data.val_fraction")]
    for data, key in bad:
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            spec.validate(_cfg(**data))
    cfg = _cfg()
    cfg["task"]["rotate_test"] = "z"
    with pytest.raises(ValueError, match=r"task\.rotate_test"):
        spec.validate(cfg)
    cfg = _cfg()
    cfg["model"]["options"] = {"num_classes": 2}
    with pytest.raises(ValueError, match=r"model\.options\.num_classes: the data has 3 classes"):
        spec.validate(cfg)
    cfg = _cfg(normals=False)
    with pytest.raises(ValueError, match=r"model\.options\.in_dim"):
        spec.validate(cfg)
    seg = get_task("part-segmentation")
    with pytest.raises(ValueError, match=r"data\.format: part segmentation"):
        seg.validate({**_cfg(format="modelnet40-h5", root=str(tmp_path)), "task": {"name": "part-segmentation"}})


def test_procedural_load_with_rotated_test_split(tmp_path):
    spec = get_task("shape-classification")
    cfg = _cfg(cache_dir=str(tmp_path), mini_batch=2)
    plain = spec.load(cfg, ("train", "test"), False)
    assert [len(b) for b in plain["train"]] == [2, 2, 2] and len(plain["test"]) == 2
    assert plain["train"][0].resample and not plain["test"][0].resample
    cfg["task"]["rotate_test"] = "so3"
    rot = spec.load(cfg, ("train", "test"), False)
    a, b = plain["test"][0].tensors(), rot["test"][0].tensors()
    assert torch.equal(plain["train"][0].tensors()["points"], rot["train"][0].tensors()["points"])
    assert not torch.allclose(a["points"], b["points"], atol=1e-3)
    assert torch.allclose(torch.cdist(a["points"], a["points"]), torch.cdist(b["points"], b["points"]), atol=1e-4)


def _write_modelnet(root, classes=("cone", "box"), per=3, n=12):
    root.mkdir()
    (root / "modelnet40_shape_names.txt").write_text("\n".join(classes) + "\n")
    ids = {"train": [], "test": []}
    g = np.random.default_rng(0)
    for c in classes:
        (root / c).mkdir()
        for i in range(per + 1):
            sid = f"{c}_{i + 1:04d}"
            rows = np.c_[g.standard_normal((n, 3)), np.tile([0.0, 0.0, 1.0], (n, 1))]
            (root / c / f"{sid}.txt").write_text("\n".join(",".join(f"{v:.6f}" for v in r) for r in rows) + "\n")
            ids["train" if i < per else "test"].append(sid)
    for s, v in ids.items():
        (root / f"modelnet40_{s}.txt").write_text("\n".join(v) + "\n")


def test_modelnet_folder_through_the_task_holds_out_validation_shapes(tmp_path):
    root = tmp_path / "mn"
    _write_modelnet(root)
    spec = get_task("shape-classification")
    cfg = {"data": {"format": "modelnet40-txt", "root": str(root), "num_points": 8, "mini_batch": 4,
                    "val_fraction": 0.34},
           "model": {"name": "mlp-cls", "options": {"num_classes": 40}}, "task": {"name": "shape-classification"}}
    spec.validate(cfg)
    out = spec.load(cfg, ("train", "val", "test"), False)
    sizes = {s: sum(len(b) for b in out[s]) for s in out}
    assert sizes == {"train": 4, "val": 2, "test": 2}          # one of 3 training shapes per class held out
    t = out["val"][0].tensors()
    assert t["points"].shape == (2, 8, 3) and sorted(t["labels"].tolist()) == [0, 1]
    assert torch.allclose(t["normals"][..., 2], torch.ones(2, 8))
    (root / "cone" / "cone_0001.txt").write_text("1,2,3\n")
    with pytest.raises(ValueError, match="cone_0001.txt"):
        spec.load({**cfg, "data": {**cfg["data"], "seed": 1}}, ("train",), False)
