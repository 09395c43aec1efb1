"""Serialized patch attention: hand-computed curve codes, patch reference, curves per layer, contract."""
import pytest
import torch
from padded_batches import cloud, scattered_batch

from pointformers.attention import ForwardContext
from pointformers.attention.full import FullAttention
from pointformers.attention.registry import build
from pointformers.attention.serialized import SerializedAttention
from pointformers.attention.space_filling import CURVES, curve_code, hilbert_code, quantize, serialize, z_order_code


def make(dim=16, heads=4, patch_size=8, seed=0, **kw):
    torch.manual_seed(seed)
    return SerializedAttention(dim, heads, patch_size=patch_size, **kw).double()


def grid(side, P):
    return torch.cartesian_prod(*[torch.arange(side)] * P).view(-1, P)


def test_registered():
    assert isinstance(build("serialized", dim=8, heads=2, patch_size=4), SerializedAttention)


def test_z_order_codes_by_hand():
    # 4×4 grid, bits = 2: code bits are x1 y1 x0 y0 (axis 0 most significant within a level)
    expect = torch.tensor([[0, 1, 4, 5],
                           [2, 3, 6, 7],
                           [8, 9, 12, 13],
                           [10, 11, 14, 15]])  # expect[x, y]
    g = grid(4, 2)
    assert torch.equal(z_order_code(g, 2), expect[g[:, 0], g[:, 1]])
    pts = torch.tensor([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1], [2, 0, 0], [3, 3, 3]])
    assert z_order_code(pts, 2).tolist() == [4, 2, 1, 7, 32, 63]


def test_hilbert_codes_by_hand():
    # the textbook second-order curve on a 4×4 grid (x = axis 0), cell by cell
    path = [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (0, 3), (1, 3), (1, 2),
            (2, 2), (2, 3), (3, 3), (3, 2), (3, 1), (2, 1), (2, 0), (3, 0)]
    assert hilbert_code(torch.tensor(path), 2).tolist() == list(range(16))
    assert hilbert_code(torch.tensor([(0, 0), (0, 1), (1, 1), (1, 0)]), 1).tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("P,bits", [(2, 3), (3, 2), (3, 3), (4, 2)])
def test_hilbert_is_a_continuous_hierarchical_curve(P, bits):
    """A bijection onto 0..2^(P·bits)−1; consecutive codes are grid neighbours; each half-size
    sub-cube is a contiguous code range (the curve finishes one before entering the next)."""
    g = grid(1 << bits, P)
    h = hilbert_code(g, bits)
    assert torch.equal(h.sort().values, torch.arange(len(g)))
    walk = g[h.argsort()]
    assert torch.all((walk[1:] - walk[:-1]).abs().sum(-1) == 1)
    octant = _interleave_top_bits(g, bits)
    assert torch.equal(h >> (P * (bits - 1)), _relabel(octant, h))


def _interleave_top_bits(g, bits):
    return ((g >> (bits - 1)) * (1 << torch.arange(g.shape[1]))).sum(-1)


def _relabel(octant, h):
    """Octant ids renumbered in the order the curve visits them: equal to h >> (P·(bits−1)) iff
    every octant is one contiguous run of codes."""
    order = octant[h.argsort()]
    first = [int(o) for i, o in enumerate(order) if i == 0 or o != order[i - 1]]
    assert len(first) == len(set(first))  # each octant entered once
    lookup = {o: i for i, o in enumerate(first)}
    return torch.tensor([lookup[int(o)] for o in octant])


def test_quantize_is_per_cloud_cubic_and_invariant():
    g = torch.Generator().manual_seed(0)
    pos = torch.randn(1, 50, 3, generator=g, dtype=torch.float64) * torch.tensor([1.0, 0.25, 0.1], dtype=torch.float64)
    mask = torch.ones(1, 50, dtype=torch.bool)
    q = quantize(pos, mask, 8)
    assert q.min() == 0 and q[..., 0].max() == 255  # the largest extent spans the grid
    assert q[..., 1].max() < 128 and q[..., 2].max() < 64  # cubic cells keep the aspect ratio
    for curve in CURVES:  # codes ignore translation and scale of the cloud
        assert torch.equal(curve_code(pos, mask, curve), curve_code(3.0 * pos + 7.0, mask, curve))
    big = torch.cat([pos, torch.full((1, 5, 3), 1e9, dtype=torch.float64)], 1)  # padding ignored
    m2 = torch.cat([mask, torch.zeros(1, 5, dtype=torch.bool)], 1)
    assert torch.equal(quantize(big, m2, 8)[:, :50], q) and torch.all(quantize(big, m2, 8)[:, 50:] == 0)


