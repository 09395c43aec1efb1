"""SFT: sampler properties, a literal reference, rank injection, rotation invariance and the attention contract."""
import math

import pytest
import torch
import torch.nn.functional as F

import pointformers.attention.sft  # noqa: F401  (registers "sft")
from pointformers.attention import ForwardContext, build
from pointformers.attention.sft import (SFTAttention, SFTBlock, SFTSampler, maxout_scores, maxout_scores_dense,
                                        point_relative_features)
from pointformers.models.sft_models import SFTEncoder

DIM = 12


def _rand_mask(sizes, N, g):
    """(B, N) mask with the given real counts at random (interleaved) positions."""
    mask = torch.zeros(len(sizes), N, dtype=torch.bool)
    for b, n in enumerate(sizes):
        mask[b, torch.randperm(N, generator=g)[:n]] = True
    return mask


# ------------------------------------------------------------------------------------------------
# sampler
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("partner", ["random", "next"])
@pytest.mark.parametrize("training", [True, False])
def test_sampler_bins_disjoint_distinct_real_and_p_in_range(partner, training):
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    k, N = 6, 20
    sizes = [20, 9, 4, 1, 13]  # n > 2k, k < n < 2k, n < k, n = 1, n ≈ 2k
    s = SFTSampler(DIM, k, partner=partner, drop_token=0.3 if training else 0.0).double().train(training)
    mask = _rand_mask(sizes, N, g)
    x = torch.randn(len(sizes), N, DIM, generator=g, dtype=torch.float64)
    out = s(x, mask)
    for b, n in enumerate(sizes):
        cand = torch.isfinite(out.scores[b])
        n_c = int(cand.sum())
        assert 1 <= n_c <= n and bool(mask[b][cand].all())             # only real points are candidates
        kv, pv = out.key_valid[b], out.partner_valid[b]
        assert int(kv.sum()) == min(k, n_c) and int(pv.sum()) == min(k, max(n_c - k, 0))
        top, rand = out.idx_top[b][kv], out.idx_rand[b][pv]
        assert len(set(top.tolist())) == len(top) and len(set(rand.tolist())) == len(rand)   # no duplicates
        assert not set(top.tolist()) & set(rand.tolist())                                     # S1 ∩ S2 = ∅
        assert bool(cand[top].all()) and bool(cand[rand].all())                               # never padding
        # S1 is exactly the top-k of the (noisy) scores among the candidates
        best = out.scores[b].topk(min(k, n_c)).indices
        assert set(top.tolist()) == set(best.tolist())
        p = out.p[b]
        assert bool((p[kv] >= 0.5).all()) and bool((p[kv] <= 1).all())
        assert bool((p[~pv] == 1).all())                                                      # no partner: p = 1
    if not training:  # deterministic eval
        again = s(x, mask)
        assert torch.equal(again.idx_rand, out.idx_rand) and torch.equal(again.p, out.p)


