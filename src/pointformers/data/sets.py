"""Set data: Gaussian mixtures for amortised clustering and a 3-D pair-potential regression set.

**Amortised clustering** (Sampled Transformer paper, App. C and Table 8, after
Set Transformer's ``mixture_of_mvns.py``/``mvn_diag.py``): each set has n ~ U{n_min..n_max}
(paper: [100, 500]) points in 2-D from a mixture of k = 4 Gaussians with weights
π ~ Dirichlet(1), means μ_j ~ U[-4, 4]^2 and fixed std σ = 0.3 per axis; the true
(π, μ, σ) and component labels are kept. The metric's log-likelihood (Eq. 6) is
:func:`mixture_log_likelihood`; Set Transformer averages it over all points.

**Pair-potential regression** (a stand-in for FLT's 3-D relative-position setting): random atom
configurations whose target energy is an exact, local, rotation- and translation-invariant
sum of pair energies ``E = Σ_{i<j} φ_{s_i s_j}(|x_i - x_j|)`` with a smooth cutoff:

* ``lennard_jones``: φ(r) = 4ε[(σ/r)^12 - (σ/r)^6], shifted so φ(r_c) = 0 (r_c = 2.5 σ);
* ``gaussian``: φ(r) = ε exp(-r² / (2σ²)) (soft, no cutoff);
* ``yukawa`` (screened Coulomb): φ(r) = q_i q_j exp(-r/λ) / r - (value at r_c), r_c = 3λ.

Species s ∈ {0..n_species-1} have per-species (ε, σ, q); pairs use Lorentz–Berthelot mixing
(σ_ij = (σ_i + σ_j)/2, ε_ij = sqrt(ε_i ε_j)). Positions: a jittered cubic lattice at the
given density (spacing a), a random subset of sites, jitter ≤ ``jitter``·a per axis, then a
uniform random rotation, so the minimum distance is ≥ (1 - 2·jitter·√3)·a and the LJ wall
stays finite. Targets: total energy, per-atom energy (½ Σ_j φ_ij) and forces (-∇E, exact).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .cache import cached_arrays, default_cache_dir

__all__ = ["MixtureParams", "MixtureSet", "generate_mixture_sets", "mixture_log_likelihood", "load_mixture_dataset",
           "PotentialParams", "Configuration", "pair_energy", "configuration_energy", "generate_configurations",
           "load_potential_dataset"]

GENERATOR_VERSION = 1
SPLITS = ("train", "val", "test")


def _seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    return int(seed)


def _split(split: str) -> int:
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {list(SPLITS)}, got {split!r}")
    return SPLITS.index(split)


def _ragged(values: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.r_[0, np.cumsum([len(v) for v in values])].astype(np.int64)
    return (np.concatenate(values) if values else np.zeros((0,))), offsets


# ============================================================================ mixtures
@dataclass(frozen=True)
class MixtureParams:
    """k-component 2-D Gaussian mixtures (Set Transformer defaults) and split sizes in sets."""

    k: int = 4
    dim: int = 2
    n_min: int = 100
    n_max: int = 500
    mean_range: float = 4.0
    sigma: float = 0.3
    sizes: tuple[int, int, int] = (10000, 500, 1000)

    def __post_init__(self) -> None:
        for name in ("k", "dim", "n_min", "n_max"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")
        if self.n_max < self.n_min:
            raise ValueError(f"n_max: expected >= n_min = {self.n_min}, got {self.n_max}")
        for name in ("mean_range", "sigma"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0 < v < math.inf):
                raise ValueError(f"{name}: expected a finite number > 0, got {v!r}")
        sizes = tuple(int(s) for s in self.sizes)
        if len(sizes) != 3 or min(sizes) < 0:
            raise ValueError(f"sizes: expected three non-negative integers (train, val, test), got {self.sizes!r}")
        object.__setattr__(self, "sizes", sizes)

    def to_dict(self) -> dict[str, Any]:
        return {"k": self.k, "dim": self.dim, "n_min": self.n_min, "n_max": self.n_max,
                "mean_range": self.mean_range, "sigma": self.sigma, "sizes": list(self.sizes)}


@dataclass
class MixtureSet:
    """One set: ``x`` (n, dim), component ``labels`` (n,), true ``pi`` (k,), ``mu`` (k, dim),
    ``sigma`` (k, dim) (per-axis standard deviations)."""

    x: np.ndarray
    labels: np.ndarray
    pi: np.ndarray
    mu: np.ndarray
    sigma: np.ndarray

    def true_log_likelihood(self) -> float:
        """Mean log-likelihood per point under the generating parameters (the "oracle")."""
        return float(mixture_log_likelihood(self.x, self.pi, self.mu, self.sigma).mean())


def mixture_log_likelihood(x: np.ndarray, pi: np.ndarray, mu: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """Per-point log Σ_j π_j N(x; μ_j, diag(σ_j²)): ``x`` (n, d), ``pi`` (k,), ``mu``/``sigma`` (k, d) -> (n,)."""
    x, pi, mu, sigma = (np.asarray(a, np.float64) for a in (x, pi, mu, sigma))
    if x.ndim != 2 or mu.shape != sigma.shape or mu.ndim != 2 or mu.shape[1] != x.shape[1] or pi.shape != (mu.shape[0],):
        raise ValueError(f"x, pi, mu, sigma: expected shapes (n, d), (k,), (k, d), (k, d), got "
                         f"{x.shape}, {pi.shape}, {mu.shape}, {sigma.shape}")
    if (sigma <= 0).any() or (pi < 0).any():
        raise ValueError("sigma, pi: expected sigma > 0 and pi >= 0")
    z = (x[:, None, :] - mu[None]) / sigma[None]
    comp = -0.5 * (z ** 2).sum(-1) - np.log(sigma).sum(-1)[None] - 0.5 * x.shape[1] * math.log(2 * math.pi)
    with np.errstate(divide="ignore"):
        comp = comp + np.log(pi)[None]
    m = comp.max(1, keepdims=True)
    return (m + np.log(np.exp(comp - m).sum(1, keepdims=True)))[:, 0]


def generate_mixture_sets(params: MixtureParams | Mapping[str, Any], count: int, rng: np.random.Generator) -> list[MixtureSet]:
    """``count`` sets drawn from ``rng`` (see the module docstring)."""
    p = params if isinstance(params, MixtureParams) else MixtureParams(**dict(params))
    out = []
    for _ in range(int(count)):
        n = int(rng.integers(p.n_min, p.n_max + 1))
        pi = rng.dirichlet(np.ones(p.k))
        labels = rng.choice(p.k, size=n, p=pi)
        mu = rng.uniform(-p.mean_range, p.mean_range, (p.k, p.dim))
        sigma = np.full((p.k, p.dim), p.sigma)
        x = mu[labels] + sigma[labels] * rng.standard_normal((n, p.dim))
        out.append(MixtureSet(x.astype(np.float32), labels.astype(np.int64), pi, mu, sigma))
    return out


def load_mixture_dataset(params: MixtureParams | Mapping[str, Any] | None, split: str,
                         cache_dir: str | Path | None = None, seed: int = 0) -> list[MixtureSet]:
    """The ``split`` sets, generated from stream (seed, split) and cached on disk."""
    p = MixtureParams() if params is None else params if isinstance(params, MixtureParams) else MixtureParams(**dict(params))
    si, seed = _split(split), _seed(seed)
    key = {"generator": "pointformers.mixtures", "version": GENERATOR_VERSION, "params": p.to_dict(),
           "seed": seed, "split": split}

    def build() -> dict[str, np.ndarray]:
        sets = generate_mixture_sets(p, p.sizes[si], np.random.default_rng([seed, si, 31]))
        x, off = _ragged([s.x for s in sets])
        return {"x": x.reshape(-1, p.dim), "labels": _ragged([s.labels for s in sets])[0].astype(np.int64),
                "offsets": off, "pi": np.array([s.pi for s in sets]).reshape(-1, p.k),
                "mu": np.array([s.mu for s in sets]).reshape(-1, p.k, p.dim),
                "sigma": np.array([s.sigma for s in sets]).reshape(-1, p.k, p.dim)}

    root = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "sets"
    a = cached_arrays(root, f"mixtures-{split}", key, build)
    off = a["offsets"]
    return [MixtureSet(a["x"][off[i]:off[i + 1]], a["labels"][off[i]:off[i + 1]], a["pi"][i], a["mu"][i], a["sigma"][i])
            for i in range(len(off) - 1)]


# ============================================================================ pair potentials
POTENTIALS = ("lennard_jones", "gaussian", "yukawa")


@dataclass(frozen=True)
class PotentialParams:
    """Atom configurations with a pair-potential energy (see the module docstring).

    ``epsilon``/``sigma``/``charge``: per-species values (``n_species`` = their length).
    ``spacing``: lattice spacing a; ``fill``: fraction of lattice sites occupied;
    ``jitter``: max displacement per axis in units of a; ``screening``: Yukawa λ.
    """

    potential: str = "lennard_jones"
    n_min: int = 16
    n_max: int = 64
    epsilon: tuple[float, ...] = (1.0, 0.6, 1.5)
    sigma: tuple[float, ...] = (1.0, 0.8, 1.2)
    charge: tuple[float, ...] = (1.0, -1.0, 0.5)
    spacing: float = 1.4
    fill: float = 0.7
    jitter: float = 0.08
    screening: float = 1.0
    sizes: tuple[int, int, int] = (2000, 200, 200)

    def __post_init__(self) -> None:
        if self.potential not in POTENTIALS:
            raise ValueError(f"potential: expected one of {list(POTENTIALS)}, got {self.potential!r}")
        for name in ("n_min", "n_max"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 2:
                raise ValueError(f"{name}: expected an integer >= 2, got {v!r}")
        if self.n_max < self.n_min:
            raise ValueError(f"n_max: expected >= n_min = {self.n_min}, got {self.n_max}")
        per = [tuple(float(v) for v in getattr(self, n)) for n in ("epsilon", "sigma", "charge")]
        if not per[0] or len({len(x) for x in per}) != 1:
            raise ValueError("epsilon, sigma, charge: expected per-species tuples of one common non-zero length")
        if min(per[0]) <= 0 or min(per[1]) <= 0 or not all(math.isfinite(v) for x in per for v in x):
            raise ValueError("epsilon, sigma: expected finite values > 0")
        for n, v in zip(("epsilon", "sigma", "charge"), per):
            object.__setattr__(self, n, v)
        for name in ("spacing", "screening"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0 < v < math.inf):
                raise ValueError(f"{name}: expected a finite number > 0, got {v!r}")
        if not 0 < self.fill <= 1:
            raise ValueError(f"fill: expected a fraction in (0, 1], got {self.fill!r}")
        if not 0 <= self.jitter < 0.5 / math.sqrt(3):
            raise ValueError(f"jitter: expected in [0, {0.5 / math.sqrt(3):.3f}) so atoms never overlap, got {self.jitter!r}")
        sizes = tuple(int(s) for s in self.sizes)
        if len(sizes) != 3 or min(sizes) < 0:
            raise ValueError(f"sizes: expected three non-negative integers (train, val, test), got {self.sizes!r}")
        object.__setattr__(self, "sizes", sizes)

    @property
    def n_species(self) -> int:
        return len(self.epsilon)

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


@dataclass
class Configuration:
    """``pos`` (n, 3), ``species`` (n,), ``energy`` (total), ``atom_energy`` (n,) with
    ``sum = energy``, ``forces`` (n, 3) = -∂E/∂pos."""

    pos: np.ndarray
    species: np.ndarray
    energy: float
    atom_energy: np.ndarray
    forces: np.ndarray


def pair_energy(r: np.ndarray, si: np.ndarray, sj: np.ndarray, params: PotentialParams) -> tuple[np.ndarray, np.ndarray]:
    """φ(r) and dφ/dr for pairs at distances ``r`` of species ``si``, ``sj`` (broadcast)."""
    eps, sig, q = (np.asarray(v) for v in (params.epsilon, params.sigma, params.charge))
    r = np.asarray(r, np.float64)
    if params.potential == "lennard_jones":
        s = 0.5 * (sig[si] + sig[sj])
        e = np.sqrt(eps[si] * eps[sj])
        rc = 2.5 * s
        with np.errstate(divide="ignore", invalid="ignore"):
            x6 = (s / r) ** 6
            phi = 4 * e * (x6 * x6 - x6) - 4 * e * ((1 / 2.5) ** 12 - (1 / 2.5) ** 6)
            dphi = 4 * e * (-12 * x6 * x6 + 6 * x6) / r
        inside = r < rc
        return np.where(inside, phi, 0.0), np.where(inside, dphi, 0.0)
    if params.potential == "gaussian":
        s = 0.5 * (sig[si] + sig[sj])
        e = np.sqrt(eps[si] * eps[sj])
        phi = e * np.exp(-r * r / (2 * s * s))
        return phi, -phi * r / (s * s)
    lam = params.screening
    qq = q[si] * q[sj]
    rc = 3 * lam
    with np.errstate(divide="ignore", invalid="ignore"):
        base = qq * np.exp(-r / lam) / r
        phi = base - qq * math.exp(-rc / lam) / rc
        dphi = -base * (1 / r + 1 / lam)
    inside = r < rc
    return np.where(inside, phi, 0.0), np.where(inside, dphi, 0.0)


def configuration_energy(pos: np.ndarray, species: np.ndarray, params: PotentialParams) -> tuple[float, np.ndarray, np.ndarray]:
    """Exact total energy, per-atom energies (n,) and forces (n, 3) of one configuration."""
    pos = np.asarray(pos, np.float64)
    species = np.asarray(species, np.int64)
    n = len(pos)
    if pos.ndim != 2 or pos.shape[1] != 3 or species.shape != (n,):
        raise ValueError(f"pos, species: expected shapes (n, 3) and (n,), got {pos.shape} and {species.shape}")
    if species.size and not (0 <= species.min() and species.max() < params.n_species):
        raise ValueError(f"species: expected values in [0, {params.n_species}), got range [{species.min()}, {species.max()}]")
    d = pos[:, None, :] - pos[None, :, :]
    r = np.linalg.norm(d, axis=-1)
    off = ~np.eye(n, dtype=bool)
    if n and (r[off] <= 0).any():
        raise ValueError("pos: two atoms coincide (zero distance)")
    rr = np.where(off, r, 1.0)
    phi, dphi = pair_energy(rr, species[:, None], species[None, :], params)
    phi, dphi = np.where(off, phi, 0.0), np.where(off, dphi, 0.0)
    atom = 0.5 * phi.sum(1)
    # F_i = -Σ_j φ'(r_ij) (x_i - x_j) / r_ij
    forces = -((dphi / rr)[..., None] * d).sum(1)
    return float(atom.sum()), atom, forces


def _random_rotation(rng: np.random.Generator) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((3, 3)))
    q = q * np.sign(np.diag(r))  # Haar-uniform orthogonal
    if np.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def generate_configurations(params: PotentialParams | Mapping[str, Any], count: int,
                            rng: np.random.Generator) -> list[Configuration]:
    """``count`` configurations with exact targets (see the module docstring)."""
    p = params if isinstance(params, PotentialParams) else PotentialParams(**dict(params))
    out = []
    for _ in range(int(count)):
        n = int(rng.integers(p.n_min, p.n_max + 1))
        side = int(math.ceil((n / p.fill) ** (1 / 3)))
        grid = np.stack(np.meshgrid(*[np.arange(side)] * 3, indexing="ij"), -1).reshape(-1, 3).astype(np.float64)
        sites = grid[rng.choice(len(grid), size=n, replace=False)]
        pos = (sites + rng.uniform(-p.jitter, p.jitter, (n, 3))) * p.spacing
        # Targets are computed on the float32 positions that are stored and fed to models.
        pos = ((pos - pos.mean(0)) @ _random_rotation(rng).T).astype(np.float32)
        species = rng.integers(0, p.n_species, n)
        e, atom, f = configuration_energy(pos, species, p)
        out.append(Configuration(pos, species.astype(np.int64), e, atom, f))
    return out


def load_potential_dataset(params: PotentialParams | Mapping[str, Any] | None, split: str,
                           cache_dir: str | Path | None = None, seed: int = 0) -> list[Configuration]:
    """The ``split`` configurations, generated from stream (seed, split) and cached on disk.

    Targets are recomputed in float64 from the stored float32 positions, so they are exact
    for the positions the model sees.
    """
    p = PotentialParams() if params is None else params if isinstance(params, PotentialParams) else PotentialParams(**dict(params))
    si, seed = _split(split), _seed(seed)
    key = {"generator": "pointformers.pair_potential", "version": GENERATOR_VERSION, "params": p.to_dict(),
           "seed": seed, "split": split}

    def build() -> dict[str, np.ndarray]:
        confs = generate_configurations(p, p.sizes[si], np.random.default_rng([seed, si, 57]))
        pos, off = _ragged([c.pos for c in confs])
        return {"pos": pos.reshape(-1, 3).astype(np.float32), "offsets": off,
                "species": _ragged([c.species for c in confs])[0].astype(np.int64)}

    root = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "sets"
    a = cached_arrays(root, f"potential-{split}", key, build)
    out = []
    off = a["offsets"]
    for i in range(len(off) - 1):
        pos, sp = a["pos"][off[i]:off[i + 1]], a["species"][off[i]:off[i + 1]]
        e, atom, f = configuration_energy(pos, sp, p)
        out.append(Configuration(pos, sp, e, atom, f))
    return out
