"""Image classification (issue 23, FLT §5.2): digits / IDX / npz readers, patches, ViT models, the task."""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from pointformers import models
from pointformers.attention import build as build_attention
from pointformers.data import images as im
from pointformers.engine.config import load_config
from pointformers.tasks import metrics
from pointformers.tasks.registry import get_task

ROOT = Path(__file__).resolve().parents[1]
VIT = ["flt-vit", "performer-vit", "full-vit", "mlp-vit"]


def test_digits_split_is_stratified_disjoint_and_seeded():
    a, b, c = im.load_digits_sets(0), im.load_digits_sets(0), im.load_digits_sets(1)
    assert sum(len(s) for s in a.values()) == 1797
    for s in im.SPLITS:
        assert np.array_equal(a[s].labels, b[s].labels) and np.array_equal(a[s].images, b[s].images)
        assert set(a[s].labels.tolist()) == set(range(10))                 # every class in every split
        assert a[s].images.shape[1:] == (8, 8, 1) and 0 <= a[s].images.min() and a[s].images.max() <= 1
    assert len(a["train"]) == pytest.approx(0.6 * 1797, abs=10)
    flat = {s: {x.tobytes() for x in a[s].images} for s in im.SPLITS}
    assert not flat["train"] & flat["test"] or len(flat["train"] & flat["test"]) < 5   # (the set has duplicates)
    assert not np.array_equal(a["test"].labels, c["test"].labels) or not np.array_equal(a["test"].images,
                                                                                          c["test"].images)
    with pytest.raises(ValueError, match="fractions"):
        im.load_digits_sets(0, (0.5, 0.5, 0.5))


@pytest.mark.parametrize("gz", [False, True])
def test_idx_files_read_back_and_split(tmp_path, gz):
    g = np.random.default_rng(0)
    sfx = ".gz" if gz else ""
    tr_img, tr_lab = g.integers(0, 256, (24, 4, 6), dtype=np.uint8), g.integers(0, 3, 24).astype(np.uint8)
    te_img, te_lab = g.integers(0, 256, (5, 4, 6), dtype=np.uint8), g.integers(0, 3, 5).astype(np.uint8)
    for (a, b), arrays in zip(im.IDX_FILES.values(), ((tr_img, tr_lab), (te_img, te_lab))):
        im.write_idx(tmp_path / (a + sfx), arrays[0])
        im.write_idx(tmp_path / (b + sfx), arrays[1])
    assert np.array_equal(im.read_idx(tmp_path / ("train-images-idx3-ubyte" + sfx)), tr_img)
    sets = im.load_idx_sets(tmp_path, val_fraction=0.25)
    assert len(sets["train"]) == 18 and len(sets["val"]) == 6 and len(sets["test"]) == 5
    assert np.allclose(sets["val"].images[..., 0], tr_img[18:] / 255.0) and np.array_equal(sets["test"].labels, te_lab)


def test_idx_reader_names_a_bad_file(tmp_path):
    path = tmp_path / "x-idx3-ubyte"
    im.write_idx(path, np.zeros((3, 4, 4), np.uint8))
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(ValueError, match=r"x-idx3-ubyte: expected 48 bytes .* \(truncated\?\)"):
        im.read_idx(path)
    path.write_bytes(b"\x01\x02\x03")
    with pytest.raises(ValueError, match="not an IDX file"):
        im.read_idx(path)
    bad = tmp_path / "y.gz"
    bad.write_bytes(gzip.compress(b"\x00\x00\x08\x01\x00\x00\x00\x05ab")[:-4])
    with pytest.raises(ValueError, match="y.gz"):
        im.read_idx(bad)
    with pytest.raises(ValueError, match="IDX files expected"):
        im.load_idx_sets(tmp_path / "none")


def test_npz_sets_and_their_errors(tmp_path):
    g = np.random.default_rng(1)
    np.savez(tmp_path / "train.npz", images=g.integers(0, 256, (6, 4, 4, 3), dtype=np.uint8), labels=np.arange(6) % 2)
    np.savez(tmp_path / "val.npz", images=g.random((2, 4, 4)).astype(np.float32), labels=np.array([0, 1]))
    sets = im.load_npz_sets(tmp_path, ["train", "val"])
    assert sets["train"].images.shape == (6, 4, 4, 3) and sets["val"].images.shape == (2, 4, 4, 1)
    np.savez(tmp_path / "test.npz", images=np.full((2, 4, 4), 2.0), labels=np.array([0, 1]))
    with pytest.raises(ValueError, match=r"test.npz: images: float pixels must be finite and in \[0, 1\]"):
        im.load_npz_sets(tmp_path, ["test"])
    np.savez(tmp_path / "test.npz", pixels=np.zeros((2, 4, 4)))
    with pytest.raises(ValueError, match="expected arrays 'images' and 'labels'"):
        im.load_npz_sets(tmp_path, ["test"])


