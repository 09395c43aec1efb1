"""Graph models (sft-graph, samsa-graph and twins) and the graph-structure encodings they use."""
import numpy as np
import pytest
import torch

from pointformers import models
from pointformers.nn.graph_structure import (CategoricalEncoder, dense_adjacency, dense_edges, laplacian_pe,
                                             one_hot_codes, random_walk_pe)

GRAPH_MODELS = ["sft-graph", "samsa-graph", "full-graph", "performer-graph", "mlp-graph"]


def _graph(n, seed, F=9, Fe=3, extra=6):
    """A path of n nodes plus ``extra`` random chords, both directions listed; random codes."""
    g = torch.Generator().manual_seed(seed)
    s = torch.arange(n - 1)
    pairs = [torch.stack([s, s + 1])]
    a, b = torch.randint(0, n, (2, extra), generator=g)
    keep = (a - b).abs() > 1
    pairs.append(torch.stack([a[keep], b[keep]]))
    und = torch.cat(pairs, 1)
    ei = torch.cat([und, und.flip(0)], 1)
    attr_und = torch.randint(0, 4, (und.shape[1], Fe), generator=g)
    ea = torch.cat([attr_und, attr_und])
    x = torch.randint(0, 12, (n, F), generator=g)
    return x, ei, ea


def _batch(graphs):
    xs, eis, eas, bs, off = [], [], [], [], 0
    for b, (x, ei, ea) in enumerate(graphs):
        xs.append(x), eis.append(ei + off), eas.append(ea), bs.append(torch.full((x.shape[0],), b))
        off += x.shape[0]
    return torch.cat(xs), torch.cat(eis, 1), torch.cat(eas), torch.cat(bs)


def _build(name, **opts):
    torch.manual_seed(0)
    return models.build(name, **opts).eval()


@pytest.mark.parametrize("name", GRAPH_MODELS)
@pytest.mark.parametrize("level", ["graph", "node"])
def test_batched_equals_one_graph_at_a_time(name, level):
    graphs = [_graph(n, i) for i, n in enumerate((23, 40, 9))]
    m = _build(name, level=level, out_dim=5, k=8)
    x, ei, ea, batch = _batch(graphs)
    with torch.no_grad():
        out = m(x, ei, ea, batch)
        by_ptr = m(x, ei, ea, ptr=torch.tensor([0, 23, 63, 72]))
        singles = [m(*g) for g in graphs]
    torch.testing.assert_close(by_ptr, out)
    if level == "graph":
        assert out.shape == (3, 5)
        torch.testing.assert_close(out, torch.cat(singles), atol=1e-5, rtol=1e-4)
    else:
        assert out.shape == (72, 5)
        torch.testing.assert_close(out, torch.cat(singles), atol=1e-5, rtol=1e-4)


def _permuted(x, ei, ea, perm):
    """The same graph with node i renamed inv[i] (x rows reordered by perm)."""
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.shape[0])
    return x[perm], inv[ei], ea


@pytest.mark.parametrize("name,opts", [("sft-graph", {}), ("sft-graph", {"rwpe_steps": 8}),
                                       ("samsa-graph", {"pe_dim": 0}), ("full-graph", {"pe_dim": 0}),
                                       ("full-graph", {"pe_dim": 8}),
                                       ("mlp-graph", {"pe_dim": 0})])
def test_permutation_equivariance(name, opts):
    """Renaming the nodes permutes node outputs and leaves graph outputs unchanged (SFT's graph RPE:
    the dense edge tensor moves with the nodes; eval's top-k has no ties on random codes). With
    Laplacian identifiers this holds where the signs are fixed by the third moment (distinct eigenvalues)."""
    x, ei, ea = _graph(30, 3)
    perm = torch.randperm(30, generator=torch.Generator().manual_seed(1))
    for level in ("graph", "node"):
        m = _build(name, level=level, out_dim=4, k=8, **opts)
        with torch.no_grad():
            a = m(x, ei, ea)
            b = m(*_permuted(x, ei, ea, perm))
        torch.testing.assert_close(b, a if level == "graph" else a[perm], atol=1e-5, rtol=1e-4)


def test_edge_order_and_direction_listing_do_not_matter():
    x, ei, ea = _graph(25, 5)
    order = torch.randperm(ei.shape[1], generator=torch.Generator().manual_seed(2))
    for name in ("sft-graph", "samsa-graph"):
        m = _build(name, k=8)
        with torch.no_grad():
            torch.testing.assert_close(m(x, ei, ea), m(x, ei[:, order], ea[order]), atol=1e-5, rtol=1e-4)


def test_the_adjacency_reaches_the_output():
    """Same nodes, different edges -> different outputs (the structure is used, not a bag of nodes)."""
    x, ei, ea = _graph(30, 7)
    _, ei2, ea2 = _graph(30, 8)
    for name, opts in (("sft-graph", {}), ("samsa-graph", {}), ("full-graph", {}), ("mlp-graph", {})):
        m = _build(name, k=8, **opts)
        with torch.no_grad():
            assert not torch.allclose(m(x, ei, ea), m(x, ei2, ea2), atol=1e-4), name


