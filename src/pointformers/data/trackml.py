"""TrackML CSV files: writer (for generated events) and reader (pixel volumes 7, 8, 9).

Per event ``<name>`` a TrackML folder holds ``<name>-hits.csv`` (hit_id, x, y, z,
volume_id, layer_id, module_id), ``<name>-cells.csv`` (hit_id, ch0, ch1, value),
``<name>-truth.csv`` (hit_id, particle_id, tx, ty, tz, tpx, tpy, tpz, weight) and
``<name>-particles.csv`` (particle_id, vx, vy, vz, px, py, pz, q, nhits); one
``detectors.csv`` (volume_id, layer_id, module_id, cx, cy, cz, rot_xu … rot_zw, module_t,
module_minhu, module_maxhu, module_hv, pitch_u, pitch_v) describes every module.
Files may also be gzip-compressed (``.csv.gz``).

Cluster-shape features are computed from the cells the way the TrackML preprocessing used
by HEPT does: the cluster extent ``n_u, n_v`` (pixels) gives the local vector
``(n_u·pitch_u, n_v·pitch_v, 2·module_t)``; ``leta``/``lphi`` are its pseudorapidity and
azimuth in the module frame, ``geta``/``gphi`` those of the vector rotated by the module's
rotation matrix; ``charge_frac`` is the fraction of the cluster charge in its highest cell.
Without ``detectors.csv`` the reader warns and falls back to cell-count features: nominal
pixel pitch (0.05 × 0.05625 mm) and thickness (0.15 mm) for lx/ly/lz/leta/lphi, and
``geta = gphi = 0`` (the module orientation is unknown).

The writer synthesises, per hit, a straight line of cells whose extent is the cluster
extent encoded in the event's features and whose highest cell holds ``charge_frac`` of the
charge, so that ``read_trackml_event(write_trackml_event(e))`` gives back e's features.
"""
from __future__ import annotations

import gzip
import io
import re
import warnings
from pathlib import Path
from typing import IO, Mapping

import numpy as np

from .event import CLUSTER_FEATURES, TrackingEvent
from .tracking import GEOMETRY, PixelGeometry, cluster_features, module_table

#: TrackML volume ids of the pixel detector (end cap -z, barrel, end cap +z).
PIXEL_VOLUMES = (7, 8, 9)

HITS_COLUMNS = {"hit_id": "i", "x": "f", "y": "f", "z": "f", "volume_id": "i", "layer_id": "i", "module_id": "i"}
CELLS_COLUMNS = {"hit_id": "i", "ch0": "i", "ch1": "i", "value": "f"}
TRUTH_COLUMNS = {"hit_id": "i", "particle_id": "i", "tx": "f", "ty": "f", "tz": "f", "tpx": "f", "tpy": "f",
                 "tpz": "f", "weight": "f"}
PARTICLES_COLUMNS = {"particle_id": "i", "vx": "f", "vy": "f", "vz": "f", "px": "f", "py": "f", "pz": "f", "q": "i",
                     "nhits": "i"}
_ROT = ("rot_xu", "rot_xv", "rot_xw", "rot_yu", "rot_yv", "rot_yw", "rot_zu", "rot_zv", "rot_zw")
DETECTORS_COLUMNS = {"volume_id": "i", "layer_id": "i", "module_id": "i", "cx": "f", "cy": "f", "cz": "f",
                     **{r: "f" for r in _ROT}, "module_t": "f", "module_minhu": "f", "module_maxhu": "f",
                     "module_hv": "f", "pitch_u": "f", "pitch_v": "f"}
_KINDS = ("hits", "cells", "truth", "particles")
_FLOAT = "%.9g"  # enough digits to round-trip float32 exactly


# ============================================================================ CSV helpers
def _open_text(path: Path) -> IO[str]:
    return gzip.open(path, "rt") if path.suffix == ".gz" else open(path, "r", newline="")


