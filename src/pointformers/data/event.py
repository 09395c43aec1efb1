"""The in-memory container for one charged-particle tracking event (or one φ-sector of it).

Everything is a numpy array, one row per hit (``n`` hits) or per particle (``p`` particles).
Generators (:mod:`pointformers.data.tracking`) and the TrackML reader
(:mod:`pointformers.data.trackml`) both produce this; the tracking task turns it into model
inputs. Units follow TrackML: millimetres, GeV.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Sequence

import numpy as np

#: Order of the cluster-shape columns in :attr:`TrackingEvent.cells` (TrackML-derived names).
CLUSTER_FEATURES = ("charge_frac", "leta", "lphi", "lx", "ly", "lz", "geta", "gphi")

#: Fields with one row per hit (the optional truth-at-hit fields may be ``None``).
HIT_FIELDS = (
    "hit_id", "x", "y", "z", "volume_id", "layer_id", "module_id", "cells", "particle_id", "weight",
    "tx", "ty", "tz", "tpx", "tpy", "tpz", "sector_own", "particle_layers",
)
#: Fields with one row per particle.
PARTICLE_FIELDS = ("particles_id", "vx", "vy", "vz", "px", "py", "pz", "q", "nhits")
_OPTIONAL_HIT_FIELDS = ("tx", "ty", "tz", "tpx", "tpy", "tpz", "sector_own", "particle_layers")
#: Optional fields with one row per pixel cell (TrackML ``cells.csv``): all set or all ``None``.
CELL_FIELDS = ("cell_hit", "cell_ch0", "cell_ch1", "cell_value")


@dataclass
class TrackingEvent:
    """One event (or sector) of detector hits with truth.

    Hit arrays, shape ``(n,)`` unless stated:
        hit_id: int64, 1-based, unique within the event.
        x, y, z: float32 measured global position [mm].
        volume_id, layer_id, module_id: int64 TrackML detector ids (pixel volumes 7, 8, 9).
        cells: float32 ``(n, 8)`` cluster-shape features in :data:`CLUSTER_FEATURES` order.
        particle_id: int64, 0 for noise hits.
        weight: float32 TrackML truth weight of the hit (0 for noise); sums to 1 over the
            event (or cloud) for generated data; as read from file for TrackML data.
        tx, ty, tz, tpx, tpy, tpz: optional float32 true position [mm] and true momentum
            [GeV] of the particle at the hit (TrackML truth columns); ``None`` when unknown.
        sector_own: optional bool, set on φ-sector clouds
            (:func:`pointformers.data.tracking.split_sectors`): True for the hits of a particle
            the sector owns (at least half of the particle's hits in the event lie in the
            sector's plain wedge), False for noise and for hits of other particles that lie in
            the extended wedge (the HEPT authors' per-hit ``sector`` is the sector id where
            this is True and -1 elsewhere); ``None`` for whole events.
        particle_layers: optional int64, set on φ-sector clouds: number of distinct layers
            the hit's particle hit in the whole event (0 for noise; the authors'
            ``n_layers_hit``); :attr:`reconstructable` uses it, so a particle cut by a sector
            boundary keeps its whole-event status. ``None`` for whole events.
    Cell arrays, shape ``(c,)``, optional (all four or none; ``None`` when unknown):
        cell_hit: int32 row (0-based, into the hit arrays) of the hit each pixel cell belongs to.
        cell_ch0, cell_ch1: int32 pixel indices along the module's u and v axes (TrackML ch0, ch1).
        cell_value: float32 TrackML cell ``value``: the track's path length in the pixel [mm].
        Cells are grouped by hit (non-decreasing ``cell_hit``); a hit may have none.
    Particle arrays, shape ``(p,)``:
        particles_id (int64), vx, vy, vz [mm] and px, py, pz [GeV] at production (float32),
        q (int64 charge), nhits (int64 number of hits the particle left).
    Metadata:
        event_id: int; sector: int (-1 for a whole event).
    """

    hit_id: np.ndarray
    x: np.ndarray
    y: np.ndarray
    z: np.ndarray
    volume_id: np.ndarray
    layer_id: np.ndarray
    module_id: np.ndarray
    cells: np.ndarray
    particle_id: np.ndarray
    weight: np.ndarray
    particles_id: np.ndarray
    vx: np.ndarray
    vy: np.ndarray
    vz: np.ndarray
    px: np.ndarray
    py: np.ndarray
    pz: np.ndarray
    q: np.ndarray
    nhits: np.ndarray
    event_id: int = 0
    sector: int = -1
    tx: np.ndarray | None = None
    ty: np.ndarray | None = None
    tz: np.ndarray | None = None
    tpx: np.ndarray | None = None
    tpy: np.ndarray | None = None
    tpz: np.ndarray | None = None
    sector_own: np.ndarray | None = None
    particle_layers: np.ndarray | None = None
    cell_hit: np.ndarray | None = None
    cell_ch0: np.ndarray | None = None
    cell_ch1: np.ndarray | None = None
    cell_value: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = int(np.shape(self.x)[0])
        for name in HIT_FIELDS:
            v = getattr(self, name)
            if v is None and name in _OPTIONAL_HIT_FIELDS:
                continue
            if v is None or np.shape(v)[:1] != (n,):
                raise ValueError(f"{name}: expected {n} rows (one per hit), got shape {np.shape(v)}")
        if np.ndim(self.cells) != 2 or np.shape(self.cells)[1] != len(CLUSTER_FEATURES):
            raise ValueError(f"cells: expected shape ({n}, {len(CLUSTER_FEATURES)}), got {np.shape(self.cells)}")
        p = int(np.shape(self.particles_id)[0])
        for name in PARTICLE_FIELDS:
            if np.shape(getattr(self, name))[:1] != (p,):
                raise ValueError(f"{name}: expected {p} rows (one per particle), got {np.shape(getattr(self, name))}")
        given = [name for name in CELL_FIELDS if getattr(self, name) is not None]
        if given:
            if len(given) != len(CELL_FIELDS):
                missing = [name for name in CELL_FIELDS if name not in given]
                raise ValueError(f"{missing[0]}: the cell table needs all of {list(CELL_FIELDS)} or none")
            c = int(np.shape(self.cell_hit)[0]) if np.ndim(self.cell_hit) == 1 else -1
            for name in CELL_FIELDS:
                if np.ndim(getattr(self, name)) != 1 or np.shape(getattr(self, name))[0] != c:
                    raise ValueError(f"{name}: expected {c} rows (one per cell), got shape {np.shape(getattr(self, name))}")
            hit = np.asarray(self.cell_hit)
            if c and (hit.min() < 0 or hit.max() >= n or (np.diff(hit) < 0).any()):
                raise ValueError(f"cell_hit: expected non-decreasing hit rows in [0, {n}), got range "
                                 f"[{hit.min()}, {hit.max()}]" + (" (not sorted)" if (np.diff(hit) < 0).any() else ""))

    @property
    def has_cell_table(self) -> bool:
        """True when the event carries its pixel cells (:data:`CELL_FIELDS`)."""
        return self.cell_hit is not None

    # ------------------------------------------------------------------ hit geometry
    @property
    def num_hits(self) -> int:
        return int(self.x.shape[0])

    @property
    def num_particles(self) -> int:
        return int(self.particles_id.shape[0])

    @property
    def r(self) -> np.ndarray:
        """Transverse radius of each hit [mm], ``(n,)``."""
        return np.hypot(self.x, self.y)

    @property
    def phi(self) -> np.ndarray:
        """Azimuth of each hit [rad] in (-π, π], ``(n,)``."""
        return np.arctan2(self.y, self.x)

    @property
    def eta(self) -> np.ndarray:
        """Pseudorapidity of each hit position, η = asinh(z / r), ``(n,)``."""
        return np.arcsinh(self.z / np.maximum(self.r, 1e-9))

    @property
    def layer_index(self) -> np.ndarray:
        """A dense per-layer index combining (volume_id, layer_id), ``(n,)`` int64."""
        return self.volume_id.astype(np.int64) * 100 + self.layer_id.astype(np.int64)

    # ------------------------------------------------------------------ particle lookups
    @property
    def hit_particle_index(self) -> np.ndarray:
        """Row of each hit's particle in the particle table, -1 for noise/unknown, ``(n,)`` int64."""
        out = np.full(self.num_hits, -1, dtype=np.int64)
        if self.num_particles == 0 or self.num_hits == 0:
            return out
        order = np.argsort(self.particles_id, kind="stable")
        pos = np.searchsorted(self.particles_id[order], self.particle_id)
        pos = np.minimum(pos, self.num_particles - 1)
        found = (self.particles_id[order][pos] == self.particle_id) & (self.particle_id > 0)
        out[found] = order[pos[found]]
        return out

    def per_hit(self, values: np.ndarray, fill: float = 0.0) -> np.ndarray:
        """Map a per-particle array ``(p, ...)`` onto hits ``(n, ...)``; noise hits get ``fill``."""
        values = np.asarray(values)
        idx = self.hit_particle_index
        out = np.full((self.num_hits,) + values.shape[1:], fill, dtype=np.result_type(values, fill))
        ok = idx >= 0
        out[ok] = values[idx[ok]]
        return out

    def _particle_lookup(self, values: np.ndarray, fill: float = 0.0) -> np.ndarray:
        """Backward-compatible alias of :meth:`per_hit` returning float64."""
        return self.per_hit(values, fill).astype(np.float64)

    @property
    def pt(self) -> np.ndarray:
        """Transverse momentum at production of each particle [GeV], ``(p,)``."""
        return np.hypot(self.px, self.py)

    @property
    def hit_pt(self) -> np.ndarray:
        """Transverse momentum [GeV] of each hit's particle (0 for noise), ``(n,)`` float32."""
        return self.per_hit(self.pt.astype(np.float32), 0.0).astype(np.float32)

    @property
    def hit_vertex(self) -> np.ndarray:
        """Production vertex (vx, vy, vz) [mm] of each hit's particle (0 for noise), ``(n, 3)``."""
        return self.per_hit(np.stack([self.vx, self.vy, self.vz], 1).astype(np.float32), 0.0)

    @property
    def reconstructable(self) -> np.ndarray:
        """True for hits of a particle (id > 0) that left hits on at least 3 distinct layers.

        Layers are counted over the whole event when :attr:`particle_layers` is set (sector
        clouds, as the HEPT authors count them), else over this event's hits.
        """
        pid = self.particle_id
        real = pid > 0
        if self.particle_layers is not None:
            return real & (np.asarray(self.particle_layers) >= 3)
        out = np.zeros(self.num_hits, dtype=bool)
        if not real.any():
            return out
        pairs = np.unique(np.stack([pid[real], self.layer_index[real]], 1), axis=0)
        ids, counts = np.unique(pairs[:, 0], return_counts=True)
        out[real] = np.isin(pid[real], ids[counts >= 3])
        return out

    # ------------------------------------------------------------------ slicing
    def subset(self, hit_mask: np.ndarray, particle_mask: np.ndarray | None = None, **meta: int) -> "TrackingEvent":
        """The event restricted to some hits (and optionally some particles).

        Args:
            hit_mask: bool ``(n,)`` or integer indices into the hits.
            particle_mask: bool ``(p,)`` or integer indices into the particle table; ``None``
                keeps the particle table as it is.
            meta: overrides for ``event_id`` / ``sector``.
        """
        kw: dict = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in HIT_FIELDS:
                kw[f.name] = None if v is None else v[hit_mask]
            elif f.name in PARTICLE_FIELDS:
                kw[f.name] = v if particle_mask is None else v[particle_mask]
            elif f.name in CELL_FIELDS:
                kw[f.name] = None
            else:
                kw[f.name] = v
        if self.has_cell_table:
            # The kept hits' cells, in the new hit order (a hit listed twice gets its cells twice).
            rows = np.arange(self.num_hits)[hit_mask]
            start = np.searchsorted(np.asarray(self.cell_hit, np.int64), np.arange(self.num_hits + 1))
            count = (start[1:] - start[:-1])[rows]
            new_hit = np.repeat(np.arange(len(rows)), count)
            src = np.repeat(start[:-1][rows] - (np.cumsum(count) - count), count) + np.arange(int(count.sum()))
            kw.update(cell_hit=new_hit.astype(np.int32), cell_ch0=self.cell_ch0[src], cell_ch1=self.cell_ch1[src],
                      cell_value=self.cell_value[src])
        kw.update(meta)
        return TrackingEvent(**kw)

    def copy(self) -> "TrackingEvent":
        """A deep copy (arrays copied)."""
        kw = {f.name: (getattr(self, f.name).copy() if isinstance(getattr(self, f.name), np.ndarray) else getattr(self, f.name))
              for f in fields(self)}
        return TrackingEvent(**kw)


