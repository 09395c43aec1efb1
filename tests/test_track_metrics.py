"""Track-matching metrics (efficiency, fake and duplicate rates) on hand-made clusterings whose
numbers are known by construction, plus a brute-force cross-check on random clusterings."""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch

from pointformers.tasks.tracking.metrics import (
    TrackMetricsAccumulator,
    format_track_metrics,
    match_rates,
    match_tracks,
    particle_eta,
    track_match_counts,
    track_matching_metrics,
)


def event(sizes, noise=0, pt=None, eta=None, rec=None):
    """Hits of particles 1..P with ``sizes[p-1]`` hits each, then ``noise`` noise hits; per-hit
    pt/eta/reconstructable from per-particle lists (defaults: 2 GeV, η 0.5, reconstructable)."""
    P = len(sizes)
    pid = np.concatenate([np.full(s, p + 1) for p, s in enumerate(sizes)] + [np.zeros(noise, int)]).astype(np.int64)
    def per_hit(vals, default, dtype):
        vals = [default] * P if vals is None else vals
        return np.concatenate([np.full(s, v, dtype) for s, v in zip(sizes, vals)] + [np.zeros(noise, dtype)])
    return pid, per_hit(pt, 2.0, np.float64), per_hit(eta, 0.5, np.float64), per_hit(rec, True, bool)


def metrics(labels, pid, pt, eta, rec, **kw):
    return track_matching_metrics(labels, pid, pt, eta, rec, **kw)


def test_perfect_clustering_is_efficient_without_fakes_or_duplicates():
    pid, pt, eta, rec = event([5, 4, 3, 7], noise=6)
    labels = np.where(pid > 0, pid * 10, -1)  # any label values; noise unassigned
    m = metrics(labels, pid, pt, eta, rec)
    assert m["particles"] == 4 and m["tracks"] == 4
    for k in ("dm", "perfect", "lhc"):
        assert m[f"eff_{k}"] == 1.0 and m[f"fake_{k}"] == 0.0 and m[f"dup_{k}"] == 0.0
    # noise gathered into its own track changes nothing: it has no majority particle
    m2 = metrics(np.where(pid > 0, pid, 99), pid, pt, eta, rec)
    assert m2 == m


def test_particle_split_in_two_halves():
    pid, pt, eta, rec = event([8])
    halves = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    m = metrics(halves, pid, pt, eta, rec)
    # each half holds exactly 50 % of the particle: not > 50 %, so no double-majority match
    assert m["tracks"] == 2 and m["eff_dm"] == 0.0 and m["fake_dm"] == 1.0 and math.isnan(m["dup_dm"])
    assert m["eff_perfect"] == 0.0
    # both halves are pure: two LHC matches of one particle = one duplicate
    assert m["eff_lhc"] == 1.0 and m["fake_lhc"] == 0.0 and m["dup_lhc"] == 1.0
    # 5 + 3: the larger part is a double-majority match, the smaller a fake for DM
    m = metrics(np.array([0, 0, 0, 0, 0, 1, 1, 1]), pid, pt, eta, rec)
    assert m["eff_dm"] == 1.0 and m["fake_dm"] == 0.5 and m["dup_dm"] == 0.0 and m["eff_perfect"] == 0.0


def test_merged_track():
    pid, pt, eta, rec = event([6, 4])
    m = metrics(np.zeros(10, int), pid, pt, eta, rec)
    # one track, majority particle 1 (purity 0.6, all of its hits): DM match, not perfect, not LHC
    assert m["tracks"] == 1 and m["particles"] == 2
    assert m["eff_dm"] == 0.5 and m["fake_dm"] == 0.0
    assert m["eff_perfect"] == 0.0 and m["fake_perfect"] == 1.0
    assert m["eff_lhc"] == 0.0 and m["fake_lhc"] == 1.0
    mt = match_tracks(np.zeros(10, int), pid)
    assert mt.particle_ids[mt.majority[0]] == 1 and mt.majority_hits[0] == 6 and mt.purity[0] == 0.6


