"""Sampled (random Hamiltonian-cycle) attention: literal subsets, cycle statistics, equivariance, contract."""
import itertools
import math

import pytest
import torch

from pointformers.attention import ForwardContext
from pointformers.attention.knn import masked_softmax_attention
from pointformers.attention.registry import build
from pointformers.attention.sampled import SampledAttention, literal_subsets, successors


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Hundreds of tiny ops: on shared cores, intra-op threads only add synchronisation latency."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def cyc(attn, order, mask=None):
    """A context holding an explicit cycle for ``attn``."""
    return attn.use_order(ForwardContext(), order, mask)


def make(dim=16, heads=4, seed=0, **kw):
    torch.manual_seed(seed)
    return SampledAttention(dim, heads, **kw).double()


def scattered_batch(clouds, g, extra=3):
    """Clouds (n_i, F) placed at random order-preserving positions of rows of max(n_i) + extra;
    padding holds huge values and NaN. -> x (B, N, F), mask (B, N), list of position tensors."""
    N = max(c.shape[0] for c in clouds) + extra
    x = torch.full((len(clouds), N, clouds[0].shape[1]), 1e6, dtype=clouds[0].dtype)
    x[:, ::2, 0] = float("nan")
    mask = torch.zeros(len(clouds), N, dtype=torch.bool)
    where = []
    for b, c in enumerate(clouds):
        p = torch.randperm(N, generator=g)[: c.shape[0]].sort().values
        x[b, p], mask[b, p] = c, True
        where.append(p)
    return x, mask, where


def random_order(mask, g):
    """A valid explicit cycle: each row's real indices in random order, then its padded ones."""
    rows = []
    for m in mask:
        real, pad = m.nonzero().flatten(), (~m).nonzero().flatten()
        rows.append(torch.cat([real[torch.randperm(len(real), generator=g)], pad]))
    return torch.stack(rows)


def test_registered():
    assert isinstance(build("sampled", dim=8, heads=2), SampledAttention)


def test_literal_subsets_structure():
    order = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    subsets = literal_subsets(order, 4)
    assert len(subsets) == 4 and all(s.numel() == 4 for s in subsets)  # l = n / (n_s − 1)
    for i, s in enumerate(subsets):  # X^i = R^i ∪ R^{γ(i)}_1: windows of n_s, stride n_s − 1, wrap-around
        assert torch.equal(s[:-1], order[3 * i: 3 * i + 3])
        assert s[-1] == subsets[(i + 1) % 4][0]
    assert sorted(torch.cat([s[:-1] for s in subsets]).tolist()) == list(range(12))
    last = literal_subsets(order, 6)  # (n_s − 1) ∤ n: the last subset is shorter
    assert [s.numel() for s in last] == [6, 6, 3] and last[-1][-1] == order[0]


@pytest.mark.parametrize("n_s", [2, 3, 4, 5, 7, 13, 6])
def test_roll_kernel_equals_literal_subsets(n_s):
    """(n_s − 1) | 12 for all but n_s = 6 (shorter last subset): the kernel never depends on n_s."""
    g = torch.Generator().manual_seed(n_s)
    roll = make()
    subsets = make(kernel="subsets", n_s=n_s)
    subsets.load_state_dict(roll.state_dict())
    clouds = [torch.randn(n, 16, generator=g, dtype=torch.float64) for n in (12, 6)]
    x, mask, _ = scattered_batch(clouds, g)
    order = random_order(mask, g)
    torch.testing.assert_close(roll(x, None, mask, context=cyc(roll, order, mask)),
                               subsets(x, None, mask, context=cyc(subsets, order, mask)), atol=1e-12, rtol=0)


def test_kernel_equals_dense_cycle_pattern():
    """Query i attends exactly to {i, succ(i)}: a dense masked softmax over that pattern agrees."""
    g = torch.Generator().manual_seed(1)
    attn = make()
    x = torch.randn(1, 9, 16, generator=g, dtype=torch.float64)
    mask = torch.ones(1, 9, dtype=torch.bool)
    order = random_order(mask, g)
    allowed = torch.eye(9, dtype=torch.bool)
    for j in range(9):  # the cycle, written out by hand from the order
        allowed[order[0, j], order[0, (j + 1) % 9]] = True
    q, k, v = (w(x).view(1, 9, 4, 4).transpose(1, 2) for w in (attn.w_q, attn.w_k, attn.w_v))
    o = masked_softmax_attention(q, k, v, allowed[None], 0.5)
    ref = attn.out_linear(o.transpose(1, 2).reshape(1, 9, 16))
    torch.testing.assert_close(attn(x, context=cyc(attn, order)), ref, atol=1e-12, rtol=0)