def test_sampler_eval_partners_spread_over_the_rest():
    s = SFTSampler(DIM, 4).double().eval()
    x = torch.randn(1, 40, DIM, dtype=torch.float64)
    out = s(x, torch.ones(1, 40, dtype=torch.bool))
    rank = torch.empty(40, dtype=torch.long)
    rank[out.scores[0].argsort(descending=True)] = torch.arange(40)
    assert rank[out.idx_rand[0]].tolist() == [4 + (2 * j + 1) * 36 // 8 for j in range(4)]  # stratified


def test_gradients_reach_the_scorer():
    torch.manual_seed(1)
    for hard in (False, True):
        m = SFTAttention(DIM, heads=2, k=4, rpe="points", hard=hard).double().train()
        x = torch.randn(2, 15, DIM, dtype=torch.float64)
        pos = torch.randn(2, 15, 3, dtype=torch.float64)
        m(x, pos).square().sum().backward()
        gw = m.sampler.score.weight.grad
        assert gw is not None and bool(torch.isfinite(gw).all()) and float(gw.abs().sum()) > 0


def test_hard_duplets_forward_uses_the_top_token_only():
    torch.manual_seed(2)
    m = SFTAttention(DIM, heads=2, k=4, rpe="points", hard_eval=True).double().eval()
    x, pos = torch.randn(1, 15, DIM, dtype=torch.float64), torch.randn(1, 15, 3, dtype=torch.float64)
    y_top = m(x, pos)                      # eval with p := 1: S1 alone
    m.train()
    m.sampler.gumbel = False               # same ranking as eval; S2 is still random in training
    y_soft = m(x, pos)
    m.hard = True
    y_hard = m(x, pos)
    torch.testing.assert_close(y_hard, y_top, atol=1e-12, rtol=0)  # straight-through: forward = S1
    assert float((y_soft - y_top).detach().abs().max()) > 1e-3               # the soft duplets differ


# ------------------------------------------------------------------------------------------------
# maxout identity and the literal reference
# ------------------------------------------------------------------------------------------------
def test_maxout_l1_identity_values_and_gradients():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 3, 9, 5, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 3, 9, 4, generator=g, dtype=torch.float64)
    fast = maxout_scores(q, k, chunk_elems=50)  # several backward chunks
    dense = maxout_scores_dense(q, k)
    torch.testing.assert_close(fast, dense, atol=1e-12, rtol=0)
    gq, gk = torch.autograd.grad((fast * w).sum(), (q, k))
    rq, rk = torch.autograd.grad((dense * w).sum(), (q, k))
    torch.testing.assert_close(gq, rq, atol=1e-12, rtol=0)
    torch.testing.assert_close(gk, rk, atol=1e-12, rtol=0)
    # one side only (the other detached): the backward computes just that gradient
    only_q = torch.autograd.grad((maxout_scores(q, k.detach(), chunk_elems=50) * w).sum(), q)[0]
    only_k = torch.autograd.grad((maxout_scores(q.detach(), k, chunk_elems=50) * w).sum(), k)[0]
    torch.testing.assert_close(only_q, rq, atol=1e-12, rtol=0)
    torch.testing.assert_close(only_k, rk, atol=1e-12, rtol=0)
    # ties (all-ones input): ½ to each side, as torch.maximum
    o = torch.ones(1, 3, 2, dtype=torch.float64, requires_grad=True)
    p = torch.ones(1, 2, 2, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(torch.autograd.grad(maxout_scores(o, p).sum(), (o, p)),
                               torch.autograd.grad(maxout_scores_dense(o, p).sum(), (o, p)))


def _sinusoid_literal(i, c):
    """S[i, 2j] = sin(i / 10000^{j/c}), S[i, 2j+1] = cos(i / 10000^{j/c}) — the paper's convention."""
    cols = []
    for j in range(c // 2):
        cols += [torch.sin(i / 10000 ** (j / c)), torch.cos(i / 10000 ** (j / c))]
    return torch.stack(cols, -1)


def sft_reference(m, x, pos, mask, edge_attr=None):
    """Literal per-cloud SFT attention from the paper's formulas, using the module's weights and eval sample."""
    samp = m.sampler(x.masked_fill(~mask[..., None], 0), mask)
    B, N, D = x.shape
    H, d = m.heads, m.head_dim
    out = torch.zeros_like(x)
    for b in range(B):
        real = mask[b].nonzero().flatten()
        bins = samp.key_valid[b].nonzero().flatten()
        t, r, p = samp.idx_top[b, bins], samp.idx_rand[b, bins], samp.p[b, bins]
        xs = p[:, None] * x[b, t] + (1 - p)[:, None] * x[b, r]
        Q = m.w_q(x[b, real]).view(-1, H, d)
        K, V = m.w_k(xs).view(-1, H, d), m.w_v(xs).view(-1, H, d)
        A = torch.maximum(Q[:, None], K[None]).sum(-1) / math.sqrt(d)                 # (n, kb, H)
        if m.rpe != "none":
            if m.rpe == "points":
                nd = m.normal_dims
                c = pos.shape[-1] - nd

                def feat(cols):
                    pi, pj = pos[b, real][:, None], pos[b, cols][None]
                    f = [((pi[..., :c] - pj[..., :c]) ** 2).sum(-1)]
                    if nd:
                        f.append((pi[..., c:] * pj[..., c:]).sum(-1))
                    return torch.stack(f, -1)
            elif m.rpe == "graph":
                def feat(cols):
                    return edge_attr[b][real][:, cols]
            else:
                s = m.w_pe(_sinusoid_literal(pos[b, :, 0], m.rel_dim))

                def feat(cols):
                    return s[real][:, None] * s[cols][None]                              # Hadamard (n, kb, c)
            ft, fr = feat(t), feat(r)
            pp = p[None, :, None]
            Rm = pp * F.softplus(m.r_mul(ft)) + (1 - pp) * F.softplus(m.r_mul(fr))
            Ra = pp * m.r_add(ft) + (1 - pp) * m.r_add(fr)
            A = A * Rm + Ra
        leak = F.softplus(m.w_c(xs)).sum(0) if m.leaky else 0.0                      # (H,)
        P = F.relu(A) / (F.relu(A).sum(1, keepdim=True) + leak + m.eps)
        O = torch.einsum("ijh,jhd->ihd", P, V)
        out[b, real] = m.out_linear(O.reshape(len(real), H * d))
    return out


@pytest.mark.parametrize("rpe", ["none", "points", "sequence", "graph"])
def test_fast_path_equals_literal_reference(rpe):
    g = torch.Generator().manual_seed(4)
    torch.manual_seed(4)
    opts = {"points": dict(normal_dims=3), "graph": dict(edge_dim=3), "sequence": dict(pe_dim=8)}.get(rpe, {})
    m = SFTAttention(DIM, heads=3, k=5, rpe=rpe, **opts).double().eval()
    mask = _rand_mask([14, 8, 3], 16, g)
    x = torch.randn(3, 16, DIM, generator=g, dtype=torch.float64)
    pos = torch.randn(3, 16, 6, generator=g, dtype=torch.float64)
    if rpe == "sequence":
        pos = torch.randperm(16, generator=g).double()[None, :, None].repeat(3, 1, 1)
    e = torch.randn(3, 16, 16, 3, generator=g, dtype=torch.float64)
    y = m(x, pos, mask, edge_attr=e)
    torch.testing.assert_close(y, sft_reference(m, x, pos, mask, e), atol=1e-10, rtol=0)


# ------------------------------------------------------------------------------------------------
# rank injection and rotation invariance
# ------------------------------------------------------------------------------------------------
def _ranks(leaky):
    torch.manual_seed(0)
    enc = SFTEncoder(24, depth=4, heads=2, k=12, rpe="graph", edge_dim=3, norm_position="post",
                     leaky=leaky, eps=1e-12).double().eval()
    e = torch.randn(1, 32, 32, 3, dtype=torch.float64)   # one random-normal relative tensor (paper Fig. 3)
    x = torch.ones(1, 32, 24, dtype=torch.float64)
    ranks = []
    with torch.no_grad():
        for blk in enc.blocks:
            x = blk(x, None, None, context=ForwardContext(edge_attr=e))
            ranks.append(int(torch.linalg.matrix_rank(x[0], rtol=1e-7)))
    return ranks


def test_leak_injects_rank_and_plain_relu_does_not():
    leaky, plain = _ranks(True), _ranks(False)
    assert plain == [1] * 4                          # every row sums to 1: tokens stay identical
    assert leaky[0] > 1 and leaky[-1] > leaky[0]     # rank grows over layers


def _random_rotation(g):
    q, r = torch.linalg.qr(torch.randn(3, 3, generator=g, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))
    return q if torch.det(q) > 0 else -q


@pytest.mark.parametrize("options", [{}, {"rel_features": "ppf"}, {"rpe_hidden": 8},
                                     {"rel_features": "ppf", "rpe_hidden": 8}, {"tokens": "radial"},
                                     {"tokens": "radial", "normal_dims": 0}, {"tokens": "local"},
                                     {"tokens": "local", "normal_dims": 0}])
def test_rotation_invariant_model_is_invariant(options):
    g = torch.Generator().manual_seed(6)
    torch.manual_seed(6)
    enc = SFTEncoder(16, depth=2, heads=2, k=6, rotation_invariant=True, drop_token=0.2, **options).double()
    xyz = torch.randn(2, 20, 3, generator=g, dtype=torch.float64)
    nrm = F.normalize(torch.randn(2, 20, 3, generator=g, dtype=torch.float64), dim=-1)
    mask = _rand_mask([20, 11], 20, g)
    pos = torch.cat([xyz, nrm], -1)
    R = _random_rotation(g)
    pos_rot = torch.cat([xyz @ R.T + torch.randn(3, generator=g, dtype=torch.float64), nrm @ R.T], -1)
    for training in (True, False):
        enc.train(training)
        torch.manual_seed(9)
        y = enc(None, pos, mask)
        torch.manual_seed(9)
        y_rot = enc(None, pos_rot, mask)
        torch.testing.assert_close(y_rot, y, atol=1e-9, rtol=0)
    assert float(y[0].detach().std(0).sum()) > 1e-3   # tokens are not all alike (rank injection at work)


def test_radial_tokens_are_the_points_invariants_about_their_centroid():
    g = torch.Generator().manual_seed(4)
    enc = SFTEncoder(8, depth=1, heads=2, k=4, rotation_invariant=True, tokens="radial").double()
    xyz = torch.randn(1, 6, 3, generator=g, dtype=torch.float64)
    nrm = F.normalize(torch.randn(1, 6, 3, generator=g, dtype=torch.float64), dim=-1)
    mask = torch.tensor([[True] * 4 + [False] * 2])
    got = enc._radial(torch.cat([xyz, nrm], -1), mask)
    c = xyz[0, :4].mean(0)                                   # the real points' centroid only
    d = xyz[0, 2] - c
    feats = torch.stack([d.norm(), nrm[0, 2] @ d / d.norm()])
    torch.testing.assert_close(got[0, 2], enc.token_embed(feats))
    assert float(got[0, 4:].abs().max()) == 0.0              # padded rows stay zero
    for bad in ({"tokens": "mean"}, {"tokens": "radial", "rotation_invariant": False}):
        with pytest.raises(ValueError, match="tokens"):
            SFTEncoder(8, depth=1, heads=2, k=4, **{"rotation_invariant": True, **bad})


def test_local_tokens_are_the_neighbourhoods_invariants():
    """tokens="local" against a hand computation for one point, padding ignored as a neighbour."""
    import pointformers.models.sft_models as sm

    g = torch.Generator().manual_seed(5)
    enc = SFTEncoder(8, depth=1, heads=2, k=4, rotation_invariant=True, tokens="local").double()
    n = 24
    xyz = torch.randn(1, n, 3, generator=g, dtype=torch.float64)
    nrm = F.normalize(torch.randn(1, n, 3, generator=g, dtype=torch.float64), dim=-1)
    mask = torch.ones(1, n, dtype=torch.bool)
    mask[0, 20:] = False
    got = enc._local(torch.cat([xyz, nrm], -1), mask)
    pts, ns = xyz[0, :20], nrm[0, :20]
    i = 3
    c = pts.mean(0)
    dist = (pts - pts[i]).norm(dim=-1)
    dist[i] = float("inf")
    nb = dist.argsort()[: sm.LOCAL_NEIGHBOURS]
    off = pts[nb] - pts[i]
    ev = torch.linalg.eigvalsh(off.T @ off / len(nb))
    r = (pts[i] - c).norm()
    feats = torch.cat([r[None], dist[nb].mean()[None], ev[:2] / ev.sum(),
                       (ns[i] @ (pts[i] - c) / r)[None], (ns[nb] @ ns[i]).mean()[None],
                       ((off / off.norm(dim=-1, keepdim=True)) @ ns[i]).mean()[None]])
    torch.testing.assert_close(got[0, i], enc.token_embed(feats))
    assert float(got[0, 20:].abs().max()) == 0.0


def test_point_pair_features_and_rpe_mlp():
    g = torch.Generator().manual_seed(3)
    xyz = torch.randn(1, 5, 3, generator=g, dtype=torch.float64)
    nrm = F.normalize(torch.randn(1, 5, 3, generator=g, dtype=torch.float64), dim=-1)
    pos = torch.cat([xyz, nrm], -1)
    f = point_relative_features(pos, pos[:, :3], 3, "ppf")
    assert f.shape == (1, 5, 3, 4)
    i, j = 4, 1
    d = xyz[0, j] - xyz[0, i]
    want = torch.stack([d @ d, nrm[0, i] @ nrm[0, j], nrm[0, i] @ d, nrm[0, j] @ d])
    torch.testing.assert_close(f[0, i, j], want)
    torch.testing.assert_close(f[..., :2], point_relative_features(pos, pos[:, :3], 3))   # the paper's two first
    m = SFTAttention(16, heads=2, k=4, rpe="points", normal_dims=3, rel_features="ppf", rpe_hidden=8)
    assert m.rpe_mlp[0].in_features == 4 and m.r_mul.in_features == 8 and "rpe_hidden=8" in repr(m)
    for bad, match in (({"rel_features": "pairs"}, "rel_features"), ({"rel_features": "ppf", "normal_dims": 0}, "ppf"),
                       ({"rpe_hidden": -1}, "rpe_hidden"), ({"rpe": "none", "rpe_hidden": 4}, "rpe_hidden")):
        opts = {"rpe": "points", "normal_dims": 3, **bad}
        with pytest.raises(ValueError, match=match):
            SFTAttention(16, heads=2, k=4, **opts)


def test_rotation_invariant_model_padding_invariance_with_tied_scores():
    # all-ones tokens give every point the same score in the first layer: ties must break the same
    # way for a cloud alone and inside a padded batch (stable ranking of the real points only)
    g = torch.Generator().manual_seed(13)
    torch.manual_seed(13)
    enc = SFTEncoder(16, depth=2, heads=2, k=6, rotation_invariant=True).double().eval()
    sizes = [17, 9]
    ps = [torch.randn(n, 6, generator=g, dtype=torch.float64) for n in sizes]
    mask = _rand_mask(sizes, 40, g)
    pos = torch.randn(2, 40, 6, generator=g, dtype=torch.float64) * 100
    for b in range(2):
        pos[b, mask[b]] = ps[b]
    y = enc(None, pos, mask)
    for b in range(2):
        torch.testing.assert_close(y[b][mask[b]], enc(None, ps[b][None])[0], atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------------
# small clouds
# ------------------------------------------------------------------------------------------------
def test_fewer_points_than_bins_masks_the_empty_bins():
    torch.manual_seed(7)
    m = SFTAttention(DIM, heads=2, k=8, rpe="points").double().eval()
    x = torch.randn(1, 5, DIM, dtype=torch.float64)
    pos = torch.randn(1, 5, 3, dtype=torch.float64)
    y8 = m(x, pos)
    m.k = m.sampler.k = 5
    torch.testing.assert_close(y8, m(x, pos), atol=1e-13, rtol=0)  # empty bins add no mass and no leak
    m.k = m.sampler.k = 8
    # in a padded batch next to a large cloud, and k < n < 2k
    xb = torch.randn(2, 30, DIM, dtype=torch.float64)
    pb = torch.randn(2, 30, 3, dtype=torch.float64)
    xb[1, :5], pb[1, :5] = x[0], pos[0]
    mask = torch.zeros(2, 30, dtype=torch.bool)
    mask[0] = True
    mask[1, :5] = True
    torch.testing.assert_close(m(xb, pb, mask)[1, :5], y8[0], atol=1e-12, rtol=0)
    x12, p12 = xb[:1, :12], pb[:1, :12]
    mask[0, 12:] = False
    torch.testing.assert_close(m(xb, pb, mask)[0, :12], m(x12, p12)[0], atol=1e-12, rtol=0)


# ------------------------------------------------------------------------------------------------
# the attention contract
# ------------------------------------------------------------------------------------------------
CONFIGS = {
    "none": dict(heads=3, k=5),
    "points": dict(heads=2, k=5, rpe="points", normal_dims=3),
    "sequence": dict(heads=3, k=5, rpe="sequence", pe_dim=6),
    "graph": dict(heads=2, k=5, rpe="graph", edge_dim=2, leak_mode="per_query"),
}


def _clouds(g, sizes, rpe):
    xs = [torch.randn(n, DIM, generator=g, dtype=torch.float64) for n in sizes]
    ps = [torch.randn(n, 6, generator=g, dtype=torch.float64) for n in sizes]
    if rpe == "sequence":
        ps = [torch.arange(n, dtype=torch.float64)[:, None] * 1.5 for n in sizes]
    es = [torch.randn(n, n, 2, generator=g, dtype=torch.float64) for n in sizes]
    return xs, ps, es


def _pad(xs, ps, es, N, g, fill=float("nan")):
    B = len(xs)
    mask = _rand_mask([len(x) for x in xs], N, g)
    x = torch.full((B, N, DIM), fill, dtype=torch.float64)
    pos = torch.full((B, N, ps[0].shape[-1]), fill, dtype=torch.float64)
    e = torch.full((B, N, N, 2), fill, dtype=torch.float64)
    for b in range(B):
        idx = mask[b].nonzero().flatten()
        x[b, idx], pos[b, idx] = xs[b], ps[b]
        e[b, idx[:, None], idx[None, :]] = es[b]
    return x, pos, e, mask


@pytest.mark.parametrize("rpe", list(CONFIGS))
def test_contract_padding_invariance_zero_rows_finite_grads(rpe):
    g = torch.Generator().manual_seed(8)
    torch.manual_seed(8)
    m = build("sft", dim=DIM, **CONFIGS[rpe]).double().eval()
    sizes = [13, 1, 7, 3]
    xs, ps, es = _clouds(g, sizes, rpe)
    x, pos, e, mask = _pad(xs, ps, es, 16, g)   # NaN padding, interleaved
    y = m(x, pos, mask, edge_attr=e)
    assert bool((y[~mask] == 0).all())
    for b in range(len(sizes)):
        alone = m(xs[b][None], ps[b][None], edge_attr=es[b][None])[0]
        torch.testing.assert_close(y[b][mask[b]], alone, atol=1e-6, rtol=0)
    m.train()
    x.requires_grad_(True)
    m(x, pos, mask, edge_attr=e).sum().backward()
    assert bool(torch.isfinite(x.grad).all()) and bool((x.grad[~mask] == 0).all())
    for name, prm in m.named_parameters():
        assert prm.grad is None or bool(torch.isfinite(prm.grad).all()), name


def test_contract_seeded_reproducibility_and_eval_determinism():
    m = build("sft", dim=DIM, heads=2, k=4, rpe="points", drop_token=0.3, qk_dropout=0.1).double()
    x, pos = torch.randn(2, 15, DIM, dtype=torch.float64), torch.randn(2, 15, 3, dtype=torch.float64)
    torch.manual_seed(1)
    a = m(x, pos)
    torch.manual_seed(1)
    b = m(x, pos)
    c = m(x, pos)
    assert torch.equal(a, b) and not torch.equal(a, c)  # the training randomness is per forward
    m.eval()
    assert torch.equal(m(x, pos), m(x, pos))


def test_contract_bad_input_raises():
    m = SFTAttention(DIM, heads=2, k=4, rpe="points")
    g = SFTAttention(DIM, heads=2, k=4, rpe="graph", edge_dim=2)
    x, pos = torch.randn(2, 6, DIM), torch.randn(2, 6, 3)
    bad = x.clone()
    bad[0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match="x contains NaN"):
        m(bad, pos)
    bad = pos.clone()
    bad[1, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="pos contains NaN"):
        m(x, bad)
    with pytest.raises(ValueError, match="pos"):
        m(x, None)
    with pytest.raises(ValueError, match="pos"):
        m(x, pos[:, :4])
    with pytest.raises(ValueError, match="empty"):
        m(x, pos, torch.tensor([[True] * 6, [False] * 6]))
    with pytest.raises(ValueError, match="empty"):
        m(x[:, :0], pos[:, :0])
    with pytest.raises(ValueError, match="mask"):
        m(x, pos, torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="feature size"):
        m(x[..., :5], pos)
    with pytest.raises(ValueError, match="edge_attr"):
        g(x)
    with pytest.raises(ValueError, match="edge_attr"):
        g(x, edge_attr=torch.randn(2, 6, 5, 2))
    e = torch.randn(2, 6, 6, 2)
    e[0, 1, 2, 0] = float("nan")
    with pytest.raises(ValueError, match="edge_attr"):
        g(x, edge_attr=e)
    for bad_opts in (dict(rpe="nope"), dict(k=0), dict(rpe="graph"), dict(leak_mode="x"), dict(tau=0.0)):
        with pytest.raises(ValueError):
            SFTAttention(DIM, **bad_opts)


def test_contract_one_point_and_all_but_one_padded():
    torch.manual_seed(10)
    m = SFTAttention(DIM, heads=3, k=4, rpe="points").double()
    for training in (True, False):
        m.train(training)
        y = m(torch.randn(1, 1, DIM, dtype=torch.float64), torch.randn(1, 1, 3, dtype=torch.float64))
        assert y.shape == (1, 1, DIM) and bool(torch.isfinite(y).all())
        mask = torch.zeros(2, 9, dtype=torch.bool)
        mask[0, 4] = True
        mask[1] = True
        y = m(torch.randn(2, 9, DIM, dtype=torch.float64), torch.randn(2, 9, 3, dtype=torch.float64), mask)
        assert bool(torch.isfinite(y).all()) and bool((y[~mask] == 0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_contract_dtypes(dtype):
    torch.manual_seed(11)
    ref = SFTAttention(DIM, heads=3, k=4, rpe="points", normal_dims=3).double().eval()
    m = SFTAttention(DIM, heads=3, k=4, rpe="points", normal_dims=3).to(dtype).eval()
    m.load_state_dict(ref.state_dict())
    x, pos = torch.randn(2, 10, DIM, dtype=torch.float64), torch.randn(2, 10, 6, dtype=torch.float64)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, 6:] = False
    y = m(x.to(dtype), pos.to(dtype), mask)
    assert y.dtype == dtype and bool(torch.isfinite(y).all()) and bool((y[~mask] == 0).all())
    if dtype == torch.float32:
        torch.testing.assert_close(y.double(), ref(x, pos, mask), atol=1e-5, rtol=1e-4)
    m.train()
    m(x.to(dtype), pos.to(dtype), mask).float().sum().backward()
    assert all(bool(torch.isfinite(p.grad).all()) for p in m.parameters() if p.grad is not None)


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_block_padding_invariance(norm_position):
    g = torch.Generator().manual_seed(12)
    torch.manual_seed(12)
    blk = SFTBlock(DIM, heads=3, k=4, norm_position=norm_position, rpe="points", dropout=0.1).double().eval()
    xs, ps, es = _clouds(g, [9, 2], "points")
    x, pos, _, mask = _pad(xs, ps, es, 12, g)
    y = blk(x, pos, mask)
    assert bool((y[~mask] == 0).all())
    for b in range(2):
        torch.testing.assert_close(y[b][mask[b]], blk(xs[b][None], ps[b][None])[0], atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------------
# eval / no-grad fast path (CPU inference kernels) against the general path
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("blocks", [1 << 19, 64, 7])  # whole groups per tile / key chunks / key and query chunks
def test_transposed_maxout_kernel_equals_dense(blocks):
    from pointformers.attention.sft import maxout_scores_t
    g = torch.Generator().manual_seed(20)
    q = torch.randn(5, 11, 4, generator=g, dtype=torch.float64)
    k = torch.randn(5, 6, 4, generator=g, dtype=torch.float64)
    k[0, 0] = q[0, 0]  # ties
    got = maxout_scores_t(q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(), 0.25, blocks)
    torch.testing.assert_close(got, 0.25 * maxout_scores_dense(q, k).transpose(1, 2), atol=1e-13, rtol=0)


@pytest.mark.parametrize("norm_position", ["pre", "post"])
@pytest.mark.parametrize("opts", [{}, {"hard_eval": True}, {"leak_mode": "per_query"}, {"leaky": False}])
@pytest.mark.parametrize("k", [3, 7])  # k' ≤ d_h = 4 (P (V Wₒᵀ) association) and k' > d_h
def test_eval_fast_path_equals_general_path(norm_position, opts, k):
    g = torch.Generator().manual_seed(21)
    torch.manual_seed(21)
    blk = SFTBlock(DIM, heads=3, k=k, norm_position=norm_position, **opts).double().eval()
    sizes = [13, 9, 5]                      # n ≥ 2k, k < n < 2k (some bins without partner), n < k
    xs = [torch.randn(n, DIM, generator=g, dtype=torch.float64) for n in sizes]
    mask = _rand_mask(sizes, 16, g)
    x = torch.full((3, 16, DIM), float("nan"), dtype=torch.float64)   # padding may hold anything
    for b in range(3):
        x[b, mask[b]] = xs[b]
    with torch.no_grad():
        for b, xb in enumerate(xs):
            xb = xb[None]
            assert blk.mixer.fast_path_applies(xb)
            fast, fast_attn = blk(xb), blk.mixer(xb)
            assert torch.equal(blk(xb, None, torch.ones(1, len(xs[b]), dtype=torch.bool)), fast)  # all-True mask
            blk.mixer.fast_inference = False
            general, general_attn = blk(xb), blk.mixer(xb)
            blk.mixer.fast_inference = True
            torch.testing.assert_close(fast, general, atol=1e-12, rtol=0)
            torch.testing.assert_close(fast_attn, general_attn, atol=1e-12, rtol=0)
            if not ({"hard_eval", "leak_mode"} & opts.keys()):   # the literal formulas (soft duplets, summed leak)
                ref = sft_reference(blk.mixer, xb, None, torch.ones(xb.shape[:2], dtype=torch.bool))
                torch.testing.assert_close(fast_attn, ref, atol=1e-12, rtol=0)
            # a padded batch (general path) gives the cloud the same output as the fast path alone
            torch.testing.assert_close(blk(x, None, mask)[b][mask[b]], fast[0], atol=1e-12, rtol=0)
        fast = blk(xs[0][None])
    torch.testing.assert_close(blk(xs[0][None]).detach(), fast, atol=1e-12, rtol=0)  # autograd on: general path


def test_fast_path_keeps_the_input_checks():
    blk = SFTBlock(DIM, heads=3, k=4).eval()
    x = torch.randn(2, 10, DIM)
    with torch.no_grad():
        for bad in (float("nan"), float("inf")):
            xb = x.clone()
            xb[1, 3, 2] = bad
            for f in (blk, blk.mixer):
                with pytest.raises(ValueError, match="NaN or inf"):
                    f(xb)
                with pytest.raises(ValueError, match="NaN or inf"):
                    f(xb, None, torch.ones(2, 10, dtype=torch.bool))
        with pytest.raises(ValueError, match="feature size"):
            blk(torch.randn(2, 10, DIM + 1))
        with pytest.raises(ValueError, match="bool"):
            blk(x, None, torch.ones(2, 10))
        with pytest.raises(ValueError, match="pos"):
            blk(x, torch.randn(2, 9, 3))
        blk.mixer(torch.full((1, 4, DIM), 1e15))        # finite, within the documented range: accepted
        with pytest.raises(ValueError, match=r"values up to 3e\+38"):  # finite, but beyond it: named
            blk.mixer(torch.full((1, 4, DIM), 3e38))
        y = x.clone()
        blk(y)
        assert torch.equal(y, x)                         # the caller's tensor is never written in place
