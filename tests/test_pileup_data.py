"""Physics and bookkeeping tests of the pile-up event generator (the stand-in for HEPT's Pileup-10k)."""
from __future__ import annotations

import numpy as np
import pytest

from pointformers.data import pileup as pu
from pointformers.data.pileup import (
    PRESETS,
    PileupEvent,
    PileupParams,
    dataset_cache_path,
    generate_event,
    generate_events,
    load_pileup_dataset,
    pack_pileup_events,
    pid_category,
    preset_params,
    unpack_pileup_events,
)

MASS = {211: 0.13957, 321: 0.493677, 2212: 0.938272, 22: 0.0, 130: 0.497611, 310: 0.497611, 2112: 0.939565,
        3122: 1.115683, 3322: 1.31486}


def cat(events, name):
    return np.concatenate([np.asarray(getattr(e, name)) for e in events])


@pytest.fixture(scope="module")
def small_events() -> list[PileupEvent]:
    return generate_events("pileup-small", 6, seed=5)


# ------------------------------------------------------------------ PID categories
def test_pid_category_hand_cases() -> None:
    pdg = np.array([211, -321, 2212, 22, 130, 310, 2112, -2112, 3122, -3122, 3322, -3322, 999])
    q = np.array([1, -1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1])  # the last: charged, any code -> 0
    assert pid_category(pdg, q).tolist() == [0, 0, 0, 1, 2, 3, 4, 4, 5, 5, 6, 6, 0]


@pytest.mark.parametrize("code", [111, -22, -130, 0])
def test_pid_category_rejects_unknown_neutral_codes(code: int) -> None:
    with pytest.raises(ValueError, match=f"PDG code {code}"):
        pid_category(np.array([22, code]), np.array([0, 0]))
    with pytest.raises(ValueError, match="equal shapes"):
        pid_category(np.array([22]), np.array([0, 0]))


# ------------------------------------------------------------------ species and charges
def test_species_fractions_and_categories(small_events) -> None:
    pdg, q = cat(small_events, "pdg"), cat(small_events, "charge")
    c = pid_category(pdg, q)
    frac = np.bincount(c, minlength=7) / len(c)
    want = np.asarray(PileupParams().species_fractions)
    assert len(c) > 8000
    np.testing.assert_allclose(frac, want, atol=0.015)
    # The generator's intended mix: charged 60-65 %, photons ~25 %, neutral hadrons ~10 %.
    assert 0.60 <= frac[0] <= 0.65 and 0.23 <= frac[1] <= 0.29 and 0.08 <= frac[2:].sum() <= 0.14
    # Charged particles are pi/K/p with the charge as the sign of the PDG code; neutrals have q = 0.
    charged = q != 0
    assert set(np.abs(pdg[charged]).tolist()) == {211, 321, 2212}
    assert np.array_equal(np.sign(pdg[charged]), q[charged])
    assert set(np.abs(pdg[~charged]).tolist()) <= {22, 130, 310, 2112, 3122, 3322}
    assert (pdg[np.isin(np.abs(pdg), (22, 130, 310))] > 0).all()  # self-conjugate: no negative codes
    assert (pdg == -2112).any() and (pdg == 2112).any()  # antineutrons occur
    assert set(np.unique(q).tolist()) == {-1, 0, 1}


def test_kinematics_are_consistent(small_events) -> None:
    ev = small_events[0]
    pt, eta, phi = (getattr(ev, k).astype(np.float64) for k in ("pt", "eta", "phi"))
    np.testing.assert_allclose(ev.px, pt * np.cos(phi), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ev.py, pt * np.sin(phi), rtol=1e-5, atol=1e-6)
    m = np.array([MASS[abs(int(c))] for c in ev.pdg])
    pz, p = pt * np.sinh(eta), pt * np.cosh(eta)
    np.testing.assert_allclose(ev.energy, np.sqrt(p ** 2 + m ** 2), rtol=1e-5)
    E = np.sqrt(p ** 2 + m ** 2)
    np.testing.assert_allclose(ev.rapidity, 0.5 * np.log((E + pz) / (E - pz)), rtol=1e-4, atol=1e-4)
    photon = ev.pdg == 22
    np.testing.assert_allclose(ev.rapidity[photon], ev.eta[photon], atol=1e-5)  # massless: y = η
    assert (np.abs(ev.rapidity) <= np.abs(ev.eta) + 1e-5).all()
    assert (ev.pt > 0).all() and (np.abs(ev.phi) <= np.pi + 1e-6).all()


