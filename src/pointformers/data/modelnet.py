"""ModelNet40 readers: the ``modelnet40_normal_resampled`` text layout and PointNet's HDF5 files.

``modelnet40_normal_resampled`` (PointNet++):

* ``modelnet40_shape_names.txt``: the 40 class names, one per line (label = line order);
* ``modelnet40_train.txt`` / ``modelnet40_test.txt``: shape ids such as ``night_stand_0001``
  (class = the id without its ``_NNNN`` suffix);
* ``<class>/<id>.txt``: 10,000 lines ``x,y,z,nx,ny,nz``.
  (ModelNet10 uses the same layout with ``modelnet10_*`` list files.)

``modelnet40_ply_hdf5_2048`` (PointNet): ``train_files.txt`` / ``test_files.txt`` list HDF5
files (paths are resolved relative to the folder, else by base name); each holds ``data``
(S, 2048, 3) float, ``label`` (S,) or (S, 1) int and optionally ``normal`` (S, 2048, 3);
``shape_names.txt`` names the classes.

Preparation (as the papers' pipelines do): ``num_points`` points per shape chosen by
farthest point sampling (SAMSA/SFT: 1,024 FPS points; ``sampling="first"`` takes the first
points as PointNet++'s default loader does, ``"random"`` a seeded random subset), then
``normalize``: centre on the centroid and scale to unit max radius (PointNet++
``pc_normalize``). Malformed files raise ValueError naming the file and line (or HDF5
dataset and row). ``cache_dir`` caches the prepared set keyed by the options and the size
and mtime of every file read.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Sequence

import numpy as np

from .cache import cached_arrays
from .clouds import ShapeCloud, ShapeCloudSet, pack_clouds, unpack_clouds
from .point_ops import fps_numpy
from .textio import read_name_list, read_numeric_table

__all__ = ["read_modelnet_txt", "load_modelnet_normal_resampled", "load_modelnet_h5", "prepare_points",
           "SAMPLINGS"]

SAMPLINGS = ("fps", "first", "random", "all")
_ID = re.compile(r"^(?P<cls>.+)_(?P<num>\d+)$")


def read_modelnet_txt(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Points (n, 3) and normals (n, 3), float32, of one ``x,y,z,nx,ny,nz`` file."""
    arr = read_numeric_table(path, 6, ",", "x,y,z,nx,ny,nz")
    return arr[:, :3].astype(np.float32), arr[:, 3:].astype(np.float32)


