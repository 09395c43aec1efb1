"""DBSCAN track building: radius selection on validation clouds, agreement with the in-house
DBSCAN, the precomputed-graph path, and TrackingTask.evaluate_report end to end."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from pointformers.tasks.tracking.building import (
    choose_dbscan_eps,
    dbscan_tracks,
    default_eps_grid,
    track_building_score,
)
from pointformers.tasks.tracking.trackml_score import trackml_like_weights, trackml_score
from pointformers.tasks.tracking import TrackingInputs, cluster_tracks
from pointformers.tasks.tracking.training import TrackingCloud, TrackingTask, cloud_truth_weights


def blobs(seed: int, n_particles: int = 25, spread: float = 0.02, spacing: float = 1.0, noise: int = 20, dim: int = 3):
    """Per-particle embedding blobs on a jittered grid (neighbouring centres ``spacing`` apart)
    plus isolated noise hits; returns (emb (n, dim), particle_id, weight)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(4, 10, n_particles)
    centres = rng.permutation(np.stack(np.meshgrid(*[np.arange(6)] * dim), -1).reshape(-1, dim))[:n_particles] * spacing
    pid = np.concatenate([np.full(s, p + 1) for p, s in enumerate(sizes)])
    emb = centres[pid - 1] + rng.normal(0, spread, (pid.size, dim))
    emb = np.concatenate([emb, rng.uniform(-3, -2, (noise, dim)) * spacing])  # far from every blob, sparse
    pid = np.concatenate([pid, np.zeros(noise, int)])
    w = trackml_like_weights(pid, np.full(pid.size, 2.0), rng.random(pid.size))
    return emb, pid, w