def test_patches_are_raster_ordered_tiles_with_their_positions():
    images = np.arange(2 * 4 * 6 * 1, dtype=np.float32).reshape(2, 4, 6, 1)
    p = im.patchify(images, 2)
    assert p.shape == (2, 6, 4)
    assert p[0, 1].tolist() == [2, 3, 8, 9] and p[1, 5].tolist() == images[1, 2:4, 4:6, 0].ravel().tolist()
    assert im.patch_positions(4, 6, 2, "raster")[:, 0].tolist() == list(range(6))
    assert im.patch_positions(4, 6, 2, "grid").tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    with pytest.raises(ValueError, match="patch"):
        im.patchify(images, 4)


def test_relu_feature_map_is_the_papers_normalised_relu_kernel():
    torch.manual_seed(0)
    att = build_attention("flt", dim=8, heads=2, nb_features=5, num_rpe_features=3, feature_map="relu").double()
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    pos = torch.arange(7.0, dtype=torch.float64).view(1, 7, 1).expand(2, 7, 1)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    qh, kh, v = att.augmented_qkv(x, pos, mask)
    w = att.feature_w.double()
    phi_q, phi_k = torch.relu(qh @ w.T), torch.relu(kh @ w.T)
    a = (phi_q @ phi_k.transpose(-1, -2)).masked_fill(~mask[:, None, None, :], 0.0)   # (B, H, N, N)
    ref = att.merge_heads(a @ v / (a.sum(-1, keepdim=True) + 1e-6), mask)
    assert torch.allclose(att(x, pos, mask), ref, atol=1e-10)
    with pytest.raises(ValueError, match="non-causal"):
        build_attention("flt", dim=8, heads=2, feature_map="relu", causal=True)
    with pytest.raises(ValueError, match="feature_map"):
        build_attention("flt", dim=8, heads=2, feature_map="cosine")


@pytest.mark.parametrize("name", VIT)
def test_vit_models_ignore_padding_and_read_their_positions(name):
    torch.manual_seed(0)
    m = models.build(name, in_dim=4, num_classes=5, dim=16, max_len=32,
                     **({} if name == "mlp-vit" else {"heads": 2})).double().eval()
    g = torch.Generator().manual_seed(0)
    x = torch.rand(2, 12, 4, generator=g, dtype=torch.float64)
    pos = torch.arange(12.0, dtype=torch.float64).view(1, 12, 1).expand(2, 12, 1)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 9:] = False
    with torch.no_grad():
        y = m(x, pos, mask)
        assert torch.allclose(y[1], m(x[1:, :9], pos[1:, :9])[0], atol=1e-10)
        shuffled = torch.randperm(12, generator=g)
        # the same pixels in another order are another image: the output changes (positions matter)
        assert not torch.allclose(m(x[:1, shuffled], pos[:1]), y[:1], atol=1e-6)


def _cfg(k: str) -> dict:
    return load_config(ROOT / "configs" / f"image-classification-{k}.yaml")


@pytest.mark.heavy
def test_image_configs_train_and_their_loss_falls():
    spec = get_task("image-classification")
    for k in ("flt", "performer", "full", "mlp"):
        cfg = _cfg(k)
        samples = spec.load(cfg, ("train", "val"), False)
        torch.manual_seed(0)
        model = models.build(cfg["model"]["name"], **cfg["model"]["options"])
        task = spec.build(cfg)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        losses = []
        for _ in range(40):  # one mini-batch: the loss of what it is fitted to falls
            loss = task.loss(model, samples["train"][0])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        assert np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3]), (k, losses)
        out = task.evaluate(model, samples["val"])
        logits, labels = task.predict(model, samples["val"])
        assert out["accuracy"] == metrics.accuracy(logits, labels) and len(labels) == len(
            im.load_digits_sets(0)["val"])


def test_image_config_errors_name_the_key(tmp_path):
    spec = get_task("image-classification")
    cfg = _cfg("flt")
    for key, value, match in (("patch", 3, "data.patch"), ("format", "png", "data.format"),
                              ("positions", "spiral", "data.positions")):
        bad = {**cfg, "data": {**cfg["data"], key: value}}
        with pytest.raises(ValueError, match=match):
            spec.validate(bad)
    grid = {**cfg, "data": {**cfg["data"], "positions": "grid"}}
    with pytest.raises(ValueError, match="model.options.coord_dim"):
        spec.validate(grid)
    wrong = {**cfg, "model": {**cfg["model"], "options": {**cfg["model"]["options"], "in_dim": 9}}}
    with pytest.raises(ValueError, match="model.options.in_dim"):
        spec.validate(wrong)
    idx = {**cfg, "data": {**cfg["data"], "format": "idx", "root": str(tmp_path / "none")}}
    with pytest.raises(ValueError, match="data.root"):
        spec.validate(idx)
