"""The TrackML score on hand-made events, against a slow reference, and its input checks."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pointformers.tasks.tracking.trackml_score import trackml_like_weights, trackml_score, trackml_score_split


def reference_score(track_id, particle_id, weight) -> float:
    """Literal double-majority rule, one track at a time (unassigned hits are singletons)."""
    track_id, particle_id = list(track_id), list(particle_id)
    weight = np.asarray(weight, dtype=float)
    next_id = max(track_id + [0]) + 1
    for i, t in enumerate(track_id):
        if t < 0:
            track_id[i], next_id = next_id, next_id + 1
    total = 0.0
    for t in set(track_id):
        hits = [i for i in range(len(track_id)) if track_id[i] == t]
        counts: dict[int, int] = {}
        for i in hits:
            counts[particle_id[i]] = counts.get(particle_id[i], 0) + 1
        best = max(counts.values())
        maj = min(p for p, c in counts.items() if c == best)  # ties: lowest particle id
        n_maj = counts[maj]
        n_particle = particle_id.count(maj)
        if n_maj / len(hits) > 0.5 and n_maj / n_particle > 0.5:
            total += sum(weight[i] for i in hits if particle_id[i] == maj)
    return total / weight.sum()


def _event(rng, n_particles=40, noise=30):
    sizes = rng.integers(1, 12, n_particles)
    pid = np.concatenate([np.full(s, p + 1) for p, s in enumerate(sizes)] + [np.zeros(noise, int)])
    pt = rng.uniform(0.1, 3.0, n_particles + 1)[pid]
    order = rng.uniform(0, 1, pid.size)
    w = trackml_like_weights(pid, pt, order)
    perm = rng.permutation(pid.size)
    return pid[perm], w[perm]


def test_hand_computed_partial_case():
    # particle 1: hits 0-3 (0.1 each); particle 2: hits 4-7 (0.15 each); noise: hits 8-9.
    pid = np.array([1, 1, 1, 1, 2, 2, 2, 2, 0, 0])
    w = np.array([0.1] * 4 + [0.15] * 4 + [0.0, 0.0])
    # track 10 = three hits of 1 + one of 2  -> 3/4 pure, 3/4 of particle 1  -> counts 0.3
    # track 11 = two hits of 2, two noise, one of 1 -> 2/5 pure            -> 0
    # hit 7 (particle 2) unassigned                                         -> 0
    tid = np.array([10, 10, 10, 11, 10, 11, 11, -1, 11, 11])
    assert trackml_score(tid, pid, w) == pytest.approx(0.3)
    # Exactly half of a particle's hits is not enough (strict > 1/2), even for a pure track.
    tid = np.array([0, 0, 0, 0, 1, 1, 2, 2, -1, -1])
    assert trackml_score(tid, pid, w) == pytest.approx(0.4)
    # Exactly half of the track is not enough either: 2 of particle 1 + 2 of particle 2 in 4 hits
    # (and the other halves are pure but hold only half of their particle).
    tid = np.array([0, 0, 1, 1, 0, 0, 2, 2, 3, 3])
    assert trackml_score(tid, pid, w) == pytest.approx(0.0)
    # A track holding all of particle 2 plus 3 noise-free foreign hits: 4/7 pure -> counts 0.6.
    tid = np.array([5, 5, 5, 6, 5, 5, 5, 5, 7, 8])
    assert trackml_score(tid, pid, w) == pytest.approx(0.6)


def test_perfect_noise_only_and_random():
    rng = np.random.default_rng(0)
    pid, w = _event(rng)
    assert w.sum() == pytest.approx(1.0)
    perfect = np.where(pid > 0, pid * 7 + 3, -1)  # any relabelling of particles; noise unassigned
    assert trackml_score(perfect, pid, w) == pytest.approx(1.0)
    # noise collected in one big track changes nothing (it is its own majority)
    assert trackml_score(np.where(pid > 0, pid, 0), pid, w) == pytest.approx(1.0)
    assert trackml_score(np.full(pid.size, -1), pid, w) == 0.0  # nothing assigned
    assert trackml_score(np.zeros(pid.size, int), pid, w) == 0.0  # everything in one track
    rand = [trackml_score(np.random.default_rng(s).integers(0, 60, pid.size), pid, w) for s in range(5)]
    assert max(rand) < 0.05


def test_matches_reference_and_is_invariant():
    rng = np.random.default_rng(1)
    for trial in range(20):
        pid, w = _event(rng, n_particles=int(rng.integers(1, 15)), noise=int(rng.integers(0, 6)))
        # corrupt a perfect assignment: random moves and random unassignments
        tid = pid.copy()
        move = rng.random(pid.size) < 0.3
        tid[move] = rng.integers(-1, 8, move.sum())
        w = w + rng.random(pid.size) * (trial % 2)  # also arbitrary positive weights
        s = trackml_score(tid, pid, w)
        assert s == pytest.approx(reference_score(tid, pid, w), abs=1e-12)
        perm = rng.permutation(pid.size)  # hit order does not matter
        assert trackml_score(tid[perm], pid[perm], w[perm]) == pytest.approx(s, abs=1e-12)
        relabel = np.where(tid >= 0, 1000 - 3 * tid, tid)  # track ids are names only
        assert trackml_score(relabel, pid, w) == pytest.approx(s, abs=1e-12)
        assert trackml_score(torch.from_numpy(tid), torch.from_numpy(pid), torch.from_numpy(w)) == pytest.approx(s)


def test_undefined_and_bad_inputs():
    assert np.isnan(trackml_score([0, 1], [0, 0], [0.0, 0.0]))  # noise-only cloud: nothing to score
    assert np.isnan(trackml_score([], [], []))
    assert trackml_score_split([0.5, float("nan"), 1.0]) == pytest.approx(0.75)
    assert np.isnan(trackml_score_split([float("nan")]))
    with pytest.raises(ValueError, match="particle_id"):
        trackml_score([0, 1, 2], [1, 1], [0.5, 0.5])
    with pytest.raises(ValueError, match="weight"):
        trackml_score([0, 1], [1, 1], [0.5, float("nan")])
    with pytest.raises(ValueError, match="weight"):
        trackml_score([0, 1], [1, 1], [0.5, -0.1])
    with pytest.raises(ValueError, match="track_id"):
        trackml_score([0.5, 1.0], [1, 1], [0.5, 0.5])
    with pytest.raises(ValueError, match="track_id"):
        trackml_score(np.zeros((2, 2)), [1, 1], [0.5, 0.5])
    with pytest.raises(ValueError, match="particle_id"):
        trackml_score([0, 1], ["a", "b"], [0.5, 0.5])


def test_trackml_like_weights_hand_computed():
    """The challenge's weights: the order profile (10, 8, 6, 5, 3, 3, 3, 5, 6) stretched over a
    particle's n hits (knots at k·(n − 1)/8) and normalised per particle; w_pT through (0.05, 0.2),
    (0.5, 0.2), (3, 1)."""
    # particle 4: five hits: knots at 0, 0.5, ..., 4 give profile values 10, 6, 3, 3, 6 at the
    # ranks 0..4; pT 0.75 (w_pT = 0.2 + 0.8·0.25/2.5 = 0.28, common to all its hits);
    # particle 9: three hits (< 4: weight 0); noise: weight 0.
    pid = np.array([4, 9, 4, 0, 4, 9, 4, 4, 9])
    pt = np.array([0.75, 5.0, 0.75, 0.0, 0.75, 5.0, 0.75, 0.75, 5.0])
    order = np.array([3.0, 1, 1.0, 9, 5.0, 2, 2.0, 4.0, 3])
    w = trackml_like_weights(pid, pt, order)
    raw = np.array([3, 0, 10, 0, 6, 0, 6, 3, 0.0])  # ranks 2, ., 0, ., 4, ., 1, 3, .
    np.testing.assert_allclose(w, raw / raw.sum())
    # w_pT: 0.68 at 2 GeV, 0.2 at 0.1 GeV (same order weights)
    w2 = trackml_like_weights([1] * 4 + [2] * 4, [2.0] * 4 + [0.1] * 4, np.tile(np.arange(4.0), 2))
    np.testing.assert_allclose(w2[:4] / w2[4:], 3.4)
    # four hits: profile at 0, 1, 2, 3 with knots k·3/8: 10, 6 − (1 − 0.75)/0.375, 3, 6
    w4 = trackml_like_weights([1] * 4, [3.0] * 4, [0.0, 1.0, 2.0, 3.0])
    prof = np.array([10.0, 6 - 0.25 / 0.375, 3.0, 6.0])
    np.testing.assert_allclose(w4, prof / prof.sum())
    # tied order keys share their average rank, truncated (ranks 0, 1.5 -> 1, 1.5 -> 1, 3)
    wt = trackml_like_weights([1] * 4, [3.0] * 4, [0.0, 1.0, 1.0, 3.0])
    np.testing.assert_allclose(wt, prof[[0, 1, 1, 3]] / prof[[0, 1, 1, 3]].sum())
    assert trackml_like_weights([0, 0], [0.0, 0.0], [0.0, 1.0]).sum() == 0.0
    with pytest.raises(ValueError, match="pt"):
        trackml_like_weights([1, 1], [1.0], [0.0, 1.0])


def test_generated_weights_score_one_for_truth_assignment():
    from pointformers.data.tracking import generate_event, preset_params

    ev = generate_event(preset_params("tiny"), seed=3)
    pid = np.asarray(ev.particle_id)
    assert trackml_score(np.where(pid > 0, pid, -1), pid, ev.weight) == pytest.approx(1.0)
    # the weights follow TrackML's zero-weight rules
    _, inv, cnt = np.unique(pid, return_inverse=True, return_counts=True)
    assert (ev.weight[(pid == 0) | (cnt[inv] < 4)] == 0).all()


def test_reader_reports_missing_truth_columns(tmp_path):
    from pointformers.data.tracking import generate_event, preset_params
    from pointformers.data.trackml import read_trackml_event, write_trackml_event

    ev = generate_event(preset_params("tiny"), seed=0)
    write_trackml_event(ev, tmp_path, "event000000001")
    truth = tmp_path / "event000000001-truth.csv"
    lines = truth.read_text().splitlines()
    header = lines[0].split(",")
    drop = header.index("weight")
    truth.write_text("\n".join(",".join(f for j, f in enumerate(line.split(",")) if j != drop) for line in lines) + "\n")
    with pytest.raises(ValueError, match=r"truth\.csv.*missing column.*weight"):
        read_trackml_event(tmp_path / "event000000001")
    truth.unlink()
    with pytest.raises(ValueError, match="truth"):
        read_trackml_event(tmp_path / "event000000001")
