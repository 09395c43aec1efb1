"""The helix fit of a track's hits (pointformers.tasks.tracking.track_fit): exact on exact helices, right
charge and close parameters on generated events' true tracks."""
from __future__ import annotations

import numpy as np
import pytest

from pointformers.data.tracking import field_ratio
from pointformers.tasks.tracking.track_fit import B_FIELD_T, fit_tracks


def _helix_inputs(q: float, radius: float, phi0: float, cot: float, n: int = 8) -> np.ndarray:
    """Tracking inputs (r [m], φ/π, z [m], η, u, v [1/m]) of n points of an exact helix from the origin."""
    direction = np.array([np.cos(phi0), np.sin(phi0)])
    right = np.array([np.sin(phi0), -np.cos(phi0)])
    centre = radius * right if q > 0 else -radius * right           # positive: turns clockwise (B along +z)
    alpha = np.linspace(0.03, 0.17, n) / radius                     # turning angles: the pixel radii [m]
    start = -centre                                                 # the origin seen from the centre
    sign = -1.0 if q > 0 else 1.0
    c, s = np.cos(sign * alpha), np.sin(sign * alpha)
    pts = centre + np.stack([c * start[0] - s * start[1], s * start[0] + c * start[1]], 1)
    assert np.allclose(pts[:1] - 0, radius * alpha[0] * direction, atol=radius * alpha[0] ** 2)   # leaves along phi0
    r = np.hypot(pts[:, 0], pts[:, 1])
    z = radius * alpha * cot
    x = np.zeros((n, 15))
    x[:, 0], x[:, 1], x[:, 2] = r, np.arctan2(pts[:, 1], pts[:, 0]) / np.pi, z
    x[:, 4], x[:, 5] = pts[:, 0] / r ** 2, pts[:, 1] / r ** 2
    return x


@pytest.mark.parametrize("q,radius,phi0,cot", [(1, 1.7, 0.3, 0.0), (-1, 1.7, 0.3, 0.5), (1, 0.6, -2.9, -2.0),
                                               (-1, 8.0, 3.0, 4.0)])
def test_an_exact_helix_gives_its_parameters(q, radius, phi0, cot):
    x = np.concatenate([_helix_inputs(q, radius, phi0, cot), _helix_inputs(-q, 1.0, 1.0, 0.1, n=5)])
    labels = np.array([4] * 8 + [9] * 5)
    fit = fit_tracks(labels, x)
    assert fit["track"].tolist() == [4, 9]
    z_mean = x[:8, 2].mean() * 1000
    assert fit["pt"][0] == pytest.approx(0.299792458 * B_FIELD_T * field_ratio(z_mean) * radius, rel=1e-9)
    assert fit["charge"].tolist() == [q, -q]
    assert np.angle(np.exp(1j * (fit["phi"][0] - phi0))) == pytest.approx(0.0, abs=1e-9)
    assert fit["eta"][0] == pytest.approx(np.arcsinh(cot), abs=1e-9)


def test_short_tracks_noise_and_bad_input():
    x = _helix_inputs(1, 2.0, 0.0, 0.0, n=6)
    fit = fit_tracks(np.array([0, 0, -1, 1, 1, 1]), x)
    assert fit["track"].tolist() == [1]                          # two hits fix no circle: no fit
    straight = x.copy()
    straight[:, 4], straight[:, 5] = 1 / np.linspace(0.1, 0.5, 6), 0.0   # on a line through the origin
    bad = fit_tracks(np.zeros(6, dtype=int), straight)
    assert np.isnan(bad["pt"][0]) and np.isnan(bad["charge"][0])
    with pytest.raises(ValueError, match="fit_tracks: expected labels"):
        fit_tracks(np.zeros(6, dtype=int), x[:, :5])
    assert fit_tracks(np.full(6, -1), x)["track"].size == 0


def test_true_tracks_of_generated_events_fit_their_particles():
    # the generator's helices in the TrackML field with material effects and noise: the fit of each
    # particle's hits recovers its charge and close parameters (fails on a wrong sign, unit or column)
    from pointformers.data.tracking import generate_event, preset_params
    from pointformers.tasks.tracking.training import cloud_particle_eta, prepare_tracking_clouds

    (cloud, *_), = [prepare_tracking_clouds([generate_event(preset_params("small"), seed=3)], cache_dir=False)]
    pid = cloud.inputs.particle_id.numpy()
    fit = fit_tracks(np.where(pid > 0, pid, -1), cloud.inputs.x.numpy())
    ids, first = np.unique(pid, return_index=True)
    h = first[np.searchsorted(ids, fit["track"])]
    sel = cloud.inputs.pt.numpy()[h] >= 0.9
    assert sel.sum() >= 20
    pt = cloud.inputs.pt.numpy()[h][sel]
    assert np.mean(fit["charge"][sel] == cloud.particle_q.numpy()[h][sel]) > 0.97
    assert np.median(np.abs(fit["pt"][sel] / pt - 1)) < 0.1
    assert np.median(np.abs(fit["eta"][sel] - cloud_particle_eta(cloud)[h][sel])) < 0.01
    assert np.median(np.abs(np.angle(np.exp(1j * (fit["phi"][sel] - cloud.particle_phi.numpy()[h][sel]))))) < 0.01