def test_noise_is_never_a_particle_but_dilutes_purity():
    pid, pt, eta, rec = event([9], noise=5)
    # the particle's 9 hits plus 1 noise hit: purity 0.9 -> DM and LHC, not perfect (> 0.99 needed)
    lab = np.array([0] * 9 + [0, -1, -1, 1, 1])
    m = metrics(lab, pid, pt, eta, rec)
    assert m["particles"] == 1
    assert m["tracks"] == 1  # the 2-hit noise track neither counts (< 3 hits) nor has a majority particle
    assert m["eff_dm"] == 1.0 and m["eff_lhc"] == 1.0 and m["eff_perfect"] == 0.0
    # a track of 3 noise hits has no majority particle: never a fake
    lab = np.array([0] * 9 + [1, 1, 1, -1, -1])
    assert metrics(lab, pid, pt, eta, rec)["tracks"] == 1
    # 2 noise + 1 hit of the particle: majority = the particle (noise is no particle), purity 1/3: a fake
    pid2, pt2, eta2, rec2 = event([9], noise=2)
    lab = np.array([0] * 8 + [1, 1, 1])
    m = metrics(lab, pid2, pt2, eta2, rec2)
    assert m["tracks"] == 2 and m["eff_dm"] == 1.0 and m["fake_dm"] == 0.5 and m["fake_lhc"] == 0.5
    # only noise: nothing to count
    m = metrics(np.zeros(4, int), np.zeros(4, int), np.zeros(4), np.zeros(4), np.zeros(4, bool))
    assert m["particles"] == 0 and m["tracks"] == 0 and math.isnan(m["eff_dm"]) and math.isnan(m["fake_dm"])


def test_tracks_need_three_hits():
    pid, pt, eta, rec = event([2, 3])
    lab = pid.copy()
    m = metrics(lab, pid, pt, eta, rec)
    assert m["tracks"] == 1 and m["eff_dm"] == 0.5 and m["fake_dm"] == 0.0
    m = metrics(lab, pid, pt, eta, rec, min_hits=2)
    assert m["tracks"] == 2 and m["eff_dm"] == 1.0


def test_cuts_select_particles_and_the_tracks_they_lead():
    # particles: 1 ok, 2 pT below the cut, 3 at |eta| = 4, 4 not reconstructable, 5 pT exactly 0.9
    pid, pt, eta, rec = event([4, 4, 4, 4, 4], pt=[2.0, 0.5, 2.0, 2.0, 0.9], eta=[0.1, 0.1, -4.0, 1.0, 3.9],
                              rec=[True, True, True, False, True])
    lab = np.where(pid == 5, -1, pid)  # particle 5 unreconstructed
    m = metrics(lab, pid, pt, eta, rec)
    assert m["particles"] == 2 and m["tracks"] == 1 and m["eff_dm"] == 0.5 and m["fake_dm"] == 0.0
    m = metrics(lab, pid, pt, eta, rec, pt_min=0.4, eta_max=4.5)
    assert m["particles"] == 4 and m["tracks"] == 3 and m["eff_dm"] == 0.75
    # a track led by a particle that fails the cuts is neither matched nor fake
    lab2 = lab.copy()
    lab2[pid == 2] = 1  # merge particle 2's hits into particle 1's track: 4 + 4 hits, tie -> particle 1
    assert match_tracks(lab2, pid).particle_ids[match_tracks(lab2, pid).majority[0]] == 1
    m = metrics(lab2, pid, pt, eta, rec)
    assert m["tracks"] == 1 and m["eff_dm"] == 0.0 and m["fake_dm"] == 1.0  # purity 0.5 is not > 0.5
    # sector ownership: an unowned particle is left out like one failing the cuts
    owned = pid != 1
    m = metrics(lab, pid, pt, eta, rec, owned=owned)
    assert m["particles"] == 1 and m["tracks"] == 0 and m["eff_dm"] == 0.0


