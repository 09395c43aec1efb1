"""Labelled 3-D point clouds (shape classification / part segmentation) and their packing.

A :class:`ShapeCloud` is one shape: points ``(n, 3)``, optional unit normals ``(n, 3)``, a
class index and optional per-point part ids ``(n,)``. A :class:`ShapeCloudSet` is a list of
clouds plus the label space: class names and, for part segmentation, the global part names
and which part ids belong to each class (ShapeNetPart restricts a shape's parts to those of
its category). The procedural generator (:mod:`pointformers.data.shapes`) and the readers of
ModelNet40 and ShapeNetPart all return this container, so tasks never depend on the source.

:func:`pack_clouds` / :func:`unpack_clouds` turn a set into flat arrays plus offsets (no
pickle) for the on-disk cache of :mod:`pointformers.data.cache`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

__all__ = ["ShapeCloud", "ShapeCloudSet", "pack_clouds", "unpack_clouds"]


@dataclass
class ShapeCloud:
    """One shape. ``points``: (n, 3) float32; ``normals``: (n, 3) float32 unit vectors or None;
    ``label``: class index; ``parts``: (n,) int64 global part ids or None; ``name``: an id."""

    points: np.ndarray
    normals: np.ndarray | None
    label: int
    parts: np.ndarray | None = None
    name: str = ""

    def __post_init__(self) -> None:
        pts = np.asarray(self.points)
        if pts.ndim != 2 or pts.shape[1] != 3:
            raise ValueError(f"points: expected shape (n, 3), got {pts.shape}")
        if not np.isfinite(pts).all():
            raise ValueError("points: expected finite coordinates, got NaN or inf")
        self.points = pts.astype(np.float32, copy=False)
        if self.normals is not None:
            nrm = np.asarray(self.normals)
            if nrm.shape != pts.shape:
                raise ValueError(f"normals: expected shape {pts.shape} like points, got {nrm.shape}")
            if not np.isfinite(nrm).all():
                raise ValueError("normals: expected finite values, got NaN or inf")
            self.normals = nrm.astype(np.float32, copy=False)
        if self.parts is not None:
            prt = np.asarray(self.parts)
            if prt.shape != (pts.shape[0],):
                raise ValueError(f"parts: expected shape ({pts.shape[0]},), got {prt.shape}")
            self.parts = prt.astype(np.int64, copy=False)
        self.label = int(self.label)

    @property
    def num_points(self) -> int:
        return int(self.points.shape[0])


@dataclass
class ShapeCloudSet:
    """Clouds plus their label space.

    ``class_parts[c]`` lists the global part ids a shape of class ``c`` may carry (empty when
    the set has no part labels); ``part_names[p]`` names global part ``p``.
    """

    clouds: list[ShapeCloud]
    class_names: tuple[str, ...]
    part_names: tuple[str, ...] = ()
    class_parts: tuple[tuple[int, ...], ...] = ()
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.class_names = tuple(self.class_names)
        self.part_names = tuple(self.part_names)
        self.class_parts = tuple(tuple(int(p) for p in ps) for ps in self.class_parts)
        if self.class_parts and len(self.class_parts) != len(self.class_names):
            raise ValueError(f"class_parts: expected one entry per class ({len(self.class_names)}), "
                             f"got {len(self.class_parts)}")

    def __len__(self) -> int:
        return len(self.clouds)

    def __getitem__(self, i: int) -> ShapeCloud:
        return self.clouds[i]

    def __iter__(self):
        return iter(self.clouds)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def num_parts(self) -> int:
        return len(self.part_names)

    def labels(self) -> np.ndarray:
        """(S,) int64 class index of every cloud."""
        return np.array([c.label for c in self.clouds], dtype=np.int64)

    def part_class(self) -> np.ndarray:
        """(P,) int64: the class owning each global part id (-1 if none)."""
        owner = np.full(len(self.part_names), -1, np.int64)
        for c, ps in enumerate(self.class_parts):
            owner[list(ps)] = c
        return owner

    def subset(self, index: Sequence[int]) -> "ShapeCloudSet":
        """The clouds at ``index`` with the same label space."""
        return ShapeCloudSet([self.clouds[int(i)] for i in index], self.class_names, self.part_names,
                             self.class_parts, dict(self.meta))


def pack_clouds(cs: ShapeCloudSet) -> dict[str, np.ndarray]:
    """Flat arrays (``points``, ``normals``, ``parts``, ``labels``, ``offsets``, names, label space)."""
    counts = np.array([c.num_points for c in cs.clouds], np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    has_normals = bool(cs.clouds) and all(c.normals is not None for c in cs.clouds)
    has_parts = bool(cs.clouds) and all(c.parts is not None for c in cs.clouds)
    cat = (lambda xs, shape: np.concatenate(xs) if xs else np.zeros(shape))
    out = {
        "points": cat([c.points for c in cs.clouds], (0, 3)).astype(np.float32),
        "labels": np.array([c.label for c in cs.clouds], np.int64),
        "offsets": offsets,
        "names": np.array([c.name for c in cs.clouds], dtype=np.str_),
        "label_space": np.array(json.dumps({"class_names": list(cs.class_names), "part_names": list(cs.part_names),
                                            "class_parts": [list(p) for p in cs.class_parts], "meta": cs.meta})),
    }
    if has_normals:
        out["normals"] = cat([c.normals for c in cs.clouds], (0, 3)).astype(np.float32)
    if has_parts:
        out["parts"] = cat([c.parts for c in cs.clouds], (0,)).astype(np.int64)
    return out


def unpack_clouds(arrays: dict[str, np.ndarray]) -> ShapeCloudSet:
    """Inverse of :func:`pack_clouds` (raises KeyError/ValueError on inconsistent arrays)."""
    offsets = arrays["offsets"]
    labels = arrays["labels"]
    names = arrays["names"]
    if len(offsets) != len(labels) + 1 or len(names) != len(labels) or offsets[-1] != len(arrays["points"]):
        raise ValueError("packed clouds: offsets, labels, names and points disagree")
    space = json.loads(str(arrays["label_space"]))
    normals, parts = arrays.get("normals"), arrays.get("parts")
    clouds = []
    for i in range(len(labels)):
        a, b = int(offsets[i]), int(offsets[i + 1])
        clouds.append(ShapeCloud(arrays["points"][a:b], None if normals is None else normals[a:b], int(labels[i]),
                                 None if parts is None else parts[a:b], str(names[i])))
    return ShapeCloudSet(clouds, tuple(space["class_names"]), tuple(space["part_names"]),
                         tuple(tuple(p) for p in space["class_parts"]), space.get("meta", {}))