def test_acceptances(small_events) -> None:
    eta, q = cat(small_events, "eta"), cat(small_events, "charge")
    assert np.abs(eta[q != 0]).max() <= 2.5 + 1e-6  # tracked charged particles only inside the tracker
    neutral_far = (q == 0) & (np.abs(eta) > 2.5)
    assert neutral_far.mean() > 0.05  # neutrals fill |eta| < 4
    soft = cat(small_events, "jet") < 0
    assert np.abs(eta[soft]).max() <= 4.0 + 1e-6


def test_soft_spectrum(small_events) -> None:
    pt, vertex = cat(small_events, "pt"), cat(small_events, "vertex")
    soft_pu = pt[vertex > 0]
    assert 0.45 < soft_pu.mean() < 0.65  # mean ~0.55 GeV
    assert 0.10 < (soft_pu > 0.9).mean() < 0.22  # roughly 10-20 % above 0.9 GeV
    assert soft_pu.max() > 5.0  # power-law tail


# ------------------------------------------------------------------ leading collision vs pile-up
def test_labels_follow_the_leading_vertex(small_events) -> None:
    for ev in small_events:
        s = np.bincount(ev.vertex, weights=ev.pt.astype(np.float64) ** 2)
        lead = int(np.argmax(s))
        assert np.array_equal(ev.is_pu, ev.vertex != lead)
        assert np.array_equal(ev.is_lc, ~ev.is_pu)
        assert (ev.vertex[ev.jet >= 0] == 0).all()  # jets belong to the hard collision
        assert lead == 0  # the hard collision outshines every soft pile-up vertex here
        assert s[0] > 3 * np.sort(s)[-2]


def test_pileup_is_softer_and_more_forward_than_the_lc(small_events) -> None:
    pt, eta, lc = cat(small_events, "pt"), cat(small_events, "eta"), cat(small_events, "is_pu") == 0
    assert np.median(pt[lc]) > 1.2 * np.median(pt[~lc])
    assert np.abs(eta[~lc]).mean() > np.abs(eta[lc]).mean() + 0.1  # PU fills |eta| < 4; LC jets are central
    hard_pt = pt > 0.9
    assert np.abs(eta[hard_pt & ~lc]).mean() > np.abs(eta[hard_pt & lc]).mean() + 0.25
    neu = cat(small_events, "charge") == 0
    hard = neu & (pt > 0.9)
    # Above the pT cut the LC share of neutral particles grows: the hard process is what makes
    # LC neutrals recognisable.
    assert lc[hard].mean() > 1.3 * lc[neu].mean()


def test_jets_are_collimated(small_events) -> None:
    dr_all, dr_pu, sums = [], [], []
    for ev in small_events:
        eta, phi, pt = (getattr(ev, k).astype(np.float64) for k in ("eta", "phi", "pt"))
        for j in np.unique(ev.jet[ev.jet >= 0]):
            m = ev.jet == j
            # pT-weighted axis (φ averaged as a unit vector, so the ±π seam does not matter)
            axis_eta = np.average(eta[m], weights=pt[m])
            axis_phi = np.arctan2(np.average(np.sin(phi[m]), weights=pt[m]), np.average(np.cos(phi[m]), weights=pt[m]))
            dphi = np.angle(np.exp(1j * (phi - axis_phi)))
            dr = np.hypot(eta - axis_eta, dphi)
            dr_all.append(dr[m])
            dr_pu.append(dr[ev.is_pu])
            sums.append(pt[m].sum())
    dr_all = np.concatenate(dr_all)
    assert (dr_all < 0.4).mean() > 0.9  # constituents mostly within ΔR < 0.4
    assert np.median(np.concatenate(dr_pu)) > 1.5  # pile-up is not clustered around jet axes
    sums = np.asarray(sums)
    assert sums.min() >= 30.0 - 1e-3 and sums.max() <= 300.0 + 0.1  # jet pT in [30, 300] GeV


def test_pileup_10k_matches_hept_statistics() -> None:
    evs = generate_events("pileup-10k", 2, seed=0)
    n = np.array([e.num_particles for e in evs])
    assert ((n > 8500) & (n < 12500)).all()  # ~10.3k particles per event
    neu = cat(evs, "charge") == 0
    lc = cat(evs, "is_pu") == 0
    assert 0.025 < lc[neu].mean() < 0.055  # ~4 % positives among neutral particles (3.9 % in HEPT's data)