def test_models_train():
    graphs = [_graph(n, i) for i, n in enumerate((20, 31, 17, 26))]
    x, ei, ea, batch = _batch(graphs)
    target = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    for name in GRAPH_MODELS:
        m = _build(name, out_dim=2, k=8).train()
        opt = torch.optim.Adam(m.parameters(), lr=3e-3)
        losses = []
        for _ in range(30):
            loss = torch.nn.functional.binary_cross_entropy_with_logits(m(x, ei, ea, batch), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        assert losses[-1] < 0.5 * losses[0], (name, losses[0], losses[-1])


def test_continuous_features_and_no_edge_features():
    x = torch.randn(15, 14)
    s = torch.arange(14)
    ei = torch.cat([torch.stack([s, s + 1]), torch.stack([s + 1, s])], 1)
    ea = torch.rand(ei.shape[1], 2)
    for name in ("sft-graph", "samsa-graph"):
        m = _build(name, categorical=False, node_features=14, edge_features=2, level="node", out_dim=21, k=8)
        assert m(x, ei, ea).shape == (15, 21)
        m0 = _build(name, categorical=False, node_features=14, edge_features=0, out_dim=3, k=8)
        assert m0(x, ei).shape == (1, 3)


def test_bad_inputs_name_the_argument():
    x, ei, ea = _graph(12, 0)
    m = _build("sft-graph", k=4)
    with pytest.raises(ValueError, match="x must be"):
        m(x[:, :5], ei, ea)
    with pytest.raises(ValueError, match="integer node codes"):
        m(x.float(), ei, ea)
    with pytest.raises(ValueError, match="edge_attr must be"):
        m(x, ei, ea[:-1])
    with pytest.raises(ValueError, match="edge_index"):
        m(x, ei + 100, ea)
    xs, eis, eas, batch = _batch([_graph(6, 1), _graph(6, 2)])
    bad = eis.clone()
    bad[1, 0] = 8                                  # an edge from graph 0 into graph 1
    with pytest.raises(ValueError, match="two different graphs"):
        m(xs, bad, eas, batch)
    for pe_dim in (0, 4):   # the token model checks its edges with and without the Laplacian encoding
        mt = _build("samsa-graph", k=4, pe_dim=pe_dim)
        with pytest.raises(ValueError, match="two different graphs"):
            mt(xs, bad, eas, batch)
        with pytest.raises(ValueError, match="edge_index"):
            mt(x, ei + 100, ea)
    mc = _build("samsa-graph", categorical=False, node_features=9, k=4, edge_features=3)
    xf = x.float()
    xf[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        mc(xf, ei, ea.float())
    with pytest.raises(ValueError, match="sft-graph feeds the adjacency"):
        models.build("sft-graph", attention="full")
    with pytest.raises(ValueError, match="level"):
        models.build("samsa-graph", level="edge")
    with pytest.raises(ValueError, match="mlp-graph: has no attention"):
        models.build("mlp-graph", attention="samsa")


# ---------------------------------------------------------------------------------- encodings
def test_random_walk_pe_is_the_return_probability():
    x, ei, _ = _graph(10, 4)
    n = x.shape[0]
    a = np.zeros((n, n))
    a[ei[0].numpy(), ei[1].numpy()] = 1
    p = a / a.sum(1, keepdims=True)
    want = np.stack([np.diag(np.linalg.matrix_power(p, t)) for t in range(1, 6)], -1)
    adj = dense_adjacency(ei, torch.zeros(n, dtype=torch.long), torch.arange(n), 1, n, dtype=torch.float64)
    np.testing.assert_allclose(random_walk_pe(adj, 5)[0].numpy(), want, atol=1e-12)
    # padded to a larger size: the real rows unchanged, the padding zero
    adj_pad = dense_adjacency(ei, torch.zeros(n, dtype=torch.long), torch.arange(n), 1, n + 3, dtype=torch.float64)
    rw = random_walk_pe(adj_pad, 5)[0]
    np.testing.assert_allclose(rw[:n].numpy(), want, atol=1e-12)
    assert rw[n:].abs().sum() == 0


def test_laplacian_pe_eigenvectors():
    graphs = [_graph(n, i) for i, n in enumerate((12, 5))]
    xs, eis, _, batch = _batch(graphs)
    slot = torch.cat([torch.arange(12), torch.arange(5)])
    adj = dense_adjacency(eis, batch, slot, 2, 12, dtype=torch.float64)
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[0], mask[1, :5] = True, True
    pe = laplacian_pe(adj, mask, 8)
    assert pe.shape == (2, 12, 8)
    for b, n in ((0, 12), (1, 5)):
        a = adj[b, :n, :n].numpy()
        d = a.sum(1)
        lap = np.eye(n) - a / np.sqrt(np.outer(d, d))
        vals = np.linalg.eigvalsh(lap)
        v = pe[b, :n, : min(n, 8)].numpy()
        np.testing.assert_allclose(v.T @ v, np.eye(v.shape[1]), atol=1e-8)        # orthonormal
        np.testing.assert_allclose(lap @ v, v * vals[: v.shape[1]], atol=1e-8)    # the smallest eigenpairs
    assert pe[1, 5:].abs().sum() == 0 and pe[1, :, 5:].abs().sum() == 0       # padding rows / missing columns


def test_dense_edges_and_categorical_encoders():
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    vals = torch.tensor([[1.0], [2.0], [3.0]])
    d = dense_edges(ei, vals, torch.zeros(3, dtype=torch.long), torch.arange(3), 1, 4)[0, ..., 0]
    assert d[0, 1] == 1 and d[1, 2] == 2 and d[2, 0] == 3 and d.sum() == 6
    enc = CategoricalEncoder(3, 5, classes=4)
    codes = torch.tensor([[0, 3, 9], [2, 1, 0]])                         # 9 clips to the last class
    oh = one_hot_codes(codes, 4)
    assert oh.shape == (2, 12) and torch.equal(oh.sum(1), torch.tensor([3.0, 3.0])) and oh[0, 11] == 1
    w = torch.cat([enc.embed.weight], 0)                                  # one-hot @ table == embedding sum
    torch.testing.assert_close(enc(codes), oh @ w + enc.bias)
    with pytest.raises(ValueError, match="codes"):
        enc(codes.float())
    with pytest.raises(ValueError, match="classes"):
        CategoricalEncoder(3, 5, classes=0)
