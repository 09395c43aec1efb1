"""TrackML CSV files: reader (pixel volumes 7, 8, 9) and writer (for generated events).

Files
-----
Per event ``<name>`` (the challenge names them ``event000001000`` …) a TrackML folder holds
``<name>-hits.csv`` (hit_id, x, y, z, volume_id, layer_id, module_id),
``<name>-cells.csv`` (hit_id, ch0, ch1, value), and for labelled events
``<name>-truth.csv`` (hit_id, particle_id, tx, ty, tz, tpx, tpy, tpz, weight) and
``<name>-particles.csv`` (particle_id, vx, vy, vz, px, py, pz, q, nhits). One
``detectors.csv`` (volume_id, layer_id, module_id, cx, cy, cz, rot_xu … rot_zw, module_t,
module_minhu, module_maxhu, module_hv, pitch_u, pitch_v) describes every module. Any file
may be gzip-compressed (``.csv.gz``); extra columns (e.g. ``particle_type``) are ignored.
Lengths are in mm, momenta in GeV. A cell's ``value`` is the geometric path length [mm] of
the track in that pixel; ``ch0`` indexes the pixel along the module's u axis, ``ch1`` along v.

Reading
-------
* One event: ``read_trackml_event("data/train_1/event000001000")`` (the files' common
  prefix), or a folder that holds exactly one event.
* A folder of events: ``for event in read_trackml_events("data/train_1"): ...`` — every
  event of the folder, sorted by name, read lazily one at a time.
* ``detectors.csv``: pass ``detectors=`` (a path or a :func:`read_detectors` table); by
  default ``detectors.csv`` (or ``.csv.gz``) is looked for in the events' folder, then in its
  parent folder (the challenge's layout: ``detectors.csv`` next to ``train_1/``). Without one
  the reader warns and uses the nominal pitch (0.05 × 0.05625 mm) and module_t (0.15 mm),
  with ``geta = gphi = 0`` (the module orientation is unknown).
* Unlabelled events (hits and cells only, e.g. the challenge's test set): pass
  ``truth=False``. Truth and particle files are then not read even if present: every
  ``particle_id`` is 0, every ``weight`` 0, the particle table is empty and the truth-at-hit
  fields (``tx`` …) are ``None``. With ``truth=True`` (the default) a missing truth or
  particles file is an error.
* Only the pixel volumes 7, 8, 9 are kept (noise hits included). Hits whose particle is
  absent from the particles file are kept with their ``particle_id`` (their particle pT and
  vertex read as 0) and a warning is issued. Truth weights and particle ``nhits`` are kept as
  in the files (they count all volumes).
* Validation (a ValueError naming the file, and the line as an editor shows it, header =
  line 1): required columns, numbers that parse, the same field count on every line; finite
  x, y, z (pixel hits), cell values, truth tx … tpz and weight, particle vx … pz, and every
  float column of ``detectors.csv``; at least one pixel hit, truth row and particle row;
  unique hit_id (pixel hits, truth), particle_id and detector module; every cell's and truth
  row's hit_id present in the hits file; a truth row for every pixel hit; a module in the
  detectors table for every pixel hit. Truncated or corrupted gzip and non-UTF-8 text are
  reported with the file (and line).

Model-input features
--------------------
The reader fills :attr:`TrackingEvent.cells` with the 8 cluster features; together with the
hit position they give the 15 model inputs of
:func:`pointformers.tasks.tracking.tracking_inputs`, as the HEPT authors' preprocessing
builds them (their ``PointCloudBuilder`` and Exa.TrkX's cell-feature code). Per hit, with
``n_u = max ch0 − min ch0 + 1`` and ``n_v = max ch1 − min ch1 + 1`` over its cells and the
module's ``pitch_u, pitch_v, module_t`` and rotation matrix R from ``detectors.csv``:

==  ============  ===========================================  =========  =================
 #  name          formula                                      unit       model input
==  ============  ===========================================  =========  =================
 0  r             sqrt(x² + y²)                                mm         r / 1000
 1  phi           atan2(y, x)                                  rad        phi / π
 2  z             z                                            mm         z / 1000
 3  eta_rz        −ln tan(θ/2), θ = atan2(r, z)                —          as is
 4  u             x / (x² + y²)                                1/mm       u · 1000
 5  v             y / (x² + y²)                                1/mm       v · 1000
 6  charge_frac   Σ value / number of cells (mean cell value)  mm         as is
 7  leta          −ln tan(θ_l/2), θ_l = arccos(lz / |l|)       —          as is
 8  lphi          atan2(ly, lx)                                rad        as is
 9  lx            n_u · pitch_u                                mm         as is
10  ly            n_v · pitch_v                                mm         as is
11  lz            2 · module_t (0.30 for every pixel module)   mm         as is
12  geta          −ln tan(θ_g/2), θ_g = arccos(g_z / |g|)      —          as is
13  gphi          atan2(g_y, g_x)                              rad        as is
14  layer         index of (volume_id, layer_id) in the        —          layer / 10
                  sorted pixel layers (7,2) … (7,14), (8,2) …
                  (8,8), (9,2) … (9,14): 0 … 17
==  ============  ===========================================  =========  =================

Here l = (lx, ly, lz) is the unsigned cluster-extent vector in the module frame (u, v, w) and
g = R·l the same vector in global coordinates. ``charge_frac`` is **not** a fraction: it is
the mean path length per pixel (real TrackML events: median ≈ 0.05 mm in the barrel, ≈ 0.17 mm
in the end caps). The cluster features are computed in float64 and rounded to float32 once,
which reproduces the authors' leta, lphi, lx, ly, lz, geta, gphi bit for bit. ``charge_frac``
is the correctly rounded mean of the cells' values as float32 (as the TrackML library reads
them); the authors' pandas code sums those float32 values in float32 before dividing, so for
clusters of three or more cells theirs can differ from ours by up to two float32 ulps
(≈ 1e-8 relative; one or two cells agree bit for bit). Likewise they evaluate r, phi,
eta_rz, u, v in float32 arithmetic where :func:`~pointformers.tasks.tracking.tracking_inputs`
uses float64: a few float32 ulps of difference (eta_rz: up to ≈ 6e-6 near η = 0). The
authors number only the pixel layers present in the whole event (before any φ-sector cut);
an event with hits on all 18 layers (every full TrackML event) gets the numbering above.

Hits without cells warn and get all 8 cluster features 0.

Writing
-------
:func:`write_trackml_event` writes the event's own pixel cells when it has a cell table
(:data:`~pointformers.data.event.CELL_FIELDS`; every generated event and every event read
by this module has one). For an event without, it writes per hit with a cluster (``lx`` or
``ly`` > 0) the ``n_u + n_v − 1`` cells of a straight staircase spanning ``n_u × n_v`` pixels
(``n_u = lx / pitch_u``, ``n_v = ly / pitch_v``), each with ``value = charge_frac``. It writes
``detectors.csv`` (the real TrackML pixel modules shipped with the package) with float64
numbers printed exactly, so that ``read_trackml_event(write_trackml_event(e))`` gives back e's
float32 features bit for bit, and its cells exactly. Every file is written atomically
(:func:`pointformers.files.atomic_write`).

The reader keeps the cells of the pixel hits as the event's cell table (grouped by hit, in
file order within a hit), and the features of generated events are computed from their cells
by the same function (:func:`~pointformers.data.tracking.cluster_features_from_cells`).
"""
from __future__ import annotations

