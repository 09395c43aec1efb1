"""SAMSA: exact hard selection, the soft limit, a dense P-matrix reference, Example 3.1 and the attention contract."""
import math

import pytest
import torch
import torch.nn.functional as F

import pointformers.attention.samsa  # noqa: F401  (registers "samsa")
from pointformers.attention import build
from pointformers.attention.samsa import SAMSAAttention, SAMSABlock, samsa_select
from pointformers.models.samsa_models import SAMSAEncoder
from pointformers.attention.sampling import gumbel_noise

DIM = 12


def _rand_mask(sizes, N, g):
    mask = torch.zeros(len(sizes), N, dtype=torch.bool)
    for b, n in enumerate(sizes):
        mask[b, torch.randperm(N, generator=g)[:n]] = True
    return mask


# ------------------------------------------------------------------------------------------------
# the selection operator
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("proxy", ["pairwise_sigmoid", "softmax_group"])
def test_hard_forward_is_an_exact_topk_gather(proxy):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, 2, 30, generator=g, dtype=torch.float64)
    z[0, 0, 5:] = float("-inf")          # only 5 candidates in one row (fewer than 2k)
    kv = torch.randn(3, 2, 30, 4, generator=g, dtype=torch.float64)
    idx = z.topk(6, dim=-1).indices
    exact = kv.gather(2, idx[..., None].expand(-1, -1, -1, 4))
    for training in (True, False):
        out, sel, valid = samsa_select(z, kv, 6, tau=1.0, mode="hard", proxy=proxy, training=training)
        assert torch.equal(valid[0, 0], torch.arange(6) < 5) and bool(valid.flatten()[6:].all())
        assert torch.equal(out[valid], exact[valid]) and torch.equal(sel[valid], idx[valid])


@pytest.mark.parametrize("proxy", ["pairwise_sigmoid", "softmax_group"])
def test_soft_weights_are_convex_and_tend_to_hard_as_tau_goes_to_zero(proxy):
    g = torch.Generator().manual_seed(1)
    z = torch.randn(4, 3, 20, generator=g, dtype=torch.float64) * 3
    kv = torch.randn(4, 3, 20, 5, generator=g, dtype=torch.float64)
    hard, _, _ = samsa_select(z, kv, 4, tau=1.0, mode="hard", proxy=proxy)
    # rows of W_soft sum to one: mixing constant rows returns the constant
    ones, _, _ = samsa_select(z, torch.ones_like(kv), 4, tau=0.1, mode="soft", proxy=proxy)
    torch.testing.assert_close(ones, torch.ones_like(ones))
    errs = [float((samsa_select(z, kv, 4, tau=t, mode="soft", proxy=proxy)[0] - hard).abs().max())
            for t in (1.0, 0.1, 0.01, 1e-4)]
    assert errs[0] > errs[1] > errs[2] > errs[3] and errs[3] < 1e-6


def test_straight_through_gradients():
    g = torch.Generator().manual_seed(2)
    z = torch.randn(2, 16, generator=g, dtype=torch.float64, requires_grad=True)
    kv = torch.randn(2, 16, 3, generator=g, dtype=torch.float64, requires_grad=True)
    out, sel, _ = samsa_select(z, kv, 4, tau=1.0, mode="hard")
    w = torch.randn(out.shape, generator=g, dtype=torch.float64)
    gz, gkv = torch.autograd.grad((out * w).sum(), (z, kv))
    assert bool(torch.isfinite(gz).all()) and float(gz.abs().sum()) > 0
    chosen = torch.zeros(2, 16, dtype=torch.bool)
    chosen.scatter_(1, sel, True)
    assert bool((gkv[~chosen] == 0).all()) and float(gkv[chosen].abs().min()) > 0  # K/V: the hard gather
    gz_soft, gkv_soft = torch.autograd.grad((samsa_select(z, kv, 4, tau=1.0, mode="hard", kv_grad="soft")[0]
                                             * w).sum(), (z, kv))
    torch.testing.assert_close(gz_soft, gz)               # scores: the same proxy gradient
    assert float(gkv_soft[~chosen].abs().sum()) > 0       # K/V: through the soft mixture (runners-up too)


