"""Graphs as data: the container every graph data set here fills, and readers of LRGB's released files.

A :class:`GraphSet` holds one split of a graph data set (the Long Range Graph Benchmark's
Peptides-func, Peptides-struct and PascalVOC-sp, or their generated stand-ins in
:mod:`pointformers.data.peptides` and :mod:`pointformers.data.superpixels`), item by item, in
the layout of LRGB's own release (the tuples ``(x, edge_attr, edge_index, y)`` of PyG's
``LRGBDataset`` raw files):

* ``nodes[i]`` (N_i, F) node features: int64 categorical codes (Peptides: OGB's 9 atom features)
  or float32 values (PascalVOC-sp: 14 superpixel statistics);
* ``edge_index[i]`` (2, E_i) int64 source/target node ids, both directions of every undirected
  edge listed (PyG's convention);
* ``edges[i]`` (E_i, F_e) edge features, one row per column of ``edge_index[i]``: int64
  categorical (Peptides: OGB's 3 bond features) or float32 (PascalVOC-sp: 2);
* ``targets``: graph level, a float32 array (S, T) (Peptides-func: 10 binary labels;
  Peptides-struct: 11 regression targets); node level, a list of int64 arrays (N_i,)
  (PascalVOC-sp: 21 classes).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

__all__ = ["GraphSet", "CATEGORICAL", "CONTINUOUS"]

CATEGORICAL, CONTINUOUS = "categorical", "continuous"


@dataclass
class GraphSet:
    """One split of a graph data set (module docstring for the fields' shapes).

    Attributes:
        nodes, edge_index, edges: per-graph arrays.
        targets: (S, T) float32 for ``level="graph"``; a list of (N_i,) int64 for ``level="node"``.
        level: ``"graph"`` (one target row per graph) or ``"node"`` (one class per node).
        name: the data set's name for messages (e.g. ``"peptides-func"``).
        feature_kind: ``"categorical"`` (int64 codes) or ``"continuous"`` (float32) node and edge features.
        meta: free-form facts (class names, the generator's parameters, the source file).
    """

    nodes: list[np.ndarray]
    edge_index: list[np.ndarray]
    edges: list[np.ndarray]
    targets: np.ndarray | list[np.ndarray]
    level: str = "graph"
    name: str = "graphs"
    feature_kind: str = CATEGORICAL
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.check()

    def __len__(self) -> int:
        return len(self.nodes)

    def check(self) -> None:
        """ValueError naming the first graph and field that breaks the layout."""
        if self.level not in ("graph", "node"):
            raise ValueError(f"{self.name}: level must be 'graph' or 'node', got {self.level!r}")
        if self.feature_kind not in (CATEGORICAL, CONTINUOUS):
            raise ValueError(f"{self.name}: feature_kind must be {CATEGORICAL!r} or {CONTINUOUS!r}, "
                             f"got {self.feature_kind!r}")
        S = len(self.nodes)
        if len(self.edge_index) != S or len(self.edges) != S:
            raise ValueError(f"{self.name}: {S} node arrays but {len(self.edge_index)} edge_index and "
                             f"{len(self.edges)} edge feature arrays")
        if self.level == "graph":
            t = np.asarray(self.targets)
            if t.ndim != 2 or t.shape[0] != S:
                raise ValueError(f"{self.name}: graph targets must have shape ({S}, T), got {t.shape}")
        elif len(self.targets) != S:
            raise ValueError(f"{self.name}: {S} graphs but {len(self.targets)} node-target arrays")
        widths = set()
        for i in range(S):
            x, ei, e = self.nodes[i], self.edge_index[i], self.edges[i]
            where = f"{self.name}: graph {i}"
            if x.ndim != 2 or x.shape[0] < 1:
                raise ValueError(f"{where}: nodes must be (N, F) with N >= 1, got shape {x.shape}")
            if ei.ndim != 2 or ei.shape[0] != 2 or ei.dtype.kind not in "iu":
                raise ValueError(f"{where}: edge_index must be an integer (2, E) array, got {ei.dtype} {ei.shape}")
            if e.ndim != 2 or e.shape[0] != ei.shape[1]:
                raise ValueError(f"{where}: edge features must be (E, F_e) with E = {ei.shape[1]}, got {e.shape}")
            if ei.size and (ei.min() < 0 or ei.max() >= x.shape[0]):
                raise ValueError(f"{where}: edge_index refers to node {int(ei.max())} (or < 0) of {x.shape[0]}")
            for arr, what in ((x, "nodes"), (e, "edge features")):
                if self.feature_kind == CATEGORICAL and (arr.dtype.kind not in "iu" or (arr.size and arr.min() < 0)):
                    raise ValueError(f"{where}: categorical {what} must be integer codes >= 0, got {arr.dtype}")
                if self.feature_kind == CONTINUOUS and not np.isfinite(arr).all():
                    raise ValueError(f"{where}: {what} contain NaN or inf")
            widths.add((x.shape[1], e.shape[1]))
            if self.level == "node" and np.asarray(self.targets[i]).shape != (x.shape[0],):
                raise ValueError(f"{where}: node targets must have shape ({x.shape[0]},), got "
                                 f"{np.asarray(self.targets[i]).shape}")
        if len(widths) > 1:
            raise ValueError(f"{self.name}: graphs differ in node/edge feature widths {sorted(widths)}")

    @property
    def num_node_features(self) -> int:
        return int(self.nodes[0].shape[1])

    @property
    def num_edge_features(self) -> int:
        return int(self.edges[0].shape[1])

    def sizes(self) -> np.ndarray:
        """(S,) node counts."""
        return np.array([x.shape[0] for x in self.nodes], dtype=np.int64)

    def subset(self, index: Sequence[int]) -> "GraphSet":
        """The graphs ``index`` (in that order) as a new set."""
        idx = [int(i) for i in index]
        targets = (np.asarray(self.targets)[idx] if self.level == "graph" else [self.targets[i] for i in idx])
        return GraphSet([self.nodes[i] for i in idx], [self.edge_index[i] for i in idx], [self.edges[i] for i in idx],
                        targets, self.level, self.name, self.feature_kind, dict(self.meta))


# ---------------------------------------------------------------------------------- LRGB's release
__all__ += ["LRGB_NAMES", "LRGB_NUM_TARGETS", "LRGB_METRIC", "LRGB_FEATURE_WIDTHS", "LRGB_RELEASE_FOLDERS",
            "read_lrgb_file", "load_lrgb"]

#: The LRGB data sets these readers know.
LRGB_NAMES = ("peptides-func", "peptides-struct", "pascalvoc-sp")
#: Targets per graph (Peptides-func: 10 binary labels; Peptides-struct: 11 regression targets) or node
#: classes (PascalVOC-sp: 21).
LRGB_NUM_TARGETS = {"peptides-func": 10, "peptides-struct": 11, "pascalvoc-sp": 21}
#: LRGB's test metric: average precision over the labels, mean absolute error, macro F1 over the classes.
LRGB_METRIC = {"peptides-func": "ap", "peptides-struct": "mae", "pascalvoc-sp": "macro_f1"}
#: (node features, edge features) per data set: OGB's 9 atom / 3 bond codes; 14 / 2 superpixel values.
LRGB_FEATURE_WIDTHS = {"peptides-func": (9, 3), "peptides-struct": (9, 3), "pascalvoc-sp": (14, 2)}
#: The folder each release zip extracts to (PyG's LRGBDataset moves its files to ``<root>/<name>/raw``).
LRGB_RELEASE_FOLDERS = {"peptides-func": "peptidesfunc", "peptides-struct": "peptidesstruct",
                        "pascalvoc-sp": "voc_superpixels_edge_wt_region_boundary"}
_SPLITS = ("train", "val", "test")


def _lrgb_name(name: str) -> str:
    if name not in LRGB_NAMES:
        raise ValueError(f"name: expected one of {list(LRGB_NAMES)}, got {name!r}")
    return name


class _RefusedGlobal(ValueError):
    pass


def _safe_load_from_bytes(b: bytes):
    # torch pickles a storage as ``torch.storage._load_from_bytes(<legacy torch.save bytes>)``, which
    # would torch.load those bytes with weights_only=False (arbitrary code); load them the safe way.
    import io

    import torch
    return torch.load(io.BytesIO(b), weights_only=True)


def _latin1_bytes(text: str, encoding: str = "latin1") -> bytes:
    # what protocol 2 pickles bytes as: _codecs.encode(text, "latin1"); no other codec is let through
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise _RefusedGlobal(f"refused _codecs.encode with encoding {encoding!r}")
    return text.encode("latin1")


def _allowed_global(module: str, name: str):
    """The object a tensor / numpy-array pickle may name, or None when it is not one of those."""
    if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor"):
        import torch._utils
        return getattr(torch._utils, name)
    if module == "torch.storage" and name == "_load_from_bytes":
        return _safe_load_from_bytes
    if module in ("torch", "torch.storage") and name.endswith("Storage"):
        import torch
        obj = getattr(torch if module == "torch" else torch.storage, name, None)
        return obj if isinstance(obj, type) else None
    if module == "_codecs" and name == "encode":  # bytes in pickle protocols < 3
        return _latin1_bytes
    if module == "collections" and name == "OrderedDict":  # a tensor's (empty) backward hooks
        import collections
        return collections.OrderedDict
    if module in ("numpy", "numpy.core.multiarray", "numpy._core.multiarray", "numpy.core.numeric",
                  "numpy._core.numeric"):
        try:
            from numpy._core import multiarray, numeric  # numpy >= 2 (numpy.core warns there)
        except ImportError:  # pragma: no cover - numpy 1.x
            from numpy.core import multiarray, numeric
        table = {"numpy": {"ndarray": np.ndarray, "dtype": np.dtype},
                 "multiarray": {"_reconstruct": multiarray._reconstruct, "scalar": multiarray.scalar},
                 "numeric": {"_frombuffer": numeric._frombuffer}}  # pickle protocol 5
        return table[module.rsplit(".", 1)[-1]].get(name)
    return None


def _restricted_unpickler(f):
    import pickle

    class Unpickler(pickle.Unpickler):
        """Rebuilds torch tensors and numpy arrays only; any other global is refused."""

        def find_class(self, module: str, name: str):
            obj = _allowed_global(module, name)
            if obj is None:
                raise _RefusedGlobal(f"refused to load the global {module}.{name} (only torch tensors and numpy "
                                     "arrays may be rebuilt from an LRGB pickle)")
            return obj

        def persistent_load(self, pid):
            raise _RefusedGlobal("refused a persistent id in a plain pickle")

    return Unpickler(f)


def _read_items(path, name: str) -> list:
    """The list of item tuples in ``path`` (``.pt``: torch.load, weights only; else the restricted
    unpickler); ValueError naming the file for anything unreadable."""
    from pathlib import Path

    path = Path(path)
    try:
        if path.suffix == ".pt":
            import torch
            items = torch.load(path, map_location="cpu", weights_only=True)
        else:
            with open(path, "rb") as f:
                items = _restricted_unpickler(f).load()
    except _RefusedGlobal as exc:
        raise ValueError(f"{path}: {exc}") from None
    except Exception as exc:  # pickle, zipfile and torch raise many types for a bad file
        if str(exc).startswith("Weights only load failed"):  # torch.load refused a global: say which
            import re
            found = re.search(r"GLOBAL ([\w.]+)", str(exc))
            raise ValueError(f"{path}: refused to load the global {found.group(1) if found else '(unknown)'} "
                             "(only torch tensors may be loaded from an LRGB split file)") from None
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ValueError(f"{path}: cannot read this {name} split file (truncated or corrupt?): "
                         f"{type(exc).__name__}: {msg[:200]}") from None
    if not isinstance(items, (list, tuple)):
        raise ValueError(f"{path}: expected a list of (x, edge_attr, edge_index, y) tuples, got {type(items).__name__}")
    if not items:
        raise ValueError(f"{path}: the file holds no graphs")
    return list(items)


def _as_numpy(v, where: str, what: str) -> np.ndarray:
    if hasattr(v, "detach") and hasattr(v, "numpy"):  # a torch tensor
        try:
            return v.detach().cpu().numpy()
        except (TypeError, RuntimeError) as exc:  # e.g. bfloat16, which numpy lacks
            raise ValueError(f"{where}: {what} cannot be converted to numpy: {exc}") from None
    if isinstance(v, (np.ndarray, list, tuple)):
        a = np.asarray(v)
        if a.dtype.kind in "iufb":
            return a
    raise ValueError(f"{where}: {what} must be a tensor or array of numbers, got {type(v).__name__}")


def read_lrgb_file(path, name: str) -> GraphSet:
    """One split file of LRGB's release as a :class:`GraphSet`.

    Each file holds a list of tuples ``(x, edge_attr, edge_index, y)`` of torch tensors (PyG's
    ``LRGBDataset`` raw files): Peptides ``{split}.pt`` (torch.save; read with ``weights_only=True``):
    x (N, 9) int64 OGB atom codes, edge_attr (E, 3) int64 OGB bond codes, edge_index (2, E), y (1, T)
    float with T = 10 (func) or 11 (struct) -> level "graph", categorical. PascalVOC-sp
    ``{split}.pickle`` (plain pickle, read by an unpickler that only rebuilds tensors and numpy arrays):
    x (N, 14) float, edge_attr (E, 2) float, edge_index (2, E), y (N,) class ids 0-20 (tensor or list)
    -> level "node", continuous.

    Raises:
        ValueError: naming the file (and item index) for an unreadable file, a refused pickle global,
            or an item of the wrong arity, shape, dtype, range or with NaN / inf values.
    """
    name = _lrgb_name(name)
    items = _read_items(path, name)
    fx, fe = LRGB_FEATURE_WIDTHS[name]
    T = LRGB_NUM_TARGETS[name]
    peptides = name.startswith("peptides")
    nodes, index, edges, targets = [], [], [], []
    for i, item in enumerate(items):
        where = f"{path}: item {i}"
        if not isinstance(item, (tuple, list)) or len(item) != 4:
            got = f"{len(item)} values" if isinstance(item, (tuple, list)) else type(item).__name__
            raise ValueError(f"{where}: expected a tuple (x, edge_attr, edge_index, y), got {got}")
        x, e, ei, y = (_as_numpy(v, where, w) for v, w in zip(item, ("x", "edge_attr", "edge_index", "y")))
        if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] != fx:
            raise ValueError(f"{where}: x must have shape (N >= 1, {fx}), got {x.shape}")
        if ei.ndim != 2 or ei.shape[0] != 2 or ei.dtype.kind not in "iu":
            raise ValueError(f"{where}: edge_index must be an integer (2, E) array, got {ei.dtype} {ei.shape}")
        if e.ndim != 2 or e.shape != (ei.shape[1], fe):
            raise ValueError(f"{where}: edge_attr must have shape (E={ei.shape[1]}, {fe}), got {e.shape}")
        if ei.size and (ei.min() < 0 or ei.max() >= x.shape[0]):
            raise ValueError(f"{where}: edge_index holds node ids in [{int(ei.min())}, {int(ei.max())}], "
                             f"expected [0, {x.shape[0] - 1}]")
        if peptides:
            for a, w in ((x, "x"), (e, "edge_attr")):
                if a.dtype.kind not in "iu" or (a.size and a.min() < 0):
                    raise ValueError(f"{where}: {w} must hold integer codes >= 0 (OGB features), got {a.dtype}"
                                     f"{'' if a.dtype.kind not in 'iu' else ' with negative codes'}")
            if y.size != T or (y.ndim == 2 and y.shape[0] != 1) or y.ndim > 2:
                raise ValueError(f"{where}: y must have shape (1, {T}) for {name}, got {y.shape}")
            if y.dtype.kind not in "iufb" or not np.isfinite(y.astype(np.float64)).all():
                raise ValueError(f"{where}: y holds NaN or inf")
            nodes.append(x.astype(np.int64))
            edges.append(e.astype(np.int64))
            targets.append(y.reshape(T).astype(np.float32))
        else:
            for a, w in ((x, "x"), (e, "edge_attr")):
                if a.dtype.kind not in "iuf" or not np.isfinite(a).all():
                    raise ValueError(f"{where}: {w} must hold finite numbers, got {a.dtype}"
                                     f"{' with NaN or inf' if a.dtype.kind == 'f' else ''}")
            if y.shape != (x.shape[0],) or y.dtype.kind not in "iu":
                raise ValueError(f"{where}: y must hold one integer class per node, shape ({x.shape[0]},), "
                                 f"got {y.dtype} {y.shape}")
            if y.size and (y.min() < 0 or y.max() >= T):
                raise ValueError(f"{where}: y holds classes in [{int(y.min())}, {int(y.max())}], expected [0, {T - 1}]")
            nodes.append(x.astype(np.float32))
            edges.append(e.astype(np.float32))
            targets.append(y.astype(np.int64))
        index.append(ei.astype(np.int64))
    meta = {"source": str(path), "num_targets": T, "metric": LRGB_METRIC[name]}
    if peptides:
        return GraphSet(nodes, index, edges, np.stack(targets), "graph", name, CATEGORICAL, meta)
    return GraphSet(nodes, index, edges, targets, "node", name, CONTINUOUS, meta)


def load_lrgb(root, name: str, split: str) -> GraphSet:
    """Split ``split`` ("train", "val", "test") of LRGB data set ``name`` from ``root``: the folder
    extracted from the release zip (e.g. ``peptidesfunc/``), its parent, or PyG's dataset root.
    Looks for ``{split}.pt`` (Peptides) or ``{split}.pickle`` (PascalVOC-sp) in ``root``, ``root/raw``,
    ``root/<release folder>`` and ``root/<name>/raw``; a ValueError lists these paths if none exists."""
    from pathlib import Path

    name = _lrgb_name(name)
    if split not in _SPLITS:
        raise ValueError(f"split: expected one of {list(_SPLITS)}, got {split!r}")
    root = Path(root).expanduser()
    file = f"{split}.pt" if name.startswith("peptides") else f"{split}.pickle"
    candidates = [root / file, root / "raw" / file, root / LRGB_RELEASE_FOLDERS[name] / file, root / name / "raw" / file]
    for c in candidates:
        if c.is_file():
            return read_lrgb_file(c, name)
    raise ValueError(f"data.root: no {split} split of {name} found; looked for "
                     + ", ".join(str(c) for c in candidates))
