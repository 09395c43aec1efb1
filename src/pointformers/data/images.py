"""Image classification data: scikit-learn's bundled digits, IDX files (MNIST, Fashion-MNIST) and
``.npz`` arrays, cut into patches for a ViT-style model.

* **digits** (:func:`load_digits_sets`): the 1,797 grey-scale 8 × 8 handwritten digits that
  scikit-learn ships (UCI "Optical Recognition of Handwritten Digits", values 0-16 scaled to [0, 1]),
  real data available offline; split per class, seeded, into train / val / test
  (``fractions``, default 60 / 20 / 20 %).
* **IDX** (:func:`read_idx`, :func:`load_idx_sets`): the released format of MNIST and of
  Fashion-MNIST -- one of the FLT paper's ViT data sets -- (``train-images-idx3-ubyte`` and
  ``train-labels-idx1-ubyte``, ``t10k-…`` for the test split; ``.gz`` too). The validation split
  is the last ``val_fraction`` of the training file's images (the file's order, not shuffled).
* **npz** (:func:`load_npz_sets`): ``{split}.npz`` files in a folder, each with ``images`` (N, H, W)
  or (N, H, W, C) -- uint8 (0-255) or float in [0, 1] -- and integer ``labels`` (N,); for any
  other released set converted to arrays.
* **CIFAR-10 binary** (:func:`read_cifar10_bin`, :func:`load_cifar10_sets`): the released
  ``cifar-10-batches-bin`` folder (``data_batch_1.bin`` … ``data_batch_5.bin``, ``test_batch.bin``;
  records of one label byte and 3,072 pixel bytes, R, G, B planes of 32 × 32), the source of LRA's
  Image task; read without pickle (the Python version of the release is pickled).

:func:`grey_levels` gives 8-bit grey pixels as LRA's Image task feeds them (RGB weighted as
``tf.image.rgb_to_grayscale``: 0.2989, 0.5870, 0.1140) and :func:`upscale` repeats pixels
(nearest neighbour), which turns the 8 × 8 digits into 32 × 32 images of LRA Image's length.

:func:`patchify` turns images (N, H, W, C) into patch tokens (N, P, p·p·C) in raster order with
their positions: the raster index (ℓ = 1, the FLT paper's r_j = j for ViT) or (row, column) of
the patch (ℓ = 2, an option the spec suggests).
"""
from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

__all__ = ["SPLITS", "IDX_FILES", "ImageSet", "load_digits_sets", "read_idx", "write_idx", "load_idx_sets",
           "load_npz_sets", "CIFAR10_BIN_FILES", "read_cifar10_bin", "load_cifar10_sets", "grey_levels", "upscale",
           "patchify", "patch_positions"]

SPLITS = ("train", "val", "test")
#: IDX file stems of MNIST / Fashion-MNIST: (images, labels) of the training and the test file.
IDX_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
             "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
#: Files of the released CIFAR-10 binary version (``cifar-10-batches-bin``).
CIFAR10_BIN_FILES = {"train": tuple(f"data_batch_{i}.bin" for i in range(1, 6)), "test": ("test_batch.bin",)}
_CIFAR_RECORD = 1 + 3 * 32 * 32
#: RGB -> grey weights of ``tf.image.rgb_to_grayscale`` (ITU-R 601), as LRA's Image pipeline uses them.
GREY_WEIGHTS = (0.2989, 0.5870, 0.1140)
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
               0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


@dataclass
class ImageSet:
    """Images (N, H, W, C) float32 in [0, 1] and labels (N,) int64 of one split."""

    images: np.ndarray
    labels: np.ndarray

    def __post_init__(self) -> None:
        if self.images.ndim != 4 or self.labels.shape != (self.images.shape[0],):
            raise ValueError(f"images/labels: expected (N, H, W, C) and (N,), got {self.images.shape} and "
                             f"{self.labels.shape}")

    def __len__(self) -> int:
        return int(self.images.shape[0])