def test_serialize_sorts_real_points_stably_padding_last():
    pos = torch.tensor([[[0.9], [0.1], [0.5], [0.1], [7.0], [0.0]]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, True, False, True]])
    assert serialize(pos, mask, "z", bits=4).tolist() == [[5, 1, 3, 2, 0, 4]]


def test_curve_varies_with_layer_index():
    assert [make(layer_index=i).curve for i in range(5)] == ["z", "z-trans", "hilbert", "hilbert-trans", "z"]
    assert make(curve="hilbert", layer_index=1).curve == "hilbert"
    g = torch.Generator().manual_seed(1)
    pos = torch.rand(1, 200, 3, generator=g, dtype=torch.float64)
    orders = [make(layer_index=i).serialize(pos) for i in range(4)]
    assert all(not torch.equal(orders[i], orders[j]) for i in range(4) for j in range(i))


@pytest.mark.parametrize("curve", CURVES)
@pytest.mark.parametrize("shift,patch_size", [(False, 8), (True, 8), (False, 5), (True, 3)])
def test_equals_dense_reference_within_patches(curve, shift, patch_size):
    g = torch.Generator().manual_seed(2)
    attn = make(patch_size=patch_size, curve=curve, shift=shift)
    x, pos, mask, _ = scattered_batch([cloud(n, g) for n in (29, 12, 1, 8)], g)
    y = attn(x, pos, mask)
    torch.testing.assert_close(y, attn.reference(x, pos, mask), atol=1e-12, rtol=0)
    # the pattern: patches are runs of the curve order inside one cloud, never across clouds
    order = attn.serialize(pos, mask)
    allowed = attn.attention_pattern(mask, order)
    b, n = 0, 29
    run = order[b, :n]
    off = attn.offset
    for start in range(-off, n, patch_size):
        members = run[max(start, 0): start + patch_size]
        block = allowed[b][members][:, members]
        assert block.all() and allowed[b][members].sum() == len(members) ** 2


def test_patch_of_one_and_patch_covering_the_cloud():
    g = torch.Generator().manual_seed(3)
    x, pos, mask, where = scattered_batch([cloud(20, g), cloud(11, g)], g)
    one = make(patch_size=1)
    torch.testing.assert_close(one(x, pos, mask), one.zero_padding(one.out_linear(one.w_v(x.nan_to_num(0.0))), mask),
                               atol=1e-12, rtol=0)
    whole = make(patch_size=64)
    full = FullAttention(16, 4).double()
    full.load_state_dict(whole.state_dict())
    y = whole(x, pos, mask)
    for b in range(2):
        torch.testing.assert_close(y[b, where[b]], full(x[b:b + 1, where[b]])[0], atol=1e-12, rtol=0)


def test_batch_and_padding_invariance():
    g = torch.Generator().manual_seed(4)
    for curve, shift in (("z", False), ("hilbert", True)):
        attn = make(curve=curve, shift=shift).eval()
        clouds = [cloud(n, g) for n in (37, 80, 5, 1)]
        x, pos, mask, where = scattered_batch(clouds, g)
        with torch.no_grad():
            y = attn(x, pos, mask)
            for b, (xc, pc) in enumerate(clouds):
                torch.testing.assert_close(y[b, where[b]], attn(xc[None], pc[None])[0], atol=1e-10, rtol=0)
        assert torch.all(y[~mask] == 0)


def test_deterministic_and_order_reuse():
    g = torch.Generator().manual_seed(5)
    attn = make()
    x, pos = cloud(40, g)
    x, pos = x[None], pos[None]
    y = attn.train()(x, pos)
    torch.testing.assert_close(attn.eval()(x, pos), y, atol=0, rtol=0)
    order = attn.serialize(pos)
    ctx = attn.use_order(ForwardContext(), order)
    torch.testing.assert_close(attn(x, context=ctx), y, atol=0, rtol=0)  # pos not needed with an order
    # layers on one curve share the order of a context; another curve sorts for itself
    ctx = ForwardContext(pos)
    attn(x, pos, context=ctx)
    make(seed=1)(x, pos, context=ctx)
    assert len(ctx) == 1 and torch.equal(ctx.get(attn.prepare_key(), None), order)
    make(curve="hilbert")(x, pos, context=ctx)
    assert len(ctx) == 2
    with pytest.raises(ValueError, match="already holds"):
        attn.use_order(ctx, order)
    with pytest.raises(ValueError, match="context's order"):
        attn(x[:, :30], pos[:, :30], context=ctx)