# ------------------------------------------------------------------------------------------------
# the module against a dense P-matrix reference (Algorithm 1 + 2 with explicit k × M matrices)
# ------------------------------------------------------------------------------------------------
def samsa_reference(m, x, mask, noise):
    B, N, D = x.shape
    H, d, k, tau = m.heads, m.head_dim, m.k, m.tau
    x = x.masked_fill(~mask[..., None], 0)
    q = m.w_q(x).view(B, N, H, d).transpose(1, 2)
    K = torch.cat([m.w_k(x).view(B, N, H, d).transpose(1, 2), m.support_kv[None, :, :, :d].expand(B, -1, -1, -1)], 2)
    V = torch.cat([m.w_v(x).view(B, N, H, d).transpose(1, 2), m.support_kv[None, :, :, d:].expand(B, -1, -1, -1)], 2)
    s = m.importance(x).transpose(1, 2).masked_fill(~mask[:, None], float("-inf"))
    z = torch.cat([s, m.support_score[None].expand(B, -1, -1)], 2) + noise            # (B, H, M)
    M = z.shape[-1]
    order = torch.argsort(z, dim=-1, descending=True, stable=True)
    S, R = order[..., :k], order[..., k:2 * k]
    zS, zR = z.gather(-1, S), z.gather(-1, R)
    P_hard = F.one_hot(S, M).to(x.dtype)                                                 # (B, H, k, M)
    if m.proxy == "pairwise_sigmoid":
        p = torch.sigmoid((zS[..., :, None] - zR[..., None, :]) / tau)
        w_s, w_r = p.mean(-1), (1 - p) / k
    else:
        e = torch.exp(torch.cat([zS[..., None], zR[..., None, :].expand(-1, -1, k, -1)], -1) / tau)
        e = e / e.sum(-1, keepdim=True)
        w_s, w_r = e[..., 0], e[..., 1:]
    P_soft = (F.one_hot(S, M) * w_s[..., None]) + (F.one_hot(R, M)[..., None, :, :] * w_r[..., None]).sum(-2)
    P = P_soft if m.mode == "soft" else (P_hard - P_soft).detach() + P_soft
    Kt, Vt = P @ K, P @ V
    att = torch.softmax(q @ Kt.transpose(-1, -2) / math.sqrt(d), -1) @ Vt
    y = m.out_linear(att.transpose(1, 2).reshape(B, N, H * d))
    return y.masked_fill(~mask[..., None], 0)


@pytest.mark.parametrize("mode,proxy", [("hard", "pairwise_sigmoid"), ("hard", "softmax_group"),
                                        ("soft", "pairwise_sigmoid"), ("soft", "softmax_group")])
def test_module_equals_dense_reference_values_and_gradients(mode, proxy):
    g = torch.Generator().manual_seed(3)
    torch.manual_seed(3)
    m = SAMSAAttention(DIM, heads=3, k=4, mode=mode, proxy=proxy).double().train()
    with torch.no_grad():
        m.support_score.normal_()  # distinct support scores, so ties do not decide the test
    mask = _rand_mask([15, 3], 16, g)
    x = torch.randn(2, 16, DIM, generator=g, dtype=torch.float64)
    torch.manual_seed(7)
    y = m(x, None, mask)
    torch.manual_seed(7)
    noise = gumbel_noise((2, 3, 16 + 8), dtype=torch.float64)
    y_ref = samsa_reference(m, x, mask, noise)
    torch.testing.assert_close(y, y_ref, atol=1e-12, rtol=0)
    params = [m.importance[0].weight, m.w_k.weight, m.w_v.weight, m.support_kv, m.support_score]
    w = torch.randn(y.shape, generator=g, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad((y * w).sum(), params), torch.autograd.grad((y_ref * w).sum(), params)):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=0)
    m.eval()  # eval: no noise; hard = the plain top-k gather, soft = the soft mixture (eval_soft)
    torch.testing.assert_close(m(x, None, mask), samsa_reference(m, x, mask, torch.zeros_like(noise)),
                               atol=1e-12, rtol=0)