def test_rates_from_counts_and_bad_input():
    c = {"particles": 10, "tracks": 8, "matched_tracks_dm": 6, "matched_particles_dm": 6,
         "matched_tracks_perfect": 4, "matched_particles_perfect": 4, "matched_tracks_lhc": 9,
         "matched_particles_lhc": 6}
    r = match_rates(c)
    assert r["eff_dm"] == 0.6 and r["fake_dm"] == pytest.approx(0.25) and r["dup_lhc"] == 0.5
    with pytest.raises(ValueError, match="counts"):
        match_rates({"particles": 1})
    pid, pt, eta, rec = event([4])
    with pytest.raises(ValueError, match="particle_id"):
        track_match_counts(np.zeros(4, int), pid[:3], pt, eta, rec)
    with pytest.raises(ValueError, match="labels"):
        track_match_counts(np.zeros((4, 1)), pid, pt, eta, rec)
    with pytest.raises(ValueError, match="labels"):
        track_match_counts(np.full(4, 0.5), pid, pt, eta, rec)
    with pytest.raises(ValueError, match="particle_id"):
        track_match_counts(np.zeros(4, int), -pid, pt, eta, rec)
    with pytest.raises(ValueError, match="pt"):
        track_match_counts(np.zeros(4, int), pid, pt[:2], eta, rec)
    with pytest.raises(ValueError, match="reconstructable"):
        track_match_counts(np.zeros(4, int), pid, pt, eta, np.full(4, 3))
    with pytest.raises(ValueError, match="min_hits"):
        track_match_counts(np.zeros(4, int), pid, pt, eta, rec, min_hits=0)
    with pytest.raises(ValueError, match="pt_min"):
        track_match_counts(np.zeros(4, int), pid, pt, eta, rec, pt_min=float("nan"))
    with pytest.raises(ValueError, match="eta_max"):
        track_match_counts(np.zeros(4, int), pid, pt, eta, rec, eta_max=0)
    with pytest.raises(ValueError, match="pt_edges"):
        TrackMetricsAccumulator(pt_edges=[1.0, 0.5])
    with pytest.raises(ValueError, match="eta_edges"):
        TrackMetricsAccumulator(eta_edges=[1.0])


def test_particle_eta():
    eta = particle_eta([1.0, 0.0, 3.0], [0.0, 2.0, 4.0], [0.0, 2.0 * math.sinh(1.5), -5.0 * math.sinh(0.7)])
    assert eta == pytest.approx([0.0, 1.5, -0.7])


def reference_counts(labels, pid, sel_particles, min_hits=3):
    """Brute force, straight from the definitions, with Python counters."""
    p_hits = Counter(int(p) for p in pid if p > 0)
    tracks = {}
    for lab, p in zip(labels, pid):
        if lab >= 0:
            tracks.setdefault(int(lab), []).append(int(p))
    out = {"particles": sum(1 for p in p_hits if p in sel_particles), "tracks": 0}
    matched = {k: [] for k in ("dm", "perfect", "lhc")}
    for hits in tracks.values():
        real = Counter(p for p in hits if p > 0)
        if len(hits) < min_hits or not real:
            continue
        top = max(real.values())
        maj = min(p for p, c in real.items() if c == top)
        if maj not in sel_particles:
            continue
        out["tracks"] += 1
        purity, share = top / len(hits), top / p_hits[maj]
        if purity > 0.5 and share > 0.5:
            matched["dm"].append(maj)
        if top == p_hits[maj] and purity > 0.99:
            matched["perfect"].append(maj)
        if purity > 0.75:
            matched["lhc"].append(maj)
    for k, m in matched.items():
        out[f"matched_tracks_{k}"] = len(m)
        out[f"matched_particles_{k}"] = len(set(m))
    return out


