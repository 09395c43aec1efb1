"""Tests for pointformers.tasks.tracking on hand-made TrackingEvents and embeddings."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from pointformers.data.event import CLUSTER_FEATURES, TrackingEvent
from pointformers.tasks.tracking import core as T
from pointformers.tasks.tracking import (
    PIXEL_LAYERS,
    TRACKING_COORDS,
    TRACKING_FEATURES,
    TrackingPairs,
    add_random_pairs,
    ap_at_k,
    ap_at_k_split,
    build_tracking_pairs,
    cluster_tracks,
    infonce_loss,
    knn_eta_phi_embedding,
    radius_graph_capped,
    tracking_inputs,
    tracking_metrics_at_k,
)


# ----------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------


def make_event(x, y, z, vol, lay, pid, particles: dict[int, tuple[float, float, float]], cells=None) -> TrackingEvent:
    """A TrackingEvent from per-hit lists and {particle id: (px, py, pz)}."""
    n = len(x)
    pids = np.array(sorted(particles), dtype=np.int64)
    mom = np.array([particles[p] for p in pids], dtype=np.float64).reshape(-1, 3)
    if cells is None:
        cells = np.zeros((n, len(CLUSTER_FEATURES)), np.float32)
    pid = np.asarray(pid, dtype=np.int64)
    return TrackingEvent(
        hit_id=np.arange(1, n + 1, dtype=np.int64),
        x=np.asarray(x, np.float32), y=np.asarray(y, np.float32), z=np.asarray(z, np.float32),
        volume_id=np.asarray(vol, np.int64), layer_id=np.asarray(lay, np.int64),
        module_id=np.zeros(n, np.int64), cells=np.asarray(cells, np.float32), particle_id=pid,
        weight=np.where(pid > 0, 1.0, 0.0).astype(np.float32),
        particles_id=pids, vx=np.zeros(len(pids)), vy=np.zeros(len(pids)), vz=np.zeros(len(pids)),
        px=mom[:, 0], py=mom[:, 1], pz=mom[:, 2], q=np.ones(len(pids), np.int64),
        nhits=np.array([(pid == p).sum() for p in pids], np.int64),
    )


def event_from_eta_phi(eta, phi, layers, pid, particles) -> TrackingEvent:
    """Hits placed at given (η, φ) on radius 100 mm + 10·layer index (float64-exact enough)."""
    eta, phi = np.asarray(eta, float), np.asarray(phi, float)
    vol = [PIXEL_LAYERS[l][0] for l in layers]
    lay = [PIXEL_LAYERS[l][1] for l in layers]
    r = 100.0 + 10.0 * np.asarray(layers, float)
    return make_event(r * np.cos(phi), r * np.sin(phi), r * np.sinh(eta), vol, lay, pid, particles)


# ----------------------------------------------------------------------------------------
# inputs
# ----------------------------------------------------------------------------------------


def test_constants_and_layer_mapping():
    assert len(TRACKING_FEATURES) == 15 and len(TRACKING_COORDS) == 6
    assert TRACKING_FEATURES[-1] == "layer" and TRACKING_COORDS[:2] == ("eta", "phi_rad")
    assert len(PIXEL_LAYERS) == 18 and len(set(PIXEL_LAYERS)) == 18
    idx = T.pixel_layer_index(np.array([7, 7, 8, 8, 9, 9]), np.array([2, 14, 2, 8, 2, 14]))
    assert idx.tolist() == [0, 6, 7, 10, 11, 17]
    with pytest.raises(ValueError, match="volume_id"):
        T.pixel_layer_index(np.array([8, 12]), np.array([2, 2]))
    with pytest.raises(ValueError, match="volume_id"):
        T.pixel_layer_index(np.array([8]), np.array([3]))


def test_features_on_hand_made_hits():
    cells = np.arange(3 * 8, dtype=np.float32).reshape(3, 8) / 10
    ev = make_event(
        x=[3.0, -100.0, 0.0], y=[4.0, 0.0, 50.0], z=[10.0, -500.0, 1200.0],
        vol=[8, 7, 9], lay=[4, 14, 2], pid=[5, 5, 0],
        particles={5: (3.0, 4.0, 1.0)}, cells=cells,
    )
    inp = tracking_inputs(ev, dtype=torch.float64)
    assert inp.x.shape == (3, 15) and inp.coords.shape == (3, 6) and inp.pos.shape == (3, 2)
    # hit 0: r = 5 mm, φ = atan2(4, 3), η = asinh(10/5), u = 3/25 mm⁻¹ -> ·1000, v = 4/25 -> ·1000
    phi0 = math.atan2(4, 3)
    exp0 = [0.005, phi0 / math.pi, 0.010, math.asinh(2.0), 120.0, 160.0, *cells[0].tolist(), 0.8]
    np.testing.assert_allclose(inp.x[0].numpy(), exp0, rtol=1e-6, atol=1e-7)
    # hit 1: r = 100, φ = π, η = asinh(-5), u = -1/100·1000 = -10, v = 0, layer (7,14) -> 6
    exp1 = [0.1, 1.0, -0.5, math.asinh(-5.0), -10.0, 0.0, *cells[1].tolist(), 0.6]
    np.testing.assert_allclose(inp.x[1].numpy(), exp1, rtol=1e-6, atol=1e-7)
    # hit 2: r = 50, φ = π/2, η = asinh(24), u = 0, v = 20, layer (9,2) -> 11
    exp2 = [0.05, 0.5, 1.2, math.asinh(24.0), 0.0, 20.0, *cells[2].tolist(), 1.1]
    np.testing.assert_allclose(inp.x[2].numpy(), exp2, rtol=1e-6, atol=1e-6)
    # η from r, z equals the authors' −log tan(θ/2), θ = atan2(r, z)
    assert math.isclose(-math.log(math.tan(math.atan2(5, 10) / 2)), math.asinh(2.0), rel_tol=1e-12)
    # coords = [η, φ(rad), r/1000, φ/π, z/1000, eta_rz]; pos = (η, φ)
    np.testing.assert_allclose(inp.coords[0].numpy(), [math.asinh(2.0), phi0, 0.005, phi0 / math.pi, 0.01, math.asinh(2.0)], rtol=1e-6)
    np.testing.assert_allclose(inp.pos[:, 1].numpy(), [phi0, math.pi, math.pi / 2], rtol=1e-6)
    assert inp.layer.tolist() == [8, 6, 11]
    assert inp.particle_id.tolist() == [5, 5, 0] and inp.particle_id.dtype == torch.int64
    np.testing.assert_allclose(inp.pt.numpy(), [5.0, 5.0, 0.0])
    assert inp.reconstructable.tolist() == [False, False, False]  # only 2 layers
    assert tracking_inputs(ev).x.dtype == torch.float32


def test_inputs_bad_input():
    ev = make_event([0.0], [0.0], [1.0], [8], [2], [0], {})
    with pytest.raises(ValueError, match="beam axis"):
        tracking_inputs(ev)
    with pytest.raises(ValueError, match="event"):
        tracking_inputs("not an event")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------
# pairs
# ----------------------------------------------------------------------------------------


def _pair_event(seed=0):
    rng = np.random.default_rng(seed)
    eta, phi, layers, pid = [], [], [], []
    particles = {}
    # particle id -> (n hits, n distinct layers, pt)
    spec = {1: (4, 4, 2.0), 2: (5, 3, 1.5), 3: (3, 3, 0.5), 4: (4, 2, 3.0), 5: (2, 2, 2.0), 6: (6, 5, 1.0), 7: (1, 1, 5.0)}
    for p, (nh, nl, pt) in spec.items():
        c = rng.uniform([-1.5, -1.5], [1.5, 1.5])
        for h in range(nh):
            e, f = c + rng.normal(0, 0.3, 2)
            eta.append(e), phi.append(f), layers.append(h % nl), pid.append(p)
        particles[p] = (pt, 0.0, 1.0)
    for _ in range(8):  # noise
        e, f = rng.uniform(-2, 2, 2)
        eta.append(e), phi.append(f), layers.append(int(rng.integers(18))), pid.append(0)
    return event_from_eta_phi(eta, phi, layers, pid, particles)


def _brute_force_pairs(pos: np.ndarray, pid: np.ndarray, eligible: np.ndarray, r: float, cap: int):
    n = len(pid)
    nb = set()
    for i in range(n):
        d = [(math.dist(pos[i], pos[j]), j) for j in range(n) if j != i]
        near = sorted(t for t in d if t[0] < r)[:cap]
        for _, j in near:
            nb.add((i, j)), nb.add((j, i))
    pairs = set()
    for p in set(pid.tolist()) - {0}:
        hits = [i for i in range(n) if pid[i] == p]
        if len(hits) < 2:
            continue
        nbrs = {b for (a, b) in nb if a in hits}
        pairs |= set(itertools.product(hits, nbrs)) | set(itertools.combinations(hits, 2))
    und = set()
    for a, b in pairs:
        if a != b:
            und.add((a, b)), und.add((b, a))
    edges = sorted(und)
    labels = [bool(pid[a] == pid[b] and eligible[a] and eligible[b]) for a, b in edges]
    return edges, labels


@pytest.mark.parametrize("cap", [3, 256])
@pytest.mark.parametrize("backend", ["kdtree", "torch"])
def test_pairs_equal_brute_force(cap, backend):
    ev = _pair_event()
    inp = tracking_inputs(ev, dtype=torch.float64)
    pairs = build_tracking_pairs(inp, radius=1.0, max_num_neighbors=cap, backend=backend)
    pid = ev.particle_id
    eligible = (pid != 0) & ev.reconstructable & (ev.hit_pt > 0.9)
    # sanity of the hand-made event: a mix of eligible / ineligible particles
    assert set(pid[eligible].tolist()) == {1, 2, 6}
    edges, labels = _brute_force_pairs(inp.pos.numpy(), pid, eligible, 1.0, cap)
    assert pairs.edge_index.dtype == torch.int64 and pairs.is_positive.dtype == torch.bool
    assert [tuple(e) for e in pairs.edge_index.T.tolist()] == edges  # same set, sorted (row, col)
    assert pairs.is_positive.tolist() == labels
    assert pairs.eligible.tolist() == eligible.tolist()
    assert 0 < sum(labels) < len(labels)


def test_pairs_from_event_directly_and_tiny_events():
    ev = _pair_event(1)
    a = build_tracking_pairs(ev)
    b = build_tracking_pairs(tracking_inputs(ev, dtype=torch.float64))
    assert torch.equal(a.edge_index, b.edge_index) and torch.equal(a.is_positive, b.is_positive)
    # only noise / singletons -> no pairs
    ev0 = event_from_eta_phi([0.0, 0.1, 0.2], [0.0, 0.0, 0.1], [0, 1, 2], [0, 0, 9], {9: (1.0, 0, 0)})
    p0 = build_tracking_pairs(ev0)
    assert p0.edge_index.shape == (2, 0) and p0.is_positive.shape == (0,)


def test_radius_graph_backends_agree():
    g = torch.Generator().manual_seed(0)
    pos = torch.rand(700, 2, generator=g, dtype=torch.float64) * 4
    for cap in (5, 256):
        a = radius_graph_capped(pos, 0.3, cap, backend="kdtree")
        b = radius_graph_capped(pos, 0.3, cap, backend="torch")
        ka = torch.sort(a[0] * 700 + a[1]).values
        kb = torch.sort(b[0] * 700 + b[1]).values
        assert torch.equal(ka, kb)
        assert (a[0] != a[1]).all()
        assert torch.bincount(a[0], minlength=700).max() <= cap
    with pytest.raises(ValueError, match="r"):
        radius_graph_capped(pos, 0.0)
    with pytest.raises(ValueError, match="pos"):
        radius_graph_capped(pos[0])


def test_add_random_pairs():
    ev = _pair_event()
    pairs = build_tracking_pairs(ev)
    g = torch.Generator().manual_seed(3)
    aug = add_random_pairs(pairs, 0.2, generator=g)
    E = pairs.num_pairs
    m = int(E * 0.2 / 2)
    assert torch.equal(aug.edge_index[:, :E], pairs.edge_index)
    extra = aug.edge_index[:, E:]
    assert 0 < extra.shape[1] <= 2 * m and extra.shape[1] % 2 == 0
    assert (extra[0] != extra[1]).all()  # no self pairs
    ks = set((extra[0] * 1000 + extra[1]).tolist())
    assert ks == set((extra[1] * 1000 + extra[0]).tolist())  # undirected
    pid, el = pairs.particle_id, pairs.eligible
    expect = (pid[extra[0]] == pid[extra[1]]) & el[extra[0]] & el[extra[1]]
    assert torch.equal(aug.is_positive[E:], expect)
    assert add_random_pairs(pairs, 0.0) is pairs
    with pytest.raises(ValueError, match="fraction"):
        add_random_pairs(pairs, -1.0)


# ----------------------------------------------------------------------------------------
# loss
# ----------------------------------------------------------------------------------------


def _hand_pairs():
    # hits 0,1,2 particle 1; 3,4 particle 2; 5 noise. pairs listed as (anchor, other, positive)
    listed = [
        (0, 1, True), (1, 0, True), (0, 2, True), (2, 0, True), (1, 2, True), (2, 1, True),
        (3, 4, True), (4, 3, True),
        (0, 3, False), (0, 5, False), (1, 5, False), (2, 4, False), (3, 0, False), (3, 5, False),
        (5, 0, False),
    ]
    ei = torch.tensor([[a for a, _, _ in listed], [b for _, b, _ in listed]])
    pos = torch.tensor([p for _, _, p in listed])
    pid = torch.tensor([1, 1, 1, 2, 2, 0])
    return TrackingPairs(ei, pos, pid, pid > 0), listed


def _hand_loss(emb: np.ndarray, listed, sim) -> float:
    """−log(e^{s+}/(e^{s+} + Σ_neg e^{s−})) per positive, mean per particle, then mean."""
    s = {(a, b): sim(np.linalg.norm(emb[a] - emb[b])) for a, b, _ in listed}
    pid = [1, 1, 1, 2, 2, 0]
    per = {}
    for a, b, p in listed:
        if not p:
            continue
        negs = sum(math.exp(s[(a2, b2)]) for a2, b2, p2 in listed if a2 == a and not p2)
        l = -math.log(math.exp(s[(a, b)]) / (math.exp(s[(a, b)]) + negs))
        per.setdefault(pid[a], []).append(l)
    return float(np.mean([np.mean(v) for v in per.values()]))


@pytest.mark.parametrize("similarity", ["l2_rbf", "paper"])
def test_infonce_equals_hand_formula(similarity):
    pairs, listed = _hand_pairs()
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(6, 3, generator=g, dtype=torch.float64)
    tau, sigma = 0.05, 0.75
    if similarity == "l2_rbf":
        sim = lambda d: math.exp(-d / (2 * sigma**2)) / tau  # noqa: E731
    else:
        sim = lambda d: math.exp(-(d**2) / tau)  # noqa: E731
    want = _hand_loss(emb.numpy(), listed, sim)
    got = infonce_loss(emb, pairs, similarity=similarity, tau=tau, sigma=sigma)
    assert got.dim() == 0
    assert math.isclose(got.item(), want, rel_tol=1e-10)
    # (anchor 4 has no negatives, so its positive pair contributes exactly 0 in both.)
    # other τ / σ values
    want2 = _hand_loss(emb.numpy(), listed, (lambda d: math.exp(-d / 2) / 0.5) if similarity == "l2_rbf"
                       else (lambda d: math.exp(-(d**2) / 0.5)))
    got2 = infonce_loss(emb, pairs, similarity=similarity, tau=0.5, sigma=1.0)
    assert math.isclose(got2.item(), want2, rel_tol=1e-10)


def test_infonce_gradient_finite_with_duplicate_embeddings():
    pairs, _ = _hand_pairs()
    emb = torch.randn(6, 4, dtype=torch.float64)
    emb[1] = emb[0]  # a positive pair at distance 0
    emb[5] = emb[0]  # a negative pair at distance 0
    emb.requires_grad_(True)
    for sim, tau in itertools.product(("l2_rbf", "paper"), (0.05, 1.0, 1e-3)):  # 1e-3: very sharp logits
        emb.grad = None
        loss = infonce_loss(emb, pairs, similarity=sim, tau=tau)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(emb.grad).all()
        if tau == 1.0:
            assert emb.grad.abs().sum() > 0


def test_infonce_gradcheck():
    pairs, _ = _hand_pairs()
    emb = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    for sim in ("l2_rbf", "paper"):
        assert torch.autograd.gradcheck(lambda e: infonce_loss(e, pairs, similarity=sim, tau=0.5), (emb,))


@pytest.mark.parametrize("similarity", ["l2_rbf", "paper"])
def test_infonce_on_a_mirrored_list_in_chunks_equals_plain_autograd(similarity, monkeypatch):
    """The training layout (each pair listed both ways, computed once) through several chunks of the
    chunked pair logits: loss and gradient equal a plain autograd evaluation of the formula over the
    full list, and the gradient passes gradcheck (a duplicate hit puts one pair at distance 0)."""
    import pointformers.tasks.tracking.core as core

    monkeypatch.setattr(core, "_PAIR_CHUNK", 7)
    g = torch.Generator().manual_seed(3)
    n = 30
    pid = torch.randint(0, 6, (n,), generator=g)
    a, b = torch.triu_indices(n, n, 1)
    keep = torch.rand(a.shape[0], generator=g) < 0.4
    half = torch.stack([a[keep], b[keep]])
    ei = torch.cat([half, half.flip(0)], dim=1)
    eligible = pid > 0
    pos = (pid[ei[0]] == pid[ei[1]]) & eligible[ei[0]]
    pairs = TrackingPairs(ei, pos, pid, eligible)
    emb = torch.randn(n, 5, generator=g, dtype=torch.float64)
    emb[1] = emb[0]
    emb.requires_grad_(True)
    tau, sigma = 0.3, 0.9

    def plain(e):  # the formula over the full list, each row an anchor, autograd through everything
        d = e[ei[0]] - e[ei[1]]
        s = (torch.exp(-torch.linalg.vector_norm(d, dim=1) / (2 * sigma**2)) / tau if similarity == "l2_rbf"
             else torch.exp(-(d * d).sum(1) / tau))
        per = {}
        for k in torch.nonzero(pos).squeeze(1).tolist():
            negs = s[(ei[0] == ei[0, k]) & ~pos]
            l = torch.logsumexp(torch.cat([s[k:k + 1], negs]), 0) - s[k]
            per.setdefault(int(pid[ei[0, k]]), []).append(l)
        return torch.stack([torch.stack(v).mean() for v in per.values()]).mean()

    got = infonce_loss(emb, pairs, similarity=similarity, tau=tau, sigma=sigma)
    want = plain(emb)
    assert torch.allclose(got, want, rtol=1e-12)
    g_got, = torch.autograd.grad(got, emb)
    g_want, = torch.autograd.grad(want, emb)
    assert torch.allclose(g_got, g_want, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(lambda e: infonce_loss(e, pairs, similarity=similarity, tau=tau, sigma=sigma),
                                    (emb,))


def test_infonce_no_positive_pairs_is_zero_with_grad():
    pairs, _ = _hand_pairs()
    pairs = TrackingPairs(pairs.edge_index, torch.zeros_like(pairs.is_positive), pairs.particle_id, pairs.eligible)
    emb = torch.randn(6, 3, requires_grad=True)
    loss = infonce_loss(emb, pairs)
    assert loss.item() == 0.0 and loss.grad_fn is not None
    loss.backward()
    assert torch.equal(emb.grad, torch.zeros_like(emb))


def test_infonce_never_n_by_n():
    # 400k hits: an n×n float32 matrix would need 640 GB; the loss only touches listed pairs.
    pairs_small, listed = _hand_pairs()
    n = 400_000
    emb = torch.zeros(n, 12, dtype=torch.float64)
    small = torch.randn(6, 12, dtype=torch.float64)
    emb[:6] = small
    pid = torch.zeros(n, dtype=torch.long)
    pid[:6] = pairs_small.particle_id
    big = TrackingPairs(pairs_small.edge_index, pairs_small.is_positive, pid, pid > 0)
    emb.requires_grad_(True)
    loss = infonce_loss(emb, big)
    loss.backward()
    assert math.isclose(loss.item(), infonce_loss(small, pairs_small).item(), rel_tol=1e-12)
    assert emb.grad[6:].abs().sum() == 0


def test_infonce_bad_input():
    pairs, _ = _hand_pairs()
    emb = torch.randn(6, 3)
    with pytest.raises(ValueError, match="emb"):
        infonce_loss(emb[0], pairs)
    with pytest.raises(ValueError, match="emb"):
        infonce_loss(torch.randn(7, 3), pairs)
    with pytest.raises(ValueError, match="emb"):
        infonce_loss(torch.full((6, 3), float("nan")), pairs)
    with pytest.raises(ValueError, match="emb"):
        infonce_loss(torch.ones(6, 3, dtype=torch.long), pairs)
    with pytest.raises(ValueError, match="similarity"):
        infonce_loss(emb, pairs, similarity="cosine")
    with pytest.raises(ValueError, match="tau"):
        infonce_loss(emb, pairs, tau=0.0)
    with pytest.raises(ValueError, match="sigma"):
        infonce_loss(emb, pairs, sigma=-1.0)
    bad = TrackingPairs(pairs.edge_index + 10, pairs.is_positive, pairs.particle_id, pairs.eligible)
    with pytest.raises(ValueError, match="pairs.edge_index"):
        infonce_loss(emb, bad)
    bad = TrackingPairs(pairs.edge_index, pairs.is_positive[:-1], pairs.particle_id, pairs.eligible)
    with pytest.raises(ValueError, match="pairs.is_positive"):
        infonce_loss(emb, bad)
    with pytest.raises(ValueError, match="pairs"):
        infonce_loss(emb, (pairs.edge_index, pairs.is_positive))  # type: ignore[arg-type]


def test_loss_on_generated_pairs_runs():
    ev = _pair_event()
    inp = tracking_inputs(ev)
    pairs = add_random_pairs(build_tracking_pairs(inp), generator=torch.Generator().manual_seed(0))
    emb = torch.randn(inp.num_hits, 12, requires_grad=True)
    loss = infonce_loss(emb, pairs)
    loss.backward()
    assert torch.isfinite(loss) and loss.item() > 0 and torch.isfinite(emb.grad).all()


# ----------------------------------------------------------------------------------------
# metric
# ----------------------------------------------------------------------------------------

# 1-D layout (embedded in 2-D). pid: P1 = 1 (4 hits), P2 = 2 (2 hits), noise 0,
# P3 = 3 low pt (2 hits), P4 = 4 non-reconstructable (2 hits), P5 = 5 single hit.
LAYOUT = [  # (x, pid, pt, reconstructable)
    (0.0, 1, 2.0, True), (1.0, 1, 2.0, True), (3.3, 1, 2.0, True), (10.0, 1, 2.0, True),
    (2.2, 2, 2.0, True), (21.0, 2, 2.0, True),
    (0.4, 0, 0.0, False),
    (2.6, 3, 0.5, True), (30.0, 3, 0.5, True),
    (1.7, 4, 2.0, False), (40.0, 4, 2.0, False),
    (60.0, 5, 2.0, True),
]


def _layout():
    x = torch.tensor([[h[0], 0.0] for h in LAYOUT], dtype=torch.float64)
    pid = torch.tensor([h[1] for h in LAYOUT])
    pt = torch.tensor([h[2] for h in LAYOUT])
    rec = torch.tensor([h[3] for h in LAYOUT])
    return x, pid, pt, rec


def test_ap_at_k_hand_computed():
    x, pid, pt, rec = _layout()
    # Queries: P1 (k=3) and P2 (k=1); P5 has k=0 (skipped); noise/P3/P4 only as neighbours.
    # Neighbour orders (K=4):   0 -> N, P1, P4, P2      acc 1/3, 1 match in top 4
    #                           1 -> N, P4, P1, P2      acc 1/3, 1
    #                         3.3 -> P3, P2, P4, P1     acc 0,   1
    #                          10 -> P1, P3, P2, P4     acc 1/3, 1
    #                         2.2 -> P3, P4, P1, P1     acc 0,   0
    #                          21 -> P3, P1, P1, P3     acc 0,   0
    m = tracking_metrics_at_k(x, pid, pt, rec, K=4)
    assert m["num_queries"] == 6
    assert math.isclose(m["accuracy"], 1 / 6, rel_tol=1e-12)
    assert math.isclose(m["precision"], (4 * 0.25) / 6, rel_tol=1e-12)
    assert math.isclose(m["recall"], (4 * (1 / 3)) / 6, rel_tol=1e-12)
    assert math.isclose(ap_at_k(x, pid, pt, rec, K=4), 1 / 6, rel_tol=1e-12)
    # default K = 19 > n - 1: ranking padded with non-matches, accuracy unchanged
    assert math.isclose(ap_at_k(x, pid, pt, rec), 1 / 6, rel_tol=1e-12)
    # pt_min = 0 lets the low-pt P3 hits query too: 2.6 -> P2 (0), 30 -> P2 (0)
    assert math.isclose(ap_at_k(x, pid, pt, rec, pt_min=0.0, K=4), (3 * (1 / 3)) / 8, rel_tol=1e-12)
    # numpy inputs work the same
    assert math.isclose(ap_at_k(x.numpy(), pid.numpy(), pt.numpy(), rec.numpy(), K=4), 1 / 6, rel_tol=1e-12)


def test_ap_exact_two_thirds_and_large_k():
    # u = (0, 0) of particle A (4 hits, k = 3); neighbours A(1.0), A(1.1), B(1.2), then far.
    x = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.1], [5.0, 5.0], [1.2, 0.0], [-9.0, 0.0]])
    pid = torch.tensor([7, 7, 7, 7, 8, 8])
    pt = torch.full((6,), 2.0)
    rec = torch.tensor([True, False, False, False, False, False])  # only u queries
    assert math.isclose(ap_at_k(x, pid, pt, rec, K=4), 2 / 3, rel_tol=1e-12)
    m = tracking_metrics_at_k(x, pid, pt, rec, K=4)
    # top 4: A, A, B, A(5, 5) -> 3 matches
    assert math.isclose(m["precision"], 3 / 4) and math.isclose(m["recall"], 1.0)
    # k_u = 3 > K = 2
    assert math.isclose(ap_at_k(x, pid, pt, rec, K=2, large_k="clip"), 1.0)  # matches[:2] / 2
    assert math.isclose(ap_at_k(x, pid, pt, rec, K=2, large_k="extend"), 2 / 3)  # full k_u
    with pytest.raises(ValueError, match="K"):
        ap_at_k(x, pid, pt, rec, K=2, large_k="raise")
    m = tracking_metrics_at_k(x, pid, pt, rec, K=2)
    assert math.isclose(m["precision"], 1.0) and math.isclose(m["recall"], 2 / 3)


def test_ap_drops_self_not_position_zero():
    # u (pid 1) and w (pid 2) share the same embedding; u's partner is at distance 1.
    x = torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0]])
    pid = torch.tensor([1, 2, 1])
    rec = torch.tensor([True, False, False])
    pt = torch.full((3,), 2.0)
    assert ap_at_k(x, pid, pt, rec, K=2) == 0.0  # nearest other hit is w, not u's partner
    # same-particle duplicate: perfect whichever of the two ranks first
    pid2 = torch.tensor([1, 1, 3])
    assert ap_at_k(x, pid2, pt, rec, K=2) == 1.0
    # u not even among the K+1 nearest (3 exact duplicates of other particles)
    x3 = torch.tensor([[0.0, 0.0]] * 4 + [[3.0, 0.0]])
    pid3 = torch.tensor([1, 2, 3, 4, 1])
    rec3 = torch.tensor([True, False, False, False, False])
    assert ap_at_k(x3, pid3, torch.full((5,), 2.0), rec3, K=1) == 0.0


def test_ap_nan_and_split():
    x, pid, pt, rec = _layout()
    assert math.isnan(ap_at_k(x, pid, pt, torch.zeros_like(rec)))  # nothing reconstructable
    assert math.isnan(ap_at_k(x, pid, pt, rec, pt_min=100.0))
    assert math.isnan(ap_at_k(x[:0], pid[:0], pt[:0], rec[:0]))
    # only k_u = 0 hits qualify
    assert math.isnan(ap_at_k(x[11:], pid[11:], pt[11:], rec[11:]))
    assert math.isclose(ap_at_k_split([0.5, float("nan"), 1.0]), 0.75)
    assert math.isnan(ap_at_k_split([float("nan")])) and math.isnan(ap_at_k_split([]))


def test_ap_matches_brute_force_with_chunks(monkeypatch):
    monkeypatch.setattr(T, "_CHUNK_ELEMS", 3000)  # force many chunks
    g = torch.Generator().manual_seed(1)
    n = 600
    pid = torch.randint(0, 60, (n,), generator=g)
    emb = torch.randn(n, 3, generator=g, dtype=torch.float64) + 0.5 * torch.randn(60, 3, generator=g, dtype=torch.float64)[pid]
    pt = torch.rand(n, generator=g, dtype=torch.float64) * 2
    rec = torch.rand(n, generator=g) < 0.8
    K = 19
    d = torch.cdist(emb, emb)
    d.fill_diagonal_(float("inf"))
    order = torch.argsort(d, dim=1)
    counts = torch.bincount(pid)
    accs, precs, recs = [], [], []
    for u in range(n):
        k = int(counts[pid[u]]) - 1
        if pid[u] == 0 or not rec[u] or pt[u] <= 0.9 or k == 0:
            continue
        match = (pid[order[u, :K]] == pid[u]).double()
        kk = min(k, K)
        accs.append(match[:kk].sum().item() / kk)
        precs.append(match.sum().item() / K)
        recs.append(match.sum().item() / k)
    m = tracking_metrics_at_k(emb, pid, pt, rec, K=K)
    assert m["num_queries"] == len(accs) > 0
    assert math.isclose(m["accuracy"], float(np.mean(accs)), rel_tol=1e-12)
    assert math.isclose(m["precision"], float(np.mean(precs)), rel_tol=1e-12)
    assert math.isclose(m["recall"], float(np.mean(recs)), rel_tol=1e-12)


def test_metric_bad_input():
    x, pid, pt, rec = _layout()
    with pytest.raises(ValueError, match="particle_id"):
        ap_at_k(x, pid[:-1], pt, rec)
    with pytest.raises(ValueError, match="pt"):
        ap_at_k(x, pid, pt[:3], rec)
    with pytest.raises(ValueError, match="emb"):
        ap_at_k(x[:, 0], pid, pt, rec)
    with pytest.raises(ValueError, match="emb"):
        ap_at_k(torch.full_like(x, float("nan")), pid, pt, rec)
    with pytest.raises(ValueError, match="large_k"):
        ap_at_k(x, pid, pt, rec, large_k="bogus")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------
# baseline embedding and clustering
# ----------------------------------------------------------------------------------------


def test_knn_eta_phi_embedding():
    ev = _pair_event()
    inp = tracking_inputs(ev, dtype=torch.float64)
    e = knn_eta_phi_embedding(ev, dtype=torch.float64)
    assert torch.allclose(e, inp.pos)
    assert torch.equal(knn_eta_phi_embedding(inp), inp.pos.float())
    w = knn_eta_phi_embedding(inp, wrap_phi=True, dtype=torch.float64)
    assert w.shape == (ev.num_hits, 3)
    assert torch.allclose(w[:, 1], torch.cos(inp.pos[:, 1])) and torch.allclose(w[:, 2], torch.sin(inp.pos[:, 1]))
    a = ap_at_k(e, inp.particle_id, inp.pt, inp.reconstructable)
    assert 0.0 <= a <= 1.0


def test_cluster_tracks():
    emb = torch.tensor([[0.0, 0], [0.1, 0], [0.0, 0.1], [5, 5], [5.1, 5], [5, 5.1], [9, 9], [0.25, 0]])
    lab = cluster_tracks(emb, eps=0.15, min_samples=2)
    # (0.25, 0) is within eps of (0.1, 0) only: with min_samples=2 it is a core point too
    assert lab.tolist() == [0, 0, 0, 1, 1, 1, -1, 0]
    # min_samples=3: (0.25, 0) has 2 neighbours incl. itself -> border point of cluster 0
    lab3 = cluster_tracks(emb, eps=0.15, min_samples=3)
    assert lab3.tolist() == [0, 0, 0, 1, 1, 1, -1, 0]
    lab4 = cluster_tracks(emb, eps=0.15, min_samples=5)
    assert (lab4 == -1).all()
    assert cluster_tracks(torch.zeros(0, 2), eps=1.0).shape == (0,)
    with pytest.raises(ValueError, match="eps"):
        cluster_tracks(emb, eps=0.0)
    with pytest.raises(ValueError, match="emb"):
        cluster_tracks(emb[:, 0], eps=1.0)


@pytest.mark.parametrize("similarity", ["l2_rbf", "paper"])
def test_infonce_mirrored_fast_path_equals_general_path(similarity):
    """The training step's mirrored pair layout (each distance computed once) gives the same
    loss and gradient as the same directed pairs in a scrambled order (general path)."""
    from pointformers.data.tracking import generate_event
    from pointformers.tasks.tracking.training import TrackingTask, prepare_tracking_clouds

    cloud = prepare_tracking_clouds([generate_event("tiny", seed=3)])[0]
    emb = torch.randn(cloud.num_hits, 4, dtype=torch.float64, requires_grad=True)
    model = lambda x, c: emb  # noqa: E731  (the task only calls model(x, coords))
    model.parameters = lambda: iter([emb])  # type: ignore[attr-defined]
    task = TrackingTask(similarity=similarity, tau=0.1, random_pairs=0.2)
    fast = task.loss(model, cloud, torch.Generator().manual_seed(5))
    (g_fast,) = torch.autograd.grad(fast, emb)

    ref_pairs = add_random_pairs(cloud.pairs(), 0.2, generator=torch.Generator().manual_seed(5))
    perm = torch.randperm(ref_pairs.num_pairs, generator=torch.Generator().manual_seed(1))
    scrambled = TrackingPairs(ref_pairs.edge_index[:, perm], ref_pairs.is_positive[perm],
                              ref_pairs.particle_id, ref_pairs.eligible)
    slow = infonce_loss(emb, scrambled, similarity=similarity, tau=0.1)
    (g_slow,) = torch.autograd.grad(slow, emb)
    assert ref_pairs.num_pairs > 100 and bool(ref_pairs.is_positive.any())
    assert math.isclose(fast.item(), slow.item(), rel_tol=1e-12)
    assert torch.allclose(g_fast, g_slow, rtol=1e-10, atol=1e-14)