def test_successor_frequency_is_uniform():
    """Each ordered pair a→b (a ≠ b) is an edge with probability 1/(n − 1); cycles are Hamiltonian;
    with padding only real points are on the cycle and a padded point is its own successor."""
    torch.manual_seed(0)
    attn = make().train()
    B, n = 20000, 12
    for real_idx in (torch.arange(n), torch.tensor([0, 2, 3, 5, 8, 9, 11])):
        mask = torch.zeros(B, n, dtype=torch.bool)
        mask[:, real_idx] = True
        succ = successors(attn.cycle_order(mask), mask)
        m = len(real_idx)
        freq = torch.zeros(n, n, dtype=torch.float64)
        for a in range(n):
            freq[a] = torch.bincount(succ[:, a], minlength=n).double() / B
        sub = freq[real_idx][:, real_idx]
        off = ~torch.eye(m, dtype=torch.bool)
        assert sub.diagonal().eq(0).all() and sub.sum(1).sub(1).abs().max() < 1e-12
        sigma = math.sqrt((1 / (m - 1)) * (1 - 1 / (m - 1)) / B)
        assert (sub[off] - 1 / (m - 1)).abs().max() < 5 * sigma
        pad = (~mask[0]).nonzero().flatten()
        assert torch.equal(succ[:, pad], pad.expand(B, -1))
        for b in range(5):  # following successors visits every real point once and returns
            seen, p = [], int(real_idx[0])
            for _ in range(m):
                seen.append(p)
                p = int(succ[b, p])
            assert p == int(real_idx[0]) and sorted(seen) == real_idx.tolist()


def test_permutation_equivariance_coupled():
    """Exact: f(x[σ], order') = f(x, order)[σ] where order' lists the same cycle in the new labels,
    i.e. x[σ][order'] == x[order] (order' = σ⁻¹[order])."""
    g = torch.Generator().manual_seed(2)
    attn = make()
    x = torch.randn(2, 11, 16, generator=g, dtype=torch.float64)
    mask = torch.ones(2, 11, dtype=torch.bool)
    mask[1, 7:] = False
    order = random_order(mask, g)
    sigma = torch.stack([torch.randperm(11, generator=g),
                         torch.cat([torch.randperm(7, generator=g), torch.arange(7, 11)])])
    inv = torch.argsort(sigma, 1)
    x2, mask2 = x.gather(1, sigma[..., None].expand_as(x)), mask.gather(1, sigma)
    order2 = inv.gather(1, order)
    assert torch.equal(x2.gather(1, order2[..., None].expand_as(x)), x.gather(1, order[..., None].expand_as(x)))
    y, y2 = attn(x, None, mask, context=cyc(attn, order, mask)), attn(x2, None, mask2, context=cyc(attn, order2, mask2))
    torch.testing.assert_close(y2, y.gather(1, sigma[..., None].expand_as(y)), atol=1e-12, rtol=0)


def test_permutation_equivariance_in_distribution():
    """Statistical: the sampled cycle is uniform over the (n − 1)! directed Hamiltonian cycles, so its
    law ignores labels; with the coupled identity above, the law of f(x[σ]) is that of f(x)[σ].
    Checked on n = 4: cycle frequencies ≈ 1/6 each, and the Monte-Carlo mean of training-mode
    outputs for x[σ] matches the exact mean over all 6 cycles for x, permuted by σ."""
    torch.manual_seed(3)
    attn = make().train()
    n, B = 4, 6000
    x = torch.randn(1, n, 16, dtype=torch.float64)
    mask = torch.ones(B, n, dtype=torch.bool)
    succ = successors(attn.cycle_order(mask), mask)
    cycles = [(0,) + p for p in itertools.permutations(range(1, n))]
    succ_of = {c: tuple(c[(c.index(a) + 1) % n] for a in range(n)) for c in cycles}
    counts = {c: 0 for c in cycles}
    for row in map(tuple, succ.tolist()):
        counts[next(c for c in cycles if succ_of[c] == row)] += 1
    sigma_f = math.sqrt((1 / 6) * (5 / 6) / B)
    assert all(abs(v / B - 1 / 6) < 5 * sigma_f for v in counts.values())
    # exact expectation over all cycles for x, then the Monte-Carlo mean for x[σ]
    exact = torch.stack([attn(x, context=cyc(attn, torch.tensor([c]))) for c in cycles]).mean(0)
    sigma = torch.tensor([2, 0, 3, 1])
    with torch.no_grad():
        mc = attn(x[:, sigma].expand(B, n, 16)).mean(0, keepdim=True)
    spread = torch.stack([attn(x, context=cyc(attn, torch.tensor([c]))) for c in cycles]).std(0).max()
    assert (mc - exact[:, sigma]).abs().max() < 5 * spread / math.sqrt(B)