def test_padding_is_never_selected_and_heads_choose_differently():
    g = torch.Generator().manual_seed(4)
    torch.manual_seed(4)
    for support in (True, False):
        m = SAMSAAttention(DIM, heads=4, k=5, support=support).double()
        mask = _rand_mask([30, 7, 2, 1], 30, g)
        x = torch.randn(4, 30, DIM, generator=g, dtype=torch.float64) * 5
        x[~mask] = 1e6   # tempting padding (it is zeroed before scoring, but no score may ever pick it)
        for training in (True, False):
            m.train(training)
            s = m.scores(x.masked_fill(~mask[..., None], 0), mask)
            if support:
                s = torch.cat([s, m.support_score.expand(4, -1, -1)], 2)
            if training:
                s = s + gumbel_noise(tuple(s.shape), dtype=s.dtype)
            kv = torch.zeros(*s.shape, 1, dtype=torch.float64)
            _, idx, valid = samsa_select(s, kv, 5, tau=1.0, training=training)
            real = torch.cat([mask, torch.ones(4, 10 * support, dtype=torch.bool)], 1)
            picked_real = real[:, None, :].expand(-1, 4, -1).gather(2, idx.clamp(max=real.shape[1] - 1))
            assert bool(picked_real[valid].all())
            if not support:
                assert torch.equal(valid.sum(-1), torch.tensor([5, 5, 2, 1])[:, None].expand(4, 4))
    # per-head sampling: the heads of one cloud do not all pick the same keys
    assert len({tuple(sorted(r)) for r in idx[0].tolist()}) > 1


def test_eval_is_deterministic_and_training_noise_is_per_forward():
    m = SAMSAAttention(DIM, heads=2, k=3, mode="soft").double()
    x = torch.randn(2, 20, DIM, dtype=torch.float64)
    torch.manual_seed(0)
    a = m(x)
    torch.manual_seed(0)
    assert torch.equal(a, m(x)) and not torch.equal(a, m(x))
    m.eval()
    assert torch.equal(m(x), m(x))