def test_agrees_with_brute_force_on_random_clusterings_and_pools_events():
    rng = np.random.default_rng(0)
    acc = TrackMetricsAccumulator(pt_edges=(0.0, 1.0, 2.0, math.inf), eta_edges=(-4.0, 0.0, 4.0))
    total, below = Counter(), Counter()
    for ev in range(6):
        P = 30
        sizes = rng.integers(1, 12, P)
        pt_p = rng.choice([0.3, 0.9, 1.5, 5.0], P)
        eta_p = rng.uniform(-4.5, 4.5, P)
        rec_p = rng.random(P) < 0.8
        pid, pt, eta, rec = event(list(sizes), noise=20, pt=list(pt_p), eta=list(eta_p), rec=list(rec_p))
        # a noisy clustering: mostly the particle, with random merges, splits and unassigned hits
        lab = pid.copy()
        for p in np.flatnonzero(sizes >= 8)[::2] + 1:  # split some long tracks in two
            lab[np.flatnonzero(pid == p)[::2]] = 100 + p
        flip = rng.random(lab.size) < 0.2
        lab[flip] = rng.integers(-1, 40, int(flip.sum()))
        sel = {p + 1 for p in range(P) if rec_p[p] and pt_p[p] >= 0.9 and abs(eta_p[p]) < 4}
        ref = reference_counts(lab, pid, sel)
        # tensors are accepted too
        assert track_match_counts(torch.as_tensor(lab), torch.as_tensor(pid), pt, eta, rec) == ref
        own = acc.add(lab, pid, pt, eta, rec)
        assert {k: int(v) for k, v in own.items() if k in ref} == ref
        total.update(ref)
        lo = reference_counts(lab, pid, {p for p in sel if pt_p[p - 1] == 0.9})
        for k in lo:
            below[k] += lo[k]
    res = acc.result()
    assert {k: res["overall"][k] for k in total} == dict(total)
    assert res["overall"]["eff_dm"] == total["matched_particles_dm"] / total["particles"]
    assert res["cuts"]["events"] == 6
    # η bins cover (-4, 4) with every cut: they split the overall counts exactly
    for k in total:
        assert sum(r[k] for r in res["vs_eta"]) == res["overall"][k]
    # pT bins replace the pT cut (pT takes the values 0.3, 0.9, 1.5 and 5): [1, 2) and [2, inf)
    # hold the 1.5 and 5 GeV particles of the overall row, [0, 1) the 0.9 GeV ones and the 0.3 GeV ones
    assert [r["bin"] for r in res["vs_pt"]] == ["[0, 1)", "[1, 2)", "[2, inf)"]
    assert res["vs_pt"][-1]["hi"] is None
    for k in total:
        assert res["vs_pt"][1][k] + res["vs_pt"][2][k] + below[k] == total[k]
    assert res["vs_pt"][0]["particles"] > below["particles"] > 0
    assert total["matched_tracks_dm"] > 0 and total["matched_tracks_lhc"] > total["matched_particles_lhc"]
    assert total["tracks"] > total["matched_tracks_dm"]
    assert sum(r["particles"] for r in res["vs_pt"]) > res["overall"]["particles"]  # the 0.3 GeV ones too
    assert set(acc.overall_metrics()) == {"eff_dm", "eff_perfect", "eff_lhc", "fake_dm", "dup_lhc"}
    text = format_track_metrics(res)
    lines = text.splitlines()
    assert any(line.startswith("overall") for line in lines)
    assert sum(line.startswith("pT [") for line in lines) == 3 and sum(line.startswith("eta [") for line in lines) == 2
    assert f"{res['overall']['eff_dm']:.4f}" in next(line for line in lines if line.startswith("overall"))
    assert "tracks = DBSCAN clusters of >= 3 hits" in lines[0]
    other = TrackMetricsAccumulator(tracks="the model's tracks").result()
    assert "tracks = the model's tracks of >= 3 hits" in format_track_metrics(other).splitlines()[0]
    with pytest.raises(ValueError, match="result"):
        format_track_metrics({"overall": {}})


