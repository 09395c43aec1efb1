"""Farthest point sampling, kNN and ball query against slow obvious references."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pointformers.data.point_ops import ball_query, farthest_point_sample, fps_numpy, gather_points, knn_indices


def fps_reference(x: np.ndarray, k: int, start: int = 0) -> list[int]:
    """Textbook FPS: each step the point whose distance to the chosen set is largest."""
    chosen = [start]
    while len(chosen) < k:
        best, best_d = -1, -1.0
        for i in range(len(x)):
            d = min(float(((x[i] - x[j]) ** 2).sum()) for j in chosen)
            if d > best_d:
                best, best_d = i, d
        chosen.append(best)
    return chosen


def padded(clouds: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(len(c) for c in clouds)
    pos = torch.full((len(clouds), n, 3), 7.0, dtype=torch.float64)  # padding far away: must never be picked
    mask = torch.zeros(len(clouds), n, dtype=torch.bool)
    for i, c in enumerate(clouds):
        pos[i, : len(c)] = torch.from_numpy(c)
        mask[i, : len(c)] = True
    return pos, mask


def test_fps_matches_reference_and_padding_is_ignored() -> None:
    rng = np.random.default_rng(0)
    clouds = [rng.normal(size=(n, 3)) for n in (40, 25, 33)]
    pos, mask = padded(clouds)
    got = farthest_point_sample(pos, 12, mask)
    for b, c in enumerate(clouds):
        assert got[b].tolist() == fps_reference(c, 12)
        alone = farthest_point_sample(torch.from_numpy(c).unsqueeze(0), 12)
        assert alone[0].tolist() == got[b].tolist()
    assert bool(mask.gather(1, got).all())


def test_fps_each_pick_maximises_the_min_distance() -> None:
    rng = np.random.default_rng(1)
    x = rng.uniform(size=(200, 3))
    idx = farthest_point_sample(torch.from_numpy(x).float().unsqueeze(0), 30)[0].numpy()
    assert len(set(idx.tolist())) == 30
    for t in range(1, 30):
        dmin = ((x[:, None] - x[idx[:t]][None]) ** 2).sum(-1).min(1)
        assert dmin[idx[t]] == pytest.approx(dmin.max(), rel=1e-5)
    # The min pairwise distance of the FPS set is at least half the covering radius (2-approximation).
    cover = np.sqrt(((x[:, None] - x[idx][None]) ** 2).sum(-1).min(1).max())
    sep = np.sqrt(((x[idx][:, None] - x[idx][None]) ** 2).sum(-1) + np.eye(30) * 1e9).min()
    assert sep >= cover - 1e-6


def test_fps_random_start_is_seeded_and_real_and_small_clouds_repeat() -> None:
    rng = np.random.default_rng(2)
    pos, mask = padded([rng.normal(size=(30, 3)), rng.normal(size=(5, 3))])
    a = farthest_point_sample(pos, 8, mask, start="random", generator=torch.Generator().manual_seed(3))
    b = farthest_point_sample(pos, 8, mask, start="random", generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    assert bool(mask.gather(1, a).all())
    assert a[0, 1:].tolist() == fps_reference(pos[0].numpy(), 8, int(a[0, 0]))[1:]
    # The 5-point cloud: all 5 points first, then repeats of already chosen ones.
    assert sorted(a[1, :5].tolist()) == [0, 1, 2, 3, 4]
    assert set(a[1, 5:].tolist()) <= set(range(5))
    assert sorted(fps_numpy(pos[1, :5].numpy(), 10).tolist()) == [0, 1, 2, 3, 4]


def test_knn_matches_brute_force() -> None:
    rng = np.random.default_rng(4)
    clouds = [rng.normal(size=(n, 3)) for n in (30, 12)]
    pos, mask = padded(clouds)
    query = torch.from_numpy(rng.normal(size=(2, 6, 3)))
    idx = knn_indices(query, pos, 5, mask)
    for b, c in enumerate(clouds):
        for m in range(6):
            d = ((c - query[b, m].numpy()) ** 2).sum(1)
            assert idx[b, m].tolist() == np.argsort(d, kind="stable")[:5].tolist()
    g = gather_points(pos, idx)
    assert g.shape == (2, 6, 5, 3) and torch.equal(g[1, 2, 3], pos[1, idx[1, 2, 3]])
    # k larger than a cloud: missing slots repeat the nearest point.
    small, smask = padded([clouds[0][:3], clouds[0]])
    idx = knn_indices(small[:, :2], small, 5, smask)
    assert (idx[0, :, 3:] == idx[0, :, :1]).all() and bool(smask.gather(1, idx.flatten(1)).all())


def test_ball_query_first_points_in_radius() -> None:
    rng = np.random.default_rng(5)
    x = rng.uniform(size=(1, 50, 3))
    q = rng.uniform(size=(1, 7, 3))
    idx = ball_query(torch.from_numpy(q), torch.from_numpy(x), 0.3, 6)
    for m in range(7):
        inside = np.flatnonzero(((x[0] - q[0, m]) ** 2).sum(1) <= 0.09)
        want = inside[:6].tolist()
        if not want:
            want = [int(((x[0] - q[0, m]) ** 2).sum(1).argmin())]
        want = want + [want[0]] * (6 - len(want))
        assert idx[0, m].tolist() == want


def test_bad_inputs_raise_value_error() -> None:
    pos = torch.zeros(1, 4, 3)
    with pytest.raises(ValueError, match="pos"):
        farthest_point_sample(torch.zeros(4, 3), 2)
    with pytest.raises(ValueError, match="k"):
        farthest_point_sample(pos, 0)
    with pytest.raises(ValueError, match="mask"):
        farthest_point_sample(pos, 2, torch.ones(1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="NaN"):
        farthest_point_sample(torch.full((1, 4, 3), float("nan")), 2)
    with pytest.raises(ValueError, match="no real point"):
        farthest_point_sample(pos, 2, torch.zeros(1, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="radius"):
        ball_query(pos, pos, -1.0, 2)