def test_training_draws_fresh_cycles_reproducibly():
    attn = make().train()
    x = torch.randn(1, 30, 16, dtype=torch.float64).expand(2, 30, 16)  # the same cloud twice
    torch.manual_seed(5)
    y1 = attn(x)
    y2 = attn(x)
    torch.manual_seed(5)
    torch.testing.assert_close(attn(x), y1, atol=0, rtol=0)  # seeded: reproducible
    assert not torch.allclose(y1, y2)  # fresh cycle every forward
    assert not torch.allclose(y1[0], y1[1])  # ... and per sample
    shared = make(perm_scope="batch").train()
    mask = torch.ones(2, 30, dtype=torch.bool)
    o = shared.cycle_order(mask)
    assert torch.equal(o[0], o[1])


def test_context_shares_the_sparse_cycle_only():
    """The fixed sparse cycle is prepared once per context; sampled cycles stay each layer's own draw."""
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    ctx = ForwardContext()
    for m in (make(mode="sparse"), make(mode="sparse", seed=1)):
        m.eval()(x, context=ctx)
    assert len(ctx) == 1
    one, two = make(seed=0).eval(), make(seed=1).eval()
    one(x, context=ctx), two(x, context=ctx)
    assert len(ctx) == 3
    torch.testing.assert_close(one(x, context=ctx), one(x), atol=0, rtol=0)
    with pytest.raises(ValueError, match="already holds"):
        one.use_order(ctx, one.cycle_order(torch.ones(2, 12, dtype=torch.bool)))
    with pytest.raises(ValueError, match="context's cycle"):
        one(x[:, :5], context=ctx)


def test_eval_cycle_is_seeded():
    attn = make(seed=0).eval()
    x = torch.randn(3, 25, 16, dtype=torch.float64)
    torch.manual_seed(1)
    y1 = attn(x)
    torch.manual_seed(2)
    torch.testing.assert_close(attn(x), y1, atol=0, rtol=0)  # independent of the global RNG
    other = make(seed=1).eval()  # same weights, another layer's seed: another cycle
    assert not torch.allclose(other(x), y1)
    other.load_state_dict(attn.state_dict())  # the seed is saved with the weights
    torch.testing.assert_close(other(x), y1, atol=0, rtol=0)
    rnd = make(eval_cycle="random").eval()
    assert not torch.allclose(rnd(x), rnd(x))


def test_sparse_is_the_fixed_input_order_cycle():
    g = torch.Generator().manual_seed(6)
    attn = make(mode="sparse")
    clouds = [torch.randn(n, 16, generator=g, dtype=torch.float64) for n in (9, 4)]
    x, mask, where = scattered_batch(clouds, g)
    order = attn.cycle_order(mask)
    for b, p in enumerate(where):
        assert torch.equal(order[b, : len(p)], p)
    y = attn.train()(x, None, mask)
    torch.testing.assert_close(attn.eval()(x, None, mask), y, atol=0, rtol=0)
    torch.testing.assert_close(attn(x, None, mask, context=cyc(attn, order, mask)), y, atol=0, rtol=0)


@pytest.mark.parametrize("options", [dict(), dict(kernel="subsets", n_s=3), dict(mode="sparse")])
def test_batch_and_padding_invariance(options):
    """Eval: a cloud alone equals the same cloud in a padded batch (at scattered positions, with
    garbage padding) next to other clouds; padded rows are exactly zero."""
    g = torch.Generator().manual_seed(7)
    attn = make(**options).eval()
    clouds = [torch.randn(n, 16, generator=g, dtype=torch.float64) for n in (37, 80, 5, 1)]
    x, mask, where = scattered_batch(clouds, g)
    with torch.no_grad():
        y = attn(x, None, mask)
        for b, c in enumerate(clouds):
            torch.testing.assert_close(y[b, where[b]], attn(c[None])[0], atol=1e-10, rtol=0)
    assert torch.all(y[~mask] == 0)


def test_single_point_and_all_but_one_padded():
    attn = make()
    x = torch.randn(1, 1, 16, dtype=torch.float64)
    expect = attn.out_linear(attn.w_v(x))  # one point: its only key is itself
    torch.testing.assert_close(attn(x), expect, atol=1e-12, rtol=0)
    xb = torch.randn(1, 10, 16, dtype=torch.float64)
    xb[0, 6] = x[0, 0]
    mask = torch.zeros(1, 10, dtype=torch.bool)
    mask[0, 6] = True
    y = attn(xb, None, mask)
    torch.testing.assert_close(y[0, 6], expect[0, 0], atol=1e-12, rtol=0)
    assert torch.all(y[0, mask[0].logical_not()] == 0)