# ------------------------------------------------------------------------------ the tracking task's report
class _Oracle(torch.nn.Module):
    """Embeds each hit at input columns 0..2, where the test clouds put the answer."""

    def __init__(self):
        super().__init__()
        self.unused = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x, coords):
        return x[:, :3]


def _cloud(seed: int, merge: bool = False, **extra):
    """Particles with 4..9 hits embedded as tight, well separated blobs (``merge``: particles 1
    and 2 share a blob) plus isolated noise hits; particle k has pT 0.5·k GeV and η 0.2·k − 2."""
    from pointformers.tasks.tracking import TrackingInputs
    from pointformers.tasks.tracking.training import TrackingCloud

    rng = np.random.default_rng(seed)
    sizes = rng.integers(4, 10, 12)
    pid = np.concatenate([np.full(s, p + 1) for p, s in enumerate(sizes)] + [np.zeros(6, int)])
    centre = np.where(pid > 0, pid, 0).astype(float)
    if merge:
        centre[pid == 2] = 1.0
    emb = np.stack([centre * 5.0, np.zeros_like(centre), np.zeros_like(centre)], 1) + rng.normal(0, 0.01, (pid.size, 3))
    emb[pid == 0] = rng.uniform(100, 200, (int((pid == 0).sum()), 3))  # noise far from every blob and each other
    n = pid.size
    x = torch.zeros(n, 15)
    x[:, :3] = torch.from_numpy(emb).float()
    coords = torch.zeros(n, 6)
    coords[:, 0] = torch.from_numpy(np.where(pid > 0, 0.2 * pid - 2, 0.0)).float()  # hit η = particle η
    inp = TrackingInputs(x=x, coords=coords, pos=coords[:, :2], particle_id=torch.from_numpy(pid),
                         pt=torch.from_numpy(0.5 * pid).float(), reconstructable=torch.from_numpy(pid > 0),
                         layer=torch.zeros(n, dtype=torch.long))
    w = np.where(pid > 0, 1.0, 0.0)
    return TrackingCloud(inp, weight=torch.from_numpy(w / w.sum()), **extra), sizes


