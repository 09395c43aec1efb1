"""Exact k-nearest-neighbour attention: dense reference, hand-made neighbourhoods, chunking, contract."""
import pytest
import torch
from padded_batches import cloud, scattered_batch

from pointformers.attention import ForwardContext
from pointformers.attention.full import FullAttention
from pointformers.attention.knn import KNNAttention, KNNGraph
from pointformers.attention.registry import build


def make(dim=16, heads=4, k=5, seed=0, **kw):
    torch.manual_seed(seed)
    return KNNAttention(dim, heads, k=k, **kw).double()


def test_registered():
    assert isinstance(build("knn", dim=8, heads=2, k=4), KNNAttention)


def test_neighbours_by_hand():
    """1-D points 0, 1, 3, 7, 15 with k = 2: every point and its nearest other point."""
    attn = make(k=2)
    pos = torch.tensor([[[0.0], [1.0], [3.0], [7.0], [15.0]]], dtype=torch.float64)
    graph = attn.knn_graph(pos)
    assert graph.index[0].tolist() == [[0, 1], [1, 0], [2, 1], [3, 2], [4, 3]]
    assert graph.valid.all()
    # duplicates of a point cannot push it out of its own neighbourhood
    dup = torch.zeros(1, 4, 2, dtype=torch.float64)
    assert make(k=1).knn_graph(dup).index[0, :, 0].tolist() == [0, 1, 2, 3]


def test_pattern_is_the_k_nearest_within_the_cloud():
    g = torch.Generator().manual_seed(1)
    attn = make(k=6)
    x, pos, mask, _ = scattered_batch([cloud(n, g) for n in (20, 4, 13)], g)
    allowed = attn.attention_pattern(pos, mask)
    for b in range(3):
        real = mask[b].nonzero().flatten()
        for i in range(allowed.shape[1]):
            row = allowed[b, i]
            if not mask[b, i]:
                assert not row.any()
                continue
            assert row[i] and row.sum() == min(6, len(real)) and not row[~mask[b]].any()
            d = (pos[b, real] - pos[b, i]).norm(dim=-1)
            inside = row[real]
            if (~inside).any():
                assert d[inside].max() < d[~inside].min()


@pytest.mark.parametrize("k", [1, 5, 16])
def test_equals_dense_masked_softmax_reference(k):
    g = torch.Generator().manual_seed(k)
    attn = make(k=k)
    x, pos, mask, _ = scattered_batch([cloud(n, g) for n in (30, 9, 1)], g)
    torch.testing.assert_close(attn(x, pos, mask), attn.reference(x, pos, mask), atol=1e-12, rtol=0)


def test_chunked_equals_unchunked():
    g = torch.Generator().manual_seed(2)
    clouds = [cloud(n, g) for n in (200, 70)]
    x, pos, mask, _ = scattered_batch(clouds, g)
    one = make(k=16, chunk_size=10**6)
    y = one(x, pos, mask)
    graph = one.knn_graph(pos, mask)
    for c in (1, 7, 64, None):
        attn = make(k=16, chunk_size=c)
        g2 = attn.knn_graph(pos, mask)
        assert torch.equal(g2.index[mask], graph.index[mask]) and torch.equal(g2.valid, graph.valid)
        torch.testing.assert_close(attn(x, pos, mask), y, atol=1e-13, rtol=0)


def test_k_larger_than_cloud_is_dense_attention():
    """k > n is clamped to n: every point attends to its whole cloud (= full attention)."""
    g = torch.Generator().manual_seed(3)
    attn = make(k=50)
    full = FullAttention(16, 4).double()
    full.load_state_dict(attn.state_dict())
    x, pos, mask, where = scattered_batch([cloud(7, g), cloud(60, g)], g)
    y = attn(x, pos, mask)
    torch.testing.assert_close(y[0, where[0]], full(x[:1, where[0]]).squeeze(0), atol=1e-12, rtol=0)
    assert attn.knn_graph(pos[:1, where[0]]).index.shape[-1] == 7