def _read_csv(path: Path, columns: Mapping[str, str]) -> dict[str, np.ndarray]:
    """Read the named columns (``"i"``: int64, ``"f"``: float64) of a comma-separated file.

    Raises ValueError naming the file and the missing columns, or the file, line number and
    column of a malformed line.
    """
    with _open_text(path) as f:
        header_line = f.readline()
    header = [h.strip() for h in header_line.strip().lstrip("\ufeff").split(",")] if header_line.strip() else []
    if not header:
        raise ValueError(f"{path}: empty file, expected a header line with columns {list(columns)}")
    missing = [c for c in columns if c not in header]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing} (found {header})")
    # Every column gets a field so that rows with a wrong field count are rejected.
    dtype = []
    for j, h in enumerate(header):
        kind = columns.get(h)
        dtype.append((f"c{j}", np.int64 if kind == "i" else np.float64 if kind == "f" else "U64"))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "input contained no data" for header-only files
            data = np.loadtxt(path, delimiter=",", skiprows=1, dtype=dtype, ndmin=1, encoding="utf-8")
    except ValueError as exc:
        raise _locate_error(path, header, columns) from exc
    return {name: np.ascontiguousarray(data[f"c{header.index(name)}"]) for name in columns}


def _locate_error(path: Path, header: list[str], columns: Mapping[str, str]) -> ValueError:
    """Find the first malformed line of ``path`` (slow path, only after a parse failure)."""
    with _open_text(path) as f:
        for lineno, line in enumerate(f, start=1):
            if lineno == 1 or not line.strip():
                continue
            tokens = line.rstrip("\r\n").split(",")
            if len(tokens) != len(header):
                return ValueError(f"{path}, line {lineno}: expected {len(header)} comma-separated fields "
                                  f"({','.join(header)}), got {len(tokens)}: {line.strip()!r}")
            for name, kind in columns.items():
                tok = tokens[header.index(name)].strip()
                try:
                    int(tok) if kind == "i" else float(tok)
                except ValueError:
                    what = "an integer" if kind == "i" else "a number"
                    return ValueError(f"{path}, line {lineno}, column {name!r}: cannot parse {tok!r} as {what}")
    return ValueError(f"{path}: could not be parsed as CSV with columns {header}")


def _write_csv(path: Path, columns: list[tuple[str, np.ndarray, str]]) -> None:
    """Write columns ``(name, values (n,), printf format)`` to ``path`` (header + n lines)."""
    row = ",".join(fmt for _, _, fmt in columns)
    lists = [np.asarray(v).tolist() for _, v, _ in columns]
    with open(path, "w", newline="") as f:
        f.write(",".join(name for name, _, _ in columns) + "\n")
        buf = io.StringIO()
        for vals in zip(*lists):
            buf.write(row % vals)
            buf.write("\n")
        f.write(buf.getvalue())


def _module_keys(volume: np.ndarray, layer: np.ndarray, module: np.ndarray) -> np.ndarray:
    return (np.asarray(volume, np.int64) * 100 + np.asarray(layer, np.int64)) * 10_000_000 + np.asarray(module, np.int64)