def test_evaluate_report_adds_the_matching_metrics():
    from pointformers.tasks.tracking.training import TrackingTask, cloud_particle_eta

    task = TrackingTask()
    assert task.track_report is None
    val = [_cloud(0)[0], _cloud(1)[0]]
    test = [_cloud(2)[0], _cloud(3, merge=True)[0]]
    # particles with pT >= 0.9 GeV: ids 2..12, 11 per cloud; in the merged cloud particles 1 (0.5
    # GeV, not selected) and 2 share a track: its majority is whichever has more hits
    _, sizes3 = _cloud(3, merge=True)
    rep = task.evaluate_report(_Oracle(), val, test)
    tr = task.track_report
    assert tr["overall"]["particles"] == 22
    p2_wins = sizes3[1] > sizes3[0]  # particle 2 more hits: a DM match of 2 (all its hits); else 1 leads
    assert tr["overall"]["matched_particles_dm"] == (22 if p2_wins else 21)
    assert rep["eff_dm"] == pytest.approx(tr["overall"]["matched_particles_dm"] / 22)
    assert rep["fake_dm"] == 0.0 and rep["eff_perfect"] == pytest.approx(21 / 22)
    assert set(rep) >= {"eff_dm", "eff_perfect", "eff_lhc", "fake_dm", "dup_lhc", "trackml_score", "ap@k"}
    assert all(isinstance(v, float) for v in rep.values())
    # η of the hand-made clouds: the fallback (mean hit η per particle) is the particle's η
    eta = cloud_particle_eta(test[0])
    pid = test[0].inputs.particle_id.numpy()
    assert eta == pytest.approx(np.where(pid > 0, 0.2 * pid - 2, 0.0))
    # η table: particle k sits at η 0.2k - 2, so η bin [-2, -1) holds ids 2..4 (id 5: η = -1.0)
    row = next(r for r in tr["vs_eta"] if r["bin"] == "[-2, -1)")
    assert row["particles"] == 2 * 3
    # an explicit particle_eta wins over the fallback; sector ownership removes particles
    c, _ = _cloud(2, particle_eta=torch.full((test[0].num_hits,), 9.0))
    task.evaluate_report(_Oracle(), val, [c])
    assert task.track_report["overall"]["particles"] == 0  # |η| = 9: outside the cut
    own = torch.from_numpy(test[0].inputs.particle_id.numpy() > 6)
    c, _ = _cloud(2, sector_own=own)
    task.evaluate_report(_Oracle(), val, [c])
    assert task.track_report["overall"]["particles"] == 6 and task.track_report["overall"]["eff_dm"] == 1.0
    # the cuts are the task's options
    loose = TrackingTask(match_pt_min=0.0)
    loose.evaluate_report(_Oracle(), val, [test[0]])
    assert loose.track_report["overall"]["particles"] == 12 and loose.track_report["cuts"]["pt_min"] == 0.0
    with pytest.raises(ValueError, match="match_eta_max"):
        TrackingTask(match_eta_max=-1.0)
    from pointformers.tasks.registry import get_task

    spec = get_task("tracking")
    cfg = {"data": dict(spec.data_defaults), "task": {**spec.task_defaults, "match_pt_min": -1.0}}
    with pytest.raises(ValueError, match="task.match_pt_min"):
        spec.validate(cfg)
    cfg["task"].update(match_pt_min=1.5, match_eta_max=2.5)
    spec.validate(cfg)
    built = spec.build(cfg)
    assert (built.match_pt_min, built.match_eta_max) == (1.5, 2.5)


def test_prepared_clouds_carry_particle_eta_and_ownership():
    from pointformers.data.tracking import generate_event, preset_params, split_sectors
    from pointformers.tasks.tracking.training import cloud_particle_eta, prepare_tracking_clouds

    ev = generate_event(preset_params("tiny"), seed=3)
    (c,) = prepare_tracking_clouds([ev], with_pairs=False)
    want = ev.per_hit(particle_eta(ev.px, ev.py, ev.pz), 0.0)
    assert c.sector_own is None
    assert cloud_particle_eta(c) == pytest.approx(np.nan_to_num(want, nan=0.0))
    sectors = split_sectors(ev, 2)
    clouds = prepare_tracking_clouds(sectors, with_pairs=False)
    assert all(cl.sector_own is not None for cl in clouds)
    assert [cl.sector_own.numpy().tolist() for cl in clouds] == [s.sector_own.tolist() for s in sectors]


# ------------------------------------------------------------------------------ figures
PNG = b"\x89PNG\r\n\x1a\n"


def test_track_colors_share_a_colour_between_a_particle_and_its_track():
    from pointformers.tasks.tracking.display import track_colors

    pid, _, _, _ = event([5, 4, 6, 3], noise=3)
    lab = pid.copy() - 1
    lab[pid == 0] = -1
    lab[pid == 3] = 7  # particle 3 found too
    lab[np.flatnonzero(pid == 4)[:2]] = 8  # particle 4 cut into 1 + 2: clusters of < 3 hits
    lab[np.flatnonzero(pid == 4)[2:]] = 9
    lab[pid == 2] = 0  # particles 1 and 2 merged: 5 + 4 hits, DM match of particle 1
    by_particle, by_track = track_colors(lab, pid)
    grey = by_particle[pid == 0][0]
    for p in (1, 3):  # matched: the track's hits have the particle's colour
        assert (by_track[pid == p] == by_particle[pid == p][0]).all()
    assert (by_track[pid == 2] == by_particle[pid == 1][0]).all()  # particle 2's hits ride particle 1's track
    assert not (by_particle[pid == 2][0] == by_particle[pid == 1][0]).all()  # distinct particle colours
    assert (by_track[pid == 4] == grey).all() and (by_track[pid == 0] == grey).all()
    # a track matched to no particle is black
    lab2 = np.where(pid > 0, 0, -1)  # one track of all 18 particle hits: purity 6/18, no match
    _, bt = track_colors(lab2, pid)
    assert (bt[pid > 0] == np.array([0, 0, 0, 1.0])).all()
    with pytest.raises(ValueError, match="particle_id"):
        track_colors(lab, pid[:-1])