def prepare_points(points: np.ndarray, num_points: int | None, sampling: str, normalize: bool,
                   seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Choose ``num_points`` indices of one cloud and return (indices, normalised points).

    ``fps``: farthest point sampling from the first point; ``first``: the first points;
    ``random``: a seeded subset (with replacement only when the cloud is too small, as the
    ShapeNetPart loaders do); ``all``/``None``: every point. Normalisation uses the chosen
    points (centroid, unit max radius).
    """
    n = len(points)
    if sampling not in SAMPLINGS:
        raise ValueError(f"sampling: expected one of {list(SAMPLINGS)}, got {sampling!r}")
    if num_points is None or sampling == "all":
        idx = np.arange(n)
    elif sampling == "random":
        rng = np.random.default_rng(seed)
        idx = rng.choice(n, size=num_points, replace=n < num_points)
    elif n < num_points:
        # Too few points for a subset: take all, then repeat a seeded random choice.
        idx = np.r_[np.arange(n), np.random.default_rng(seed).choice(n, num_points - n)]
    elif sampling == "first":
        idx = np.arange(num_points)
    else:
        idx = fps_numpy(points, num_points)
    p = points[idx].astype(np.float64)
    if normalize:
        p = p - p.mean(0)
        r = np.linalg.norm(p, axis=1).max()
        if r > 0:
            p = p / r
    return idx, p.astype(np.float32)


def check_sampling_options(num_points: int | None, sampling: str) -> None:
    if num_points is not None and (isinstance(num_points, bool) or not isinstance(num_points, (int, np.integer))
                                   or num_points < 1):
        raise ValueError(f"num_points: expected an integer >= 1 or None, got {num_points!r}")
    if sampling not in SAMPLINGS:
        raise ValueError(f"sampling: expected one of {list(SAMPLINGS)}, got {sampling!r}")


def files_fingerprint(paths: Sequence[Path]) -> list:
    out = []
    for p in paths:
        st = p.stat()
        out.append([str(p), st.st_size, st.st_mtime_ns])
    return out


def _cached(cache_dir, prefix: str, key: dict, files: Sequence[Path], build) -> ShapeCloudSet:
    if cache_dir is None:
        return build()
    key = dict(key, files=files_fingerprint(files))
    arrays = cached_arrays(Path(cache_dir) / "modelnet", prefix, key, lambda: pack_clouds(build()))
    return unpack_clouds(arrays)


def load_modelnet_normal_resampled(
    root: str | os.PathLike,
    split: str,
    num_points: int | None = 1024,
    sampling: str = "fps",
    normalize: bool = True,
    use_normals: bool = True,
    variant: str = "modelnet40",
    cache_dir: str | os.PathLike | None = None,
    seed: int = 0,
) -> ShapeCloudSet:
    """The ``split`` ("train" | "test") shapes of a ``modelnet40_normal_resampled`` folder."""
    root = Path(root)
    if split not in ("train", "test"):
        raise ValueError(f"split: expected 'train' or 'test' (ModelNet has no val list), got {split!r}")
    if variant not in ("modelnet40", "modelnet10"):
        raise ValueError(f"variant: expected 'modelnet40' or 'modelnet10', got {variant!r}")
    check_sampling_options(num_points, sampling)
    if not root.is_dir():
        raise ValueError(f"root: {root} is not a folder")
    names_file = root / f"{variant}_shape_names.txt"
    list_file = root / f"{variant}_{split}.txt"
    classes = read_name_list(names_file, "class name")
    if len(set(classes)) != len(classes):
        raise ValueError(f"{names_file}: class names must be distinct")
    class_index = {c: i for i, c in enumerate(classes)}
    entries = []
    if not list_file.is_file():
        raise ValueError(f"{list_file}: file not found (expected the {split} shape list)")
    try:
        list_lines = list_file.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        line = list_file.read_bytes()[: e.start].count(b"\n") + 1
        raise ValueError(f"file {list_file}: not UTF-8 text (line {line})") from None
    for i, ln in enumerate(list_lines, start=1):
        sid = ln.strip()
        if not sid:
            continue
        m = _ID.match(sid)
        if m is None or m.group("cls") not in class_index:
            raise ValueError(f"{list_file}:{i}: expected a shape id '<class>_<number>' with a class from "
                             f"{names_file.name}, got {sid!r}")
        path = root / m.group("cls") / f"{sid}.txt"
        if not path.is_file():
            raise ValueError(f"{list_file}:{i}: listed shape file {path} does not exist")
        entries.append((sid, class_index[m.group("cls")], path))
    if not entries:
        raise ValueError(f"{list_file}: empty file, expected one shape id '<class>_<number>' per line")

    def build() -> ShapeCloudSet:
        clouds = []
        for j, (sid, label, path) in enumerate(entries):
            pts, nrm = read_modelnet_txt(path)
            idx, p = prepare_points(pts, num_points, sampling, normalize, seed=seed + j)
            clouds.append(ShapeCloud(p, nrm[idx] if use_normals else None, label, None, sid))
        return ShapeCloudSet(clouds, tuple(classes), meta={"source": f"{variant}_normal_resampled", "split": split})

    key = {"reader": "modelnet_normal_resampled", "version": 1, "root": str(root.resolve()), "split": split,
           "num_points": num_points, "sampling": sampling, "normalize": normalize, "use_normals": use_normals,
           "variant": variant, "seed": seed}
    return _cached(cache_dir, f"{variant}-{split}", key, [names_file, list_file] + [e[2] for e in entries], build)


def _resolve_h5(root: Path, entry: str) -> Path | None:
    for cand in (root / entry, root / Path(entry).name):
        if cand.is_file():
            return cand
    return None


def load_modelnet_h5(
    root: str | os.PathLike,
    split: str,
    num_points: int | None = 1024,
    sampling: str = "first",
    normalize: bool = False,
    use_normals: bool = True,
    cache_dir: str | os.PathLike | None = None,
    seed: int = 0,
) -> ShapeCloudSet:
    """The ``split`` ("train" | "test") shapes of PointNet's ``modelnet40_ply_hdf5_2048`` folder.

    The files are already centred and unit-sphere scaled; ``sampling="first"`` with 1024
    points is PointNet's protocol. Normals are returned when the files have ``normal`` and
    ``use_normals`` is set.
    """
    try:
        import h5py
    except ImportError as e:  # pragma: no cover - h5py is in the io extra
        raise ImportError("load_modelnet_h5 needs h5py (pip install 'pointformers[io]')") from e
    root = Path(root)
    if split not in ("train", "test"):
        raise ValueError(f"split: expected 'train' or 'test', got {split!r}")
    check_sampling_options(num_points, sampling)
    list_file = root / f"{split}_files.txt"
    names_file = root / "shape_names.txt"
    classes = read_name_list(names_file, "class name")
    files = []
    for i, entry in enumerate(read_name_list(list_file, "HDF5 file path"), start=1):
        p = _resolve_h5(root, entry)
        if p is None:
            raise ValueError(f"{list_file}: listed file {entry!r} (entry {i}) not found in {root}")
        files.append(p)

    def build() -> ShapeCloudSet:
        clouds = []
        for path in files:
            try:
                f = h5py.File(path, "r")
            except OSError as e:
                raise ValueError(f"{path}: not a readable HDF5 file ({e})") from None
            with f:
                for name in ("data", "label"):
                    if name not in f:
                        raise ValueError(f"{path}: missing dataset {name!r} (found {sorted(f.keys())})")
                data = np.asarray(f["data"])
                label = np.asarray(f["label"])
                normal = np.asarray(f["normal"]) if "normal" in f and use_normals else None
            if data.ndim != 3 or data.shape[2] != 3 or not np.issubdtype(data.dtype, np.number):
                raise ValueError(f"{path}: dataset 'data' must be numeric of shape (S, N, 3), got {data.shape} {data.dtype}")
            if label.ndim == 2 and label.shape[1] == 1:
                label = label[:, 0]
            if label.shape != (data.shape[0],) or not np.issubdtype(label.dtype, np.integer):
                raise ValueError(f"{path}: dataset 'label' must be integers of shape ({data.shape[0]},) or "
                                 f"({data.shape[0]}, 1), got {label.shape} {label.dtype}")
            if normal is not None and normal.shape != data.shape:
                raise ValueError(f"{path}: dataset 'normal' must have the shape of 'data' {data.shape}, got {normal.shape}")
            for r in range(data.shape[0]):
                if not 0 <= label[r] < len(classes):
                    raise ValueError(f"{path}: dataset 'label' row {r}: expected a class index in "
                                     f"[0, {len(classes)}), got {int(label[r])}")
                if not np.isfinite(data[r]).all() or (normal is not None and not np.isfinite(normal[r]).all()):
                    raise ValueError(f"{path}: dataset 'data'/'normal' row {r}: expected finite values, got NaN or inf")
                idx, p = prepare_points(data[r].astype(np.float32), num_points, sampling, normalize,
                                        seed=seed + len(clouds))
                clouds.append(ShapeCloud(p, None if normal is None else normal[r][idx], int(label[r]), None,
                                         f"{path.stem}/{r}"))
        return ShapeCloudSet(clouds, tuple(classes), meta={"source": "modelnet40_ply_hdf5_2048", "split": split})

    key = {"reader": "modelnet_h5", "version": 1, "root": str(root.resolve()), "split": split,
           "num_points": num_points, "sampling": sampling, "normalize": normalize, "use_normals": use_normals,
           "seed": seed}
    return _cached(cache_dir, f"modelnet40h5-{split}", key, [names_file, list_file, *files], build)