def _lookup(keys_table: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Row of each key in ``keys_table`` (-1 when absent)."""
    keys = np.asarray(keys)
    if len(keys_table) == 0:
        return np.full(len(keys), -1, np.int64)
    order = np.argsort(keys_table, kind="stable")
    pos = np.minimum(np.searchsorted(keys_table[order], keys), len(keys_table) - 1)
    found = keys_table[order][pos] == keys
    return np.where(found, order[pos], -1)


# ============================================================================ writer
def write_detectors(path: str | Path, geo: PixelGeometry = GEOMETRY) -> Path:
    """Write the simulated detector's modules as a TrackML ``detectors.csv``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    t = module_table(geo)
    rot = t["rot"].reshape(-1, 9)  # row-major: rot_xu, rot_xv, rot_xw, rot_yu, ...
    cols = [("volume_id", t["volume_id"], "%d"), ("layer_id", t["layer_id"], "%d"), ("module_id", t["module_id"], "%d"),
            ("cx", t["cx"], _FLOAT), ("cy", t["cy"], _FLOAT), ("cz", t["cz"], _FLOAT)]
    cols += [(name, rot[:, j], _FLOAT) for j, name in enumerate(_ROT)]
    cols += [(name, t[name], _FLOAT) for name in ("module_t", "module_minhu", "module_maxhu", "module_hv", "pitch_u", "pitch_v")]
    _write_csv(path, cols)
    return path


def _synthesise_cells(event: TrackingEvent, geo: PixelGeometry) -> tuple[np.ndarray, ...]:
    """Cells ``(hit_id, ch0, ch1, value)`` reproducing each hit's cluster extent and charge fraction."""
    f = {name: event.cells[:, j].astype(np.float64) for j, name in enumerate(CLUSTER_FEATURES)}
    n_u = np.maximum(1, np.rint(f["lx"] / geo.pitch_u)).astype(np.int64)
    n_v = np.maximum(1, np.rint(f["ly"] / geo.pitch_v)).astype(np.int64)
    m = np.maximum(n_u, n_v)
    cf = np.clip(f["charge_frac"], 1.0 / m, 1.0)
    charge = np.sqrt(f["lx"] ** 2 + f["ly"] ** 2 + f["lz"] ** 2) / geo.thickness  # ∝ path length
    charge = np.where(charge > 0, charge, 1.0)
    # First cell channel: the hit's local position on its module (cosmetic; only extents matter).
    t = module_table(geo)
    row = _lookup(_module_keys(t["volume_id"], t["layer_id"], t["module_id"]),
                  _module_keys(event.volume_id, event.layer_id, event.module_id))
    u0 = np.zeros(event.num_hits, np.int64)
    v0 = np.zeros(event.num_hits, np.int64)
    ok = row >= 0
    if ok.any():
        r = row[ok]
        rel = np.stack([event.x[ok] - t["cx"][r], event.y[ok] - t["cy"][r], event.z[ok] - t["cz"][r]], 1)
        loc = np.einsum("nij,ni->nj", t["rot"][r], rel)
        u0[ok] = np.maximum(0, np.floor((loc[:, 0] + t["module_minhu"][r]) / geo.pitch_u).astype(np.int64) - n_u[ok] // 2)
        v0[ok] = np.maximum(0, np.floor((loc[:, 1] + t["module_hv"][r]) / geo.pitch_v).astype(np.int64) - n_v[ok] // 2)
    # One cell per step along the cluster diagonal: k = 0 .. m-1 per hit.
    hit = np.repeat(np.arange(event.num_hits), m)
    k = np.arange(len(hit)) - np.repeat(np.cumsum(m) - m, m)
    mm = m[hit]
    denom = np.maximum(mm - 1, 1)
    ch0 = u0[hit] + np.rint(k * (n_u[hit] - 1) / denom).astype(np.int64)
    ch1 = v0[hit] + np.rint(k * (n_v[hit] - 1) / denom).astype(np.int64)
    peak = k == mm // 2
    value = np.where(peak, cf[hit] * charge[hit], (1 - cf[hit]) * charge[hit] / denom)
    return event.hit_id[hit], ch0, ch1, value


def write_trackml_event(
    event: TrackingEvent,
    directory: str | Path,
    event_name: str = "event000000000",
    write_detectors_file: bool = True,
    geo: PixelGeometry = GEOMETRY,
) -> dict[str, Path]:
    """Write ``event`` as TrackML CSV files in ``directory``.

    Writes ``<event_name>-{hits,cells,truth,particles}.csv`` and (unless
    ``write_detectors_file`` is False) ``detectors.csv`` for the simulated geometry. Missing
    truth-at-hit fields (``tx`` …) are filled with the measured position and the particle's
    production momentum. Returns the written paths by kind.
    """
    if not re.fullmatch(r"[A-Za-z0-9_.]+", event_name):
        raise ValueError(f"event_name: expected letters, digits, '_' or '.', got {event_name!r}")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    paths = {kind: d / f"{event_name}-{kind}.csv" for kind in _KINDS}
    _write_csv(paths["hits"], [("hit_id", event.hit_id, "%d"), ("x", event.x, _FLOAT), ("y", event.y, _FLOAT),
                               ("z", event.z, _FLOAT), ("volume_id", event.volume_id, "%d"),
                               ("layer_id", event.layer_id, "%d"), ("module_id", event.module_id, "%d")])
    hid, ch0, ch1, value = _synthesise_cells(event, geo)
    _write_csv(paths["cells"], [("hit_id", hid, "%d"), ("ch0", ch0, "%d"), ("ch1", ch1, "%d"), ("value", value, _FLOAT)])
    tx = event.tx if event.tx is not None else event.x
    ty = event.ty if event.ty is not None else event.y
    tz = event.tz if event.tz is not None else event.z
    tpx = event.tpx if event.tpx is not None else event.per_hit(event.px)
    tpy = event.tpy if event.tpy is not None else event.per_hit(event.py)
    tpz = event.tpz if event.tpz is not None else event.per_hit(event.pz)
    _write_csv(paths["truth"], [("hit_id", event.hit_id, "%d"), ("particle_id", event.particle_id, "%d"),
                                ("tx", tx, _FLOAT), ("ty", ty, _FLOAT), ("tz", tz, _FLOAT), ("tpx", tpx, _FLOAT),
                                ("tpy", tpy, _FLOAT), ("tpz", tpz, _FLOAT), ("weight", event.weight, _FLOAT)])
    _write_csv(paths["particles"], [("particle_id", event.particles_id, "%d"), ("vx", event.vx, _FLOAT),
                                    ("vy", event.vy, _FLOAT), ("vz", event.vz, _FLOAT), ("px", event.px, _FLOAT),
                                    ("py", event.py, _FLOAT), ("pz", event.pz, _FLOAT), ("q", event.q, "%d"),
                                    ("nhits", event.nhits, "%d")])
    if write_detectors_file:
        paths["detectors"] = write_detectors(d / "detectors.csv", geo)
    return paths


# ============================================================================ reader
_HITS_RE = re.compile(r"^(?P<name>.+)-hits\.csv(\.gz)?$")


def list_trackml_events(directory: str | Path) -> list[Path]:
    """Prefixes (``<directory>/<name>``) of the events in ``directory``, sorted by name."""
    d = Path(directory)
    if not d.is_dir():
        raise ValueError(f"directory: {d} is not a folder")
    names = {m.group("name") for p in d.iterdir() if (m := _HITS_RE.match(p.name))}
    return [d / n for n in sorted(names)]


def _event_file(prefix: Path, kind: str) -> Path:
    for suffix in (".csv", ".csv.gz"):
        p = prefix.parent / f"{prefix.name}-{kind}{suffix}"
        if p.is_file():
            return p
    raise ValueError(f"{prefix.parent / (prefix.name + '-' + kind + '.csv')}: file not found (the event's {kind} table)")


def read_detectors(path: str | Path) -> dict[str, np.ndarray]:
    """A TrackML ``detectors.csv`` as arrays (layout of :func:`~pointformers.data.tracking.module_table`)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: detectors file not found")
    t = _read_csv(path, DETECTORS_COLUMNS)
    t["rot"] = np.stack([t.pop(r) for r in _ROT], 1).reshape(-1, 3, 3)
    return t


def _cell_summary(cells: dict[str, np.ndarray], hit_ids: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per hit: cluster extents ``n_u, n_v`` (0 when no cells) and charge fraction."""
    n = len(hit_ids)
    n_u = np.zeros(n, np.int64)
    n_v = np.zeros(n, np.int64)
    frac = np.zeros(n)
    row = _lookup(hit_ids, cells["hit_id"])
    keep = row >= 0
    if not keep.any():
        return n_u, n_v, frac
    row = row[keep]
    order = np.argsort(row, kind="stable")
    r = row[order]
    ch0, ch1, val = cells["ch0"][keep][order], cells["ch1"][keep][order], cells["value"][keep][order]
    starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
    h = r[starts]
    n_u[h] = np.maximum.reduceat(ch0, starts) - np.minimum.reduceat(ch0, starts) + 1
    n_v[h] = np.maximum.reduceat(ch1, starts) - np.minimum.reduceat(ch1, starts) + 1
    total = np.add.reduceat(val, starts)
    frac[h] = np.where(total > 0, np.maximum.reduceat(val, starts) / np.where(total > 0, total, 1), 0.0)
    return n_u, n_v, frac


def read_trackml_event(
    directory_or_prefix: str | Path, detectors: str | Path | Mapping[str, np.ndarray] | None = None
) -> TrackingEvent:
    """Read one TrackML event, keeping the pixel volumes 7, 8, 9 (noise hits included).

    Args:
        directory_or_prefix: the files' common prefix (``…/event000001000``), or a folder
            holding exactly one event.
        detectors: a ``detectors.csv`` path or a table from :func:`read_detectors`; ``None``
            uses ``detectors.csv`` next to the event files when present, otherwise falls back
            (with a warning) to cell-count features, see the module docstring.

    Truth weights and particle ``nhits`` are kept as in the files (they count all volumes).
    """
    src = Path(directory_or_prefix)
    if src.is_dir():
        events = list_trackml_events(src)
        if len(events) != 1:
            raise ValueError(f"directory_or_prefix: {src} holds {len(events)} events "
                             f"({[e.name for e in events[:5]]}…); pass one prefix such as {src / 'event000001000'}")
        src = events[0]
    paths = {kind: _event_file(src, kind) for kind in _KINDS}
    hits = _read_csv(paths["hits"], HITS_COLUMNS)
    truth = _read_csv(paths["truth"], TRUTH_COLUMNS)
    cells = _read_csv(paths["cells"], CELLS_COLUMNS)
    parts = _read_csv(paths["particles"], PARTICLES_COLUMNS)

    keep = np.isin(hits["volume_id"], PIXEL_VOLUMES)
    hits = {k: v[keep] for k, v in hits.items()}
    if len(np.unique(hits["hit_id"])) != len(hits["hit_id"]):
        raise ValueError(f"{paths['hits']}: duplicate hit_id values")
    trow = _lookup(truth["hit_id"], hits["hit_id"])
    if (trow < 0).any():
        raise ValueError(f"{paths['truth']}: no row for hit_id {int(hits['hit_id'][trow < 0][0])} "
                         f"({int((trow < 0).sum())} pixel hits without truth)")
    truth = {k: v[trow] for k, v in truth.items()}

    n_u, n_v, frac = _cell_summary(cells, hits["hit_id"])
    if (n_u == 0).any():
        warnings.warn(f"{paths['cells']}: {int((n_u == 0).sum())} pixel hits have no cells; their cluster features are 0",
                      stacklevel=2)
    det = detectors
    if det is None and (src.parent / "detectors.csv").is_file():
        det = src.parent / "detectors.csv"
    n = len(n_u)
    if det is not None:
        table = det if isinstance(det, Mapping) else read_detectors(det)
        mrow = _lookup(_module_keys(table["volume_id"], table["layer_id"], table["module_id"]),
                       _module_keys(hits["volume_id"], hits["layer_id"], hits["module_id"]))
        if (mrow < 0).any():
            i = int(np.flatnonzero(mrow < 0)[0])
            where = det if not isinstance(det, Mapping) else "detectors"
            raise ValueError(f"{where}: no module (volume_id, layer_id, module_id) = "
                             f"({hits['volume_id'][i]}, {hits['layer_id'][i]}, {hits['module_id'][i]}) "
                             f"of hit_id {hits['hit_id'][i]}")
        feats = cluster_features(n_u * table["pitch_u"][mrow], n_v * table["pitch_v"][mrow],
                                 np.where(n_u > 0, 2 * table["module_t"][mrow], 0.0), frac, table["rot"][mrow])
    else:
        warnings.warn(f"{src}: no detectors file given or found next to the event; cluster features use the "
                      "nominal pixel pitch and thickness and geta = gphi = 0", stacklevel=2)
        g = GEOMETRY
        feats = cluster_features(n_u * g.pitch_u, n_v * g.pitch_v, np.where(n_u > 0, g.thickness, 0.0), frac,
                                 np.broadcast_to(np.eye(3), (n, 3, 3)))
        feats[:, CLUSTER_FEATURES.index("geta")] = 0.0
        feats[:, CLUSTER_FEATURES.index("gphi")] = 0.0
    feats[n_u == 0] = 0.0

    f32 = np.float32
    m = re.search(r"(\d+)$", src.name)
    return TrackingEvent(
        hit_id=hits["hit_id"], x=hits["x"].astype(f32), y=hits["y"].astype(f32), z=hits["z"].astype(f32),
        volume_id=hits["volume_id"], layer_id=hits["layer_id"], module_id=hits["module_id"], cells=feats,
        particle_id=truth["particle_id"], weight=truth["weight"].astype(f32),
        particles_id=parts["particle_id"], vx=parts["vx"].astype(f32), vy=parts["vy"].astype(f32),
        vz=parts["vz"].astype(f32), px=parts["px"].astype(f32), py=parts["py"].astype(f32), pz=parts["pz"].astype(f32),
        q=parts["q"], nhits=parts["nhits"], event_id=int(m.group(1)) if m else 0, sector=-1,
        tx=truth["tx"].astype(f32), ty=truth["ty"].astype(f32), tz=truth["tz"].astype(f32),
        tpx=truth["tpx"].astype(f32), tpy=truth["tpy"].astype(f32), tpz=truth["tpz"].astype(f32),
    )


__all__ = ["PIXEL_VOLUMES", "list_trackml_events", "read_detectors", "read_trackml_event", "write_detectors",
           "write_trackml_event"]