def test_track_display_and_hept_buckets_pngs(tmp_path):
    from pointformers import models
    from pointformers.data.tracking import generate_event, preset_params
    from pointformers.tasks.tracking import tracking_inputs
    from pointformers.tasks.tracking.display import draw_hept_buckets, draw_track_display, hept_query_blocks

    ev = generate_event(preset_params("tiny"), seed=4)
    inp = tracking_inputs(ev)
    lab = np.where(ev.particle_id > 0, ev.particle_id, -1)
    p = draw_track_display(tmp_path / "d" / "event.png", ev.x, ev.y, ev.z, lab, ev.particle_id, title="t", note="n")
    assert p.read_bytes()[:8] == PNG and sorted(x.name for x in p.parent.iterdir()) == ["event.png"]
    with pytest.raises(ValueError, match="x, y, z"):
        draw_track_display(tmp_path / "bad.png", ev.x[:-1], ev.y, ev.z, lab, ev.particle_id)
    assert not (tmp_path / "bad.png").exists()

    torch.manual_seed(0)
    model = models.build("hept-tracking", n_layers=2, mlp_hidden=32, block_size=32, num_regions=4).eval()
    with torch.no_grad():
        before = model(inp.x, inp.coords)
    blocks = hept_query_blocks(model, inp.x, inp.coords)
    with torch.no_grad():
        assert torch.equal(model(inp.x, inp.coords), before)  # recording changes nothing, and is undone
    att = [m for m in model.modules() if type(m).__name__ == "HEPTAttention"][0]
    assert "sort_orders" not in vars(att)
    # the all-heads-at-once path (the default off the CPU) records the same order
    for m in model.modules():
        if type(m).__name__ == "HEPTAttention":
            m.all_heads = True
    assert np.array_equal(hept_query_blocks(model, inp.x, inp.coords), blocks)
    for m in model.modules():
        if type(m).__name__ == "HEPTAttention":
            m.all_heads = False
    assert np.array_equal(hept_query_blocks(model, inp.x, inp.coords), blocks)
    n = inp.num_hits
    counts = np.bincount(blocks)
    assert blocks.shape == (n,) and counts.max() <= 32 and counts.sum() == n and (counts[:-2] == 32).all()
    # a block is a neighbourhood of the layer's hash: far tighter in (η, φ) than a random set of hits
    eta = inp.coords[:, 0].numpy()
    spread = np.mean([eta[blocks == b].std() for b in range(counts.size) if counts[b] > 5])
    shuffled = np.random.default_rng(0).permutation(blocks)
    random_spread = np.mean([eta[shuffled == b].std() for b in range(counts.size) if counts[b] > 5])
    assert spread < 0.5 * random_spread
    other = hept_query_blocks(model, inp.x, inp.coords, layer=1, head=1, table=2)
    assert not np.array_equal(other, blocks)
    for kw, name in (({"layer": 2}, "layer"), ({"head": 8}, "head"), ({"table": -1}, "table")):
        with pytest.raises(ValueError, match=name):
            hept_query_blocks(model, inp.x, inp.coords, **kw)
    with pytest.raises(ValueError, match="model"):
        hept_query_blocks(_Oracle(), inp.x, inp.coords)
    p = draw_hept_buckets(tmp_path / "b.png", inp.coords[:, 0], inp.coords[:, 1], blocks, inp.particle_id)
    assert p.read_bytes()[:8] == PNG
    with pytest.raises(ValueError, match="blocks"):
        draw_hept_buckets(tmp_path / "b2.png", inp.coords[:, 0], inp.coords[:, 1], -np.ones(n, int), inp.particle_id)


