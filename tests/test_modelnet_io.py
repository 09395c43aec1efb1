"""ModelNet40 readers on small files written in the real formats (normal_resampled txt, PointNet HDF5)."""
from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from pointformers.data.modelnet import load_modelnet_h5, load_modelnet_normal_resampled, read_modelnet_txt
from pointformers.data.point_ops import fps_numpy

CLASSES = ["airplane", "night_stand", "flower_pot"]


def write_shape(path: Path, rng: np.random.Generator, n: int = 60) -> np.ndarray:
    p = rng.normal(size=(n, 3))
    nrm = rng.normal(size=(n, 3))
    nrm /= np.linalg.norm(nrm, axis=1, keepdims=True)
    arr = np.c_[p, nrm]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(",".join(f"{v:.6f}" for v in row) for row in arr) + "\n")
    return np.round(arr, 6)


@pytest.fixture()
def root(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    r = tmp_path / "modelnet40_normal_resampled"
    r.mkdir()
    (r / "modelnet40_shape_names.txt").write_text("\n".join(CLASSES) + "\n")
    data = {}
    ids = {"train": ["airplane_0001", "night_stand_0001", "flower_pot_0002"], "test": ["night_stand_0107"]}
    for split, names in ids.items():
        (r / f"modelnet40_{split}.txt").write_text("\n".join(names) + "\n")
        for sid in names:
            data[sid] = write_shape(r / sid.rsplit("_", 1)[0] / f"{sid}.txt", rng)
    return r, data


def test_normal_resampled_reader_values_labels_and_fps(root) -> None:
    r, data = root
    ds = load_modelnet_normal_resampled(r, "train", num_points=16, sampling="fps", normalize=False)
    assert ds.class_names == tuple(CLASSES) and [c.label for c in ds] == [0, 1, 2]
    for c in ds:
        arr = data[c.name]
        idx = fps_numpy(arr[:, :3], 16)
        assert np.allclose(c.points, arr[idx, :3], atol=1e-6) and np.allclose(c.normals, arr[idx, 3:], atol=1e-6)
    ds = load_modelnet_normal_resampled(r, "test", num_points=None, normalize=True)
    c = ds[0]
    assert c.num_points == 60 and c.label == 1
    centred = data["night_stand_0107"][:, :3] - data["night_stand_0107"][:, :3].mean(0)
    assert np.allclose(c.points, centred / np.linalg.norm(centred, axis=1).max(), atol=1e-5)
    first = load_modelnet_normal_resampled(r, "test", num_points=10, sampling="first", normalize=False, use_normals=False)
    assert np.allclose(first[0].points, data["night_stand_0107"][:10, :3], atol=1e-6) and first[0].normals is None


def test_normal_resampled_cache_follows_the_files(root, tmp_path: Path) -> None:
    r, data = root
    cache = tmp_path / "cache"
    a = load_modelnet_normal_resampled(r, "test", num_points=8, cache_dir=cache)
    assert len(list((cache / "modelnet").glob("*.npz"))) == 1
    b = load_modelnet_normal_resampled(r, "test", num_points=8, cache_dir=cache)
    assert np.array_equal(a[0].points, b[0].points)
    arr = write_shape(r / "night_stand" / "night_stand_0107.txt", np.random.default_rng(9), n=70)
    c = load_modelnet_normal_resampled(r, "test", num_points=None, normalize=False, cache_dir=cache)
    assert c[0].num_points == 70 and np.allclose(c[0].points, arr[:, :3], atol=1e-6)


@pytest.mark.parametrize("line, msg", [
    ("0.1,0.2,0.3,0.0,1.0", "expected 6 comma-separated values"),
    ("0.1,0.2,zero,0.0,1.0,0.0", "expected numbers"),
    ("0.1,0.2,nan,0.0,1.0,0.0", "expected finite numbers"),
])
def test_malformed_shape_file_names_file_and_line(root, line: str, msg: str) -> None:
    r, _ = root
    f = r / "airplane" / "airplane_0001.txt"
    lines = f.read_text().splitlines()
    lines[4] = line
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=f"airplane_0001.txt:5: {msg}"):
        load_modelnet_normal_resampled(r, "train")
    with pytest.raises(ValueError, match=":5:"):
        read_modelnet_txt(f)


