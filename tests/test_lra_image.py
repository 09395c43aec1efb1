"""LRA Image: the CIFAR-10 binary reader, grey levels, pixel tokens and the task's config checks."""
from pathlib import Path

import numpy as np
import pytest

from pointformers.data import images as im
from pointformers.engine.config import load_config
from pointformers.tasks.lra_image import pixel_tokens
from pointformers.tasks.registry import get_task

ROOT = Path(__file__).resolve().parents[1]


def _write_batch(path, labels, rng):
    pix = rng.integers(0, 256, (len(labels), 3 * 32 * 32), dtype=np.uint8)
    rec = np.concatenate([np.asarray(labels, np.uint8)[:, None], pix], 1)
    rec.tofile(path)
    return pix.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)


def test_cifar10_binary_reader_reads_records_and_names_bad_files(tmp_path):
    rng = np.random.default_rng(0)
    want = {}
    for i in range(1, 6):
        want[i] = _write_batch(tmp_path / f"data_batch_{i}.bin", [i, (i + 3) % 10], rng)
    _write_batch(tmp_path / "test_batch.bin", [9, 0, 1], rng)
    images, labels = im.read_cifar10_bin(tmp_path / "data_batch_2.bin")
    assert images.shape == (2, 32, 32, 3) and labels.tolist() == [2, 5]
    np.testing.assert_array_equal(images, want[2])
    sets = im.load_cifar10_sets(tmp_path, ["train", "val", "test"], val_fraction=0.2)
    assert [len(sets[s]) for s in ("train", "val", "test")] == [8, 2, 3]
    assert sets["val"].labels.tolist() == [5, 8]  # the last 20 % of the training records, in file order
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\x01" * 3072)
    with pytest.raises(ValueError, match="bad.bin: 3072 bytes"):
        im.read_cifar10_bin(bad)
    rec = np.zeros(3073, np.uint8)
    rec[0] = 12
    rec.tofile(bad)
    with pytest.raises(ValueError, match="record 0 has label 12"):
        im.read_cifar10_bin(bad)
    (tmp_path / "test_batch.bin").unlink()
    with pytest.raises(ValueError, match="test_batch.bin not found"):
        im.load_cifar10_sets(tmp_path, ["test"])


def test_grey_levels_follow_the_weights_and_tokens_run_row_by_row():
    rgb = np.zeros((1, 2, 2, 3), np.float32)
    rgb[0, 0, 1] = [1, 0, 0]
    rgb[0, 1, 0] = [0, 1, 0]
    rgb[0, 1, 1] = [1, 1, 1]
    grey = im.grey_levels(rgb)
    assert grey.tolist() == [[[0, round(0.2989 * 255)], [round(0.5870 * 255), 255]]]
    tok = pixel_tokens(rgb, upscale=2)
    assert tok.shape == (1, 16) and tok.min() >= 1 and tok.max() <= 256
    # row 0 of the 4 x 4 image: pixel (0, 0) twice, then (0, 1) twice
    assert tok[0, :4].tolist() == [1, 1, grey[0, 0, 1] + 1, grey[0, 0, 1] + 1]
    assert tok[0, 4:8].tolist() == tok[0, :4].tolist()
    with pytest.raises(ValueError, match="factor"):
        im.upscale(rgb, 0)


def test_lra_image_configs_validate_and_errors_name_the_key():
    spec = get_task("lra-image")
    paths = sorted((ROOT / "configs").glob("lra-image-*.yaml"))
    assert {p.stem for p in paths} == {"lra-image-samsa", "lra-image-sft", "lra-image-full", "lra-image-performer", "lra-image-mlp"}
    for p in paths:
        spec.validate(load_config(p))
    cfg = load_config(paths[0])
    for key, value, match in (("upscale", 0, "data.upscale"), ("format", "jpeg", "data.format"),
                              ("val_fraction", 1.0, "data.val_fraction")):
        with pytest.raises(ValueError, match=match):
            spec.validate({**cfg, "data": {**cfg["data"], key: value}})
    with pytest.raises(ValueError, match="data.root"):
        spec.validate({**cfg, "data": {**cfg["data"], "format": "cifar10-bin"}})
    short = {**cfg, "model": {**cfg["model"], "options": {**cfg["model"]["options"], "max_len": 128}}}
    with pytest.raises(ValueError, match="model.options.max_len"):
        spec.validate(short)


def test_lra_image_mlp_trains_on_the_digits_and_its_loss_falls():
    import torch
    from pointformers import models

    spec = get_task("lra-image")
    cfg = load_config(ROOT / "configs" / "lra-image-mlp.yaml", ["data.upscale=1", "model.options.max_len=64"])
    samples = spec.load(cfg, ("train",), False)
    torch.manual_seed(0)
    model = models.build(cfg["model"]["name"], **cfg["model"]["options"])
    task = spec.build(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for i in range(60):
        loss = task.loss(model, samples["train"][0])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.7 * losses[0], losses
