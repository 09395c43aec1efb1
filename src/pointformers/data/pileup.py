"""A particle-level pile-up simulation standing in for HEPT's Pileup-10k data (HEPT paper, App. A).

One event is the leading collision (LC) plus ``Poisson(mu)`` pile-up collisions (PCs); one
point is one reconstructed particle. The task asks, for every *neutral* particle, whether it
comes from the LC. What is simulated:

* **Soft collisions** (every PC, and the LC's underlying event): ``Poisson(particles_per_vertex)``
  particles per PC and ``ue_scale`` times as many for the LC's underlying event (a hard
  collision's underlying event is busier than a minimum-bias one). pT follows the same soft
  spectrum as the tracking simulation, density ∝ pT·(1 + pT/p0)^-n (p0 = 1.1 GeV, n = 7: mean
  ≈ 0.55 GeV, ≈ 16 % above 0.9 GeV, power-law tail); φ is flat; η is flat in
  |η| < ``eta_max`` (4) for neutral particles and in |η| < ``charged_eta_max`` (2.5) for charged
  ones (charged particles are the tracked ones, so they exist only inside the tracker).
* **Hard process** of the LC: ``1 + Poisson(n_jets_mean − 1)`` jets with pT drawn from
  dN/dpT ∝ pT^-``jet_pt_power`` on [``jet_pt_min``, ``jet_pt_max``] = [30, 300] GeV and axes
  flat in |η| < ``jet_eta_max`` and φ. A jet of transverse momentum P has
  ``max(2, Poisson(jet_mult_a + jet_mult_b·ln(P / 10 GeV)))`` constituents (≈ 10 at 30 GeV,
  ≈ 23 at 300 GeV) sharing P with Dirichlet(``frag_alpha``) momentum fractions -- a small
  concentration gives the hard fragmentation of real jets (a few constituents carry most of
  P). Each constituent is displaced from the axis by Gaussian (Δη, Δφ) of standard deviation
  ``jet_width``·clip(sqrt(1 GeV / pT), 0.3, 2): hard constituents hug the axis, soft ones
  spread, and ΔR = sqrt(Δη² + Δφ²) is mostly below 0.4. Charged constituents are kept inside
  the tracker (|η| clipped to ``charged_eta_max``).
* **Species**: every particle (soft or jet) draws its PID category from ``species_fractions``
  in HEPT's category order (charged 0, γ 1, K⁰_L 2, K⁰_S 3, n 4, Λ 5, Ξ⁰ 6); the default mix is
  63 % charged hadrons, 26 % photons, 11 % neutral hadrons. Charged hadrons are π± / K± / p±
  (80 / 12 / 8 %); n, Λ and Ξ⁰ come with their antiparticles half the time. PDG codes, charges
  and masses are those of the particles, so E and the rapidity are exact.
* **Labels**: the leading vertex is the one with the largest Σ pT² of its particles (the
  hard collision, except in a rare event where a PC outshines it); ``is_pu`` is True for every
  particle of any other vertex. Particles are randomly permuted within the event (as HEPT's
  preprocessing does), so the order carries no label information.

Kinematics are particle-level (no calorimeter smearing or tower merging). Per particle the
event records pT, η, φ, px, py, E, rapidity (HEPT's features), the charge, the PDG code, the
label and generator truth (vertex index and jet index).

Public API: :class:`PileupEvent`, :func:`pid_category`, :class:`PileupParams`,
:data:`PRESETS`, :func:`preset_params`, :func:`resolve_params`, :func:`generate_event`,
:func:`generate_events`, :func:`load_pileup_dataset`, :func:`pack_pileup_events`,
:func:`unpack_pileup_events`.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .cache import (cache_path, cached_arrays, default_cache_dir, finite_param, param_error, params_from_preset,
                    resolve_generator_params, save_arrays)

#: Bump when the generator's output for given parameters changes (invalidates caches).
GENERATOR_VERSION = 1

SPLITS = ("train", "val", "test")

#: HEPT's PID categories, in category order (the HEPT authors' code).
PID_CATEGORIES: tuple[str, ...] = ("charged", "photon", "K0L", "K0S", "neutron", "Lambda", "Xi0")

#: |PDG code| of the neutral species of categories 1..6.
_NEUTRAL_PDG = {22: 1, 130: 2, 310: 3, 2112: 4, 3122: 5, 3322: 6}

# Masses [GeV] (PDG) by |PDG code|.
_MASS = {211: 0.13957, 321: 0.493677, 2212: 0.938272, 22: 0.0, 130: 0.497611, 310: 0.497611,
         2112: 0.939565, 3122: 1.115683, 3322: 1.31486}
# Charged hadron composition (π, K, p); fixed, as measured in soft QCD at the LHC (roughly).
_CHARGED_PDG = np.array([211, 321, 2212])
_CHARGED_MIX = np.array([0.80, 0.12, 0.08])
# Representative |PDG| of each category (charged is resolved with _CHARGED_MIX).
_CATEGORY_PDG = np.array([0, 22, 130, 310, 2112, 3122, 3322])
# Categories whose particles have a distinct antiparticle (drawn half the time).
_HAS_ANTI = np.array([False, False, False, False, True, True, True])


def pid_category(pdg: np.ndarray, charge: np.ndarray) -> np.ndarray:
    """HEPT's PID category of each particle, ``(n,)`` int64 (as the HEPT authors' code maps PDG codes).

    Charged particles (charge ≠ 0) are category 0 whatever their PDG code; neutral ones map
    γ (22) → 1, K⁰_L (130) → 2, K⁰_S (310) → 3, n (±2112) → 4, Λ (±3122) → 5, Ξ⁰ (±3322) → 6.

    Raises:
        ValueError: a neutral particle with another PDG code (the authors assert the same),
            naming the first offending index and code; or shapes that differ.
    """
    pdg = np.asarray(pdg)
    charge = np.asarray(charge)
    if pdg.shape != charge.shape:
        raise ValueError(f"pdg/charge: expected equal shapes, got {pdg.shape} and {charge.shape}")
    a = np.abs(pdg.astype(np.int64))
    cat = np.full(a.shape, -1, np.int64)
    for code, c in _NEUTRAL_PDG.items():
        cat[a == code] = c
    # K0L/K0S/γ are their own antiparticles: only +130/+310/+22 are valid codes.
    cat[(pdg < 0) & np.isin(a, (22, 130, 310))] = -1
    cat[charge != 0] = 0
    if (cat < 0).any():
        i = int(np.flatnonzero(cat < 0)[0])
        raise ValueError(f"pdg: neutral particle {i} has PDG code {int(pdg.flat[i])}, which is none of HEPT's "
                         "neutral categories (22, 130, 310, ±2112, ±3122, ±3322)")
    return cat


# ============================================================================ container
@dataclass
class PileupEvent:
    """One collision event, one row per particle (``n`` particles).

    Arrays of shape ``(n,)``:
        pt, eta, phi: float32 transverse momentum [GeV], pseudorapidity, azimuth (−π, π].
        px, py: float32 transverse momentum components [GeV].
        energy: float32 energy [GeV]; rapidity: float32 y = ½ ln((E + pz)/(E − pz)).
        charge: int64 (−1, 0, +1); pdg: int64 PDG code.
        is_pu: bool, True when the particle comes from a pile-up collision (Delphes ``IsPU``).
        vertex: int64 generator vertex index (0 = the hard collision, 1.. = pile-up), −1 unknown.
        jet: int64 index of the jet the particle belongs to, −1 for none or unknown.
    Metadata: ``event_id`` (int).
    """

    pt: np.ndarray
    eta: np.ndarray
    phi: np.ndarray
    px: np.ndarray
    py: np.ndarray
    energy: np.ndarray
    rapidity: np.ndarray
    charge: np.ndarray
    pdg: np.ndarray
    is_pu: np.ndarray
    vertex: np.ndarray
    jet: np.ndarray
    event_id: int = 0

    def __post_init__(self) -> None:
        n = len(np.asarray(self.pt))
        for f in fields(self):
            if f.name == "event_id":
                continue
            a = np.asarray(getattr(self, f.name))
            if a.shape != (n,):
                raise ValueError(f"PileupEvent.{f.name}: expected shape ({n},) like pt, got {a.shape}")
        self.charge = np.asarray(self.charge, np.int64)
        self.pdg = np.asarray(self.pdg, np.int64)
        self.is_pu = np.asarray(self.is_pu, bool)
        self.vertex = np.asarray(self.vertex, np.int64)
        self.jet = np.asarray(self.jet, np.int64)
        self.event_id = int(self.event_id)

    @property
    def num_particles(self) -> int:
        return int(len(self.pt))

    @property
    def is_neutral(self) -> np.ndarray:
        """``(n,)`` bool: charge 0."""
        return self.charge == 0

    @property
    def is_lc(self) -> np.ndarray:
        """``(n,)`` bool: the particle comes from the leading collision (the task's label)."""
        return ~self.is_pu

    @property
    def pid_category(self) -> np.ndarray:
        """``(n,)`` int64 HEPT PID category (see :func:`pid_category`)."""
        return pid_category(self.pdg, self.charge)


_FLOAT_FIELDS = ("pt", "eta", "phi", "px", "py", "energy", "rapidity")
_INT_FIELDS = ("charge", "pdg", "vertex", "jet")


def pack_pileup_events(events: Sequence[PileupEvent]) -> dict[str, np.ndarray]:
    """Concatenate events into flat arrays plus ``offsets`` ``(len+1,)`` and ``event_ids`` (for ``np.savez``)."""
    out: dict[str, np.ndarray] = {
        "offsets": np.concatenate([[0], np.cumsum([e.num_particles for e in events])]).astype(np.int64),
        "event_ids": np.asarray([e.event_id for e in events], np.int64),
    }
    for name in _FLOAT_FIELDS:
        out[name] = np.concatenate([np.asarray(getattr(e, name), np.float32) for e in events]) if events \
            else np.zeros(0, np.float32)
    for name in _INT_FIELDS:
        out[name] = np.concatenate([getattr(e, name) for e in events]).astype(np.int32) if events \
            else np.zeros(0, np.int32)
    out["is_pu"] = np.concatenate([e.is_pu for e in events]) if events else np.zeros(0, bool)
    return out


def unpack_pileup_events(arrays: Mapping[str, np.ndarray]) -> list[PileupEvent]:
    """Inverse of :func:`pack_pileup_events` (ValueError/KeyError on inconsistent arrays)."""
    off = np.asarray(arrays["offsets"], np.int64)
    ids = np.asarray(arrays["event_ids"], np.int64)
    total = int(off[-1]) if len(off) else 0
    if len(off) != len(ids) + 1 or (np.diff(off) < 0).any() or any(
            len(arrays[k]) != total for k in _FLOAT_FIELDS + _INT_FIELDS + ("is_pu",)):
        raise ValueError("arrays: offsets and per-particle arrays are inconsistent")
    events = []
    for i in range(len(ids)):
        s = slice(int(off[i]), int(off[i + 1]))
        kw = {k: arrays[k][s] for k in _FLOAT_FIELDS}
        kw.update({k: arrays[k][s].astype(np.int64) for k in _INT_FIELDS})
        events.append(PileupEvent(is_pu=arrays["is_pu"][s].astype(bool), event_id=int(ids[i]), **kw))
    return events


# ============================================================================ parameters
@dataclass(frozen=True)
class PileupParams:
    """All knobs of the simulation and of the data set built from it (see the module doc).

    Attributes:
        mu: mean number of pile-up collisions per event (Poisson).
        n_events: events in a data set; split: train/val/test fractions of the events.
        particles_per_vertex: mean particles (all species) of one pile-up collision.
        ue_scale: the LC's underlying event has ``ue_scale · particles_per_vertex`` on average.
        eta_max: neutral particles are flat in |η| < eta_max.
        charged_eta_max: charged (tracked) particles are flat in |η| < charged_eta_max.
        pt_scale, pt_power: soft spectrum, density ∝ pT (1 + pT/pt_scale)^-pt_power [GeV].
        species_fractions: probabilities of the 7 PID categories (charged, γ, K⁰_L, K⁰_S, n, Λ, Ξ⁰).
        n_jets_mean: mean number of jets of the hard process (at least one: 1 + Poisson(mean − 1)).
        jet_pt_min, jet_pt_max, jet_pt_power: jet pT ∝ pT^-power on [min, max] [GeV].
        jet_eta_max: jet axes are flat in |η| < jet_eta_max.
        jet_mult_a, jet_mult_b: mean constituents a + b·ln(pT_jet / 10 GeV).
        frag_alpha: Dirichlet concentration of the constituents' momentum fractions.
        jet_width: (Δη, Δφ) spread [rad] of a 1 GeV constituent around the axis.
    """

    mu: float = 140.0
    n_events: int = 1000
    split: tuple[float, float, float] = (0.8, 0.1, 0.1)
    particles_per_vertex: float = 70.0
    ue_scale: float = 4.0
    eta_max: float = 4.0
    charged_eta_max: float = 2.5
    pt_scale: float = 1.1
    pt_power: float = 7.0
    species_fractions: tuple[float, ...] = (0.63, 0.26, 0.044, 0.011, 0.0385, 0.011, 0.0055)
    n_jets_mean: float = 5.0
    jet_pt_min: float = 30.0
    jet_pt_max: float = 300.0
    jet_pt_power: float = 3.0
    jet_eta_max: float = 2.0
    jet_mult_a: float = 6.0
    jet_mult_b: float = 6.0
    frag_alpha: float = 0.6
    jet_width: float = 0.1

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> None:
            param_error(self, name, why)

        def finite(name: str) -> float:
            return finite_param(self, name)

        v = self.n_events
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            bad("n_events", "expected an integer >= 1")
        object.__setattr__(self, "n_events", int(v))
        for name in ("mu", "particles_per_vertex", "ue_scale", "jet_mult_a", "jet_mult_b"):
            if finite(name) < 0:
                bad(name, "expected >= 0")
        for name in ("eta_max", "charged_eta_max", "pt_scale", "jet_pt_min", "jet_eta_max", "frag_alpha",
                     "jet_width"):
            if finite(name) <= 0:
                bad(name, "expected > 0")
        if finite("pt_power") <= 3:
            bad("pt_power", "expected > 3 (finite mean pT)")
        if finite("n_jets_mean") < 1:
            bad("n_jets_mean", "expected >= 1 (every LC has at least one jet)")
        if finite("jet_pt_max") <= self.jet_pt_min:
            bad("jet_pt_max", "expected > jet_pt_min")
        if finite("jet_pt_power") <= 0:
            bad("jet_pt_power", "expected > 0 (a falling spectrum)")
        if self.charged_eta_max > self.eta_max:
            bad("charged_eta_max", f"expected <= eta_max ({self.eta_max})")
        try:
            fr = tuple(float(s) for s in self.species_fractions)
        except (TypeError, ValueError):
            bad("species_fractions", "expected 7 probabilities")
        if len(fr) != len(PID_CATEGORIES) or min(fr) < 0 or abs(sum(fr) - 1) > 1e-6 or not all(map(math.isfinite, fr)):
            bad("species_fractions", f"expected {len(PID_CATEGORIES)} non-negative probabilities summing to 1 "
                                     f"(order {PID_CATEGORIES})")
        object.__setattr__(self, "species_fractions", fr)
        try:
            split = tuple(float(s) for s in self.split)
        except (TypeError, ValueError):
            bad("split", "expected three fractions (train, val, test)")
        if len(split) != 3 or min(split) < 0 or abs(sum(split) - 1) > 1e-6:
            bad("split", "expected three non-negative fractions summing to 1")
        object.__setattr__(self, "split", split)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON view (used for the cache key)."""
        d = dataclasses.asdict(self)
        d["split"] = list(self.split)
        d["species_fractions"] = list(self.species_fractions)
        return d

    def replace(self, **changes: Any) -> "PileupParams":
        """A copy with some fields changed (validated); unknown names raise ValueError."""
        valid = sorted(f.name for f in dataclasses.fields(self))
        unknown = sorted(set(changes) - set(valid))
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown PileupParams field; valid: {valid}")
        return dataclasses.replace(self, **changes)


#: Named parameter sets. ``pileup-tiny``: unit tests (≈ 350 particles per event, a
#: millisecond each). ``pileup-small``: CPU demos and config runs (≈ 2k particles, μ = 20).
#: ``pileup-10k``: HEPT's Pileup-10k size (1000 events of ≈ 10.3k particles; ≈ 4 % of the
#: neutral particles come from the LC, as in HEPT's data).
PRESETS: dict[str, dict[str, Any]] = {
    "pileup-tiny": dict(mu=4.0, n_events=20, particles_per_vertex=50.0, ue_scale=1.5, n_jets_mean=3.0),
    "pileup-small": dict(mu=20.0, n_events=200),
    "pileup-10k": dict(mu=140.0, n_events=1000),
}


def preset_params(name: str, **overrides: Any) -> PileupParams:
    """The :class:`PileupParams` of preset ``name`` (with optional field overrides)."""
    return params_from_preset(PileupParams, PRESETS, "pile-up", name, **overrides)


def resolve_params(preset_or_params: str | PileupParams | Mapping[str, Any]) -> PileupParams:
    """Accept a preset name, a :class:`PileupParams`, or a mapping of field values."""
    return resolve_generator_params(PileupParams, PRESETS, "pile-up", preset_or_params)


# ============================================================================ generation
def _soft_pt(rng: np.random.Generator, n: int, params: PileupParams) -> np.ndarray:
    # Beta-prime(2, n-2) scaled by p0 has density ∝ pT (1 + pT/p0)^-n (as data/tracking.py).
    pt = params.pt_scale * rng.gamma(2.0, size=n) / rng.gamma(params.pt_power - 2.0, size=n)
    return np.maximum(pt, 1e-3)


def _power_law(rng: np.random.Generator, n: int, lo: float, hi: float, power: float) -> np.ndarray:
    """Inverse-CDF samples of density ∝ x^-power on [lo, hi]."""
    u = rng.random(n)
    if abs(power - 1.0) < 1e-12:
        return lo * (hi / lo) ** u
    e = 1.0 - power
    return (lo ** e + u * (hi ** e - lo ** e)) ** (1.0 / e)


def _wrap(phi: np.ndarray) -> np.ndarray:
    """Azimuth wrapped into (−π, π]."""
    return np.pi - np.mod(np.pi - phi, 2 * np.pi)


def _species(rng: np.random.Generator, n: int, params: PileupParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Category ``(n,)``, PDG code ``(n,)`` and charge ``(n,)`` of ``n`` particles."""
    cat = rng.choice(len(PID_CATEGORIES), size=n, p=np.asarray(params.species_fractions))
    sign = np.where(rng.random(n) < 0.5, -1, 1)
    charged = cat == 0
    pdg = _CATEGORY_PDG[cat].copy()
    pdg[charged] = _CHARGED_PDG[rng.choice(3, size=int(charged.sum()), p=_CHARGED_MIX)]
    # Charged: the sign is the charge (π+ 211, π− −211, ...); neutral: antiparticles of n, Λ, Ξ⁰.
    flip = charged | _HAS_ANTI[cat]
    pdg = np.where(flip, pdg * sign, pdg)
    charge = np.where(charged, sign, 0)
    return cat, pdg.astype(np.int64), charge.astype(np.int64)


def _rng(seed: int, event_id: int) -> np.random.Generator:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    if isinstance(event_id, bool) or not isinstance(event_id, (int, np.integer)) or event_id < 0:
        raise ValueError(f"event_id: expected a non-negative integer, got {event_id!r}")
    return np.random.default_rng([int(seed), int(event_id), 0x9E])  # 0x9E: a stream apart from tracking


def generate_event(params: PileupParams | str | Mapping[str, Any], seed: int, event_id: int = 0) -> PileupEvent:
    """One simulated event; deterministic in (params, seed, event_id). Vectorised, no loop per particle."""
    params = resolve_params(params)
    rng = _rng(seed, event_id)

    # --- soft collisions: vertex 0 is the LC's underlying event, 1..n_pu the pile-up.
    n_pu = int(rng.poisson(params.mu))
    means = np.full(n_pu + 1, params.particles_per_vertex)
    means[0] *= params.ue_scale
    mult = rng.poisson(means)
    s_vertex = np.repeat(np.arange(n_pu + 1), mult)
    ns = len(s_vertex)
    s_cat, s_pdg, s_charge = _species(rng, ns, params)
    s_pt = _soft_pt(rng, ns, params)
    eta_lim = np.where(s_charge != 0, params.charged_eta_max, params.eta_max)
    s_eta = rng.uniform(-1.0, 1.0, ns) * eta_lim
    s_phi = rng.uniform(-np.pi, np.pi, ns)

    # --- hard process: jets of the LC.
    n_jets = 1 + int(rng.poisson(params.n_jets_mean - 1.0))
    j_pt = _power_law(rng, n_jets, params.jet_pt_min, params.jet_pt_max, params.jet_pt_power)
    j_eta = rng.uniform(-params.jet_eta_max, params.jet_eta_max, n_jets)
    j_phi = rng.uniform(-np.pi, np.pi, n_jets)
    mean_c = params.jet_mult_a + params.jet_mult_b * np.log(j_pt / 10.0)
    n_c = np.maximum(2, rng.poisson(np.maximum(mean_c, 0.0)))
    c_jet = np.repeat(np.arange(n_jets), n_c)
    nc = len(c_jet)
    # Dirichlet(α) fractions per jet: normalised Gamma(α) draws.
    g = np.maximum(rng.gamma(params.frag_alpha, size=nc), 1e-300)
    z = g / np.bincount(c_jet, weights=g, minlength=n_jets)[c_jet]
    c_pt = np.maximum(z * j_pt[c_jet], 1e-3)
    sigma = params.jet_width * np.clip(np.sqrt(1.0 / c_pt), 0.3, 2.0)
    c_eta = j_eta[c_jet] + rng.normal(size=nc) * sigma
    c_phi = _wrap(j_phi[c_jet] + rng.normal(size=nc) * sigma)
    c_cat, c_pdg, c_charge = _species(rng, nc, params)
    c_eta = np.where(c_charge != 0, np.clip(c_eta, -params.charged_eta_max, params.charged_eta_max), c_eta)

    # --- merge; kinematics from (pT, η, φ, m).
    pt = np.r_[s_pt, c_pt]
    eta = np.r_[s_eta, c_eta]
    phi = np.r_[s_phi, c_phi]
    pdg = np.r_[s_pdg, c_pdg]
    charge = np.r_[s_charge, c_charge]
    vertex = np.r_[s_vertex, np.zeros(nc, np.int64)]
    jet = np.r_[np.full(ns, -1, np.int64), c_jet]
    mass = np.vectorize(_MASS.__getitem__, otypes=[float])(np.abs(pdg)) if len(pdg) else np.zeros(0)
    pz = pt * np.sinh(eta)
    energy = np.sqrt((pt * np.cosh(eta)) ** 2 + mass ** 2)
    rapidity = np.arcsinh(pz / np.sqrt(pt ** 2 + mass ** 2))  # y = asinh(pz / mT), stable form

    # --- label: the leading vertex has the largest Σ pT².
    sum_pt2 = np.bincount(vertex, weights=pt ** 2, minlength=n_pu + 1)
    leading = int(np.argmax(sum_pt2))
    is_pu = vertex != leading

    perm = rng.permutation(len(pt))  # no label information in the order (as HEPT's preprocessing)
    f32 = np.float32
    return PileupEvent(
        pt=pt[perm].astype(f32), eta=eta[perm].astype(f32), phi=phi[perm].astype(f32),
        px=(pt * np.cos(phi))[perm].astype(f32), py=(pt * np.sin(phi))[perm].astype(f32),
        energy=energy[perm].astype(f32), rapidity=rapidity[perm].astype(f32),
        charge=charge[perm], pdg=pdg[perm], is_pu=is_pu[perm], vertex=vertex[perm], jet=jet[perm],
        event_id=int(event_id),
    )


def generate_events(preset_or_params: str | PileupParams | Mapping[str, Any], n_events: int | None = None,
                    seed: int = 0, start: int = 0) -> list[PileupEvent]:
    """Events ``start .. start + n_events − 1`` (default: the preset's count from 0)."""
    params = resolve_params(preset_or_params)
    n_events = params.n_events if n_events is None else n_events
    if isinstance(n_events, bool) or not isinstance(n_events, (int, np.integer)) or n_events < 0:
        raise ValueError(f"n_events: expected a non-negative integer, got {n_events!r}")
    return [generate_event(params, seed, event_id=start + e) for e in range(int(n_events))]


def split_ranges(n_events: int, fractions: Sequence[float]) -> dict[str, tuple[int, int]]:
    """Event index ranges ``[start, stop)`` of train/val/test (floor for train and val)."""
    n_train = int(math.floor(fractions[0] * n_events + 1e-9))
    n_val = int(math.floor(fractions[1] * n_events + 1e-9))
    return {"train": (0, n_train), "val": (n_train, n_train + n_val), "test": (n_train + n_val, n_events)}


def _cache_location(preset: str | PileupParams | Mapping[str, Any], split: str, cache_dir: str | Path | None,
                    seed: int) -> tuple[Path, str, dict[str, Any], PileupParams]:
    """(folder, file prefix, cache key, params) of a data set split."""
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {list(SPLITS)}, got {split!r}")
    params = resolve_params(preset)
    _rng(seed, 0)  # validates the seed
    key = {"generator": "pointformers.pileup", "version": GENERATOR_VERSION, "params": params.to_dict(),
           "seed": int(seed), "split": split}
    name = preset if isinstance(preset, str) else "custom"
    folder = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "pileup"
    return folder, f"{name}-{split}", key, params


def dataset_cache_path(preset: str | PileupParams | Mapping[str, Any], split: str,
                       cache_dir: str | Path | None = None, seed: int = 0) -> Path:
    """The cache file :func:`load_pileup_dataset` reads or writes for these arguments."""
    folder, prefix, key, _ = _cache_location(preset, split, cache_dir, seed)
    return cache_path(folder, prefix, key)


def load_pileup_dataset(
    preset: str | PileupParams | Mapping[str, Any],
    split: str,
    cache_dir: str | Path | None = None,
    seed: int = 0,
) -> list[PileupEvent]:
    """The ``split`` ("train" | "val" | "test") events of a data set, cached on disk.

    Events are cut 80/10/10 (``params.split``) in event-id order, as HEPT splits by cloud; only
    the events a split needs are generated. The cache file (:func:`dataset_cache_path`) is
    keyed by all parameters, the seed, the split and :data:`GENERATOR_VERSION`; a missing,
    stale or corrupted file is regenerated. ``cache_dir`` defaults to ``$POINTFORMERS_CACHE``
    or ``~/.cache/pointformers``.
    """
    folder, prefix, key, params = _cache_location(preset, split, cache_dir, seed)
    start, stop = split_ranges(params.n_events, params.split)[split]

    def build() -> dict[str, np.ndarray]:
        return pack_pileup_events(generate_events(params, stop - start, seed, start=start))

    arrays = cached_arrays(folder, prefix, key, build)
    try:
        return unpack_pileup_events(arrays)
    except (KeyError, ValueError, IndexError):
        # A well-formed file with inconsistent content: rebuild and overwrite.
        arrays = build()
        save_arrays(cache_path(folder, prefix, key), key, arrays)
        return unpack_pileup_events(arrays)


__all__ = [
    "GENERATOR_VERSION", "PID_CATEGORIES", "PRESETS", "SPLITS", "PileupEvent", "PileupParams", "dataset_cache_path",
    "generate_event",
    "generate_events", "load_pileup_dataset", "pack_pileup_events", "pid_category", "preset_params",
    "resolve_params", "split_ranges", "unpack_pileup_events",
]
