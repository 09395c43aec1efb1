"""ShapeNetPart reader: the ``shapenetcore_partanno_segmentation_benchmark_v0_normal`` layout.

* ``synsetoffset2category.txt``: lines ``<Category>\\t<synset>`` (e.g. ``Airplane\\t02691156``);
  categories are indexed in the file's order (alphabetical in the release);
* ``<synset>/<shape id>.txt``: lines ``x y z nx ny nz part`` (part: an integer-valued number
  among the category's global part ids);
* ``train_test_split/shuffled_{train,val,test}_file_list.json``: JSON lists of
  ``"shape_data/<synset>/<shape id>"``.

The 16 categories own 50 parts in contiguous blocks (:data:`CATEGORY_PARTS`, the standard
mapping used by PointNet++ and its successors); a part id outside the shape's category is
rejected. Point selection: ``num_points=2500`` with ``sampling="random"`` (PointNet++'s
seeded choice, with replacement only when a shape has fewer points) or ``None`` / ``"all"``
for every point (SAMSA: "initial 2,500 point-normal ... without any change"); ``normalize``
centres on the centroid and scales to unit max radius. Errors name the file and line.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from .cache import cached_arrays
from .clouds import ShapeCloud, ShapeCloudSet, pack_clouds, unpack_clouds
from .modelnet import check_sampling_options, files_fingerprint, prepare_points
from .textio import read_numeric_table

__all__ = ["CATEGORIES", "CATEGORY_PARTS", "PART_NAMES", "read_shapenetpart_txt", "load_shapenetpart"]

#: (category, synset) in the release's order.
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("Airplane", "02691156"), ("Bag", "02773838"), ("Cap", "02954340"), ("Car", "02958343"),
    ("Chair", "03001627"), ("Earphone", "03261776"), ("Guitar", "03467517"), ("Knife", "03624134"),
    ("Lamp", "03636649"), ("Laptop", "03642806"), ("Motorbike", "03790512"), ("Mug", "03797390"),
    ("Pistol", "03948459"), ("Rocket", "04099429"), ("Skateboard", "04225987"), ("Table", "04379243"),
)
#: Global part ids of each category (50 in all).
CATEGORY_PARTS: dict[str, tuple[int, ...]] = {
    "Airplane": (0, 1, 2, 3), "Bag": (4, 5), "Cap": (6, 7), "Car": (8, 9, 10, 11), "Chair": (12, 13, 14, 15),
    "Earphone": (16, 17, 18), "Guitar": (19, 20, 21), "Knife": (22, 23), "Lamp": (24, 25, 26, 27),
    "Laptop": (28, 29), "Motorbike": (30, 31, 32, 33, 34, 35), "Mug": (36, 37), "Pistol": (38, 39, 40),
    "Rocket": (41, 42, 43), "Skateboard": (44, 45, 46), "Table": (47, 48, 49),
}
# [ext] Part names as commonly listed for the ShapeNet part annotations; only the ids matter.
_PART_WORDS = {
    "Airplane": ("body", "wing", "tail", "engine"), "Bag": ("handle", "body"), "Cap": ("panels", "peak"),
    "Car": ("roof", "hood", "wheel", "body"), "Chair": ("back", "seat", "leg", "arm"),
    "Earphone": ("earphone", "headband", "data_wire"), "Guitar": ("head", "neck", "body"),
    "Knife": ("blade", "handle"), "Lamp": ("base", "lampshade", "canopy", "tube"), "Laptop": ("keyboard", "screen"),
    "Motorbike": ("gas_tank", "seat", "wheel", "handle", "light", "body"), "Mug": ("handle", "body"),
    "Pistol": ("barrel", "handle", "trigger_and_guard"), "Rocket": ("body", "fin", "nose"),
    "Skateboard": ("wheel", "deck", "belt_for_foot"), "Table": ("desktop", "leg", "support"),
}
PART_NAMES: tuple[str, ...] = tuple(f"{c}/{w}" for c, _ in CATEGORIES for w in _PART_WORDS[c])
_SPLITS = ("train", "val", "test")


def read_shapenetpart_txt(path: str | os.PathLike, allowed_parts: tuple[int, ...] | None = None
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Points (n, 3), normals (n, 3) float32 and part ids (n,) int64 of one shape file.

    ``allowed_parts``: the category's part ids; any other (or a non-integer) part value
    raises ValueError naming the file and line.
    """
    arr = read_numeric_table(path, 7, None, "x y z nx ny nz part")
    part = arr[:, 6]
    bad = part != np.round(part)
    if allowed_parts is not None:
        bad |= ~np.isin(part, np.asarray(allowed_parts, float))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        line = _line_of_row(Path(path), row)
        what = f"one of the category's part ids {list(allowed_parts)}" if allowed_parts is not None else "an integer"
        raise ValueError(f"{path}:{line}: expected the part label (7th value) to be {what}, got {part[row]:g}")
    return arr[:, :3].astype(np.float32), arr[:, 3:6].astype(np.float32), part.astype(np.int64)


def _line_of_row(path: Path, row: int) -> int:
    """1-based line number of the ``row``-th non-blank line."""
    k = -1
    for i, ln in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if ln.strip():
            k += 1
            if k == row:
                return i
    return row + 1  # pragma: no cover