# ------------------------------------------------------------------------------------------------
# Example 3.1: learn to select the five largest of ten values through the sampler alone
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("proxy", ["pairwise_sigmoid", "softmax_group"])
def test_example_3_1_picks_the_right_five_of_ten(proxy):
    torch.manual_seed(0)
    scorer = torch.nn.Linear(1, 1)          # importance of each value
    with torch.no_grad():
        scorer.weight.fill_(-1.0)           # start by preferring the smallest values
        scorer.bias.zero_()
    w, b = torch.nn.Parameter(torch.tensor(1.0)), torch.nn.Parameter(torch.tensor(0.0))
    opt = torch.optim.Adam([{"params": scorer.parameters(), "lr": 0.05}, {"params": [w, b], "lr": 0.01}])

    def right_fraction():
        x = torch.randn(500, 10)
        with torch.no_grad():
            _, idx, _ = samsa_select(scorer(x[..., None]).squeeze(-1), x[..., None], 5, tau=1.0, training=False)
        return float((idx.sort(-1).values == x.topk(5, -1).indices.sort(-1).values).all(-1).float().mean())

    assert right_fraction() == 0.0
    for _ in range(150):
        x = torch.randn(32, 10)
        y = 2.0 * x.topk(5, -1).values + 0.5                              # min Σ_j (x_{i_j} w + b − y_j)²
        z = scorer(x[..., None]).squeeze(-1) + gumbel_noise((32, 10))
        sel, _, _ = samsa_select(z, x[..., None], 5, tau=1.0, mode="hard", proxy=proxy, training=True)
        loss = ((w * sel.squeeze(-1) + b - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert right_fraction() == 1.0


# ------------------------------------------------------------------------------------------------
# block
# ------------------------------------------------------------------------------------------------
def test_block_rezero_shared_and_padding_invariant():
    g = torch.Generator().manual_seed(5)
    torch.manual_seed(5)
    enc = SAMSAEncoder(DIM, depth=2, heads=3, k=3, parallel=False, score_input="raw").double().eval()
    assert sum(p.numel() for n, p in enc.named_parameters() if "alpha" in n) == 1   # one shared scalar
    x = torch.randn(2, 10, DIM, generator=g, dtype=torch.float64)
    mask = _rand_mask([10, 4], 10, g)
    torch.testing.assert_close(enc(x, None, mask), x.masked_fill(~mask[..., None], 0))  # ReZero: α = 0 at init
    with torch.no_grad():
        enc.alpha.fill_(0.7)
    y = enc(x, None, mask)
    assert bool((y[~mask] == 0).all()) and float((y - x)[mask].abs().max()) > 1e-2
    for b in range(2):
        torch.testing.assert_close(y[b][mask[b]], enc(x[b][mask[b]][None])[0], atol=1e-6, rtol=0)
    enc.train()
    enc(x, None, mask).sum().backward()
    assert enc.alpha.grad is not None and float(enc.alpha.grad.abs()) > 0
    blk = SAMSABlock(DIM, heads=2, k=3).double()
    assert blk.alpha is not None and blk(x, None, mask).shape == x.shape


# ------------------------------------------------------------------------------------------------
# the attention contract
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("opts", [dict(heads=3, k=4), dict(heads=2, k=4, mode="soft", proxy="softmax_group"),
                                  dict(heads=3, k=4, support=False), dict(heads=3, k=4, mode="soft", eval_soft=False),
                                  dict(heads=2, k=4, mode="soft", support=False)])
def test_contract_padding_invariance_zero_rows_finite_grads(opts):
    g = torch.Generator().manual_seed(6)
    torch.manual_seed(6)
    m = build("samsa", dim=DIM, **opts).double().eval()
    sizes = [13, 1, 6, 3]
    xs = [torch.randn(n, DIM, generator=g, dtype=torch.float64) for n in sizes]
    mask = _rand_mask(sizes, 16, g)
    x = torch.full((4, 16, DIM), float("nan"), dtype=torch.float64)
    for b in range(4):
        x[b, mask[b]] = xs[b]
    y = m(x, None, mask)
    assert bool((y[~mask] == 0).all())
    for b in range(4):
        torch.testing.assert_close(y[b][mask[b]], m(xs[b][None])[0], atol=1e-6, rtol=0)
    m.train()
    x.requires_grad_(True)
    m(x, None, mask).sum().backward()
    assert bool(torch.isfinite(x.grad).all()) and bool((x.grad[~mask] == 0).all())
    for name, prm in m.named_parameters():
        assert prm.grad is None or bool(torch.isfinite(prm.grad).all()), name


def test_contract_bad_input_raises():
    m = SAMSAAttention(DIM, heads=2, k=3)
    x = torch.randn(2, 6, DIM)
    bad = x.clone()
    bad[1, 2, 3] = float("inf")
    with pytest.raises(ValueError, match="x contains NaN"):
        m(bad)
    pos = torch.randn(2, 6, 3)
    pos[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="pos contains NaN"):
        m(x, pos)
    with pytest.raises(ValueError, match="pos"):
        m(x, torch.randn(2, 5, 3))
    with pytest.raises(ValueError, match="empty"):
        m(x, None, torch.tensor([[False] * 6, [True] * 6]))
    with pytest.raises(ValueError, match="empty"):
        m(x[:, :0])
    with pytest.raises(ValueError, match="mask"):
        m(x, None, torch.ones(2, 6))
    with pytest.raises(ValueError, match="score_x"):
        m(x, score_x=x[:, :3])
    for bad_opts in (dict(mode="x"), dict(k=0), dict(proxy="x"), dict(kv_grad="x"), dict(tau=-1.0)):
        with pytest.raises(ValueError):
            SAMSAAttention(DIM, **bad_opts)


def test_contract_one_point_and_all_but_one_padded():
    torch.manual_seed(8)
    for support in (True, False):
        m = SAMSAAttention(DIM, heads=3, k=4, support=support).double()
        for training in (True, False):
            m.train(training)
            y = m(torch.randn(1, 1, DIM, dtype=torch.float64))
            assert y.shape == (1, 1, DIM) and bool(torch.isfinite(y).all())
            mask = torch.zeros(2, 9, dtype=torch.bool)
            mask[0, 7] = True
            mask[1] = True
            y = m(torch.randn(2, 9, DIM, dtype=torch.float64), None, mask)
            assert bool(torch.isfinite(y).all()) and bool((y[~mask] == 0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_contract_dtypes(dtype):
    torch.manual_seed(9)
    ref = SAMSAAttention(DIM, heads=3, k=4).double().eval()
    m = SAMSAAttention(DIM, heads=3, k=4).to(dtype).eval()
    m.load_state_dict(ref.state_dict())
    x = torch.randn(2, 10, DIM, dtype=torch.float64)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, 6:] = False
    y = m(x.to(dtype), None, mask)
    assert y.dtype == dtype and bool(torch.isfinite(y).all()) and bool((y[~mask] == 0).all())
    if dtype == torch.float32:
        torch.testing.assert_close(y.double(), ref(x, None, mask), atol=1e-5, rtol=1e-4)
    m.train()
    m(x.to(dtype), None, mask).float().sum().backward()
    assert all(bool(torch.isfinite(p.grad).all()) for p in m.parameters() if p.grad is not None)