def test_single_point_and_all_but_one_padded():
    attn = make()
    x, pos = torch.randn(1, 1, 16, dtype=torch.float64), torch.randn(1, 1, 3, dtype=torch.float64)
    expect = attn.out_linear(attn.w_v(x))
    torch.testing.assert_close(attn(x, pos), expect, atol=1e-12, rtol=0)
    xb, pb = torch.randn(1, 10, 16, dtype=torch.float64), torch.randn(1, 10, 3, dtype=torch.float64)
    xb[0, 6], pb[0, 6] = x[0, 0], pos[0, 0]
    mask = torch.zeros(1, 10, dtype=torch.bool)
    mask[0, 6] = True
    y = make(shift=True)(xb, pb, mask)
    torch.testing.assert_close(y[0, 6], expect[0, 0], atol=1e-12, rtol=0)
    assert torch.all(y[0, ~mask[0]] == 0)


def test_gradients_finite_and_correct():
    g = torch.Generator().manual_seed(6)
    attn = make(dim=8, heads=3, patch_size=3, shift=True)
    x = torch.randn(2, 9, 8, generator=g, dtype=torch.float64, requires_grad=True)
    pos = torch.randn(2, 9, 2, generator=g, dtype=torch.float64)
    mask = torch.rand(2, 9, generator=g) > 0.3
    mask[:, 0] = True
    assert torch.autograd.gradcheck(lambda x: attn(x, pos, mask), (x,))
    xg = torch.randn(2, 9, 8, dtype=torch.float64)
    xg[~mask] = float("nan")
    xg.requires_grad_()
    attn(xg, pos.masked_fill(~mask[..., None], float("nan")), mask).pow(2).sum().backward()
    assert torch.isfinite(xg.grad).all() and torch.all(xg.grad[~mask] == 0)
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters())


@pytest.mark.parametrize("dim,heads", [(12, 3), (10, 3), (7, 1)])
def test_odd_heads(dim, heads):
    g = torch.Generator().manual_seed(7)
    attn = make(dim, heads, patch_size=4, curve="hilbert")
    x, pos, mask, _ = scattered_batch([cloud(15, g, dim), cloud(6, g, dim)], g)
    torch.testing.assert_close(attn(x, pos, mask), attn.reference(x, pos, mask), atol=1e-12, rtol=0)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_dtypes(dtype, tol):
    g = torch.Generator().manual_seed(8)
    attn = make()
    x, pos = cloud(40, g)
    x, pos = x[None].to(dtype), pos[None].to(dtype)
    mask = torch.ones(1, 40, dtype=torch.bool)
    mask[0, 33:] = False
    y64 = attn(x.double(), pos.double(), mask)  # same (rounded) inputs, so the same order
    low = make().to(dtype)
    low.load_state_dict(attn.state_dict())
    y = low(x, pos, mask)
    assert y.dtype == dtype and torch.all(y[~mask] == 0)
    assert (y.double() - y64).abs().max() < tol * y64.abs().max()


def test_bad_inputs():
    attn = make(coord_dim=3)
    x, pos = torch.randn(1, 10, 16, dtype=torch.float64), torch.randn(1, 10, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="pos .* required"):
        attn(x)
    for value in (float("nan"), float("inf")):
        bad = pos.clone()
        bad[0, 2, 1] = value
        with pytest.raises(ValueError, match="pos contains NaN or inf"):
            attn(x, bad)
        badx = x.clone()
        badx[0, 2, 1] = value
        with pytest.raises(ValueError, match="x contains NaN or inf"):
            attn(badx, pos)
    with pytest.raises(ValueError, match="empty"):
        attn(x, pos, torch.zeros(1, 10, dtype=torch.bool))
    with pytest.raises(ValueError, match="empty"):
        attn(x[:, :0], pos[:, :0])
    with pytest.raises(ValueError, match="pos must have shape"):
        attn(x, pos[:, :9])
    with pytest.raises(ValueError, match="coordinate columns"):
        attn(x, pos[..., :2])
    with pytest.raises(ValueError, match="mask must be a bool"):
        attn(x, pos, torch.ones(1, 10))
    with pytest.raises(ValueError, match="order"):
        attn.use_order(ForwardContext(), torch.zeros(1, 10, dtype=torch.int64))
    with pytest.raises(ValueError, match="bits"):
        make(bits=30)(x, pos)  # 3 axes × 30 bits do not fit an int64 code
    for bad_opt in (dict(patch_size=0), dict(curve="peano"), dict(layer_index=-1), dict(bits=0)):
        with pytest.raises(ValueError, match=next(iter(bad_opt))):
            SerializedAttention(16, 4, **bad_opt)
