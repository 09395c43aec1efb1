"""LRA Pathfinder: are the two marked dots joined by one dashed curve? The released images and a
generator that stands in for them.

**Released format** (:func:`load_pathfinder_release`): one difficulty folder of LRA's release, e.g.
``lra_release/pathfinder32/curv_contour_length_14``, holding ``metadata/*.npy`` -- despite the name,
text files with one line per image, fields separated by spaces: the image's sub-folder and file name
(``imgs/0 sample_0.png``), a field this reader does not use, and the label (0 or 1) as the fourth
field -- and the grey-level PNG images they name. Empty image files (the release has a few) are
skipped, as LRA's own pipeline does. The images are shuffled (seeded) and cut 80 / 10 / 10 % into
train / val / test, the split LRA's preprocessing uses. PNGs are decoded by :func:`read_png`
(8-bit grey, grey + alpha, RGB or RGBA, not interlaced; no imaging library needed).

**Generated stand-in** (:func:`generate_pathfinder`, after the published algorithm of Linsley et al.,
2018, written here from its description): every image holds two long curves and a few short
distractor curves, each a chain of short straight dashes ("paddles") whose direction turns by at
most ``max_turn`` between paddles, with gaps between paddles so that no pixel neighbourhood traces a
curve; curves keep a margin of one pixel from each other. Two dots mark curve ends: both ends of the
same long curve (label 1) or one end of each long curve (label 0); curves are grey
(:data:`CURVE_LEVEL`), dots white. The classes differ only in which
ends are marked, so deciding needs to follow a curve along its paddles across the image: pixels that
are ``contour_length`` paddles apart. What it keeps of the release: 32 × 32 grey images (1,024-token
sequences), dashed curves of the three difficulties' lengths (6, 9 and 14 paddles), distractors,
balanced labels. What it cannot: the release's exact rendering (anti-aliased paddles of set width
and spacing, its distractor statistics) and its size (200k images per difficulty).
"""
from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

__all__ = ["PathfinderParams", "generate_pathfinder", "STANDIN_SIZES", "load_generated_pathfinder", "read_png", "write_png", "load_pathfinder_release",
           "RELEASE_FRACTIONS", "CURVE_LEVEL"]

#: Grey level of the curves; the end markers are white (255), so that finding them is easy and the task
#: is the curve between them.
CURVE_LEVEL = 160

#: train / val / test fractions of the released images (LRA's preprocessing: 80 / 10 / 10 %).
RELEASE_FRACTIONS = (0.8, 0.1, 0.1)


