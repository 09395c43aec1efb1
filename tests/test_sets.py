"""Gaussian-mixture sets (amortised clustering) and the exact pair-potential regression set."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import multivariate_normal

from pointformers.data import sets as S


def test_mixture_sets_follow_set_transformer_and_oracle_likelihood() -> None:
    p = S.MixtureParams()
    sets = S.generate_mixture_sets(p, 150, np.random.default_rng(0))
    ns = np.array([len(s.x) for s in sets])
    assert ns.min() >= 100 and ns.max() <= 500 and ns.std() > 50
    for s in sets[:20]:
        assert s.pi.shape == (4,) and abs(s.pi.sum() - 1) < 1e-12
        assert np.abs(s.mu).max() <= 4 and np.all(s.sigma == 0.3)
        for j in range(4):
            xj = s.x[s.labels == j]
            if len(xj) > 60:  # a component's points scatter around its mean with std 0.3
                assert np.abs(xj.mean(0) - s.mu[j]).max() < 0.15
                assert np.abs(xj.std(0) - 0.3).max() < 0.08
    # Set Transformer's benchmark reports an oracle log-likelihood of -1.4726 per point.
    oracle = np.mean([s.true_log_likelihood() for s in sets])
    assert abs(oracle + 1.4726) < 0.05


def test_mixture_log_likelihood_equals_scipy() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(30, 2))
    pi = np.array([0.1, 0.6, 0.3])
    mu = rng.normal(size=(3, 2))
    sig = rng.uniform(0.2, 1.5, (3, 2))
    ref = np.log(sum(pi[j] * multivariate_normal(mu[j], np.diag(sig[j] ** 2)).pdf(x) for j in range(3)))
    assert np.allclose(S.mixture_log_likelihood(x, pi, mu, sig), ref, atol=1e-10)
    # A zero weight is allowed (a component switched off), far points stay finite.
    ll = S.mixture_log_likelihood(np.array([[100.0, 100.0]]), np.array([0.0, 1.0]), mu[:2], sig[:2])
    assert np.isfinite(ll).all()
    with pytest.raises(ValueError, match="sigma"):
        S.mixture_log_likelihood(x, pi, mu, -sig)


def test_mixture_dataset_cache(tmp_path: Path) -> None:
    params = S.MixtureParams(sizes=(5, 2, 3))
    a = S.load_mixture_dataset(params, "test", tmp_path, seed=1)
    b = S.load_mixture_dataset(params, "test", tmp_path, seed=1)
    assert len(a) == 3 and all(np.array_equal(x.x, y.x) and np.array_equal(x.mu, y.mu) for x, y in zip(a, b))
    c = S.load_mixture_dataset(S.MixtureParams(sizes=(5, 2, 3), sigma=0.5), "test", tmp_path, seed=1)
    assert len(list((tmp_path / "sets").glob("mixtures-test-*.npz"))) == 2
    assert not np.array_equal(a[0].x, c[0].x)
    with pytest.raises(ValueError, match="split"):
        S.load_mixture_dataset(params, "dev", tmp_path)


def test_lennard_jones_pair_hand_values() -> None:
    p = S.PotentialParams(epsilon=(2.0,), sigma=(1.0,), charge=(0.0,))
    shift = 4 * 2.0 * (2.5 ** -12 - 2.5 ** -6)
    rmin = 2 ** (1 / 6)
    e, atom, f = S.configuration_energy(np.array([[0, 0, 0], [rmin, 0, 0]]), np.array([0, 0]), p)
    assert e == pytest.approx(-2.0 - shift) and np.allclose(atom, e / 2)
    assert np.abs(f).max() < 1e-12  # the minimum: no force
    phi, _ = S.pair_energy(np.array([2.5 - 1e-9, 2.6]), np.array([0]), np.array([0]), p)
    assert abs(phi[0]) < 1e-8 and phi[1] == 0  # continuous at the cutoff, zero beyond
    # Mixing: σ_ij = mean, ε_ij = geometric mean.
    p2 = S.PotentialParams(epsilon=(1.0, 4.0), sigma=(1.0, 2.0), charge=(0.0, 0.0))
    phi, _ = S.pair_energy(np.array([1.5]), np.array([0]), np.array([1]), p2)
    assert phi[0] == pytest.approx(4 * 2.0 * ((1.5 / 1.5) ** 12 - 1) - 4 * 2.0 * (2.5 ** -12 - 2.5 ** -6))


@pytest.mark.parametrize("potential", S.POTENTIALS)
def test_energy_invariances_and_exact_forces(potential: str) -> None:
    p = S.PotentialParams(potential=potential, n_min=12, n_max=20)
    conf = S.generate_configurations(p, 1, np.random.default_rng(2))[0]
    pos = conf.pos.astype(np.float64)
    e, atom, f = S.configuration_energy(pos, conf.species, p)
    assert e == pytest.approx(conf.energy) and atom.sum() == pytest.approx(e)
    assert np.allclose(f.sum(0), 0, atol=1e-9)  # Newton's third law
    q, _ = np.linalg.qr(np.random.default_rng(3).normal(size=(3, 3)))
    perm = np.random.default_rng(4).permutation(len(pos))
    e2, atom2, f2 = S.configuration_energy(pos[perm] @ q.T + [3.0, -1.0, 2.0], conf.species[perm], p)
    assert e2 == pytest.approx(e, rel=1e-10) and np.allclose(atom2, atom[perm]) and np.allclose(f2, f[perm] @ q.T)
    # Forces are minus the gradient (central differences).
    h = 1e-6
    for i in (0, 5):
        for k in range(3):
            d = np.zeros_like(pos)
            d[i, k] = h
            num = -(S.configuration_energy(pos + d, conf.species, p)[0] - S.configuration_energy(pos - d, conf.species, p)[0]) / (2 * h)
            assert num == pytest.approx(f[i, k], rel=1e-5, abs=1e-6)


def test_configurations_keep_atoms_apart_and_cache(tmp_path: Path) -> None:
    p = S.PotentialParams(sizes=(4, 1, 2))
    confs = S.load_potential_dataset(p, "train", tmp_path, seed=0)
    again = S.load_potential_dataset(p, "train", tmp_path, seed=0)
    assert len(confs) == 4
    for c, d in zip(confs, again):
        assert np.array_equal(c.pos, d.pos) and c.energy == d.energy
        assert 16 <= len(c.pos) <= 64
        r = np.linalg.norm(c.pos[:, None] - c.pos[None], axis=-1) + np.eye(len(c.pos)) * 1e9
        assert r.min() >= (1 - 2 * math.sqrt(3) * p.jitter) * p.spacing - 1e-5
        assert abs(c.pos.mean(0)).max() < 1e-4
    with pytest.raises(ValueError, match="jitter"):
        S.PotentialParams(jitter=0.4)
    with pytest.raises(ValueError, match="species"):
        S.configuration_energy(np.zeros((2, 3)) + [[0, 0, 0], [1, 0, 0]], np.array([0, 7]), p)