import gzip
import io
import re
import warnings
import zlib
from pathlib import Path
from typing import IO, Callable, Iterator, Mapping

import numpy as np

from ..files import atomic_write
from .event import CLUSTER_FEATURES, TrackingEvent
from .tracking import GEOMETRY, PixelGeometry, cluster_features_from_cells, module_table

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
_TABLE_KEYS = ("volume_id", "layer_id", "module_id", "rot", "module_t", "pitch_u", "pitch_v")
_KINDS = ("hits", "cells", "truth", "particles")
_FLOAT = "%.9g"  # enough digits to round-trip float32 exactly
_EXACT = "%r"  # Python's shortest repr: round-trips float64 exactly


# ============================================================================ CSV helpers
def _open_text(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", errors="strict")
    return open(path, "r", newline="", encoding="utf-8", errors="strict")


def _read_csv(path: Path, columns: Mapping[str, str]) -> dict[str, np.ndarray]:
    """Read the named columns (``"i"``: int64, ``"f"``: float64) of a comma-separated file.

    Raises ValueError naming the file and the missing columns, or the file, line number and
    column of a malformed line.
    """
    try:
        return _read_csv_checked(path, columns)
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise ValueError(f"file {path}: truncated or corrupted gzip ({exc})") from None
    except UnicodeDecodeError:
        raise ValueError(f"file {path}: not UTF-8 text (line {_bad_utf8_line(path)})") from None


def _bad_utf8_line(path: Path) -> int:
    """1-based line number of the first line of ``path`` that is not valid UTF-8."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return lineno
    return 1


def _read_csv_checked(path: Path, columns: Mapping[str, str]) -> dict[str, np.ndarray]:
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


def _data_line(path: Path, row: int) -> int:
    """File line number of data row ``row`` (0-based; the header is line 1, blank lines skipped)."""
    seen = -1
    with _open_text(path) as f:
        for lineno, line in enumerate(f, start=1):
            if lineno > 1 and line.strip():
                seen += 1
                if seen == row:
                    return lineno
    return row + 2


def _check_finite(path: Path, table: Mapping[str, np.ndarray], columns: Mapping[str, str]) -> None:
    """ValueError naming the file, line and column of the first NaN/inf among the float columns."""
    for name, kind in columns.items():
        if kind != "f":
            continue
        bad = ~np.isfinite(table[name])
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{path}, line {_data_line(path, i)}, column {name!r}: {table[name][i]} is not a "
                             "finite number")


def _check_rows(path: Path, table: Mapping[str, np.ndarray], what: str) -> None:
    """ValueError naming the file when it holds a header but no data line."""
    if len(next(iter(table.values()))) == 0:
        raise ValueError(f"{path}: no data lines (only the header); expected at least one {what}")


def _check_unique(path: Path, values: np.ndarray, name: str, shown: Callable[[int], str] | None = None) -> None:
    """ValueError naming the file and the lines of the first repeated ``name`` value (``shown(row)``:
    how to print a row's value, e.g. the columns that make a composite key)."""
    uniq, first, counts = np.unique(values, return_index=True, return_counts=True)
    if (counts > 1).any():
        seen = np.zeros(len(values), bool)
        seen[first] = True
        i = int(np.flatnonzero(~seen)[0])  # the first row whose value appeared on an earlier row
        k = int(np.searchsorted(uniq, values[i]))
        raise ValueError(f"{path}: {name} {int(values[i]) if shown is None else shown(i)} appears {int(counts[k])} "
                         f"times (lines {_data_line(path, int(first[k]))} and {_data_line(path, i)})")


def _check_known(path: Path, values: np.ndarray, known: np.ndarray, name: str, other: Path,
                 allow_zero: bool = False) -> None:
    """ValueError naming the file and the line of the first ``name`` value absent from ``known``."""
    bad = ~np.isin(values, known)
    if allow_zero:
        bad &= values != 0
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{path}, line {_data_line(path, i)}: {name} {int(values[i])} is not in {other} "
                         f"({int(bad.sum())} rows of this file refer to {name}s that are not there)")


def _write_csv(path: Path, columns: list[tuple[str, np.ndarray, str]]) -> None:
    """Write columns ``(name, values (n,), printf format)`` to ``path`` (header + n lines), atomically
    (:func:`~pointformers.files.atomic_write`: a failure leaves no partial file)."""
    row = ",".join(fmt for _, _, fmt in columns)
    lists = [np.asarray(v).tolist() for _, v, _ in columns]
    buf = io.StringIO()
    buf.write(",".join(name for name, _, _ in columns) + "\n")
    for vals in zip(*lists):
        buf.write(row % vals)
        buf.write("\n")
    data = buf.getvalue().encode("utf-8")
    atomic_write(path, lambda f: f.write(data))


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
    """Write the simulated detector's modules as a TrackML ``detectors.csv``.

    These are the real TrackML pixel modules (volumes 7, 8, 9) shipped with the package
    (:func:`~pointformers.data.tracking.module_table`: the challenge's ``detectors.csv`` as
    distributed in the HEPT authors' repository; Amrouche et al. 2019). Floating-point columns
    are printed with Python's shortest round-trip ``repr``, so the reader recovers the float64
    module frames exactly.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    t = module_table(geo)
    rot = t["rot"].reshape(-1, 9)  # row-major: rot_xu, rot_xv, rot_xw, rot_yu, ...
    cols = [("volume_id", t["volume_id"], "%d"), ("layer_id", t["layer_id"], "%d"), ("module_id", t["module_id"], "%d"),
            ("cx", t["cx"], _EXACT), ("cy", t["cy"], _EXACT), ("cz", t["cz"], _EXACT)]
    cols += [(name, rot[:, j].astype(np.float64), _EXACT) for j, name in enumerate(_ROT)]
    cols += [(name, np.asarray(t[name], np.float64), _EXACT)
             for name in ("module_t", "module_minhu", "module_maxhu", "module_hv", "pitch_u", "pitch_v")]
    _write_csv(path, cols)
    return path


def _synthesise_cells(event: TrackingEvent, geo: PixelGeometry) -> tuple[np.ndarray, ...]:
    """Cells ``(hit_id, ch0, ch1, value)`` giving back each hit's extents and mean cell value.

    A hit with ``lx`` or ``ly`` > 0 gets the ``n_u + n_v − 1`` pixels of a monotone staircase
    from one corner of its ``n_u × n_v`` box to the other (the pixels a straight segment
    crosses), each of value ``charge_frac``; a hit with ``lx = ly = 0`` (no cluster) gets none.
    """
    cells = np.asarray(event.cells)
    cf = cells[:, CLUSTER_FEATURES.index("charge_frac")].astype(np.float32)
    if not np.all(np.isfinite(cf)) or (cf < 0).any():
        bad = int(np.flatnonzero(~np.isfinite(cf) | (cf < 0))[0])
        raise ValueError(f"event.cells: charge_frac (a mean cell value) must be finite and >= 0, "
                         f"got {cf[bad]} for hit_id {int(event.hit_id[bad])}")
    lx = cells[:, CLUSTER_FEATURES.index("lx")].astype(np.float64)
    ly = cells[:, CLUSTER_FEATURES.index("ly")].astype(np.float64)
    has = (lx > 0) | (ly > 0)
    n_u = np.maximum(1, np.rint(lx / geo.pitch_u)).astype(np.int64)
    n_v = np.maximum(1, np.rint(ly / geo.pitch_v)).astype(np.int64)
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
        nch_u = np.floor(2 * t["module_maxhu"][r] / geo.pitch_u).astype(np.int64)
        nch_v = np.floor(2 * t["module_hv"][r] / geo.pitch_v).astype(np.int64)
        u = np.floor((loc[:, 0] + t["module_minhu"][r]) / geo.pitch_u).astype(np.int64) - n_u[ok] // 2
        v = np.floor((loc[:, 1] + t["module_hv"][r]) / geo.pitch_v).astype(np.int64) - n_v[ok] // 2
        u0[ok] = np.clip(u, 0, np.maximum(nch_u - n_u[ok], 0))
        v0[ok] = np.clip(v, 0, np.maximum(nch_v - n_v[ok], 0))
    # Cell k = 0 .. m-1 of a hit: i_u(k) = round(k·a / (a + b)) u-steps and k - i_u(k) v-steps
    # (a = n_u - 1, b = n_v - 1), so each step moves one pixel in u or in v.
    m = np.where(has, n_u + n_v - 1, 0)
    hit = np.repeat(np.arange(event.num_hits), m)
    k = np.arange(len(hit), dtype=np.int64) - np.repeat(np.cumsum(m) - m, m)
    a, b = n_u[hit] - 1, n_v[hit] - 1
    iu = (2 * k * a + a + b) // np.maximum(2 * (a + b), 1)
    return event.hit_id[hit], u0[hit] + iu, v0[hit] + (k - iu), cf[hit]


def write_trackml_event(
    event: TrackingEvent,
    directory: str | Path,
    event_name: str = "event000000000",
    write_detectors_file: bool = True,
    geo: PixelGeometry = GEOMETRY,
) -> dict[str, Path]:
    """Write ``event`` as TrackML CSV files in ``directory``.

    Writes ``<event_name>-{hits,cells,truth,particles}.csv`` and (unless
    ``write_detectors_file`` is False) ``detectors.csv`` for the simulated geometry (the real
    TrackML pixel modules). An event with a cell table (``event.cell_hit`` …, e.g. every
    generated event) gets exactly its own cells; for one without, cells are synthesised from
    the cluster features (see the module docstring). Either way reading the folder back gives
    the same float32 features (and the same cells). Missing truth-at-hit fields (``tx`` …) are
    filled with the measured position and the particle's production momentum. Returns the
    written paths by kind.
    """
    if not re.fullmatch(r"[A-Za-z0-9_.]+", event_name):
        raise ValueError(f"event_name: expected letters, digits, '_' or '.', got {event_name!r}")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    paths = {kind: d / f"{event_name}-{kind}.csv" for kind in _KINDS}
    if event.has_cell_table:
        hid, ch0, ch1, value = (event.hit_id[event.cell_hit], event.cell_ch0, event.cell_ch1,
                                np.asarray(event.cell_value, np.float32))
    else:
        hid, ch0, ch1, value = _synthesise_cells(event, geo)
    _write_csv(paths["hits"], [("hit_id", event.hit_id, "%d"), ("x", event.x, _FLOAT), ("y", event.y, _FLOAT),
                               ("z", event.z, _FLOAT), ("volume_id", event.volume_id, "%d"),
                               ("layer_id", event.layer_id, "%d"), ("module_id", event.module_id, "%d")])
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
_DETECTOR_NAMES = ("detectors.csv", "detectors.csv.gz")


def list_trackml_events(directory: str | Path) -> list[Path]:
    """Prefixes (``<directory>/<name>``) of the events in ``directory``, sorted by name.

    An event is any ``<name>-hits.csv`` or ``<name>-hits.csv.gz`` file.
    """
    d = Path(directory)
    if not d.is_dir():
        raise ValueError(f"directory: {d} is not a folder")
    names = {m.group("name") for p in d.iterdir() if (m := _HITS_RE.match(p.name))}
    return [d / n for n in sorted(names)]


def _event_file(prefix: Path, kind: str, hint: str = "") -> Path:
    for suffix in (".csv", ".csv.gz"):
        p = prefix.parent / f"{prefix.name}-{kind}{suffix}"
        if p.is_file():
            return p
    raise ValueError(f"{prefix.parent / (prefix.name + '-' + kind + '.csv')}: file not found "
                     f"(the event's {kind} table, also looked for .csv.gz){hint}")


def read_detectors(path: str | Path) -> dict[str, np.ndarray]:
    """A TrackML ``detectors.csv`` as arrays (layout of :func:`~pointformers.data.tracking.module_table`).

    Returns ``volume_id, layer_id, module_id`` (int64), ``cx … pitch_v`` (float64, ``(m,)``)
    and ``rot`` ``(m, 3, 3)`` (row = global x, y, z; column = local u, v, w).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: detectors file not found")
    t = _read_csv(path, DETECTORS_COLUMNS)
    _check_finite(path, t, DETECTORS_COLUMNS)  # a header-only file fails at the first hit's module
    _check_unique(path, _module_keys(t["volume_id"], t["layer_id"], t["module_id"]),
                  "module (volume_id, layer_id, module_id) =",
                  lambda i: f"({t['volume_id'][i]}, {t['layer_id'][i]}, {t['module_id'][i]})")
    t["rot"] = np.stack([t.pop(r) for r in _ROT], 1).reshape(-1, 3, 3)
    return t


def _find_detectors(folder: Path) -> Path | None:
    """``detectors.csv[.gz]`` in ``folder``, else in its parent (the challenge's layout)."""
    for d in (folder, folder.parent):
        for name in _DETECTOR_NAMES:
            if (d / name).is_file():
                return d / name
    return None


def _detector_table(detectors: object, folder: Path) -> tuple[Mapping[str, np.ndarray] | None, str]:
    """The module table to use and how to name it in messages (``None`` when there is none)."""
    if detectors is None:
        found = _find_detectors(folder)
        return (read_detectors(found), str(found)) if found is not None else (None, "")
    if isinstance(detectors, Mapping):
        missing = [k for k in _TABLE_KEYS if k not in detectors]
        if missing:
            raise ValueError(f"detectors: table lacks {missing} (expected the output of read_detectors)")
        return detectors, "detectors"
    if isinstance(detectors, (str, Path)):
        return read_detectors(detectors), str(detectors)
    raise ValueError(f"detectors: expected a path, a read_detectors table or None, got {type(detectors).__name__}")


def _cell_rows(cells: dict[str, np.ndarray], hit_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hit row of each cell of a kept hit, and the cells' positions in the file.

    Cells of hits that were not kept (other volumes, unknown hit ids) are dropped; the rest are
    stably sorted by hit row, so a file grouped by hit keeps its order.
    """
    row = _lookup(hit_ids, cells["hit_id"])
    src = np.flatnonzero(row >= 0)
    src = src[np.argsort(row[src], kind="stable")]
    return row[src], src


def _check_truth_flag(truth: object) -> bool:
    if not isinstance(truth, (bool, np.bool_)):
        raise ValueError(f"truth: expected True (labelled event) or False (hits and cells only), got {truth!r}")
    return bool(truth)


def read_trackml_event(
    directory_or_prefix: str | Path,
    detectors: str | Path | Mapping[str, np.ndarray] | None = None,
    truth: bool = True,
) -> TrackingEvent:
    """Read one TrackML event, keeping the pixel volumes 7, 8, 9 (noise hits included).

    Args:
        directory_or_prefix: the files' common prefix (``…/event000001000``), or a folder
            holding exactly one event (a folder with several: use :func:`read_trackml_events`).
        detectors: a ``detectors.csv`` path or a table from :func:`read_detectors`; ``None``
            looks for ``detectors.csv`` next to the event files, then in their parent folder,
            and otherwise falls back (with a warning) to nominal pixel features, see the
            module docstring.
        truth: False reads an unlabelled event (hits and cells only): particle_id and weight
            0, no particles, no truth-at-hit fields.

    The 8 cluster features (:attr:`TrackingEvent.cells`) are computed from the cells as the
    module docstring says. Truth weights and particle ``nhits`` are kept as in the files
    (they count all volumes).
    """
    truth = _check_truth_flag(truth)
    src = Path(directory_or_prefix)
    if src.is_dir():
        events = list_trackml_events(src)
        if not events:
            raise ValueError(f"directory_or_prefix: {src} holds no TrackML event (no <name>-hits.csv or .csv.gz)")
        if len(events) > 1:
            shown = ", ".join(e.name for e in events[:3]) + (", …" if len(events) > 3 else "")
            raise ValueError(f"directory_or_prefix: {src} holds {len(events)} events ({shown}); read them all "
                             f"with read_trackml_events({str(src)!r}) or pass one prefix such as {events[0]}")
        src = events[0]
    table, where = _detector_table(detectors, src.parent)
    if table is None:
        _warn_no_detectors(str(src), stacklevel=3)
    return _read_event(src, table, where, truth)


def read_trackml_events(
    directory: str | Path,
    detectors: str | Path | Mapping[str, np.ndarray] | None = None,
    truth: bool = True,
) -> Iterator[TrackingEvent]:
    """Every TrackML event of a folder, sorted by name, one :class:`TrackingEvent` at a time.

    Accepts the challenge's layout (``event000001000-hits.csv.gz``, ``…-cells.csv.gz``, …).
    ``detectors`` (a path or a :func:`read_detectors` table) is read once; ``None`` looks for
    ``detectors.csv`` in ``directory``, then in its parent folder (the challenge ships it next
    to the ``train_*`` folders). ``truth`` as in :func:`read_trackml_event`. The folder, the
    detectors and ``truth`` are checked at once; each event is read when the iterator reaches it.

    Raises:
        ValueError: if ``directory`` is not a folder or holds no event.
    """
    truth = _check_truth_flag(truth)
    prefixes = list_trackml_events(directory)
    if not prefixes:
        raise ValueError(f"directory: {directory} holds no TrackML event (no <name>-hits.csv or .csv.gz)")
    table, where = _detector_table(detectors, Path(directory))
    if table is None:
        _warn_no_detectors(str(directory), stacklevel=3)
    return (_read_event(p, table, where, truth) for p in prefixes)


def _warn_no_detectors(what: str, stacklevel: int) -> None:
    warnings.warn(f"{what}: no detectors file given or found (detectors.csv next to the events or in their "
                  "parent folder); cluster features use the nominal pixel pitch and module_t and geta = gphi = 0",
                  stacklevel=stacklevel)


def _read_event(src: Path, table: Mapping[str, np.ndarray] | None, where: str, truth: bool) -> TrackingEvent:
    paths = {"hits": _event_file(src, "hits"), "cells": _event_file(src, "cells")}
    if truth:
        hint = "; pass truth=False to read an unlabelled event (hits and cells only)"
        paths["truth"] = _event_file(src, "truth", hint)
        paths["particles"] = _event_file(src, "particles", hint)
    hits = _read_csv(paths["hits"], HITS_COLUMNS)
    all_hit_ids = hits["hit_id"]  # every volume's: cells and truth rows must refer to one of them
    keep = np.isin(hits["volume_id"], PIXEL_VOLUMES)
    hits = {k: v[keep] for k, v in hits.items()}
    if len(hits["hit_id"]) == 0:
        raise ValueError(f"{paths['hits']}: no pixel hits (volumes {PIXEL_VOLUMES}); the file holds "
                         f"{int(keep.size)} hit rows")
    bad = ~(np.isfinite(hits["x"]) & np.isfinite(hits["y"]) & np.isfinite(hits["z"]))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        row = int(np.flatnonzero(keep)[i])
        raise ValueError(f"{paths['hits']}, line {_data_line(paths['hits'], row)} (hit_id {int(hits['hit_id'][i])}): "
                         f"coordinates (x, y, z) = ({hits['x'][i]}, {hits['y'][i]}, {hits['z'][i]}) are not finite")
    if len(np.unique(hits["hit_id"])) != len(hits["hit_id"]):
        raise ValueError(f"{paths['hits']}: duplicate hit_id values")

    cells = _read_csv(paths["cells"], CELLS_COLUMNS)
    _check_finite(paths["cells"], cells, CELLS_COLUMNS)
    _check_known(paths["cells"], cells["hit_id"], all_hit_ids, "hit_id", paths["hits"])
    n = len(hits["hit_id"])
    cell_hit, cell_src = _cell_rows(cells, hits["hit_id"])
    cell_table = dict(cell_hit=cell_hit.astype(np.int32), cell_ch0=cells["ch0"][cell_src].astype(np.int32),
                      cell_ch1=cells["ch1"][cell_src].astype(np.int32), cell_value=cells["value"][cell_src].astype(np.float32))
    n_cells = np.bincount(cell_hit, minlength=n)
    if (n_cells == 0).any():
        warnings.warn(f"{paths['cells']}: {int((n_cells == 0).sum())} pixel hits have no cells; "
                      "their cluster features are 0", stacklevel=3)
    if table is not None:
        mrow = _lookup(_module_keys(table["volume_id"], table["layer_id"], table["module_id"]),
                       _module_keys(hits["volume_id"], hits["layer_id"], hits["module_id"]))
        if (mrow < 0).any():
            i = int(np.flatnonzero(mrow < 0)[0])
            raise ValueError(f"{where}: no module (volume_id, layer_id, module_id) = "
                             f"({hits['volume_id'][i]}, {hits['layer_id'][i]}, {hits['module_id'][i]}) "
                             f"of hit_id {hits['hit_id'][i]} in {paths['hits']}")
        pitch_u, pitch_v = np.asarray(table["pitch_u"])[mrow], np.asarray(table["pitch_v"])[mrow]
        module_t, rot = np.asarray(table["module_t"])[mrow], np.asarray(table["rot"])[mrow]
    else:
        g = GEOMETRY
        pitch_u, pitch_v, module_t = np.full(n, g.pitch_u), np.full(n, g.pitch_v), np.full(n, g.module_t)
        rot = np.broadcast_to(np.eye(3), (n, 3, 3))
    # The same code computes the features of generated events from their cells.
    feats, _ = cluster_features_from_cells(cell_hit, cell_table["cell_ch0"], cell_table["cell_ch1"],
                                           cell_table["cell_value"], n, pitch_u, pitch_v, module_t, rot)
    if table is None:
        feats[:, CLUSTER_FEATURES.index("geta")] = 0.0
        feats[:, CLUSTER_FEATURES.index("gphi")] = 0.0

    f32 = np.float32
    m = re.search(r"(\d+)$", src.name)
    event_id = int(m.group(1)) if m else 0
    geometry = dict(hit_id=hits["hit_id"], x=hits["x"].astype(f32), y=hits["y"].astype(f32), z=hits["z"].astype(f32),
                    volume_id=hits["volume_id"], layer_id=hits["layer_id"], module_id=hits["module_id"], cells=feats,
                    event_id=event_id, sector=-1, **cell_table)
    if not truth:
        f0, i0 = np.zeros(0, f32), np.zeros(0, np.int64)
        return TrackingEvent(**geometry, particle_id=np.zeros(n, np.int64), weight=np.zeros(n, f32),
                             particles_id=i0, vx=f0, vy=f0, vz=f0, px=f0, py=f0, pz=f0, q=i0, nhits=i0)

    tru = _read_csv(paths["truth"], TRUTH_COLUMNS)
    _check_rows(paths["truth"], tru, "hit")
    _check_finite(paths["truth"], tru, TRUTH_COLUMNS)
    _check_unique(paths["truth"], tru["hit_id"], "hit_id")
    _check_known(paths["truth"], tru["hit_id"], all_hit_ids, "hit_id", paths["hits"])
    parts = _read_csv(paths["particles"], PARTICLES_COLUMNS)
    _check_rows(paths["particles"], parts, "particle")
    _check_finite(paths["particles"], parts, PARTICLES_COLUMNS)
    _check_unique(paths["particles"], parts["particle_id"], "particle_id")
    trow = _lookup(tru["hit_id"], hits["hit_id"])
    if (trow < 0).any():
        raise ValueError(f"{paths['truth']}: no row for hit_id {int(hits['hit_id'][trow < 0][0])} "
                         f"({int((trow < 0).sum())} pixel hits without truth)")
    tru = {k: v[trow] for k, v in tru.items()}
    orphan = (tru["particle_id"] != 0) & ~np.isin(tru["particle_id"], parts["particle_id"])
    if orphan.any():
        warnings.warn(f"{paths['particles']}: {int(orphan.sum())} pixel hits of "
                      f"{len(np.unique(tru['particle_id'][orphan]))} particles absent from this file (e.g. "
                      f"particle_id {int(tru['particle_id'][orphan][0])}); they keep their particle_id, their "
                      "particle's pT and vertex read as 0", stacklevel=3)
    return TrackingEvent(
        **geometry, particle_id=tru["particle_id"], weight=tru["weight"].astype(f32),
        particles_id=parts["particle_id"], vx=parts["vx"].astype(f32), vy=parts["vy"].astype(f32),
        vz=parts["vz"].astype(f32), px=parts["px"].astype(f32), py=parts["py"].astype(f32), pz=parts["pz"].astype(f32),
        q=parts["q"], nhits=parts["nhits"],
        tx=tru["tx"].astype(f32), ty=tru["ty"].astype(f32), tz=tru["tz"].astype(f32),
        tpx=tru["tpx"].astype(f32), tpy=tru["tpy"].astype(f32), tpz=tru["tpz"].astype(f32),
    )


__all__ = ["PIXEL_VOLUMES", "list_trackml_events", "read_detectors", "read_trackml_event", "read_trackml_events",
           "write_detectors", "write_trackml_event"]
