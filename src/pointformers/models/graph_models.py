"""Graph transformers of the SFT and SAMSA papers (LRGB: Peptides-func, Peptides-struct, PascalVOC-sp).

Both take PyTorch Geometric's flat batch, so they drop into a PyG pipeline unchanged::

    out = model(x (ΣN, F), edge_index (2, ΣE), edge_attr (ΣE, F_e), batch (ΣN,))   # or ptr= (B + 1,)

and return (B, out_dim) for graph-level tasks (``level="graph"``) or (ΣN, out_dim) per node in the
input's order (``level="node"``). Node and edge features are integer codes (``categorical=True``:
OGB's atom and bond features in Peptides) or real values (PascalVOC-sp's superpixel statistics).

* ``sft-graph`` — :class:`SFTGraphModel` (SFT paper, exp. 2.1-2.3): nodes are the tokens, each
  categorical column "through a 17-class one-hot vectorization"
  (:class:`~pointformers.nn.graph_structure.CategoricalEncoder`);
  the adjacency is SFT's sparse high-rank relative information: a dense (B, N, N, r) tensor of the
  edge features "concatenated with 1-valued tensor" (one-hot bond codes and an edge indicator; zero
  where there is no edge), whose sampled columns bias every layer's attention (``rpe="graph"`` of
  :class:`~pointformers.attention.sft.SFTAttention`). ``rwpe_steps > 0`` is SFT-RWPE: random-walk
  return probabilities added to the node tokens (absolute PE). Head: the paper's "linear layer with
  softmax aggregation" (attention pooling) for graphs, a per-node linear layer for nodes.
* ``samsa-graph`` — :class:`TokenGraphModel` (SAMSA paper, LRGB): "the whole graph, with both node
  and edge as tokens" (one token per undirected edge). The paper gives no structural encoding;
  where it is silent we use TokenGT's: Laplacian eigenvectors P (``pe_dim`` of them, signs
  randomised in training), a node token gets Linear([P_v, P_v]), an edge token Linear([P_u, P_v])
  (averaged with Linear([P_v, P_u]): the edges are undirected), plus a node/edge type embedding. The SAMSA backbone (:class:`~.samsa_models.SAMSABackbone`), then
  masked mean pooling and an MLP (graphs) or a per-node MLP (nodes).
  ``full-graph`` and ``performer-graph`` are its twins with that mechanism in every layer;
  ``mlp-graph`` the same tokens through residual feed-forward layers with no token mixing (the
  attention-free baseline).

The dense (B, N, N, r) edge tensor of ``sft-graph`` is what the paper stores too (for
``torch.compile``; its stated limitation: large graphs do not fit).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import entry as attention_entry
from ..data.batch import FlatLayout, flat_layout
from ..nn import RMSNorm
from ..nn.graph_structure import CategoricalEncoder, check_edges, dense_adjacency, dense_edges, laplacian_pe, \
    one_hot_codes, random_walk_pe
from ..nn.pooling import masked_mean
from ..nn.transformer_block import FeedForward
from .registry import register_model
from .samsa_models import SAMSABackbone
from .sft_models import SFTEncoder

__all__ = ["SFTGraphModel", "TokenGraphModel"]

_LEVELS = ("graph", "node")


def _check_int(name: str, v, low: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ValueError(f"{name}: expected an int >= {low}, got {v!r}")
    return v


class _GraphInputs(nn.Module):
    """Shared input side: option checks, the node/edge feature encoders and the input validation."""

    def _setup(self, out_dim, level, node_features, edge_features, categorical, node_classes, edge_classes, dim):
        if level not in _LEVELS:
            raise ValueError(f"level: expected one of {_LEVELS}, got {level!r}")
        _check_int("out_dim", out_dim, 1)
        _check_int("node_features", node_features, 1)
        _check_int("edge_features", edge_features, 0)
        _check_int("node_classes", node_classes, 2)
        _check_int("edge_classes", edge_classes, 2)
        self.level, self.out_dim, self.categorical = level, out_dim, bool(categorical)
        self.node_features, self.edge_features = node_features, edge_features
        self.node_classes, self.edge_classes = node_classes, edge_classes
        self.node_encoder = (CategoricalEncoder(node_features, dim, node_classes) if categorical
                             else nn.Linear(node_features, dim))

    def _layout(self, x, edge_index, edge_attr, batch, ptr) -> FlatLayout:
        who = type(self).__name__
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != self.node_features or x.shape[0] < 1:
            raise ValueError(f"{who}: x must be (num_nodes >= 1, {self.node_features}), got "
                             f"{tuple(getattr(x, 'shape', ())) or type(x).__name__}")
        if self.categorical and x.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{who}: categorical=True needs integer node codes, got x of dtype {x.dtype}")
        if not self.categorical and not x.is_floating_point():
            raise ValueError(f"{who}: categorical=False needs floating node features, got x of dtype {x.dtype}")
        if self.edge_features:
            E = edge_index.shape[1] if isinstance(edge_index, torch.Tensor) and edge_index.dim() == 2 else None
            if not isinstance(edge_attr, torch.Tensor) or edge_attr.shape != (E, self.edge_features):
                raise ValueError(f"{who}: edge_attr must be (E, {self.edge_features}) with E = edge_index.shape[1], "
                                 f"got {tuple(getattr(edge_attr, 'shape', ())) or type(edge_attr).__name__}")
            if not self.categorical and not bool(torch.isfinite(edge_attr).all()):
                raise ValueError(f"{who}: edge_attr contains NaN or inf")
        if not self.categorical and not bool(torch.isfinite(x).all()):
            raise ValueError(f"{who}: x contains NaN or inf")
        return flat_layout(x.shape[0], batch, ptr, device=x.device)

    def _edge_values(self, edge_attr: torch.Tensor | None, num_edges: int, like: torch.Tensor) -> torch.Tensor:
        """Per-edge relative features (E, r): the edge features (one-hot codes or values) and a 1."""
        ones = like.new_ones(num_edges, 1)
        if not self.edge_features:
            return ones
        feats = one_hot_codes(edge_attr, self.edge_classes) if self.categorical else edge_attr
        return torch.cat([feats.to(like.dtype), ones], -1)


class SFTGraphModel(_GraphInputs):
    """SFT on graphs: node tokens, the dense edge tensor as relative bias (module docstring).

    Args:
        out_dim: graph targets (Peptides-func 10, -struct 11) or node classes (PascalVOC-sp 21).
        level: ``"graph"`` or ``"node"``.
        node_features, edge_features: columns F of ``x`` and F_e of ``edge_attr`` (0: no edge features,
            the indicator alone).
        categorical: integer-coded features (one-hot per column; else real values through a Linear).
        node_classes: one-hot size per node column (the paper's 17); edge_classes: per edge column.
        dim, depth, heads, k: width, layers, heads, sampled tokens per layer (SFT's k).
        rwpe_steps: 0 (SFT) or the random-walk steps of SFT-RWPE's node encoding (LRGB's 16-20).
        norm_position: ``"pre"`` (default; the spec's choice for graphs, Table 9 is garbled) or ``"post"``.
        drop_token, qk_dropout, dropout, ffn_dropout: SFT Table 9's regularisers.
        attention_options: further options of the SFT mechanism (e.g. ``rpe_hidden``).
    Shapes: x (ΣN, F), edge_index (2, ΣE), edge_attr (ΣE, F_e), batch (ΣN,) -> (B, out_dim) | (ΣN, out_dim).
    """

    def __init__(self, out_dim: int = 10, level: str = "graph", node_features: int = 9, edge_features: int = 3,
                 categorical: bool = True, node_classes: int = 17, edge_classes: int = 6, dim: int = 64,
                 depth: int = 2, heads: int = 4, k: int = 32, rwpe_steps: int = 0, norm_position: str = "pre",
                 drop_token: float = 0.0, qk_dropout: float = 0.0, dropout: float = 0.0, ffn_dropout: float = 0.0,
                 attention: str = "sft", attention_options: dict | None = None):
        super().__init__()
        self._setup(out_dim, level, node_features, edge_features, categorical, node_classes, edge_classes, dim)
        if not attention_entry(attention).accepts("rpe"):
            raise ValueError(f"attention: sft-graph feeds the adjacency as relative features, which {attention!r} "
                             "does not take; use samsa-graph (nodes and edges as tokens) for other mechanisms")
        self.rwpe_steps = _check_int("rwpe_steps", rwpe_steps, 0)
        self.edge_dim = (edge_features * edge_classes if categorical else edge_features) + 1
        self.rwpe = nn.Linear(rwpe_steps, dim) if rwpe_steps else None
        self.encoder = SFTEncoder(dim, depth, heads=heads, k=k, norm_position=norm_position, attention=attention,
                                  rpe="graph", edge_dim=self.edge_dim, drop_token=drop_token, qk_dropout=qk_dropout,
                                  dropout=dropout, ffn_dropout=ffn_dropout, **(attention_options or {}))
        self.final_norm = nn.LayerNorm(dim) if norm_position == "pre" else nn.Identity()
        self.pool_score = nn.Linear(dim, 1) if level == "graph" else None
        self.head = nn.Linear(dim, out_dim)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor | None = None,
                batch: torch.Tensor | None = None, *, ptr: torch.Tensor | None = None) -> torch.Tensor:
        layout = self._layout(x, edge_index, edge_attr, batch, ptr)
        B, N = layout.n_clouds, layout.n_max
        h = self.node_encoder(x)
        mask = layout.mask()
        if self.rwpe is not None:
            adj = dense_adjacency(edge_index, layout.cloud, layout.slot, B, N, dtype=h.dtype)
            h = h + self.rwpe(layout.unpad(random_walk_pe(adj, self.rwpe_steps)))
        rel = dense_edges(edge_index, self._edge_values(edge_attr, edge_index.shape[1], h), layout.cloud,
                          layout.slot, B, N)
        z = self.encoder(layout.pad(h), None, mask, edge_attr=rel)
        z = self.final_norm(z)
        if self.level == "node":
            return self.head(layout.unpad(z))
        score = self.pool_score(z).squeeze(-1).masked_fill(~mask, float("-inf"))
        w = torch.softmax(score, dim=1).unsqueeze(-1)
        return self.head((w * z.masked_fill(~mask.unsqueeze(-1), 0.0)).sum(1))


class _FeedForwardStack(nn.Module):
    """The attention-free backbone: pre-RMSNorm residual feed-forward layers, no token mixing.
    h (B, T, D), mask (B, T) -> (B, T, D), padded rows zero."""

    def __init__(self, dim: int, depth: int, ffn_mult: int = 4):
        super().__init__()
        self.norms = nn.ModuleList(RMSNorm(dim) for _ in range(depth))
        self.ffns = nn.ModuleList(FeedForward(dim, ffn_mult * dim) for _ in range(depth))
        self.final_norm = RMSNorm(dim)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        for norm, ffn in zip(self.norms, self.ffns):
            h = h + ffn(norm(h))
        return self.final_norm(h).masked_fill(~mask.unsqueeze(-1), 0.0)


class TokenGraphModel(_GraphInputs):
    """Nodes and edges as tokens with TokenGT's Laplacian identifiers (module docstring).

    Args:
        out_dim, level, node_features, edge_features, categorical, node_classes, edge_classes: as
            :class:`SFTGraphModel` (edge codes through their own :class:`CategoricalEncoder`).
        dim, depth, heads, k, mode: the :class:`~.samsa_models.SAMSABackbone` options.
        pe_dim: Laplacian eigenvectors per node (TokenGT's d_p; 0: no structural encoding).
        attention: the backbone's mechanism (``"samsa"``, ``"full"``, ``"performer"``, ...), or None
            for the attention-free baseline (feed-forward layers only).
        attention_options: extra options of the mechanism.
    Shapes: as :class:`SFTGraphModel`. The padded token set holds, per graph, its nodes then its
    undirected edges (a pair listed in both directions is one token, with the first listing's features).
    """

    def __init__(self, out_dim: int = 10, level: str = "graph", node_features: int = 9, edge_features: int = 3,
                 categorical: bool = True, node_classes: int = 17, edge_classes: int = 6, dim: int = 64,
                 depth: int = 2, heads: int = 4, k: int = 32, mode: str = "hard", pe_dim: int = 16,
                 attention: str | None = "samsa", attention_options: dict | None = None):
        super().__init__()
        self._setup(out_dim, level, node_features, edge_features, categorical, node_classes, edge_classes, dim)
        self.pe_dim = _check_int("pe_dim", pe_dim, 0)
        if edge_features:
            self.edge_encoder = (CategoricalEncoder(edge_features, dim, edge_classes) if categorical
                                 else nn.Linear(edge_features, dim))
        else:
            self.edge_encoder = None
        self.pe = nn.Linear(2 * pe_dim, dim, bias=False) if pe_dim else None
        self.token_type = nn.Embedding(2, dim)
        self.attention = attention
        if attention is None:
            self.backbone = _FeedForwardStack(dim, depth)
        else:
            self.backbone = SAMSABackbone(dim=dim, depth=depth, heads=heads, k=k, mode=mode, attention=attention,
                                          attention_options=attention_options)
        self.head = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, out_dim))

    def _undirected(self, edge_index: torch.Tensor, n: int) -> torch.Tensor:
        """Indices of one column per undirected pair {u, v} (its first listing), in pair order."""
        u, v = edge_index.long()
        key = torch.minimum(u, v) * n + torch.maximum(u, v)
        uniq, inv = torch.unique(key, return_inverse=True)
        pos = torch.arange(key.shape[0], device=key.device)
        return torch.full_like(uniq, key.shape[0]).scatter_reduce(0, inv, pos, "amin")

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor | None = None,
                batch: torch.Tensor | None = None, *, ptr: torch.Tensor | None = None) -> torch.Tensor:
        layout = self._layout(x, edge_index, edge_attr, batch, ptr)
        B, N, n = layout.n_clouds, layout.n_max, x.shape[0]
        # the Laplacian encoding's adjacency checks edge_index while it scatters; without it, check alone
        adj = dense_adjacency(edge_index, layout.cloud, layout.slot, B, N) if self.pe is not None else None
        if adj is None:
            check_edges(edge_index, layout.cloud)
        cols = self._undirected(edge_index, n)
        u, v = edge_index.long()[:, cols]
        nodes = self.node_encoder(x) + self.token_type.weight[0]
        edges = self.token_type.weight[1].expand(cols.shape[0], -1)
        if self.edge_encoder is not None:
            edges = edges + self.edge_encoder(edge_attr[cols])
        if self.pe is not None:
            p = layout.unpad(laplacian_pe(adj, layout.mask(), self.pe_dim)).to(nodes.dtype)
            if self.training:   # eigenvector signs are arbitrary: randomise them per graph and column
                sign = torch.randint(0, 2, (B, self.pe_dim), device=p.device).to(p.dtype) * 2 - 1
                p = p * sign[layout.cloud]
            nodes = nodes + self.pe(torch.cat([p, p], -1))
            # both orientations of an undirected edge, averaged: the token does not depend on which
            # end the edge list names first
            edges = edges + 0.5 * (self.pe(torch.cat([p[u], p[v]], -1)) + self.pe(torch.cat([p[v], p[u]], -1)))
        # tokens grouped by graph, each graph's nodes first: a stable sort of the graph ids
        graph = torch.cat([layout.cloud, layout.cloud[u]])
        order = torch.sort(graph, stable=True).indices
        tokens = flat_layout(graph.shape[0], graph[order])
        h = self.backbone(tokens.pad(torch.cat([nodes, edges])[order]), tokens.mask())
        if self.level == "graph":
            return self.head(masked_mean(h, tokens.mask()))
        where = torch.empty_like(order)
        where[order] = torch.arange(order.shape[0], device=order.device)   # flat token -> sorted position
        flat = tokens.unpad(h)
        return self.head(flat[where[:n]])


@register_model("sft-graph")
def sft_graph(**options) -> SFTGraphModel:
    """SFT on graphs (SFT paper, LRGB): node tokens, adjacency as relative bias; SFT-RWPE with rwpe_steps."""
    return SFTGraphModel(**options)


@register_model("samsa-graph")
def samsa_graph(**options) -> TokenGraphModel:
    """SAMSA on graphs (SAMSA paper, LRGB): node and edge tokens with Laplacian identifiers."""
    return TokenGraphModel(**options)


@register_model("full-graph")
def full_graph(**options) -> TokenGraphModel:
    """samsa-graph's full-attention twin: node and edge tokens, softmax attention."""
    options.setdefault("attention", "full")
    return TokenGraphModel(**options)


@register_model("performer-graph")
def performer_graph(**options) -> TokenGraphModel:
    """samsa-graph's Performer twin: node and edge tokens, FAVOR+ attention."""
    options.setdefault("attention", "performer")
    return TokenGraphModel(**options)


@register_model("mlp-graph")
def mlp_graph(**options) -> TokenGraphModel:
    """The attention-free baseline: samsa-graph's tokens through feed-forward layers, mean pooled."""
    if options.get("attention") is not None:
        raise ValueError("mlp-graph: has no attention (got attention=%r); use samsa-graph/full-graph" %
                         options["attention"])
    options["attention"] = None
    return TokenGraphModel(**options)