def test_gradients_finite_and_correct():
    g = torch.Generator().manual_seed(8)
    attn = make(dim=8, heads=3)
    x = torch.randn(2, 7, 8, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(2, 7, generator=g) > 0.3
    mask[:, 0] = True
    order = random_order(mask, g)
    assert torch.autograd.gradcheck(lambda x: attn(x, None, mask, context=cyc(attn, order, mask)), (x,))
    xg = torch.randn(2, 7, 8, dtype=torch.float64)
    xg[~mask] = float("nan")  # padding may hold anything
    xg.requires_grad_()
    attn.train()(xg, None, mask).pow(2).sum().backward()
    assert torch.isfinite(xg.grad).all() and torch.all(xg.grad[~mask] == 0)
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters())


@pytest.mark.parametrize("dim,heads", [(12, 3), (10, 3), (7, 1)])
def test_odd_heads(dim, heads):
    g = torch.Generator().manual_seed(9)
    roll, ref = make(dim, heads), make(dim, heads, kernel="subsets", n_s=4)
    ref.load_state_dict(roll.state_dict())
    x = torch.randn(2, 13, dim, generator=g, dtype=torch.float64)
    mask = torch.ones(2, 13, dtype=torch.bool)
    mask[1, 9:] = False
    order = random_order(mask, g)
    torch.testing.assert_close(roll(x, None, mask, context=cyc(roll, order, mask)),
                               ref(x, None, mask, context=cyc(ref, order, mask)), atol=1e-12, rtol=0)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_dtypes(dtype, tol):
    g = torch.Generator().manual_seed(10)
    attn = make().eval()
    x = torch.randn(2, 20, 16, generator=g, dtype=torch.float64)
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[0, 15:] = False
    y64 = attn(x, None, mask)
    low = make().to(dtype).eval()
    low.load_state_dict(attn.state_dict())
    y = low(x.to(dtype), None, mask)
    assert y.dtype == dtype and torch.all(y[~mask] == 0)
    assert (y.double() - y64).abs().max() < tol * y64.abs().max()


def test_bad_inputs():
    attn = make()
    x = torch.randn(1, 10, 16, dtype=torch.float64)
    bad = x.clone()
    bad[0, 3, 2] = float("nan")
    with pytest.raises(ValueError, match="x contains NaN or inf"):
        attn(bad)
    bad[0, 3, 2] = float("inf")
    with pytest.raises(ValueError, match="x contains NaN or inf"):
        attn(bad)
    with pytest.raises(ValueError, match="empty"):
        attn(x, None, torch.zeros(1, 10, dtype=torch.bool))
    with pytest.raises(ValueError, match="empty"):
        attn(x[:, :0])
    with pytest.raises(ValueError, match="mask has shape"):
        attn(x, None, torch.ones(1, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match="feature size"):
        attn(torch.randn(1, 10, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="pos must have shape"):
        attn(x, torch.randn(1, 9, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="order"):
        cyc(attn, torch.zeros(1, 10, dtype=torch.int64))
    mask = torch.ones(1, 10, dtype=torch.bool)
    mask[0, 0] = False
    with pytest.raises(ValueError, match="order"):  # a padded point listed among the real ones
        cyc(attn, torch.arange(10)[None], mask)
    for bad_opt in (dict(mode="dense"), dict(kernel="sequential"), dict(n_s=1), dict(perm_scope="head"),
                    dict(eval_cycle="none"), dict(heads=0)):
        with pytest.raises(ValueError, match=next(iter(bad_opt))):
            SampledAttention(16, **{"heads": 4, **bad_opt})


@pytest.mark.parametrize("chunk", [1, 4, 5, 2048])
def test_chunked_cycle_walk_equals_batched_roll(chunk):
    """Without autograd the kernel walks each cycle in chunks (successor = next row, wrapping to the
    cycle's first point); it equals the batched roll kernel for chunks that do and do not divide n,
    with padding, a one-point cloud and an empty padded row count."""
    g = torch.Generator().manual_seed(11)
    attn = make()
    clouds = [torch.randn(n, 16, generator=g, dtype=torch.float64) for n in (12, 6, 1)]
    x, mask, _ = scattered_batch(clouds, g)
    order = random_order(mask, g)
    ref = attn(x, None, mask, context=cyc(attn, order, mask))  # autograd on: batched path
    with torch.no_grad():
        got = attn.zero_padding(attn._roll_along_cycle(x.masked_fill(~mask[..., None], 0.0), mask, order, chunk),
                                mask)
        assert torch.equal(attn(x, None, mask, context=cyc(attn, order, mask)), attn._roll_along_cycle(
            x.masked_fill(~mask[..., None], 0.0), mask, order))  # forward without grad takes this path
    torch.testing.assert_close(got, ref.detach(), atol=1e-12, rtol=0)