@dataclass(frozen=True)
class PathfinderParams:
    """Options of :func:`generate_pathfinder`.

    Attributes:
        size: image side in pixels (LRA: 32).
        contour_length: paddles per long curve (the release's difficulties: 6, 9, 14).
        paddle: length of a paddle in pixels; gap: empty length between two paddles.
        max_turn: largest change of direction between paddles, degrees.
        distractors: short curves per image, each of ``contour_length // 2`` paddles.
        dot_radius: radius of the end markers in pixels.
    """

    size: int = 32
    contour_length: int = 14
    paddle: float = 1.5
    gap: float = 1.5
    max_turn: float = 30.0
    distractors: int = 2
    dot_radius: float = 1.5

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or self.size < 16:
            raise ValueError(f"size: expected an image side of at least 16 pixels, got {self.size!r}")
        if not isinstance(self.contour_length, int) or self.contour_length < 2:
            raise ValueError(f"contour_length: expected at least 2 paddles, got {self.contour_length!r}")
        for name in ("paddle", "gap", "dot_radius"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: expected a positive length in pixels, got {getattr(self, name)!r}")
        if not 0 <= self.max_turn <= 90:
            raise ValueError(f"max_turn: expected degrees in [0, 90], got {self.max_turn!r}")
        if not isinstance(self.distractors, int) or self.distractors < 0:
            raise ValueError(f"distractors: expected a count >= 0, got {self.distractors!r}")


def _paddle_pixels(start: np.ndarray, end: np.ndarray, length: float) -> tuple[np.ndarray, np.ndarray]:
    """Rows and columns of the pixels on the segment start–end (sampled every quarter pixel)."""
    t = np.linspace(0.0, 1.0, int(np.ceil(length * 4)) + 1)[:, None]
    rc = np.rint(start + t * (end - start)).astype(int)
    return rc[:, 0], rc[:, 1]


def _curve(rng: np.random.Generator, p: PathfinderParams, paddles: int, taken: np.ndarray, tries: int = 50):
    """A dashed curve of ``paddles`` paddles clear of the pixels ``taken``: its pixels (a bool mask)
    and its two end points, or None when no placement was found. Each paddle turns by at most
    ``max_turn``; a paddle that would leave the image or touch ``taken`` is drawn again (up to 12
    times) before the curve is started afresh."""
    n = p.size
    lo, hi = 1.0, n - 2.0
    for _ in range(tries):
        pos = rng.uniform(lo + 2, hi - 2, 2)
        angle = rng.uniform(0, 2 * np.pi)
        start = pos.copy()
        mask = np.zeros((n, n), dtype=bool)
        for k in range(paddles):
            for _attempt in range(12):
                turn = np.deg2rad(rng.uniform(-p.max_turn, p.max_turn)) if k else 0.0
                a = angle + turn
                step = np.array([np.cos(a), np.sin(a)])
                s0 = pos + (p.gap * step if k else 0.0)
                e = s0 + p.paddle * step
                if not (lo <= e[0] <= hi and lo <= e[1] <= hi):
                    continue
                r, c = _paddle_pixels(s0, e, p.paddle)
                if taken[r, c].any():
                    continue
                mask[r, c] = True
                pos, angle = e, a
                break
            else:
                break
        else:
            return mask, start, pos
    return None


def _dilate(mask: np.ndarray) -> np.ndarray:
    out = mask.copy()
    out[1:] |= mask[:-1]
    out[:-1] |= mask[1:]
    out[:, 1:] |= out[:, :-1]
    out[:, :-1] |= out[:, 1:]
    return out


def _dot(img: np.ndarray, centre: np.ndarray, radius: float) -> None:
    rr, cc = np.mgrid[:img.shape[0], :img.shape[1]]
    img[(rr - centre[0]) ** 2 + (cc - centre[1]) ** 2 <= radius ** 2] = 255


def generate_pathfinder(count: int, params: PathfinderParams = PathfinderParams(),
                        seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``count`` images (count, size, size) uint8 and labels (count,) int64, alternating 1, 0, 1, …
    (balanced): label 1 when the two dots mark both ends of one curve. Seeded: the same ``seed`` and
    ``params`` give the same images."""
    if not isinstance(count, int) or count < 0:
        raise ValueError(f"count: expected a number of images >= 0, got {count!r}")
    p = params
    rng = np.random.default_rng([int(seed), 1018])
    images = np.zeros((count, p.size, p.size), dtype=np.uint8)
    labels = np.zeros(count, dtype=np.int64)
    i = 0
    while i < count:
        taken = np.zeros((p.size, p.size), dtype=bool)
        curves = []
        for length in [p.contour_length] * 2 + [max(2, p.contour_length // 2)] * p.distractors:
            c = _curve(rng, p, length, taken)
            if c is None:
                break
            curves.append(c)
            taken |= _dilate(c[0])
        if len(curves) < 2 + p.distractors:
            continue  # a crowded draw: start the image again
        img = np.zeros((p.size, p.size), dtype=np.uint8)
        for mask, _, _ in curves:
            img[mask] = CURVE_LEVEL
        positive = i % 2 == 0
        (_, a0, a1), (_, b0, b1) = curves[0], curves[1]
        _dot(img, a0, p.dot_radius)
        _dot(img, a1 if positive else (b1 if rng.random() < 0.5 else b0), p.dot_radius)
        images[i], labels[i] = img, int(positive)
        i += 1
    return images, labels


#: Images of the generated stand-in's train / val / test splits (the release: 160k / 20k / 20k).
STANDIN_SIZES = (2000, 250, 250)
GENERATOR_VERSION = 1


def load_generated_pathfinder(splits: Sequence[str] = ("train", "val", "test"), seed: int = 0,
                              sizes: Sequence[int] = STANDIN_SIZES, params: PathfinderParams = PathfinderParams(),
                              cache_dir: str | os.PathLike | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The generated stand-in's splits (images (N, H, W) uint8, labels (N,) int64), each split from its
    own seed; cached under ``cache_dir`` (default: the package's data cache) since generating takes
    about 0.1 s an image."""
    from dataclasses import asdict

    from .cache import cached_arrays, default_cache_dir

    if len(sizes) != 3 or any(not isinstance(n, int) or n < 1 for n in sizes):
        raise ValueError(f"sizes: expected three image counts >= 1 (train, val, test), got {list(sizes)}")
    out = {}
    for k, split in enumerate(("train", "val", "test")):
        if split not in splits:
            continue
        key = {"version": GENERATOR_VERSION, "seed": int(seed), "split": split, "count": int(sizes[k]), **asdict(params)}
        arr = cached_arrays(cache_dir if cache_dir is not None else default_cache_dir(), "pathfinder", key,
                            lambda k=k: dict(zip(("images", "labels"),
                                                 generate_pathfinder(int(sizes[k]), params, seed * 3 + k))))
        out[split] = (arr["images"], arr["labels"])
    return out


# ---------------------------------------------------------------------------------- PNG
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}  # colour type -> samples per pixel


def _paeth(a: int, b: int, c: int) -> int:
    """PNG's Paeth predictor of a pixel from its left (a), upper (b) and upper-left (c) neighbours."""
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else (b if pb <= pc else c)


def read_png(path: str | os.PathLike) -> np.ndarray:
    """An 8-bit PNG as grey levels (H, W) uint8: grey (with or without alpha) as stored, RGB / RGBA as
    ``tf.image.rgb_to_grayscale`` weighs them; errors name the file and what is not supported."""
    data = Path(path).read_bytes()
    if not data.startswith(_PNG_SIGNATURE):
        raise ValueError(f"{path}: not a PNG file (no PNG signature)")
    pos, header, idat = 8, None, []
    try:
        while pos < len(data):
            length, kind = struct.unpack(">I4s", data[pos:pos + 8])
            body = data[pos + 8:pos + 8 + length]
            if len(body) != length:
                raise ValueError("truncated chunk")
            if kind == b"IHDR":
                header = struct.unpack(">IIBBBBB", body)
            elif kind == b"IDAT":
                idat.append(body)
            elif kind == b"IEND":
                break
            pos += 12 + length
        if header is None or not idat:
            raise ValueError("no IHDR or no IDAT chunk")
        width, height, depth, colour, _, _, interlace = header
        if depth != 8 or colour not in _CHANNELS or interlace != 0:
            raise ValueError(f"only 8-bit, non-interlaced grey/RGB(A) images are read (bit depth {depth}, colour "
                             f"type {colour}, interlace {interlace})")
        ch = _CHANNELS[colour]
        raw = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8)
        stride = width * ch
        if raw.size != height * (stride + 1):
            raise ValueError(f"image data of {raw.size} bytes for {width} x {height} x {ch}")
    except (struct.error, zlib.error, ValueError) as exc:
        raise ValueError(f"{path}: unreadable PNG: {exc}") from None
    rows = raw.reshape(height, stride + 1)
    out = np.zeros((height, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.uint8)
    for r in range(height):
        f, line = rows[r, 0], rows[r, 1:].copy()
        if f == 1 or f == 3 or f == 4:  # sub, average and Paeth need the reconstructed left neighbour
            for x in range(stride):
                left = line[x - ch] if x >= ch else 0
                if f == 1:
                    line[x] = (int(line[x]) + int(left)) & 0xFF
                elif f == 3:
                    line[x] = (int(line[x]) + ((int(left) + int(prev[x])) >> 1)) & 0xFF
                else:
                    ul = prev[x - ch] if x >= ch else 0
                    line[x] = (int(line[x]) + _paeth(int(left), int(prev[x]), int(ul))) & 0xFF
        elif f == 2:
            line = (line.astype(np.int16) + prev).astype(np.uint8)
        elif f != 0:
            raise ValueError(f"{path}: unreadable PNG: unknown row filter {f}")
        out[r], prev = line, line
    pix = out.reshape(height, width, ch)
    if ch in (1, 2):
        return pix[..., 0].copy()
    rgb = pix[..., :3].astype(np.float64)
    return np.rint(rgb @ np.array([0.2989, 0.5870, 0.1140])).clip(0, 255).astype(np.uint8)


def write_png(path: str | os.PathLike, image: np.ndarray) -> None:
    """Write grey levels (H, W) uint8 as an 8-bit grey PNG (row filter 0); for tests and stand-in files."""
    img = np.asarray(image)
    if img.ndim != 2 or img.dtype != np.uint8:
        raise ValueError(f"image: expected grey levels (H, W) uint8, got {img.dtype} {img.shape}")

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + row.tobytes() for row in img)
    Path(path).write_bytes(_PNG_SIGNATURE + chunk(b"IHDR", struct.pack(">IIBBBBB", img.shape[1], img.shape[0], 8, 0, 0,
                                                                          0, 0))
                           + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


# ---------------------------------------------------------------------------------- the release
def load_pathfinder_release(root: str | os.PathLike, splits: Sequence[str] = ("train", "val", "test"),
                            seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The images (N, H, W) uint8 and labels (N,) int64 of each split of one released difficulty folder
    (module doc): every ``metadata/*.npy`` line's image, shuffled (seeded) and cut 80 / 10 / 10 %."""
    root = Path(root).expanduser()
    meta = sorted((root / "metadata").glob("*.npy")) if (root / "metadata").is_dir() else []
    if not meta:
        raise ValueError(f"data.root: {root} has no metadata/*.npy files (expected one difficulty folder of LRA's "
                         "Pathfinder release, e.g. pathfinder32/curv_contour_length_14)")
    items: list[tuple[Path, int]] = []
    for m in meta:
        for n, line in enumerate(m.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            f = line.split()
            if len(f) < 4 or f[3] not in ("0", "1"):
                raise ValueError(f"{m}:{n}: expected 'folder file field label' with label 0 or 1, got {line!r}")
            items.append((root / f[0] / f[1], int(f[3])))
    images, labels = [], []
    for path, label in items:
        if not path.is_file():
            raise ValueError(f"data.root: {path} is named in the metadata but missing")
        if path.stat().st_size == 0:
            continue  # the release's empty files, skipped as LRA's pipeline does
        img = read_png(path)
        if images and img.shape != images[0].shape:
            raise ValueError(f"{path}: image of {img.shape}, the others are {images[0].shape}")
        images.append(img)
        labels.append(label)
    if not images:
        raise ValueError(f"data.root: {root}: every image named in its metadata is empty")
    order = np.random.default_rng([int(seed), 32]).permutation(len(images))
    cuts = np.round(np.cumsum(RELEASE_FRACTIONS)[:2] * len(order)).astype(int)
    parts = dict(zip(("train", "val", "test"), np.split(order, cuts)))
    x, y = np.stack(images), np.asarray(labels, dtype=np.int64)
    return {s: (x[parts[s]], y[parts[s]]) for s in splits}