def test_batch_and_padding_invariance():
    g = torch.Generator().manual_seed(4)
    attn = make(k=8).eval()
    clouds = [cloud(n, g) for n in (37, 80, 5, 1)]
    x, pos, mask, where = scattered_batch(clouds, g)
    with torch.no_grad():
        y = attn(x, pos, mask)
        for b, (xc, pc) in enumerate(clouds):
            torch.testing.assert_close(y[b, where[b]], attn(xc[None], pc[None])[0], atol=1e-10, rtol=0)
    assert torch.all(y[~mask] == 0)


def test_deterministic_and_graph_reuse():
    g = torch.Generator().manual_seed(5)
    attn = make(k=4)
    x, pos = cloud(40, g)
    x, pos = x[None], pos[None]
    y = attn.train()(x, pos)
    torch.testing.assert_close(attn.eval()(x, pos), y, atol=0, rtol=0)
    # layers with equal k share one graph through the context; another k builds its own
    ctx = ForwardContext(pos)
    torch.testing.assert_close(attn(x, pos, context=ctx), y, atol=0, rtol=0)
    twin, other = make(k=4, seed=1), make(k=6)
    twin(x, pos, context=ctx)
    assert len(ctx) == 1 and torch.equal(ctx.get(twin.prepare_key(), None).index, attn.knn_graph(pos).index)
    other(x, pos, context=ctx)
    assert len(ctx) == 2
    torch.testing.assert_close(attn(x, pos, context=ctx), y, atol=0, rtol=0)
    with pytest.raises(ValueError, match="graph was built"):
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
    y = attn(xb, pb, mask)
    torch.testing.assert_close(y[0, 6], expect[0, 0], atol=1e-12, rtol=0)
    assert torch.all(y[0, ~mask[0]] == 0)


def test_gradients_finite_and_correct():
    g = torch.Generator().manual_seed(6)
    attn = make(dim=8, heads=3, k=3, chunk_size=4)
    x = torch.randn(2, 9, 8, generator=g, dtype=torch.float64, requires_grad=True)
    pos = torch.randn(2, 9, 2, generator=g, dtype=torch.float64)
    mask = torch.rand(2, 9, generator=g) > 0.3
    mask[:, 0] = True
    assert torch.autograd.gradcheck(lambda x: attn(x, pos, mask), (x,))
    xg = torch.randn(2, 9, 8, dtype=torch.float64)
    xg[~mask] = float("nan")
    xg.requires_grad_()
    attn(xg, pos.masked_fill(~mask[..., None], float("inf")), mask).pow(2).sum().backward()
    assert torch.isfinite(xg.grad).all() and torch.all(xg.grad[~mask] == 0)
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters())


@pytest.mark.parametrize("dim,heads", [(12, 3), (10, 3), (7, 1)])
def test_odd_heads(dim, heads):
    g = torch.Generator().manual_seed(7)
    attn = make(dim, heads, k=4)
    x, pos, mask, _ = scattered_batch([cloud(15, g, dim), cloud(6, g, dim)], g)
    torch.testing.assert_close(attn(x, pos, mask), attn.reference(x, pos, mask), atol=1e-12, rtol=0)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_dtypes(dtype, tol):
    g = torch.Generator().manual_seed(8)
    attn = make(k=6)
    x, pos = cloud(40, g)
    x, pos = x[None].to(dtype), pos[None].to(dtype)
    mask = torch.ones(1, 40, dtype=torch.bool)
    mask[0, 33:] = False
    y64 = attn(x.double(), pos.double(), mask)  # same (rounded) inputs, so the same neighbours
    low = make(k=6).to(dtype)
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
    with pytest.raises(ValueError, match="mask has shape"):
        attn(x, pos, torch.ones(2, 10, dtype=torch.bool))
    ctx = ForwardContext()
    ctx.get(attn.prepare_key(), lambda: KNNGraph(torch.zeros(1, 9, 3, dtype=torch.int64),
                                                 torch.ones(1, 9, 3, dtype=torch.bool)))
    with pytest.raises(ValueError, match="graph was built"):
        attn(x, pos, context=ctx)
    for bad_opt in (dict(k=0), dict(coord_dim=0), dict(chunk_size=0)):
        with pytest.raises(ValueError, match=next(iter(bad_opt))):
            KNNAttention(16, 4, **bad_opt)
