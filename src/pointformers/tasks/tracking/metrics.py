"""Track-level performance as the tracking literature reads it: efficiency, fake and duplicate
rates of matched tracks, overall and against pT and η.

Definitions (those of the gnn_tracking project's cluster metrics and of Exa.TrkX-style papers):

* A **predicted track** is a set of hits with one label ``>= 0`` (a DBSCAN cluster of the hit
  embeddings, :func:`~.building.dbscan_tracks`); unassigned hits (label ``< 0``) form no
  track. A track **counts** only when it has at least ``min_hits`` hits (3).
* **Noise hits** (particle id 0) are never a particle: they are not counted as particles, are
  never a track's majority particle, but they do count in a track's size (they lower purity).
  (gnn_tracking lets noise be a track's majority "particle", which drops such a track from the
  fake-rate denominator; here a track of mostly noise around a few hits of a selected particle
  is a fake. The two agree on every track whose most frequent id is a real particle.)
* A track's **majority particle** is the particle with most hits in it (ties: the lowest
  particle id). ``purity`` = its hits in the track / the track's hits; ``share`` = its hits in
  the track / all its hits in the event (or cloud).
* Matches of a counting track to its majority particle:

  - **double majority** (``dm``): purity > 0.5 and share > 0.5 (so at most one track per particle);
  - **perfect**: share = 1 (every hit of the particle) and purity > 0.99;
  - **LHC** (``lhc``): purity > 0.75 (several tracks can match one particle).

* **Selected particles**: pT ≥ ``pt_min`` (0.9 GeV), reconstructable (hits on ≥ 3 distinct
  layers) and |η| < ``eta_max`` (4), η of the particle's momentum; on φ-sector clouds also
  owned by the sector (the particle is counted in one cloud only).
* For each kind of match (``k`` = ``dm``, ``perfect``, ``lhc``), with *tracks* = counting
  tracks whose majority particle is selected:

  - efficiency ``eff_k`` = matched particles / selected particles (a particle with at least one
    matched track; for ``dm`` and ``perfect`` this equals matched tracks / particles, since at
    most one track can match a particle; for ``lhc`` it keeps the efficiency ≤ 1);
  - fake rate ``fake_k`` = 1 − matched tracks / tracks;
  - duplicate rate ``dup_k`` = (matched tracks − matched particles) / matched particles.

  Ratios with an empty denominator are NaN.

Binned tables: against pT, the pT cut is replaced by the bin (``lo ≤ pT < hi``; other cuts
kept); against η, the bin is ``lo ≤ η < hi`` with every cut kept. Tracks are binned by their
majority particle. Over several events (or clouds) the **counts are summed** before the ratios
are taken (each particle and each track weighs the same, whatever event it is in).

Entry points: :func:`match_tracks` (one event's track table), :func:`track_match_counts`,
:func:`match_rates`, :func:`track_matching_metrics`, :class:`TrackMetricsAccumulator` (pooled
over events, with the binned tables) and :func:`format_track_metrics`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from .trackml_score import hit_array, hit_ids

__all__ = ["MATCH_KINDS", "DEFAULT_PT_EDGES", "DEFAULT_ETA_EDGES", "TrackMatching", "particle_eta",
           "match_tracks", "track_match_counts", "match_rates", "track_matching_metrics",
           "TrackMetricsAccumulator", "format_track_metrics", "OVERALL_KEYS"]

#: The kinds of match, in report order.
MATCH_KINDS: tuple[str, ...] = ("dm", "perfect", "lhc")
_KIND_NAMES = {"dm": "double majority", "perfect": "perfect", "lhc": "LHC (purity > 75 %)"}
#: pT bin edges [GeV] of the table against pT (the last bin is open).
DEFAULT_PT_EDGES: tuple[float, ...] = (0.0, 0.5, 0.9, 1.5, 3.0, 10.0, math.inf)
#: η bin edges of the table against η.
DEFAULT_ETA_EDGES: tuple[float, ...] = (-4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0)
#: The flat overall keys the tracking evaluation adds to its metrics.
OVERALL_KEYS: tuple[str, ...] = ("eff_dm", "eff_perfect", "eff_lhc", "fake_dm", "dup_lhc")

_COUNT_KEYS = ("particles", "tracks") + tuple(f"matched_{w}_{k}" for k in MATCH_KINDS for w in ("tracks", "particles"))


def _check_count(v, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"{name}: must be an integer >= 1, got {v!r}")
    return int(v)


def _check_cut(v, name: str, positive: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) or math.isnan(v) \
            or (positive and not v > 0) or v < 0:
        raise ValueError(f"{name}: must be a number >= 0{' (> 0)' if positive else ''}, got {v!r}")
    return float(v)


def _check_edges(edges, name: str) -> tuple[float, ...]:
    try:
        e = tuple(float(x) for x in edges)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a sequence of numbers, got {edges!r}") from None
    if len(e) < 2 or any(math.isnan(x) for x in e) or any(b <= a for a, b in zip(e, e[1:])):
        raise ValueError(f"{name}: expected at least 2 strictly increasing bin edges, got {edges!r}")
    return e


def particle_eta(px, py, pz) -> np.ndarray:
    """Pseudorapidity of momenta, η = asinh(pz / pT) (±inf for pT = 0, NaN for a zero momentum)."""
    px, py, pz = (np.asarray(a, dtype=np.float64) for a in (px, py, pz))
    pt = np.hypot(px, py)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.arcsinh(pz / pt)


@dataclass
class TrackMatching:
    """One event's tracks matched to their majority particles (see the module docstring).

    Particle arrays ``(P,)`` (particles with id > 0 that left a hit, ids sorted):
        particle_ids, particle_hits (their hits in the event).
    Track arrays ``(T,)`` (every label >= 0, sorted):
        track_ids, size (hits), majority (index into the particle arrays, −1 when the track
        holds only noise), majority_hits, counts (size >= min_hits), dm, perfect, lhc (bool
        match flags, False for a track that does not count).
    """

    particle_ids: np.ndarray
    particle_hits: np.ndarray
    track_ids: np.ndarray
    size: np.ndarray
    majority: np.ndarray
    majority_hits: np.ndarray
    counts: np.ndarray
    dm: np.ndarray
    perfect: np.ndarray
    lhc: np.ndarray

    @property
    def purity(self) -> np.ndarray:
        """Majority hits / track size per track ``(T,)``."""
        return self.majority_hits / np.maximum(self.size, 1)

    def count(self, selected: np.ndarray) -> dict[str, int]:
        """The counts of :data:`_COUNT_KEYS` for a boolean selection ``(P,)`` of particles."""
        selected = np.asarray(selected, dtype=bool)
        if selected.shape != self.particle_ids.shape:
            raise ValueError(f"selected: expected {self.particle_ids.shape[0]} values (one per particle), "
                             f"got shape {selected.shape}")
        has = self.majority >= 0
        considered = self.counts & has
        considered[has] &= selected[self.majority[has]]
        out = {"particles": int(selected.sum()), "tracks": int(considered.sum())}
        for k in MATCH_KINDS:
            m = getattr(self, k) & considered
            out[f"matched_tracks_{k}"] = int(m.sum())
            out[f"matched_particles_{k}"] = int(np.unique(self.majority[m]).size)
        return out


def match_tracks(labels, particle_id, min_hits: int = 3) -> TrackMatching:
    """Match every predicted track of one event to its majority particle.

    Args:
        labels: ``(n,)`` integer track label per hit, ``< 0`` = unassigned.
        particle_id: ``(n,)`` integer truth particle per hit, 0 = noise.
        min_hits: hits a track needs to count.
    Raises:
        ValueError: naming the argument, on shapes, non-integer ids, negative particle ids or
            ``min_hits < 1``.
    """
    lab = hit_ids(labels, "labels")
    n = lab.shape[0]
    pid = hit_ids(particle_id, "particle_id", n)
    if (pid < 0).any():
        raise ValueError("particle_id: expected ids >= 0 (0 = noise), got a negative id")
    min_hits = _check_count(min_hits, "min_hits")
    real = pid > 0
    p_ids, p_inv, p_hits = np.unique(pid[real], return_inverse=True, return_counts=True)
    p_index = np.full(n, -1, dtype=np.int64)
    p_index[real] = p_inv
    in_track = lab >= 0
    t_ids, t_inv, t_size = np.unique(lab[in_track], return_inverse=True, return_counts=True)
    t_index = np.full(n, -1, dtype=np.int64)
    t_index[in_track] = t_inv
    T = t_ids.size
    majority = np.full(T, -1, dtype=np.int64)
    maj_hits = np.zeros(T, dtype=np.int64)
    both = in_track & real
    if both.any():
        P = max(p_ids.size, 1)
        keys, joint = np.unique(t_index[both] * P + p_index[both], return_counts=True)
        kt, kp = keys // P, keys % P
        order = np.lexsort((kp, -joint, kt))  # by track, then most hits, then lowest particle id
        first = order[np.r_[True, kt[order][1:] != kt[order][:-1]]]
        majority[kt[first]] = kp[first]
        maj_hits[kt[first]] = joint[first]
    counts = t_size >= min_hits
    has = majority >= 0
    part_hits = np.zeros(T, dtype=np.int64)
    part_hits[has] = p_hits[majority[has]]
    purity = maj_hits / np.maximum(t_size, 1)
    share = np.where(has, maj_hits / np.maximum(part_hits, 1), 0.0)
    ok = counts & has
    return TrackMatching(
        particle_ids=p_ids, particle_hits=p_hits, track_ids=t_ids, size=t_size, majority=majority,
        majority_hits=maj_hits, counts=counts,
        dm=ok & (purity > 0.5) & (share > 0.5),
        perfect=ok & (maj_hits == part_hits) & (purity > 0.99),
        lhc=ok & (purity > 0.75))


def _per_particle(values, name: str, n: int, particle_id: np.ndarray, dtype=np.float64) -> np.ndarray:
    """A per-hit truth array reduced to one value per particle (its first hit's)."""
    arr = hit_array(values, name, n)
    if dtype is bool:
        if arr.dtype != bool and not np.isin(arr, (0, 1)).all():
            raise ValueError(f"{name}: expected booleans (or 0/1)")
        arr = arr.astype(bool)
    else:
        if arr.dtype == bool or not np.issubdtype(arr.dtype, np.number):
            raise ValueError(f"{name}: expected numbers, got dtype {arr.dtype}")
        arr = arr.astype(np.float64)
    real = np.flatnonzero(particle_id > 0)
    _, first = np.unique(particle_id[real], return_index=True)
    return arr[real[first]]


@dataclass
class _Truth:
    matching: TrackMatching
    pt: np.ndarray
    eta: np.ndarray
    base: np.ndarray  # reconstructable & owned


def _truth(labels, particle_id, pt, eta, reconstructable, owned, min_hits) -> _Truth:
    m = match_tracks(labels, particle_id, min_hits)
    pid = hit_ids(particle_id, "particle_id")
    n = pid.shape[0]
    ptp = _per_particle(pt, "pt", n, pid)
    etap = _per_particle(eta, "eta", n, pid)
    base = _per_particle(reconstructable, "reconstructable", n, pid, bool)
    if owned is not None:
        base = base & _per_particle(owned, "owned", n, pid, bool)
    return _Truth(m, ptp, etap, base)


def _selection(t: _Truth, pt_min: float, eta_max: float, pt_bin=None, eta_bin=None) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        sel = t.base & (np.abs(t.eta) < eta_max)
        sel &= (t.pt >= pt_min) if pt_bin is None else ((t.pt >= pt_bin[0]) & (t.pt < pt_bin[1]))
        if eta_bin is not None:
            sel &= (t.eta >= eta_bin[0]) & (t.eta < eta_bin[1])
    return sel


def track_match_counts(labels, particle_id, pt, eta, reconstructable, *, pt_min: float = 0.9,
                       eta_max: float = 4.0, min_hits: int = 3, owned=None) -> dict[str, int]:
    """Counts of one event: ``"particles"`` (selected), ``"tracks"`` (counting tracks whose
    majority particle is selected) and per kind ``k`` ``"matched_tracks_k"``,
    ``"matched_particles_k"``.

    Args:
        labels, particle_id: as :func:`match_tracks`.
        pt, eta, reconstructable: ``(n,)`` per hit: the pT [GeV] and η of the hit's particle, and
            whether it is reconstructable (values of noise hits are ignored).
        pt_min, eta_max: the particle cuts pT ≥ ``pt_min`` and |η| < ``eta_max``.
        min_hits: hits a track needs to count.
        owned: optional ``(n,)`` bool, True for hits of particles this cloud owns (φ-sectors);
            other particles are left out like particles failing the cuts.
    """
    pt_min = _check_cut(pt_min, "pt_min")
    eta_max = _check_cut(eta_max, "eta_max", positive=True)
    t = _truth(labels, particle_id, pt, eta, reconstructable, owned, min_hits)
    return t.matching.count(_selection(t, pt_min, eta_max))


def _ratio(a: float, b: float) -> float:
    return float(a) / float(b) if b else float("nan")


def match_rates(counts: Mapping[str, int]) -> dict[str, float]:
    """``eff_k``, ``fake_k``, ``dup_k`` for every kind ``k`` from counts (NaN for an empty
    denominator)."""
    missing = [k for k in _COUNT_KEYS if k not in counts]
    if missing:
        raise ValueError(f"counts: missing {', '.join(missing)}")
    out: dict[str, float] = {}
    for k in MATCH_KINDS:
        mt, mp = counts[f"matched_tracks_{k}"], counts[f"matched_particles_{k}"]
        out[f"eff_{k}"] = _ratio(mp, counts["particles"])
        out[f"fake_{k}"] = 1.0 - _ratio(mt, counts["tracks"]) if counts["tracks"] else float("nan")
        out[f"dup_{k}"] = _ratio(mt - mp, mp)
    return out


def track_matching_metrics(labels, particle_id, pt, eta, reconstructable, *, pt_min: float = 0.9,
                           eta_max: float = 4.0, min_hits: int = 3, owned=None) -> dict[str, float]:
    """:func:`match_rates` of :func:`track_match_counts` of one event, with the counts."""
    c = track_match_counts(labels, particle_id, pt, eta, reconstructable, pt_min=pt_min, eta_max=eta_max,
                           min_hits=min_hits, owned=owned)
    return {**match_rates(c), **{k: float(v) for k, v in c.items()}}


def _zero() -> dict[str, int]:
    return {k: 0 for k in _COUNT_KEYS}


def _bin_label(lo: float, hi: float) -> str:
    return f"[{lo:g}, {'inf' if math.isinf(hi) else f'{hi:g}'})"


class TrackMetricsAccumulator:
    """Track-matching metrics pooled over events (counts summed), overall and in bins.

    Args:
        pt_min, eta_max: the particle cuts (pT ≥ 0.9 GeV, |η| < 4).
        min_hits: hits a track needs to count (3).
        pt_edges, eta_edges: bin edges of the tables against pT and η.
        tracks: what the tracks are, for the report's heading (``"DBSCAN clusters"`` of embeddings,
            or ``"the model's tracks"`` of an end-to-end model).
    """

    def __init__(self, pt_min: float = 0.9, eta_max: float = 4.0, min_hits: int = 3,
                 pt_edges: Sequence[float] = DEFAULT_PT_EDGES, eta_edges: Sequence[float] = DEFAULT_ETA_EDGES,
                 tracks: str = "DBSCAN clusters"):
        if not isinstance(tracks, str) or not tracks:
            raise ValueError(f"tracks: expected a non-empty description, got {tracks!r}")
        self.tracks = tracks
        self.pt_min = _check_cut(pt_min, "pt_min")
        self.eta_max = _check_cut(eta_max, "eta_max", positive=True)
        self.min_hits = _check_count(min_hits, "min_hits")
        self.pt_edges = _check_edges(pt_edges, "pt_edges")
        self.eta_edges = _check_edges(eta_edges, "eta_edges")
        self.events = 0
        self.overall = _zero()
        self.vs_pt = [_zero() for _ in self.pt_edges[1:]]
        self.vs_eta = [_zero() for _ in self.eta_edges[1:]]

    def add(self, labels, particle_id, pt, eta, reconstructable, owned=None) -> dict[str, float]:
        """Add one event (arguments as :func:`track_match_counts`); returns its own overall
        rates and counts (as :func:`track_matching_metrics`)."""
        t = _truth(labels, particle_id, pt, eta, reconstructable, owned, self.min_hits)
        c = t.matching.count(_selection(t, self.pt_min, self.eta_max))
        for k, v in c.items():
            self.overall[k] += v
        for acc, lo, hi in zip(self.vs_pt, self.pt_edges[:-1], self.pt_edges[1:]):
            for k, v in t.matching.count(_selection(t, self.pt_min, self.eta_max, pt_bin=(lo, hi))).items():
                acc[k] += v
        for acc, lo, hi in zip(self.vs_eta, self.eta_edges[:-1], self.eta_edges[1:]):
            for k, v in t.matching.count(_selection(t, self.pt_min, self.eta_max, eta_bin=(lo, hi))).items():
                acc[k] += v
        self.events += 1
        return {**match_rates(c), **{k: float(v) for k, v in c.items()}}

    def result(self) -> dict[str, Any]:
        """JSON-ready: ``{"cuts": {...}, "overall": {rates and counts}, "vs_pt": [rows],
        "vs_eta": [rows]}``; a row is ``{"lo", "hi", "bin"}`` plus rates and counts (``hi`` of
        an open last bin is None)."""
        def row(c, lo, hi):
            return {"lo": lo, "hi": None if math.isinf(hi) else hi, "bin": _bin_label(lo, hi), **match_rates(c),
                    **c}

        return {"cuts": {"pt_min": self.pt_min, "eta_max": self.eta_max, "min_hits": self.min_hits,
                         "reconstructable_min_layers": 3, "events": self.events, "tracks": self.tracks},
                "overall": {**match_rates(self.overall), **self.overall},
                "vs_pt": [row(c, lo, hi) for c, lo, hi in zip(self.vs_pt, self.pt_edges[:-1], self.pt_edges[1:])],
                "vs_eta": [row(c, lo, hi) for c, lo, hi in zip(self.vs_eta, self.eta_edges[:-1], self.eta_edges[1:])]}

    def overall_metrics(self) -> dict[str, float]:
        """The flat :data:`OVERALL_KEYS` of the pooled counts (what a metrics table shows)."""
        r = match_rates(self.overall)
        return {k: r[k] for k in OVERALL_KEYS}


_TABLE_COLS = (("eff DM", "eff_dm"), ("eff perf", "eff_perfect"), ("eff LHC", "eff_lhc"), ("fake DM", "fake_dm"),
               ("fake perf", "fake_perfect"), ("fake LHC", "fake_lhc"), ("dup LHC", "dup_lhc"),
               ("particles", "particles"), ("tracks", "tracks"))


def _fmt(v, key: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if key in ("particles", "tracks"):
        return str(int(v))
    return f"{v:.4f}"


def format_track_metrics(result: Mapping[str, Any]) -> str:
    """:meth:`TrackMetricsAccumulator.result` as text: a heading with the cuts, then one table
    with the overall row and the rows against pT and against η."""
    for key in ("cuts", "overall", "vs_pt", "vs_eta"):
        if key not in result:
            raise ValueError(f"result: missing {key!r} (expected TrackMetricsAccumulator.result())")
    c = result["cuts"]
    rows = [("overall", result["overall"])]
    rows += [(f"pT {r['bin']}", r) for r in result["vs_pt"]]
    rows += [(f"eta {r['bin']}", r) for r in result["vs_eta"]]
    w = max(len(n) for n, _ in rows)
    widths = [max(len(h), 7) for h, _ in _TABLE_COLS]
    header = f"{'':<{w}}  " + "  ".join(f"{h:>{cw}}" for (h, _), cw in zip(_TABLE_COLS, widths))
    lines = [f"track matching ({c.get('events', '?')} clouds/events, counts summed): tracks = "
             f"{c.get('tracks', 'DBSCAN clusters')} of "
             f">= {c['min_hits']} hits; particles with pT >= {c['pt_min']:g} GeV, |eta| < {c['eta_max']:g}, "
             f"hits on >= 3 layers (pT rows: the bin replaces the pT cut)",
             "  DM = double majority (>50% purity, >50% of the particle's hits), perf = perfect (all its hits, "
             ">99% purity), LHC = >75% purity; eff = matched particles / particles, fake = 1 - matched tracks / "
             "tracks, dup = (matched tracks - matched particles) / matched particles",
             header, "-" * len(header)]
    for i, (name, r) in enumerate(rows):
        if i in (1, 1 + len(result["vs_pt"])):
            lines.append("-" * len(header))
        lines.append(f"{name:<{w}}  " + "  ".join(f"{_fmt(r.get(k), k):>{cw}}" for (_, k), cw in zip(_TABLE_COLS, widths)))
    return "\n".join(lines)