def test_the_refit_drops_a_few_hits_of_another_particle():
    x = _helix_inputs(1, 1.5, 0.4, 0.3, n=8)
    other = _helix_inputs(1, 1.0, 0.46, 0.3, n=8)[[5, 7]]             # two hits of another track, ~1 cm away
    both = np.concatenate([x, other])
    labels = np.zeros(10, dtype=int)
    z_mean = x[:, 2].mean() * 1000
    want = 0.299792458 * B_FIELD_T * field_ratio(z_mean) * 1.5
    trimmed, plain = fit_tracks(labels, both), fit_tracks(labels, both, trim=0)
    assert trimmed["pt"][0] == pytest.approx(want, rel=1e-9)
    assert trimmed["eta"][0] == pytest.approx(np.arcsinh(0.3), abs=1e-9)
    assert abs(plain["pt"][0] / want - 1) > 0.05                        # one fit of every hit is pulled
    with pytest.raises(ValueError, match="trim"):
        fit_tracks(labels, both, trim=-1)


def test_resolutions_leave_degenerate_fits_out_of_the_widths():
    from pointformers.tasks.tracking.track_fit import parameter_resolutions

    truth = {"pt": np.array([1.0, 2.0, 4.0]), "eta": np.zeros(3), "phi": np.zeros(3), "charge": np.array([1.0, -1, 1])}
    got = {"pt": np.array([1.1, 2.2, np.nan]), "eta": np.array([0.1, -0.1, np.nan]), "phi": np.array([0.1, 0.3, np.nan]),
           "charge": np.array([1.0, -1, np.nan])}
    res = parameter_resolutions(got, truth)
    assert res["pt_rel_res"] == pytest.approx(0.0) and res["eta_res"] == pytest.approx(1.4826 * 0.1)
    assert res["pt_rel_bias"] == pytest.approx(0.1)
    assert res["phi_res"] == pytest.approx(1.4826 * 0.1) and res["charge_acc"] == pytest.approx(2 / 3)
    assert res["param_tracks"] == 3


def _slot_fit(x: np.ndarray, slot: np.ndarray, weight: np.ndarray, num_slots: int, trim: float = 0.0):
    import torch

    from pointformers.models.track_reconstruction import FIT_COLUMNS, slot_helix_fit

    hits = torch.as_tensor(x[:, list(FIT_COLUMNS)])[None]
    return slot_helix_fit(hits, torch.as_tensor(slot)[None], torch.as_tensor(weight, dtype=torch.float64)[None],
                          num_slots, trim)


def test_the_model_s_slot_fit_is_the_track_fit():
    # the end-to-end model's fixed-shape torch fit per slot (pointformers.models.track_reconstruction) and the
    # numpy fit per track share the helix formulas: equal on the same hits; hits of weight 0 (padding, hits
    # claimed by no slot) are left out; a slot of fewer than three hits is not fitted
    x = np.concatenate([_helix_inputs(1, 1.7, 0.3, 0.5), _helix_inputs(-1, 0.8, -2.0, -1.5, n=6),
                        _helix_inputs(1, 3.0, 1.0, 0.0, n=2), np.random.default_rng(0).normal(size=(4, 15))])
    slot = np.array([3] * 8 + [0] * 6 + [5] * 2 + [3, 0, 1, 1])
    weight = np.array([1.0] * 16 + [0.0] * 4)
    fit = _slot_fit(x, slot, weight, num_slots=6)
    want = fit_tracks(np.where(weight > 0, slot, -1), x, trim=0)
    assert want["track"].tolist() == [0, 3]
    for k in ("pt", "charge", "phi"):
        np.testing.assert_allclose(fit[k][0, want["track"]].numpy(), want[k], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.arcsinh(fit["cot"][0, want["track"]].numpy()), want["eta"], atol=1e-12)
    assert fit["fitted"][0].tolist() == [True, False, False, True, False, False]
    assert fit["charge"][0, [3, 0]].tolist() == [1.0, -1.0]


def test_the_slot_fit_s_refit_drops_a_few_hits_of_another_particle():
    x = np.concatenate([_helix_inputs(1, 1.5, 0.4, 0.3, n=8), _helix_inputs(1, 1.0, 0.46, 0.3, n=8)[[5, 7]]])
    want = 0.299792458 * B_FIELD_T * field_ratio(x[:8, 2].mean() * 1000) * 1.5
    slot, weight = np.zeros(10, dtype=np.int64), np.ones(10)
    trimmed, plain = _slot_fit(x, slot, weight, 1, trim=2.0), _slot_fit(x, slot, weight, 1)
    assert trimmed["pt"][0, 0].item() == pytest.approx(want, rel=1e-9)
    assert trimmed["weight"][0, 0].item() == 8                          # the two stray hits left out
    assert abs(plain["pt"][0, 0].item() / want - 1) > 0.05


def test_the_resolutions_use_the_particles_the_efficiency_counts():
    # matched_track_truth: one track per double-majority matched particle that track_matching_report counts
    # (selected, reconstructable and, on a phi-sector cloud, owned by it), never others
    import dataclasses

    import torch

    from pointformers.data.tracking import generate_event, preset_params
    from pointformers.tasks.tracking.training import matched_track_truth, prepare_tracking_clouds, track_matching_report

    (cloud,) = prepare_tracking_clouds([generate_event(preset_params("small"), seed=3)], cache_dir=False)
    pid = cloud.inputs.particle_id.numpy()
    owned_particles = np.unique(pid[pid > 0])[::2]                        # every other particle owned
    cloud = dataclasses.replace(cloud, sector_own=torch.as_tensor(np.isin(pid, owned_particles)))
    labels = np.where(pid > 0, pid, -1)
    labels[np.flatnonzero(pid > 0)[::7]] = -1                             # some hits left out
    tracks, truth = matched_track_truth(labels, cloud, 0.9, 4.0)
    report = track_matching_report([labels], [cloud], 0.9, 4.0)
    assert len(tracks) == report["overall"]["matched_particles_dm"] > 10
    assert np.isin(tracks, owned_particles).all() and (truth["pt"] >= 0.9).all()
