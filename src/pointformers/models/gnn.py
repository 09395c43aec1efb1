"""GNN baselines of HEPT's Table 1 for tracking: DGCNN (EdgeConv) and GravNet on kNN graphs built on the fly.

Both follow the HEPT authors' baseline skeleton (HEPT paper, Sec. 6.2 and App. C.2; ``gnns.py`` of
the authors' repository, Graph-COM/HEPT) so that only the token mixer differs from HEPT:

    h₀ = feat_encoder(x)  (Linear → ReLU → Linear)
    for each layer:  h ← h + Drop(conv(pre(h)))      pre = LayerNorm → Linear
                     h ← h + Drop(FFN(LN(h)))        FFN = Linear → ReLU → Linear
    e = W[h₀ ‖ … ‖ h_L]  (no bias);  out = e + Drop(MLP(e))   (the 5-layer, 256-wide tanh head)

* ``edgeconv`` -- DGCNN's dynamic EdgeConv (Wang et al. 2019) as the authors modify it: the
  kNN graph (k neighbours, the point itself included) is built on ``lin_s(h)``, a linear
  projection to ``knn_dim`` dimensions, then ``h'_i = mean_j θ([h_i, h_j − h_i])`` with
  θ = Linear(2C, C) → LN → ReLU → Linear(C, C) → LN → ReLU. The neighbour search is not
  differentiable, so ``lin_s`` receives no gradient and acts as a fixed random projection,
  exactly as in the authors' code.
* ``gravnet`` -- GravNet (Qasim et al. 2019): coordinates ``s = lin_s(h)`` (``knn_dim``) and
  features ``f = lin_h(h)`` (``propagate_dim``); kNN in s (self included); edge weights
  ``w_ij = exp(−‖s_i − s_j‖²·exp(θ))`` with a learnable θ (initialised at log 10, GravNet's
  factor); ``h'_i = lin_out1(h_i) + lin_out2([mean_j w_ij f_j ‖ max_j w_ij f_j])``.

Graphs are rebuilt in every layer and every forward pass, so their construction is part of the
inference time, as the paper measures it for real-time use. The kNN search is plain torch:
``torch.cdist`` + ``topk`` over row chunks (memory O(chunk·n)), and the messages are computed over
row chunks too, so memory stays O(n·k) plus one chunk's O(chunk·k·C) work space.

``coords`` is accepted (and shape-checked) so the models are drop-in replacements for
``hept-tracking`` (``model(x, coords) -> (n, 12)``); like the authors' DGCNN and GravNet they do
not use it: the graph lives in a learned space of the features, which already contain r, φ, z, η.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..data.batch import accepts_flat_inputs
from ..nn import MLP, FeedForward
from .registry import register_model

__all__ = ["knn_graph", "EdgeConvLayer", "GravNetLayer", "KNNGraphNet", "GNN_TRACKING_DEFAULTS"]

#: Entries of one chunk's distance block / message tensor.
DEFAULT_CHUNK_ELEMS = 1 << 22

#: The authors' GNN tracking configuration (``tracking_gnn_{dgcnn,gravnet}.yaml``): 4 layers,
#: k = 32, knn_dim = 32, 12-d output; widths 64 (DGCNN) / 72 (GravNet) in their code, re-tuned here
#: to the HEPT parameter count (see ``configs/tracking-{edgeconv,gravnet}-small.yaml``).
GNN_TRACKING_DEFAULTS = dict(in_dim=15, coord_dim=6, n_layers=4, out_dim=12, k=32, knn_dim=32, mlp_hidden=256,
                             mlp_layers=5, dropout=0.1)


def knn_graph(points: torch.Tensor, k: int, chunk_elems: int = DEFAULT_CHUNK_ELEMS) -> torch.Tensor:
    """Indices ``(n, min(k, n))`` of each point's nearest points (L2), itself included, nearest first.

    Chunked over rows: each chunk computes a ``(rows, n)`` distance block with ``torch.cdist`` and
    keeps its ``topk``; memory O(chunk_elems + n·k). Not differentiable (indices only).

    Args:
        points: ``(n, s)`` floating, finite.
        k: neighbours per point (clamped to n).
    """
    if not isinstance(points, torch.Tensor) or points.dim() != 2 or not points.is_floating_point():
        raise ValueError(f"points: expected a floating tensor of shape (n, s), got "
                         f"{tuple(points.shape) if isinstance(points, torch.Tensor) else type(points).__name__}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k: must be an integer >= 1, got {k!r}")
    n = points.shape[0]
    kk = min(k, n)
    if n == 0:
        return torch.zeros(0, kk, dtype=torch.long, device=points.device)
    p = points.detach()
    if p.dtype in (torch.float16, torch.bfloat16):  # distances in float32 (half has no CPU cdist, and few bits)
        p = p.float()
    rows = max(1, chunk_elems // n)
    out = []
    for s in range(0, n, rows):
        d = torch.cdist(p[s:s + rows], p)  # (rows, n)
        # The point itself first even when duplicates tie at distance 0 (GravNet/DGCNN include it).
        r = torch.arange(s, min(n, s + rows), device=p.device)
        d[r - s, r] = -1.0
        out.append(torch.topk(d, kk, dim=1, largest=False, sorted=True).indices)
    return torch.cat(out)


def _row_chunks(n: int, k: int, width: int, chunk_elems: int) -> int:
    return max(1, chunk_elems // max(1, k * width))


class EdgeConvLayer(nn.Module):
    """Dynamic EdgeConv on a kNN graph of ``lin_s(h)`` (see the module docstring).

    Args:
        dim: width C (in and out). k: neighbours (self included). knn_dim: graph space size.
    Shapes: (n, C) -> (n, C).
    """

    def __init__(self, dim: int, k: int = 32, knn_dim: int = 32, chunk_elems: int = DEFAULT_CHUNK_ELEMS):
        super().__init__()
        self.k, self.chunk_elems = k, chunk_elems
        self.lin_s = nn.Linear(dim, knn_dim)
        self.lin1 = nn.Linear(2 * dim, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.lin2 = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        n, C = h.shape
        idx = knn_graph(self.lin_s(h), self.k, self.chunk_elems)  # (n, k)
        # Linear(2C→C) on [h_i, h_j − h_i] = (W_a − W_b) h_i + W_b h_j + b: two (n, C) products,
        # then one gather per edge instead of an (n·k, 2C) matmul.
        w_a, w_b = self.lin1.weight[:, :C], self.lin1.weight[:, C:]
        centre = h @ (w_a - w_b).t() + self.lin1.bias
        nbr = h @ w_b.t()
        step = _row_chunks(n, idx.shape[1], C, self.chunk_elems)
        out = []
        for s in range(0, n, step):
            m = centre[s:s + step, None, :] + nbr[idx[s:s + step]]  # (rows, k, C)
            m = torch.relu(self.norm1(m))
            m = torch.relu(self.norm2(self.lin2(m)))
            out.append(m.mean(1))
        return torch.cat(out)


class GravNetLayer(nn.Module):
    """GravNet on a kNN graph of learned coordinates (see the module docstring).

    Args:
        dim: width C (in and out). k: neighbours (self included). knn_dim: coordinate space S.
        propagate_dim: message features P.
    Shapes: (n, C) -> (n, C).
    """

    def __init__(self, dim: int, k: int = 32, knn_dim: int = 32, propagate_dim: int = 32,
                 chunk_elems: int = DEFAULT_CHUNK_ELEMS):
        super().__init__()
        self.k, self.chunk_elems = k, chunk_elems
        self.lin_s = nn.Linear(dim, knn_dim)
        self.lin_h = nn.Linear(dim, propagate_dim)
        self.lin_out1 = nn.Linear(dim, dim, bias=False)
        self.lin_out2 = nn.Linear(2 * propagate_dim, dim)
        # log of the distance scale: w = exp(−d²·exp(θ)); GravNet's fixed factor is 10.
        self.log_scale = nn.Parameter(torch.tensor([math.log(10.0)]))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        n = h.shape[0]
        s_all = self.lin_s(h)
        f_all = self.lin_h(h)
        idx = knn_graph(s_all, self.k, self.chunk_elems)
        scale = self.log_scale.exp()
        step = _row_chunks(n, idx.shape[1], s_all.shape[1] + f_all.shape[1], self.chunk_elems)
        agg = []
        for s in range(0, n, step):
            j = idx[s:s + step]
            d2 = (s_all[s:s + step, None, :] - s_all[j]).pow(2).sum(-1)  # (rows, k)
            msg = torch.exp(-d2 * scale).unsqueeze(-1) * f_all[j]  # (rows, k, P)
            agg.append(torch.cat([msg.mean(1), msg.amax(1)], -1))
        return self.lin_out1(h) + self.lin_out2(torch.cat(agg))


class _GNNBlock(nn.Module):
    """h ← h + Drop(conv(Linear(LN(h)))); h ← h + Drop(FFN(LN(h))). (n, C) -> (n, C)."""

    def __init__(self, dim: int, conv: nn.Module, dropout: float):
        super().__init__()
        self.pre = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim))
        self.conv = conv
        self.norm2 = nn.LayerNorm(dim)
        self.ff = FeedForward(dim, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.dropout(self.conv(self.pre(h)))
        return h + self.dropout(self.ff(self.norm2(h)))


class KNNGraphNet(nn.Module):
    """Per-hit embeddings from a GNN on dynamic kNN graphs (DGCNN/EdgeConv or GravNet layers).

    Args:
        in_dim: input features F. coord_dim: kernel-coordinate columns c (checked, unused).
        conv: ``"edgeconv"`` or ``"gravnet"``. hidden: width C. n_layers: GNN blocks.
        out_dim: embedding size. k: graph neighbours (self included). knn_dim: graph space size.
        propagate_dim: GravNet message width. mlp_hidden, mlp_layers: the output head.
        dropout: residual/head dropout. chunk_elems: work-space size of the chunked loops.
    Shapes: forward(x (N, F) or (B, N, F), coords (N, c) or (B, N, c), mask (B, N) | None)
    -> (N, out_dim) or (B, N, out_dim); padded rows are zero and each cloud's graph only links
    its own real points. A 2-D x without an index is one cloud; PyG-style several clouds:
    forward(x (N, F), coords (N, c) | None, batch=b (N,) | ptr=p (B + 1,)) -> (N, out_dim), hit for
    hit the padded call's output (one graph per cloud).
    """

    def __init__(self, in_dim: int = 15, coord_dim: int = 6, conv: str = "edgeconv", hidden: int = 64,
                 n_layers: int = 4, out_dim: int = 12, k: int = 32, knn_dim: int = 32, propagate_dim: int = 32,
                 mlp_hidden: int = 256, mlp_layers: int = 5, dropout: float = 0.1,
                 chunk_elems: int = DEFAULT_CHUNK_ELEMS):
        super().__init__()
        for name, v in (("in_dim", in_dim), ("coord_dim", coord_dim), ("hidden", hidden), ("n_layers", n_layers),
                        ("out_dim", out_dim), ("k", k), ("knn_dim", knn_dim), ("propagate_dim", propagate_dim),
                        ("mlp_hidden", mlp_hidden), ("mlp_layers", mlp_layers), ("chunk_elems", chunk_elems)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {v!r}")
        if mlp_layers < 2:
            raise ValueError(f"mlp_layers: must be >= 2 (input and output layer), got {mlp_layers}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
            raise ValueError(f"dropout: must be a number in [0, 1), got {dropout!r}")
        if conv not in ("edgeconv", "gravnet"):
            raise ValueError(f"conv: expected 'edgeconv' or 'gravnet', got {conv!r}")
        self.in_dim, self.coord_dim, self.conv_type, self.k = in_dim, coord_dim, conv, k

        def make_conv() -> nn.Module:
            if conv == "edgeconv":
                return EdgeConvLayer(hidden, k, knn_dim, chunk_elems)
            return GravNetLayer(hidden, k, knn_dim, propagate_dim, chunk_elems)

        self.feat_encoder = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
        self.blocks = nn.ModuleList(_GNNBlock(hidden, make_conv(), dropout) for _ in range(n_layers))
        self.W = nn.Linear(hidden * (n_layers + 1), out_dim, bias=False)
        self.mlp_out = MLP([out_dim] + [mlp_hidden] * (mlp_layers - 1) + [out_dim])
        self.dropout = nn.Dropout(dropout)

    def _embed_cloud(self, x: torch.Tensor) -> torch.Tensor:
        h = self.feat_encoder(x)
        hs = [h]
        for block in self.blocks:
            h = block(h)
            hs.append(h)
        e = self.W(torch.cat(hs, -1))
        return e + self.dropout(self.mlp_out(e))

    @accepts_flat_inputs(2, 2, per_point=True)
    def forward(self, x: torch.Tensor, coords: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() not in (2, 3) or not x.is_floating_point():
            raise ValueError(f"x: expected floating (N, {self.in_dim}) or (B, N, {self.in_dim}) features, got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        single = x.dim() == 2
        if single:
            x = x[None]
            coords = None if coords is None else coords[None]
            mask = None if mask is None else mask[None]
        B, N, F = x.shape
        if F != self.in_dim:
            raise ValueError(f"x: expected {self.in_dim} features per hit, got shape {tuple(x.shape[1:] if single else x.shape)}")
        if coords is not None and (not isinstance(coords, torch.Tensor) or tuple(coords.shape) != (B, N, self.coord_dim)):
            raise ValueError(f"coords: expected shape {(N, self.coord_dim) if single else (B, N, self.coord_dim)}, got "
                             f"{tuple(coords.shape) if isinstance(coords, torch.Tensor) else type(coords).__name__}")
        if mask is None:
            mask = torch.ones(B, N, dtype=torch.bool, device=x.device)
        elif not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (B, N):
            raise ValueError(f"mask: expected a bool tensor of shape {(B, N)}, got "
                             f"{(mask.dtype, tuple(mask.shape)) if isinstance(mask, torch.Tensor) else type(mask).__name__}")
        if N == 0 or not bool(mask.any(1).all()):
            raise ValueError("x: every cloud needs at least one (real) hit")
        if not bool(torch.isfinite(x[mask]).all()):
            raise ValueError("x: contains non-finite values at real hits")
        # one graph per cloud, over its real hits only; the output takes the embeddings' dtype (under
        # autocast the layers' compute dtype, not the input's)
        embedded = [self._embed_cloud(x[b, mask[b]]) for b in range(B)]
        out = embedded[0].new_zeros(B, N, embedded[0].shape[-1])
        for b, e in enumerate(embedded):
            out[b, mask[b]] = e.to(out.dtype)
        return out[0] if single else out

    def export_refusal(self) -> str | None:
        """Why this model cannot be exported (see :func:`pointformers.attention.set_exportable`)."""
        return KNN_EXPORT_REFUSAL


#: Why the k-NN graph networks have no exported graph (their registry entries and ``export_refusal``).
KNN_EXPORT_REFUSAL = ("its kNN graph is rebuilt in every layer by a chunked search whose chunk count depends on "
                      "the point count")


@register_model("tracking-edgeconv", export=KNN_EXPORT_REFUSAL)
def tracking_edgeconv(**options) -> KNNGraphNet:
    """DGCNN-style (dynamic EdgeConv) tracking baseline; options of :class:`KNNGraphNet` override."""
    return KNNGraphNet(**{**GNN_TRACKING_DEFAULTS, "conv": "edgeconv", "hidden": 64, **options})


@register_model("tracking-gravnet", export=KNN_EXPORT_REFUSAL)
def tracking_gravnet(**options) -> KNNGraphNet:
    """GravNet-style tracking baseline; options of :class:`KNNGraphNet` override."""
    return KNNGraphNet(**{**GNN_TRACKING_DEFAULTS, "conv": "gravnet", "hidden": 72, **options})