def _as_images(images: np.ndarray, what: str) -> np.ndarray:
    """(N, H, W) or (N, H, W, C) uint8 or float -> float32 (N, H, W, C) in [0, 1]."""
    a = np.asarray(images)
    if a.ndim == 3:
        a = a[..., None]
    if a.ndim != 4 or min(a.shape) < 1:
        raise ValueError(f"{what}: expected images (N, H, W) or (N, H, W, C), got shape {a.shape}")
    if a.dtype == np.uint8:
        return a.astype(np.float32) / 255.0
    if not np.issubdtype(a.dtype, np.floating):
        raise ValueError(f"{what}: expected uint8 (0-255) or float ([0, 1]) pixels, got {a.dtype}")
    a = a.astype(np.float32)
    if not np.isfinite(a).all() or a.min() < 0 or a.max() > 1:
        raise ValueError(f"{what}: float pixels must be finite and in [0, 1], got range [{a.min()}, {a.max()}]")
    return a


def _as_labels(labels: np.ndarray, n: int, what: str) -> np.ndarray:
    lab = np.asarray(labels)
    if lab.shape != (n,) or not np.issubdtype(lab.dtype, np.integer) or (n and lab.min() < 0):
        raise ValueError(f"{what}: expected {n} non-negative integer labels, got {lab.dtype} {lab.shape}")
    return lab.astype(np.int64)


def _stratified(labels: np.ndarray, fractions: Sequence[float], seed: int) -> list[np.ndarray]:
    """Indices of each split: every class's items shuffled (seeded) and cut by ``fractions``."""
    rng = np.random.default_rng([int(seed), 8, 8])
    parts: list[list[np.ndarray]] = [[] for _ in fractions]
    cuts = np.cumsum(fractions)[:-1]
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        for i, chunk in enumerate(np.split(idx, np.round(cuts * len(idx)).astype(int))):
            parts[i].append(chunk)
    return [np.sort(np.concatenate(p)) for p in parts]


def load_digits_sets(seed: int = 0, fractions: Sequence[float] = (0.6, 0.2, 0.2)) -> dict[str, ImageSet]:
    """scikit-learn's bundled 8 × 8 digits (10 classes), split per class by ``fractions`` (seeded)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError("data.format 'digits' needs scikit-learn (pip install 'pointformers[tasks]')") from None
    f = [float(x) for x in fractions]
    if len(f) != 3 or min(f) <= 0 or abs(sum(f) - 1) > 1e-9:
        raise ValueError(f"fractions: expected three positive fractions summing to 1, got {list(fractions)}")
    d = load_digits()
    images = (d.images / 16.0).astype(np.float32)[..., None]
    labels = d.target.astype(np.int64)
    return {s: ImageSet(images[i], labels[i]) for s, i in zip(SPLITS, _stratified(labels, f, seed))}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """An IDX file (MNIST's format; ``.gz`` read as gzip): magic 0 0 <type> <ndim>, the dimensions as
    big-endian int32, then the values. ValueError naming the file if it is malformed or truncated."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: file not found (expected an IDX file)")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as exc:
        raise ValueError(f"{path}: cannot be read as {'gzip' if opener is gzip.open else 'IDX'} ({exc})") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES or data[3] < 1:
        raise ValueError(f"{path}: not an IDX file (expected magic bytes 0 0 <type> <ndim>)")
    ndim, dtype = data[3], np.dtype(_IDX_DTYPES[data[2]])
    if len(data) < 4 + 4 * ndim:
        raise ValueError(f"{path}: truncated IDX header")
    shape = tuple(int(v) for v in np.frombuffer(data, ">u4", ndim, 4))
    need = int(np.prod(shape)) * dtype.itemsize
    body = data[4 + 4 * ndim:]
    if len(body) != need:
        raise ValueError(f"{path}: expected {need} bytes of values for shape {shape}, got {len(body)} (truncated?)")
    return np.frombuffer(body, dtype).reshape(shape).astype(dtype.newbyteorder("="))


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
    """Write ``array`` (uint8) as an IDX file (gzip when the name ends in ``.gz``)."""
    a = np.ascontiguousarray(array, dtype=np.uint8)
    head = bytes([0, 0, 0x08, a.ndim]) + np.asarray(a.shape, ">u4").tobytes()
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(head + a.tobytes())