def test_well_separated_blobs_score_one_and_eps_is_chosen_between_scales():
    val = [blobs(s) for s in (0, 1)]
    test = [blobs(s) for s in (2, 3)]
    sel = choose_dbscan_eps([v[0] for v in val], [v[1] for v in val], [v[2] for v in val])
    assert sel.score == pytest.approx(1.0)
    # the radius joins hits of a blob (spread 0.02) but never two blobs (1 apart)
    assert 0.05 < sel.eps < 0.9
    assert sel.scores[sel.eps] == max(sel.scores.values())
    tied = sorted(e for e, v in sel.scores.items() if v == sel.score)
    assert len(tied) > 2 and sel.eps == tied[(len(tied) - 1) // 2]  # ties -> middle of the plateau
    assert track_building_score([t[0] for t in test], [t[1] for t in test], [t[2] for t in test], sel.eps) \
        == pytest.approx(1.0)
    # too small a radius leaves hits unassigned, too large merges particles
    assert track_building_score([test[0][0]], [test[0][1]], [test[0][2]], 1e-4) == 0.0
    assert track_building_score([test[0][0]], [test[0][1]], [test[0][2]], 2.5) < 0.2


def test_grid_scores_equal_direct_dbscan_and_in_house_dbscan_agrees():
    emb, pid, w = blobs(5, spread=0.15, spacing=0.6)  # overlapping blobs: scores vary with eps
    grid = [0.05, 0.1, 0.2, 0.3, 0.5]
    sel = choose_dbscan_eps([emb], [pid], [w], eps_grid=grid, refine=0)
    for eps in grid:  # precomputed radius graph at max(grid) == a fresh DBSCAN at each radius
        assert sel.scores[eps] == pytest.approx(trackml_score(dbscan_tracks(emb, eps), pid, w), abs=1e-12)
    assert len({round(v, 6) for v in sel.scores.values()}) > 2
    # sklearn's DBSCAN and the in-house cluster_tracks give the same partition of core points
    for eps, ms in ((0.1, 2), (0.2, 3), (0.3, 5)):
        a, b = dbscan_tracks(emb, eps, ms), cluster_tracks(torch.from_numpy(emb), eps, ms)
        counts = np.array([np.sum(np.linalg.norm(emb - x, axis=1) <= eps) for x in emb])
        core = counts >= ms
        pairs = {(int(x), int(y)) for x, y in zip(a[core], b[core])}
        assert len(pairs) == len({p[0] for p in pairs}) == len({p[1] for p in pairs})  # a bijection
        assert ((a >= 0) == (b >= 0)).all()  # same unassigned hits (border hits may join another cluster)


def test_refinement_only_adds_candidates_and_never_lowers_the_score():
    emb, pid, w = blobs(7, spread=0.12, spacing=0.7)
    coarse = choose_dbscan_eps([emb], [pid], [w], refine=0)
    fine = choose_dbscan_eps([emb], [pid], [w], refine=5)
    assert set(coarse.scores) <= set(fine.scores)
    assert fine.score >= coarse.score
    grid = default_eps_grid([emb])
    assert np.all(np.diff(grid) > 0) and grid.size == 16
    nn1 = np.sort(np.linalg.norm(emb[:, None] - emb[None], axis=-1), axis=1)[:, 1]
    assert grid[0] == pytest.approx(np.percentile(nn1[nn1 > 0], 5))


def test_bad_inputs():
    emb, pid, w = blobs(0)
    with pytest.raises(ValueError, match="eps"):
        dbscan_tracks(emb, 0.0)
    with pytest.raises(ValueError, match="min_samples"):
        dbscan_tracks(emb, 0.1, 0)
    bad = emb.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        dbscan_tracks(bad, 0.1)
    with pytest.raises(ValueError, match="shape"):
        dbscan_tracks(emb[:, 0], 0.1)
    with pytest.raises(ValueError, match="validation cloud"):
        choose_dbscan_eps([], [], [])
    with pytest.raises(ValueError, match=r"particle_ids\[0\]"):
        choose_dbscan_eps([emb], [pid[:-1]], [w])
    with pytest.raises(ValueError, match="eps_grid"):
        choose_dbscan_eps([emb], [pid], [w], eps_grid=[0.1, -1.0])
    with pytest.raises(ValueError, match="weight"):
        choose_dbscan_eps([emb], [np.zeros_like(pid)], [np.zeros_like(w)], eps_grid=[0.1])
    with pytest.raises(ValueError, match="collapsed"):
        default_eps_grid([np.zeros((5, 3))])
    with pytest.raises(ValueError, match="2 or more hits"):
        default_eps_grid([np.zeros((1, 3))])
    assert dbscan_tracks(np.zeros((0, 3)), 0.1).shape == (0,)


class _Oracle(nn.Module):
    """Embeds each hit at the first 3 input columns (where the test clouds put the answer)."""

    def __init__(self):
        super().__init__()
        self.unused = nn.Parameter(torch.zeros(1))

    def forward(self, x, coords):
        return x[:, :3]


def _cloud(seed: int, with_weight: bool = True) -> TrackingCloud:
    emb, pid, w = blobs(seed)
    n = pid.size
    rng = np.random.default_rng(seed)
    x = torch.zeros(n, 15)
    x[:, :3] = torch.from_numpy(emb).float()
    coords = torch.from_numpy(rng.uniform(0.1, 1, (n, 6))).float()
    inp = TrackingInputs(x=x, coords=coords, pos=coords[:, :2], particle_id=torch.from_numpy(pid),
                         pt=torch.full((n,), 2.0), reconstructable=torch.from_numpy(pid > 0),
                         layer=torch.zeros(n, dtype=torch.long))
    return TrackingCloud(inp, weight=torch.from_numpy(w) if with_weight else None)


def test_evaluate_report_end_to_end():
    task = TrackingTask()
    val, test = [_cloud(0), _cloud(1)], [_cloud(2), _cloud(3, with_weight=False)]
    rep = task.evaluate_report(_Oracle(), val, test)
    assert rep["trackml_score"] == pytest.approx(1.0)
    assert rep["val_trackml_score"] == pytest.approx(1.0)
    assert rep["ap@k"] == pytest.approx(1.0)
    assert 0.05 < rep["dbscan_eps"] < 0.9
    assert set(task.evaluate(_Oracle(), test)) <= set(rep)
    # the radius comes from the validation clouds: a val set whose blobs are 10x wider picks a larger one
    wide = []
    for c in val:
        c2 = TrackingCloud(TrackingInputs(**{**c.inputs.__dict__, "x": c.inputs.x * 10}), weight=c.weight)
        wide.append(c2)
    rep_wide = task.evaluate_report(_Oracle(), wide, test)
    assert rep_wide["dbscan_eps"] > 2 * rep["dbscan_eps"]
    with pytest.raises(ValueError, match="val_clouds"):
        task.evaluate_report(_Oracle(), [], test)
    with pytest.raises(ValueError, match="test_clouds"):
        task.evaluate_report(_Oracle(), val, [])


def test_cloud_truth_weights_fallback_and_prepared_clouds_carry_weights():
    from pointformers.data.tracking import generate_event, preset_params
    from pointformers.tasks.tracking.training import prepare_tracking_clouds

    c = _cloud(4, with_weight=False)
    w = cloud_truth_weights(c)
    assert w.shape == (c.num_hits,) and w.sum() == pytest.approx(1.0)
    assert (w[c.inputs.particle_id.numpy() == 0] == 0).all()
    ev = generate_event(preset_params("tiny"), seed=1)
    (cloud,) = prepare_tracking_clouds([ev], with_pairs=False)
    np.testing.assert_allclose(cloud_truth_weights(cloud), ev.weight.astype(np.float64))
    with pytest.raises(ValueError, match="dbscan_min_samples"):
        TrackingTask(dbscan_min_samples=0)