def empty_event(event_id: int = 0, sector: int = -1) -> TrackingEvent:
    """An event with no hits and no particles (dtypes as documented)."""
    f32, i64 = np.zeros(0, np.float32), np.zeros(0, np.int64)
    return TrackingEvent(
        hit_id=i64, x=f32, y=f32, z=f32, volume_id=i64, layer_id=i64, module_id=i64,
        cells=np.zeros((0, len(CLUSTER_FEATURES)), np.float32), particle_id=i64, weight=f32,
        particles_id=i64, vx=f32, vy=f32, vz=f32, px=f32, py=f32, pz=f32, q=i64, nhits=i64,
        event_id=event_id, sector=sector,
    )


def pack_events(events: Sequence[TrackingEvent]) -> dict[str, np.ndarray]:
    """Concatenate events into flat arrays (for ``np.savez``; no pickling needed).

    Returns per-field concatenations plus ``hit_offsets``/``particle_offsets`` ``(len+1,)``,
    ``event_ids``/``sectors`` ``(len,)``. Optional per-hit fields (truth at hit,
    ``sector_own``, ``particle_layers``) are stored only when every event has them; so is the
    cell table (:data:`CELL_FIELDS`, with ``cell_offsets`` ``(len+1,)``; ``cell_hit`` stays
    relative to each event's hits).
    """
    out: dict[str, np.ndarray] = {}
    out["hit_offsets"] = np.concatenate([[0], np.cumsum([e.num_hits for e in events])]).astype(np.int64)
    out["particle_offsets"] = np.concatenate([[0], np.cumsum([e.num_particles for e in events])]).astype(np.int64)
    out["event_ids"] = np.asarray([e.event_id for e in events], dtype=np.int64)
    out["sectors"] = np.asarray([e.sector for e in events], dtype=np.int64)
    template = empty_event()
    for name in HIT_FIELDS + PARTICLE_FIELDS:
        vals = [getattr(e, name) for e in events]
        if any(v is None for v in vals):
            continue
        if vals:
            arr = np.concatenate(vals)
            # Ids fit in int32 for generated data: halve their size on disk (cast back on unpack).
            if arr.dtype == np.int64 and (arr.size == 0 or (arr.min() >= -(2 ** 31) and arr.max() < 2 ** 31)):
                arr = arr.astype(np.int32)
            out[name] = arr
        else:
            out[name] = getattr(template, name) if getattr(template, name) is not None else np.zeros(0, np.float32)
    if events and all(e.has_cell_table for e in events):
        out["cell_offsets"] = np.concatenate([[0], np.cumsum([len(e.cell_hit) for e in events])]).astype(np.int64)
        out["cell_hit"] = np.concatenate([e.cell_hit for e in events]).astype(np.int32)
        for name in ("cell_ch0", "cell_ch1"):  # pixel indices < 1280: int16 on disk when they fit
            arr = np.concatenate([getattr(e, name) for e in events])
            small = arr.size == 0 or (arr.min() >= -(2 ** 15) and arr.max() < 2 ** 15)
            out[name] = arr.astype(np.int16 if small else np.int32)
        out["cell_value"] = np.concatenate([e.cell_value for e in events]).astype(np.float32)
    return out


def unpack_events(arrays: dict[str, np.ndarray]) -> list[TrackingEvent]:
    """Inverse of :func:`pack_events`."""
    ho, po = arrays["hit_offsets"], arrays["particle_offsets"]
    arrays = {k: (v.astype(np.int32 if k in CELL_FIELDS else np.int64) if v.dtype.kind in "iu" else v)
              for k, v in arrays.items()}
    events = []
    for i in range(len(arrays["event_ids"])):
        kw: dict = {}
        for name in HIT_FIELDS:
            kw[name] = arrays[name][ho[i]:ho[i + 1]] if name in arrays else None
        for name in PARTICLE_FIELDS:
            kw[name] = arrays[name][po[i]:po[i + 1]]
        if "cell_offsets" in arrays:
            co = arrays["cell_offsets"]
            for name in CELL_FIELDS:
                kw[name] = arrays[name][co[i]:co[i + 1]]
        events.append(TrackingEvent(event_id=int(arrays["event_ids"][i]), sector=int(arrays["sectors"][i]), **kw))
    return events
