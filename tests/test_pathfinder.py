"""LRA Pathfinder: the stand-in generator, the PNG reader, the release reader and the task's configs."""
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from pointformers.data import pathfinder as pf
from pointformers.engine.config import load_config
from pointformers.tasks.registry import get_task

ROOT = Path(__file__).resolve().parents[1]


def _blobs(mask: np.ndarray) -> int:
    """4-connected components of a bool mask."""
    seen = np.zeros_like(mask)
    count = 0
    for r, c in zip(*np.nonzero(mask)):
        if seen[r, c]:
            continue
        count += 1
        stack = [(r, c)]
        seen[r, c] = True
        while stack:
            y, x = stack.pop()
            for dy, dx in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                v, u = y + dy, x + dx
                if 0 <= v < mask.shape[0] and 0 <= u < mask.shape[1] and mask[v, u] and not seen[v, u]:
                    seen[v, u] = True
                    stack.append((v, u))
    return count


def test_generated_images_are_seeded_balanced_and_hold_two_dots_on_grey_curves():
    x, y = pf.generate_pathfinder(12, seed=3)
    x2, y2 = pf.generate_pathfinder(12, seed=3)
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    assert not np.array_equal(x, pf.generate_pathfinder(12, seed=4)[0])
    assert x.shape == (12, 32, 32) and x.dtype == np.uint8 and y.tolist() == [1, 0] * 6
    for img in x:
        assert set(np.unique(img)) <= {0, pf.CURVE_LEVEL, 255}
        assert 1 <= _blobs(img == 255) <= 2  # the two dots (touching dots merge)
        # dashed curves: many separate grey pieces, not one solid stroke per curve
        assert _blobs(img == pf.CURVE_LEVEL) > 6
    with pytest.raises(ValueError, match="contour_length"):
        pf.PathfinderParams(contour_length=1)
    with pytest.raises(ValueError, match="count"):
        pf.generate_pathfinder(-1)


def _png(rows: np.ndarray, filters: list[int], colour: int = 0) -> bytes:
    """A PNG of ``rows`` (H, W·ch) uint8 with the given filter per row (encoded as the spec defines)."""
    ch = {0: 1, 2: 3, 4: 2, 6: 4}[colour]
    h, stride = rows.shape
    prev = np.zeros(stride, dtype=np.int32)
    out = b""
    for r in range(h):
        cur = rows[r].astype(np.int32)
        left = np.concatenate([np.zeros(ch, np.int32), cur[:-ch]])
        ul = np.concatenate([np.zeros(ch, np.int32), prev[:-ch]])
        f = filters[r]
        if f == 0:
            enc = cur
        elif f == 1:
            enc = cur - left
        elif f == 2:
            enc = cur - prev
        elif f == 3:
            enc = cur - (left + prev) // 2
        else:
            p = left + prev - ul
            pa, pb, pc = np.abs(p - left), np.abs(p - prev), np.abs(p - ul)
            enc = cur - np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, prev, ul))
        out += bytes([f]) + (enc % 256).astype(np.uint8).tobytes()
        prev = cur

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    w = stride // ch
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, colour, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(out)) + chunk(b"IEND", b""))


def test_png_reader_undoes_every_row_filter_and_names_bad_files(tmp_path):
    rng = np.random.default_rng(0)
    grey = rng.integers(0, 256, (5, 7), dtype=np.uint8)
    path = tmp_path / "g.png"
    path.write_bytes(_png(grey, [0, 1, 2, 3, 4]))
    assert np.array_equal(pf.read_png(path), grey)
    rgb = rng.integers(0, 256, (5, 4 * 3), dtype=np.uint8)
    path.write_bytes(_png(rgb, [4, 3, 2, 1, 0], colour=2))
    want = np.rint(rgb.reshape(5, 4, 3).astype(float) @ [0.2989, 0.5870, 0.1140]).astype(np.uint8)
    assert np.array_equal(pf.read_png(path), want)
    pf.write_png(path, grey)
    assert np.array_equal(pf.read_png(path), grey)
    path.write_bytes(b"not a png")
    with pytest.raises(ValueError, match="g.png.*signature"):
        pf.read_png(path)
    path.write_bytes(_png(grey, [0] * 5)[:40])
    with pytest.raises(ValueError, match="g.png.*unreadable"):
        pf.read_png(path)


