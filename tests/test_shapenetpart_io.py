"""ShapeNetPart reader on small files written in the real layout."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pointformers.data.shapenetpart import CATEGORIES, CATEGORY_PARTS, PART_NAMES, load_shapenetpart


def test_standard_label_space() -> None:
    assert len(CATEGORIES) == 16 and len(PART_NAMES) == 50
    ids = [p for c, _ in CATEGORIES for p in CATEGORY_PARTS[c]]
    assert ids == list(range(50))  # contiguous blocks in category order
    assert CATEGORY_PARTS["Motorbike"] == (30, 31, 32, 33, 34, 35) and CATEGORY_PARTS["Table"] == (47, 48, 49)


def write_shape(path: Path, rng: np.random.Generator, parts: tuple[int, ...], n: int = 40) -> np.ndarray:
    arr = np.c_[rng.normal(size=(n, 6)), rng.choice(parts, n)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(" ".join(f"{v:.6f}" for v in row) for row in arr) + "\n")
    return np.round(arr, 6)


@pytest.fixture()
def root(tmp_path: Path):
    rng = np.random.default_rng(0)
    r = tmp_path / "shapenetcore_partanno_segmentation_benchmark_v0_normal"
    r.mkdir()
    (r / "synsetoffset2category.txt").write_text("".join(f"{c}\t{s}\n" for c, s in CATEGORIES))
    shapes = {"train": [("02691156", "a1"), ("03797390", "m1")], "val": [("04379243", "t1")],
              "test": [("03797390", "m2"), ("02691156", "a2")]}
    syn = {s: c for c, s in CATEGORIES}
    data = {}
    (r / "train_test_split").mkdir()
    for split, items in shapes.items():
        (r / "train_test_split" / f"shuffled_{split}_file_list.json").write_text(
            json.dumps([f"shape_data/{s}/{i}" for s, i in items]))
        for s, i in items:
            data[f"{s}/{i}"] = write_shape(r / s / f"{i}.txt", rng, CATEGORY_PARTS[syn[s]])
    return r, data


def test_reader_values_labels_and_sampling(root) -> None:
    r, data = root
    ds = load_shapenetpart(r, "train", num_points=None, normalize=False)
    assert ds.num_classes == 16 and ds.num_parts == 50 and len(ds.class_parts) == 16
    assert [c.label for c in ds] == [0, 11]  # Airplane, Mug
    for c in ds:
        arr = data[c.name]
        assert np.allclose(c.points, arr[:, :3], atol=1e-6) and np.allclose(c.normals, arr[:, 3:6], atol=1e-6)
        assert np.array_equal(c.parts, arr[:, 6].astype(int))
        assert set(c.parts.tolist()) <= set(ds.class_parts[c.label])
    # 2500 points from 40: a seeded choice with replacement; every pick is a real (point, normal, part) row.
    a = load_shapenetpart(r, "test", num_points=2500, seed=1)
    b = load_shapenetpart(r, "test", num_points=2500, seed=1)
    assert a[0].num_points == 2500 and np.array_equal(a[0].points, b[0].points)
    raw = data[a[1].name]
    centred = raw[:, :3] - raw[:, :3].mean(0)
    full = load_shapenetpart(r, "test", num_points=None)
    assert np.allclose(full[1].points, centred / np.linalg.norm(centred, axis=1).max(), atol=1e-5)
    tv = load_shapenetpart(r, "trainval", num_points=None, categories=("Table", "Mug"))
    assert sorted(c.name for c in tv) == ["03797390/m1", "04379243/t1"]


def test_cache(root, tmp_path: Path) -> None:
    r, _ = root
    a = load_shapenetpart(r, "val", num_points=64, cache_dir=tmp_path / "c")
    b = load_shapenetpart(r, "val", num_points=64, cache_dir=tmp_path / "c")
    assert len(list((tmp_path / "c" / "shapenetpart").glob("*.npz"))) == 1
    assert np.array_equal(a[0].parts, b[0].parts) and a.class_parts == b.class_parts


@pytest.mark.parametrize("line, msg", [
    ("0.1 0.2 0.3 0.0 1.0 0.0", "expected 7 values"),
    ("0.1 0.2 0.3 0.0 1.0 0.0 x", "expected numbers"),
    ("0.1 0.2 0.3 0.0 1.0 0.0 37.000000", r"expected the part label \(7th value\) to be one of the category's part ids \[0, 1, 2, 3\], got 37"),
    ("0.1 0.2 0.3 0.0 1.0 0.0 1.5", r"expected the part label .* got 1.5"),
])
def test_malformed_shape_file_names_file_and_line(root, line: str, msg: str) -> None:
    r, _ = root
    f = r / "02691156" / "a1.txt"
    lines = f.read_text().splitlines()
    lines[2] = line
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=f"a1.txt:3: {msg}"):
        load_shapenetpart(r, "train")


def test_malformed_index_files(root) -> None:
    r, _ = root
    split = r / "train_test_split" / "shuffled_val_file_list.json"
    split.write_text(json.dumps(["shape_data/04379243/missing"]))
    with pytest.raises(ValueError, match=r"shuffled_val_file_list.json: entry 0: listed shape file .*missing.txt does not exist"):
        load_shapenetpart(r, "val")
    split.write_text('[\n"shape_data/04379243/t1",\n')
    with pytest.raises(ValueError, match=r"shuffled_val_file_list.json:\d+: invalid JSON"):
        load_shapenetpart(r, "val")
    split.write_text(json.dumps(["shape_data/99999999/t1"]))
    with pytest.raises(ValueError, match="entry 0 .*synset"):
        load_shapenetpart(r, "val")
    (r / "synsetoffset2category.txt").write_text("Airplane\t02691156\nSpaceship\t09999999\n")
    with pytest.raises(ValueError, match=r"synsetoffset2category.txt:2: unknown ShapeNetPart category 'Spaceship'"):
        load_shapenetpart(r, "train")
    (r / "synsetoffset2category.txt").write_text("Airplane\n")
    with pytest.raises(ValueError, match=r"synsetoffset2category.txt:1: expected '<Category> <synset id>'"):
        load_shapenetpart(r, "train")
    with pytest.raises(ValueError, match="categories"):
        load_shapenetpart(r, "train", categories=("Boat",))