def _read_categories(path: Path) -> list[tuple[str, str]]:
    if not path.is_file():
        raise ValueError(f"{path}: file not found (expected the category map)")
    out = []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise ValueError(f"file {path}: not UTF-8 text (line {line})") from None
    for i, ln in enumerate(text.splitlines(), start=1):
        f = ln.split()
        if not f:
            continue
        if len(f) != 2 or not f[1].isdigit():
            raise ValueError(f"{path}:{i}: expected '<Category> <synset id>', got {ln.strip()[:80]!r}")
        if f[0] not in CATEGORY_PARTS:
            raise ValueError(f"{path}:{i}: unknown ShapeNetPart category {f[0]!r}; expected one of {list(CATEGORY_PARTS)}")
        out.append((f[0], f[1]))
    if not out:
        raise ValueError(f"{path}: empty file, expected '<Category> <synset id>' lines")
    return out


def load_shapenetpart(
    root: str | os.PathLike,
    split: str,
    num_points: int | None = 2500,
    sampling: str = "random",
    normalize: bool = True,
    categories: tuple[str, ...] | None = None,
    cache_dir: str | os.PathLike | None = None,
    seed: int = 0,
) -> ShapeCloudSet:
    """The ``split`` ("train" | "val" | "test" | "trainval") shapes of a ShapeNetPart folder.

    Labels index :data:`CATEGORIES` (all 16 always, so ids are stable); part ids are the
    global ids of :data:`CATEGORY_PARTS`. ``categories`` keeps only those categories.
    """
    root = Path(root)
    if split not in (*_SPLITS, "trainval"):
        raise ValueError(f"split: expected one of {[*_SPLITS, 'trainval']}, got {split!r}")
    check_sampling_options(num_points, sampling)
    if categories is not None:
        unknown = [c for c in categories if c not in CATEGORY_PARTS]
        if unknown:
            raise ValueError(f"categories: unknown {unknown}; expected names from {list(CATEGORY_PARTS)}")
    if not root.is_dir():
        raise ValueError(f"root: {root} is not a folder")
    cat_file = root / "synsetoffset2category.txt"
    synset_cat = {s: c for c, s in _read_categories(cat_file)}
    cat_index = {c: i for i, (c, _) in enumerate(CATEGORIES)}
    entries = []
    list_files = []
    for sp in (("train", "val") if split == "trainval" else (split,)):
        jf = root / "train_test_split" / f"shuffled_{sp}_file_list.json"
        list_files.append(jf)
        if not jf.is_file():
            raise ValueError(f"{jf}: file not found (expected the {sp} split list)")
        try:
            items = json.loads(jf.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{jf}:{e.lineno}: invalid JSON ({e.msg})") from None
        except UnicodeDecodeError as e:
            line = jf.read_bytes()[: e.start].count(b"\n") + 1
            raise ValueError(f"file {jf}: not UTF-8 text (line {line})") from None
        if isinstance(items, list) and not items:
            raise ValueError(f"{jf}: empty shape list (expected a JSON list of 'shape_data/<synset>/<id>' strings)")
        if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
            raise ValueError(f"{jf}: expected a JSON list of 'shape_data/<synset>/<id>' strings")
        for k, item in enumerate(items):
            parts = item.strip("/").split("/")
            if len(parts) < 2 or parts[-2] not in synset_cat:
                raise ValueError(f"{jf}: entry {k} {item!r}: expected 'shape_data/<synset>/<id>' with a synset "
                                 f"listed in {cat_file.name}")
            cat = synset_cat[parts[-2]]
            if categories is not None and cat not in categories:
                continue
            path = root / parts[-2] / f"{parts[-1]}.txt"
            if not path.is_file():
                raise ValueError(f"{jf}: entry {k}: listed shape file {path} does not exist")
            entries.append((f"{parts[-2]}/{parts[-1]}", cat, path))

    def build() -> ShapeCloudSet:
        clouds = []
        for j, (sid, cat, path) in enumerate(entries):
            pts, nrm, part = read_shapenetpart_txt(path, CATEGORY_PARTS[cat])
            idx, p = prepare_points(pts, num_points, sampling, normalize, seed=seed + j)
            clouds.append(ShapeCloud(p, nrm[idx], cat_index[cat], part[idx], sid))
        return ShapeCloudSet(clouds, tuple(c for c, _ in CATEGORIES), PART_NAMES,
                             tuple(CATEGORY_PARTS[c] for c, _ in CATEGORIES),
                             {"source": "shapenetcore_partanno_segmentation_benchmark_v0_normal", "split": split})

    if cache_dir is None:
        return build()
    key = {"reader": "shapenetpart", "version": 1, "root": str(root.resolve()), "split": split,
           "num_points": num_points, "sampling": sampling, "normalize": normalize,
           "categories": None if categories is None else list(categories), "seed": seed,
           "files": files_fingerprint([cat_file, *list_files, *(e[2] for e in entries)])}
    return unpack_clouds(cached_arrays(Path(cache_dir) / "shapenetpart", f"shapenetpart-{split}", key,
                                       lambda: pack_clouds(build())))