# ------------------------------------------------------------------ determinism, presets, validation
def test_deterministic_under_seed() -> None:
    a = generate_event("pileup-tiny", seed=3, event_id=2)
    b = generate_event("pileup-tiny", seed=3, event_id=2)
    c = generate_event("pileup-tiny", seed=4, event_id=2)
    for k in ("pt", "eta", "phi", "pdg", "is_pu", "jet", "vertex"):
        assert np.array_equal(getattr(a, k), getattr(b, k))
    assert a.num_particles != c.num_particles or not np.array_equal(a.pt, c.pt)
    # An event does not depend on which other events were generated with it.
    evs = generate_events("pileup-tiny", 3, seed=3)
    assert np.array_equal(evs[2].pt, a.pt) and evs[2].event_id == 2
    # Particles are shuffled: the label is not sorted (it switches both ways along the event).
    step = np.diff(a.is_pu.astype(int))
    assert (step > 0).any() and (step < 0).any()


def test_params_validation_names_the_field() -> None:
    for bad, key in ((dict(mu=-1.0), "mu"), (dict(n_events=0), "n_events"), (dict(pt_power=2.0), "pt_power"),
                     (dict(species_fractions=(0.5, 0.5)), "species_fractions"),
                     (dict(jet_pt_max=10.0), "jet_pt_max"), (dict(charged_eta_max=5.0), "charged_eta_max"),
                     (dict(split=(0.5, 0.5, 0.5)), "split"), (dict(mu=float("nan")), "mu")):
        with pytest.raises(ValueError, match=f"^{key}:"):
            PileupParams(**bad)
    with pytest.raises(ValueError, match="^preset:"):
        preset_params("nope")
    with pytest.raises(ValueError, match="unknown PileupParams field"):
        preset_params("pileup-tiny", colour=1)
    with pytest.raises(ValueError, match="^seed:"):
        generate_event("pileup-tiny", seed=-1)
    assert {"pileup-tiny", "pileup-small", "pileup-10k"} <= set(PRESETS)
    assert preset_params("pileup-10k").n_events == 1000


def test_event_container_checks_shapes_and_packs() -> None:
    evs = generate_events("pileup-tiny", 3, seed=1)
    back = unpack_pileup_events(pack_pileup_events(evs))
    for a, b in zip(evs, back):
        for k in ("pt", "eta", "phi", "px", "py", "energy", "rapidity", "charge", "pdg", "is_pu", "vertex", "jet"):
            assert np.array_equal(getattr(a, k), getattr(b, k)), k
        assert a.event_id == b.event_id
    kw = {k: getattr(evs[0], k) for k in ("pt", "eta", "phi", "px", "py", "energy", "rapidity", "charge", "pdg",
                                           "is_pu", "vertex", "jet")}
    kw["eta"] = kw["eta"][:-1]
    with pytest.raises(ValueError, match="PileupEvent.eta"):
        PileupEvent(**kw)


# ------------------------------------------------------------------ data set and cache
def test_dataset_splits_and_cache(tmp_path, monkeypatch) -> None:
    p = preset_params("pileup-tiny")
    sizes = {s: len(load_pileup_dataset("pileup-tiny", s, cache_dir=tmp_path, seed=2))
             for s in ("train", "val", "test")}
    assert sizes == {"train": 16, "val": 2, "test": 2} and p.n_events == 20
    val = load_pileup_dataset("pileup-tiny", "val", cache_dir=tmp_path, seed=2)
    assert [e.event_id for e in val] == [16, 17]
    direct = generate_events("pileup-tiny", 2, seed=2, start=16)
    assert all(np.array_equal(a.pt, b.pt) for a, b in zip(val, direct))
    path = dataset_cache_path("pileup-tiny", "val", cache_dir=tmp_path, seed=2)
    assert path.is_file()

    calls = []
    real = pu.generate_events

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(pu, "generate_events", counting)
    again = load_pileup_dataset("pileup-tiny", "val", cache_dir=tmp_path, seed=2)
    assert not calls and all(np.array_equal(a.pt, b.pt) for a, b in zip(val, again))  # served from the cache
    # A changed parameter is a different cache entry and is regenerated.
    changed = p.replace(mu=6.0)
    other = load_pileup_dataset(changed, "val", cache_dir=tmp_path, seed=2)
    assert calls and dataset_cache_path(changed, "val", cache_dir=tmp_path, seed=2) != path
    assert sum(e.num_particles for e in other) != sum(e.num_particles for e in val)
    # A corrupted file is regenerated, with the same content.
    calls.clear()
    path.write_bytes(b"not a zip file")
    fixed = load_pileup_dataset("pileup-tiny", "val", cache_dir=tmp_path, seed=2)
    assert calls and all(np.array_equal(a.pt, b.pt) for a, b in zip(val, fixed))
    with pytest.raises(ValueError, match="^split:"):
        load_pileup_dataset("pileup-tiny", "dev", cache_dir=tmp_path)