def test_release_reader_follows_the_metadata_skips_empty_files_and_splits_80_10_10(tmp_path):
    root = tmp_path / "curv_contour_length_14"
    (root / "metadata").mkdir(parents=True)
    (root / "imgs" / "0").mkdir(parents=True)
    lines = []
    for i in range(21):
        img = np.full((32, 32), i, dtype=np.uint8)
        pf.write_png(root / "imgs" / "0" / f"sample_{i}.png", img)
        lines.append(f"imgs/0 sample_{i}.png 0 {i % 2} 14")
    (root / "imgs" / "0" / "sample_21.png").write_bytes(b"")  # an empty file, as the release has some
    lines.append("imgs/0 sample_21.png 0 1 14")
    (root / "metadata" / "0.npy").write_text("\n".join(lines) + "\n")
    sets = pf.load_pathfinder_release(root, seed=0)
    assert [len(sets[s][1]) for s in ("train", "val", "test")] == [17, 2, 2]
    x = np.concatenate([sets[s][0] for s in ("train", "val", "test")])
    y = np.concatenate([sets[s][1] for s in ("train", "val", "test")])
    assert sorted(x[:, 0, 0].tolist()) == list(range(21)) and np.array_equal(y, x[:, 0, 0] % 2)
    (root / "metadata" / "1.npy").write_text("imgs/0 sample_0.png 0 7 14\n")
    with pytest.raises(ValueError, match=r"1\.npy:1"):
        pf.load_pathfinder_release(root)
    with pytest.raises(ValueError, match="metadata"):
        pf.load_pathfinder_release(tmp_path)


def test_pathfinder_configs_validate_and_the_mlp_trains_on_the_stand_in(tmp_path):
    import torch
    from pointformers import models

    spec = get_task("lra-pathfinder")
    paths = sorted((ROOT / "configs").glob("lra-pathfinder-*.yaml"))
    assert {p.stem for p in paths} == {"lra-pathfinder-samsa", "lra-pathfinder-sft", "lra-pathfinder-full",
                                       "lra-pathfinder-performer", "lra-pathfinder-mlp"}
    for p in paths:
        spec.validate(load_config(p))
    cfg = load_config(paths[1], ["data.sizes=[48, 8, 8]"])
    with pytest.raises(ValueError, match="data.sizes"):
        spec.validate({**cfg, "data": {**cfg["data"], "sizes": [1, 2]}})
    released = {**cfg, "data": {**cfg["data"], "sizes": None, "root": str(tmp_path)}}
    spec.validate(released)  # a folder: its content is read at load time
    with pytest.raises(ValueError, match="metadata"):
        spec.load(released, ("train",), False)
    samples = spec.load(cfg, ("train",), False)
    batch = samples["train"][0]
    t = batch.tensors()
    x, y = pf.load_generated_pathfinder(("train",), 0, (48, 8, 8))["train"]
    # the stand-in's pixels, row by row, grey level + 1 (the cached images); labels balanced
    assert t["tokens"].shape[1] == 1024 and int(t["tokens"].min()) == 1 and int(t["tokens"].max()) == 256
    first = int(batch.index[0])
    assert np.array_equal(t["tokens"][0].numpy(), x[first].reshape(-1).astype(np.int64) + 1)
    assert int(t["labels"][0]) == int(y[first]) and sorted(np.unique(y).tolist()) == [0, 1]
    # one training step of the config's classifier: finite loss and gradients (Pathfinder is hard: models at this
    # size stay at chance for many epochs, so no falling loss is asked here)
    torch.manual_seed(0)
    model = models.build(cfg["model"]["name"], **cfg["model"]["options"])
    loss = spec.build(cfg).loss(model, batch)
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