def test_pileup_curves_png_and_plot_hook(tmp_path):
    from pointformers.data.pileup import generate_events
    from pointformers.tasks.pileup import PILEUP_TASK, draw_pileup_curves, prepare_pileup_samples

    rng = np.random.default_rng(0)
    labels = [rng.random(50) < 0.3 for _ in range(3)]
    good = [y + rng.normal(0, 0.3, y.size) for y in labels]
    p = draw_pileup_curves(tmp_path / "c.png", {"good": (good, labels), "random": ([rng.random(50) for _ in labels],
                                                                                    labels)})
    assert p.read_bytes()[:8] == PNG
    with pytest.raises(ValueError, match="curves"):
        draw_pileup_curves(tmp_path / "e.png", {})
    assert PILEUP_TASK.plot is not None
    samples = prepare_pileup_samples(generate_events("pileup-tiny", 2, seed=0))
    torch.manual_seed(0)
    from pointformers import models

    model = models.build("pileup-encoder", attention="hept", n_layers=1, heads=2, head_dim=8, dim=16, mlp_hidden=32,
                         mlp_layers=3, dropout=0.0, num_regions=2, block_size=50)
    cfg = {"data": dict(PILEUP_TASK.data_defaults), "task": dict(PILEUP_TASK.task_defaults),
           "model": {"name": "pileup-encoder"}}
    (png,) = PILEUP_TASK.plot(cfg, model, samples, tmp_path / "run")
    assert png.name == "pileup_curves.png" and png.read_bytes()[:8] == PNG


def test_evaluate_split_test_prints_and_writes_the_matching_table(tmp_path, monkeypatch, capsys):
    import json

    from pointformers.cli import main

    monkeypatch.setenv("POINTFORMERS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CI", "1")
    run = tmp_path / "run"
    assert main(["train", "--set", "data.preset=tiny", "--set", "train.epochs=1", "--set", "model.options.n_layers=1",
                 "--set", "model.options.mlp_hidden=32", "--set", "model.options.block_size=32",
                 "--set", "model.options.num_regions=4", "--out", str(run)]) == 0
    capsys.readouterr()
    js = tmp_path / "e.json"
    assert main(["evaluate", "--checkpoint", str(run / "best.pt"), "--split", "test", "--json", str(js)]) == 0
    lines = capsys.readouterr().out.splitlines()
    res = json.loads(js.read_text())
    tm = res["track_metrics"]
    assert set(tm) == {"cuts", "overall", "vs_pt", "vs_eta"} and tm["cuts"]["pt_min"] == 0.9
    row = res["rows"][next(iter(res["rows"]))]
    for k in ("eff_dm", "eff_perfect", "eff_lhc", "fake_dm", "dup_lhc"):
        assert row[k] == tm["overall"][k] or (row[k] is None and tm["overall"][k] is None)
    o = tm["overall"]
    assert o["eff_dm"] == pytest.approx(o["matched_particles_dm"] / o["particles"])
    assert o["particles"] > 0 and o["tracks"] > 0
    assert sum(b["particles"] for b in tm["vs_eta"]) == o["particles"]
    overall = [line for line in lines if line.startswith("overall")]
    assert len(overall) == 1 and f"{o['eff_dm']:.4f}" in overall[0] and str(o["particles"]) in overall[0]
    assert sum(line.startswith("pT [") for line in lines) == len(tm["vs_pt"]) == 6
    assert sum(line.startswith("eta [") for line in lines) == len(tm["vs_eta"]) == 8
