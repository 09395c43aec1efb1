"""kNN-graph GNN baselines: chunked kNN, layers against slow per-edge references, invariances, errors."""
from __future__ import annotations

import pytest
import torch

from pointformers import models
from pointformers.models.gnn import EdgeConvLayer, GravNetLayer, KNNGraphNet, knn_graph


def test_knn_graph_matches_brute_force_and_chunking():
    g = torch.Generator().manual_seed(0)
    pts = torch.randn(301, 5, generator=g)
    ref = torch.cdist(pts, pts).argsort(dim=1)[:, :7]
    for chunk in (1 << 22, 301 * 4, 50):  # whole, several rows, less than one row per chunk
        idx = knn_graph(pts, 7, chunk_elems=chunk)
        assert torch.equal(idx, ref)
    assert torch.equal(knn_graph(pts, 7)[:, 0], torch.arange(301))  # itself first
    dup = torch.zeros(4, 2)  # exact duplicates: the point itself still comes first
    assert torch.equal(knn_graph(dup, 2)[:, 0], torch.arange(4))
    assert knn_graph(pts[:3], 10).shape == (3, 3)  # k clamped to the cloud size
    with pytest.raises(ValueError, match="k"):
        knn_graph(pts, 0)
    with pytest.raises(ValueError, match="points"):
        knn_graph(pts[:, 0], 3)


def _edgeconv_reference(layer: EdgeConvLayer, h: torch.Tensor) -> torch.Tensor:
    idx = torch.cdist(layer.lin_s(h), layer.lin_s(h)).argsort(1)[:, :layer.k]
    out = []
    for i in range(h.shape[0]):
        e = torch.cat([h[i].expand(idx.shape[1], -1), h[idx[i]] - h[i]], -1)  # [h_i, h_j − h_i]
        m = torch.relu(layer.norm1(layer.lin1(e)))
        m = torch.relu(layer.norm2(layer.lin2(m)))
        out.append(m.mean(0))
    return torch.stack(out)


def _gravnet_reference(layer: GravNetLayer, h: torch.Tensor) -> torch.Tensor:
    s, f = layer.lin_s(h), layer.lin_h(h)
    d2 = torch.cdist(s, s) ** 2
    idx = d2.argsort(1)[:, :layer.k]
    out = []
    for i in range(h.shape[0]):
        w = torch.exp(-10.0 * d2[i, idx[i]])  # GravNet's exp(−10 d²) at initialisation
        msg = w[:, None] * f[idx[i]]
        out.append(torch.cat([msg.mean(0), msg.max(0).values]))
    return layer.lin_out1(h) + layer.lin_out2(torch.stack(out))


@pytest.mark.parametrize("chunk", [1 << 22, 64])
def test_layers_equal_per_edge_references(chunk):
    torch.manual_seed(0)
    h = torch.randn(90, 16, dtype=torch.float64)
    ec = EdgeConvLayer(16, k=9, knn_dim=4, chunk_elems=chunk).double()
    torch.testing.assert_close(ec(h), _edgeconv_reference(ec, h))
    gn = GravNetLayer(16, k=9, knn_dim=4, propagate_dim=6, chunk_elems=chunk).double()
    torch.testing.assert_close(gn(h), _gravnet_reference(gn, h))


@pytest.mark.parametrize("name", ["tracking-edgeconv", "tracking-gravnet"])
def test_models_equivariance_padding_and_small_clouds(name):
    assert name in models.available()
    torch.manual_seed(1)
    m = models.build(name, hidden=16, k=8, knn_dim=4, propagate_dim=4, mlp_hidden=16).eval()
    x, c = torch.randn(60, 15), torch.randn(60, 6)
    with torch.no_grad():
        y = m(x, c)
        assert y.shape == (60, 12) and torch.isfinite(y).all()
        perm = torch.randperm(60)
        torch.testing.assert_close(m(x[perm], c[perm]), y[perm], rtol=1e-5, atol=1e-5)  # permutation equivariant
        # a padded batch with another cloud: same rows for the real hits, zeros for the padding
        x2, c2 = torch.randn(45, 15), torch.randn(45, 6)
        xb = torch.zeros(2, 60, 15)
        cb = torch.zeros(2, 60, 6)
        xb[0], cb[0] = x, c
        xb[1, :45], cb[1, :45] = x2, c2
        xb[1, 45:] = float("nan")  # padding content is never read
        mask = torch.arange(60)[None] < torch.tensor([[60], [45]])
        yb = m(xb, cb, mask)
        torch.testing.assert_close(yb[0], y, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(yb[1, :45], m(x2, c2), rtol=1e-5, atol=1e-5)
        assert (yb[1, 45:] == 0).all()
        # clouds smaller than k: every hit is everyone's neighbour, same as k = n
        small = m(x[:5], c[:5])
        m.k = 5
        for b in m.blocks:
            b.conv.k = 5
        torch.testing.assert_close(small, m(x[:5], c[:5]))
        assert m(x[:1], c[:1]).shape == (1, 12)


def test_gradients_edgeconv_projection_is_fixed_gravnet_space_is_learned():
    torch.manual_seed(2)
    x, c = torch.randn(40, 15), torch.randn(40, 6)
    for name, learns_space in (("tracking-edgeconv", False), ("tracking-gravnet", True)):
        m = models.build(name, hidden=16, k=6, knn_dim=4, propagate_dim=4, mlp_hidden=16)
        m(x, c).pow(2).sum().backward()
        g = m.blocks[0].conv.lin_s.weight.grad
        # the kNN search is not differentiable: EdgeConv's projection only chooses neighbours
        assert (g is not None and g.abs().sum() > 0) == learns_space
        trained = m.blocks[0].conv.log_scale if learns_space else m.blocks[0].conv.lin1.weight
        assert trained.grad.abs().sum() > 0


def test_bad_inputs():
    m = models.build("tracking-gravnet", hidden=8, k=4, knn_dim=2, propagate_dim=2, mlp_hidden=8)
    x, c = torch.randn(10, 15), torch.randn(10, 6)
    bad = x.clone()
    bad[2, 3] = float("inf")
    with pytest.raises(ValueError, match="non-finite"):
        m(bad, c)
    with pytest.raises(ValueError, match="15 features"):
        m(x[:, :14], c)
    with pytest.raises(ValueError, match="coords"):
        m(x, c[:, :2])
    with pytest.raises(ValueError, match="mask"):
        m(x[None], c[None], torch.ones(1, 10))
    with pytest.raises(ValueError, match="at least one"):
        m(x[None], c[None], torch.zeros(1, 10, dtype=torch.bool))
    with pytest.raises(ValueError, match="at least one"):
        m(x[:0], c[:0])
    with pytest.raises(ValueError, match="x:"):
        m(x.long(), c)
    with pytest.raises(ValueError, match="conv"):
        KNNGraphNet(conv="gcn")
    with pytest.raises(ValueError, match="hidden"):
        KNNGraphNet(hidden=0)
    with pytest.raises(ValueError, match="dropout"):
        KNNGraphNet(dropout=1.0)