def _idx_file(root: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz"):
        if (root / name).is_file():
            return root / name
    raise ValueError(f"data.root: neither {root / stem} nor {root / (stem + '.gz')} found (MNIST / Fashion-MNIST "
                     "IDX files expected)")


def _split_of(images: np.ndarray, labels: np.ndarray, split: str, val_fraction: float) -> ImageSet:
    """``split`` of a released file pair: the test file as it is; of the training file, "val" is the last
    ``val_fraction`` of its images (in file order, at least one) and "train" the rest."""
    if split == "test":
        return ImageSet(images, labels)
    cut = len(labels) - max(1, int(round(val_fraction * len(labels))))
    sl = slice(cut, None) if split == "val" else slice(0, cut)
    return ImageSet(images[sl], labels[sl])


def load_idx_sets(root: str | os.PathLike, splits: Sequence[str] = SPLITS,
                  val_fraction: float = 1 / 12) -> dict[str, ImageSet]:
    """MNIST-format IDX files in ``root``; val = the last ``val_fraction`` of the training images."""
    root = Path(root).expanduser()
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction: expected a fraction in (0, 1), got {val_fraction!r}")
    out: dict[str, ImageSet] = {}
    files = {}
    for s in splits:
        key = "test" if s == "test" else "train"
        if key not in files:
            img_path, lab_path = (_idx_file(root, stem) for stem in IDX_FILES[key])
            images = read_idx(img_path)
            if images.ndim != 3 or images.dtype != np.uint8:
                raise ValueError(f"{img_path}: expected uint8 images (N, H, W), got {images.dtype} {images.shape}")
            labels = _as_labels(read_idx(lab_path), images.shape[0], str(lab_path))
            files[key] = (_as_images(images, str(img_path)), labels)
        out[s] = _split_of(*files[key], s, val_fraction)
    return out


def load_npz_sets(root: str | os.PathLike, splits: Sequence[str] = SPLITS) -> dict[str, ImageSet]:
    """``root/{split}.npz`` with arrays ``images`` and ``labels`` (module doc)."""
    root = Path(root).expanduser()
    out = {}
    for s in splits:
        path = root / f"{s}.npz"
        if not path.is_file():
            raise ValueError(f"data.root: {path} not found (expected {', '.join(f'{x}.npz' for x in SPLITS)})")
        try:
            with np.load(path, allow_pickle=False) as z:
                if "images" not in z or "labels" not in z:
                    raise ValueError(f"{path}: expected arrays 'images' and 'labels', got {sorted(z.files)}")
                images = _as_images(z["images"], f"{path}: images")
                out[s] = ImageSet(images, _as_labels(z["labels"], images.shape[0], f"{path}: labels"))
        except (OSError, EOFError) as exc:
            raise ValueError(f"{path}: not a readable .npz file ({exc})") from None
    return out


def read_cifar10_bin(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR-10 binary batch file -> images uint8 (N, 32, 32, 3), labels int64 (N,). ValueError
    naming the file if its size is not a whole number of 3,073-byte records or a label is not 0-9."""
    path = Path(path)
    try:
        raw = np.fromfile(path, dtype=np.uint8)
    except OSError as exc:
        raise ValueError(f"{path}: not readable ({exc})") from None
    if raw.size == 0 or raw.size % _CIFAR_RECORD:
        raise ValueError(f"{path}: {raw.size} bytes is not a whole number of CIFAR-10 records of {_CIFAR_RECORD} "
                         "bytes (truncated, or not a cifar-10-batches-bin file)")
    rec = raw.reshape(-1, _CIFAR_RECORD)
    labels = rec[:, 0].astype(np.int64)
    if labels.max() > 9:
        bad = int(np.flatnonzero(labels > 9)[0])
        raise ValueError(f"{path}: record {bad} has label {int(labels[bad])} (CIFAR-10 labels are 0-9)")
    images = rec[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels


def load_cifar10_sets(root: str | os.PathLike, splits: Sequence[str] = SPLITS,
                      val_fraction: float = 0.1) -> dict[str, ImageSet]:
    """The ``cifar-10-batches-bin`` folder ``root``; val = the last ``val_fraction`` of the training images."""
    root = Path(root).expanduser()
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction: expected a fraction in (0, 1), got {val_fraction!r}")
    out: dict[str, ImageSet] = {}
    files: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for s in splits:
        key = "test" if s == "test" else "train"
        if key not in files:
            parts = []
            for name in CIFAR10_BIN_FILES[key]:
                if not (root / name).is_file():
                    raise ValueError(f"data.root: {root / name} not found (the cifar-10-batches-bin release expected)")
                parts.append(read_cifar10_bin(root / name))
            files[key] = (_as_images(np.concatenate([p[0] for p in parts]), str(root)),
                          np.concatenate([p[1] for p in parts]))
        out[s] = _split_of(*files[key], s, val_fraction)
    return out


def grey_levels(images: np.ndarray) -> np.ndarray:
    """Images (N, H, W, C) in [0, 1] with C = 1 or 3 -> 8-bit grey levels (N, H, W) uint8 (RGB weighted by
    :data:`GREY_WEIGHTS`), rounded to the nearest level."""
    a = np.asarray(images, np.float32)
    if a.ndim != 4 or a.shape[3] not in (1, 3):
        raise ValueError(f"images: expected (N, H, W, 1) or (N, H, W, 3), got shape {a.shape}")
    grey = a[..., 0] if a.shape[3] == 1 else a @ np.asarray(GREY_WEIGHTS, np.float32)
    return np.clip(np.rint(grey * 255.0), 0, 255).astype(np.uint8)


def upscale(images: np.ndarray, factor: int) -> np.ndarray:
    """Every pixel repeated ``factor`` × ``factor`` times (nearest neighbour): (N, H, W, …) -> (N, fH, fW, …)."""
    if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
        raise ValueError(f"factor: expected a positive integer, got {factor!r}")
    return np.repeat(np.repeat(np.asarray(images), factor, axis=1), factor, axis=2)


def patch_positions(h: int, w: int, patch: int, positions: str = "raster") -> np.ndarray:
    """Positions of the (h/p)·(w/p) patches in raster order: (P, 1) raster index or (P, 2) (row, col)."""
    rows, cols = h // patch, w // patch
    r, c = np.divmod(np.arange(rows * cols), cols)
    if positions == "raster":
        return np.arange(rows * cols, dtype=np.float32)[:, None]
    if positions == "grid":
        return np.stack([r, c], 1).astype(np.float32)
    raise ValueError(f"positions: expected 'raster' or 'grid', got {positions!r}")


def patchify(images: np.ndarray, patch: int) -> np.ndarray:
    """(N, H, W, C) -> (N, P, p·p·C) non-overlapping p × p patches in raster order (H, W multiples of p)."""
    N, H, W, C = images.shape
    if isinstance(patch, bool) or not isinstance(patch, (int, np.integer)) or patch < 1 or H % patch or W % patch:
        raise ValueError(f"patch: expected a positive divisor of the image size {H} x {W}, got {patch!r}")
    p = int(patch)
    x = images.reshape(N, H // p, p, W // p, p, C).transpose(0, 1, 3, 2, 4, 5)
    return np.ascontiguousarray(x.reshape(N, (H // p) * (W // p), p * p * C))