def test_malformed_lists_are_rejected(root) -> None:
    r, _ = root
    (r / "modelnet40_train.txt").write_text("airplane_0001\nspaceship_0001\n")
    with pytest.raises(ValueError, match=r"modelnet40_train.txt:2: expected a shape id"):
        load_modelnet_normal_resampled(r, "train")
    (r / "modelnet40_train.txt").write_text("airplane_0001\nairplane_0009\n")
    with pytest.raises(ValueError, match=r"modelnet40_train.txt:2: listed shape file .*airplane_0009.txt does not exist"):
        load_modelnet_normal_resampled(r, "train")
    with pytest.raises(ValueError, match="split"):
        load_modelnet_normal_resampled(r, "val")
    with pytest.raises(ValueError, match="sampling"):
        load_modelnet_normal_resampled(r, "train", sampling="grid")


def write_h5(root: Path, name: str, data: np.ndarray, label: np.ndarray, normal: np.ndarray | None = None) -> None:
    with h5py.File(root / name, "w") as f:
        f["data"] = data
        f["label"] = label
        if normal is not None:
            f["normal"] = normal


def test_hdf5_reader(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    r = tmp_path / "modelnet40_ply_hdf5_2048"
    r.mkdir()
    (r / "shape_names.txt").write_text("\n".join(CLASSES) + "\n")
    d0, d1 = rng.normal(size=(3, 32, 3)).astype(np.float32), rng.normal(size=(2, 32, 3)).astype(np.float32)
    n0 = rng.normal(size=(3, 32, 3)).astype(np.float32)
    write_h5(r, "ply_data_train0.h5", d0, np.array([[0], [2], [1]], np.uint8), n0)
    write_h5(r, "ply_data_train1.h5", d1, np.array([1, 1], np.int64))
    # The official lists carry paths relative to the PointNet repository: resolved by base name.
    (r / "train_files.txt").write_text("data/modelnet40_ply_hdf5_2048/ply_data_train0.h5\n"
                                       "data/modelnet40_ply_hdf5_2048/ply_data_train1.h5\n")
    ds = load_modelnet_h5(r, "train", num_points=16, use_normals=False)
    assert [c.label for c in ds] == [0, 2, 1, 1, 1]
    assert np.array_equal(ds[3].points, d1[0, :16]) and ds[0].normals is None
    (r / "train_files.txt").write_text("ply_data_train0.h5\n")
    ds = load_modelnet_h5(r, "train", num_points=None)
    assert np.array_equal(ds[1].normals, n0[1]) and ds[1].num_points == 32
    write_h5(r, "ply_data_train0.h5", d0, np.array([0, 5, 1]))
    with pytest.raises(ValueError, match=r"ply_data_train0.h5: dataset 'label' row 1: expected a class index in \[0, 3\)"):
        load_modelnet_h5(r, "train")
    with h5py.File(r / "ply_data_train0.h5", "w") as f:
        f["points"] = d0
    with pytest.raises(ValueError, match=r"ply_data_train0.h5: missing dataset 'data'"):
        load_modelnet_h5(r, "train")
    write_h5(r, "ply_data_train0.h5", d0[..., :2].copy(), np.array([0, 1, 1]))
    with pytest.raises(ValueError, match=r"dataset 'data' must be numeric of shape \(S, N, 3\)"):
        load_modelnet_h5(r, "train")
    (r / "train_files.txt").write_text("ply_data_train7.h5\n")
    with pytest.raises(ValueError, match=r"train_files.txt: listed file 'ply_data_train7.h5' \(entry 1\) not found"):
        load_modelnet_h5(r, "train")
    (r / "ply_data_train7.h5").write_text("not hdf5")
    with pytest.raises(ValueError, match="ply_data_train7.h5: not a readable HDF5 file"):
        load_modelnet_h5(r, "train")
