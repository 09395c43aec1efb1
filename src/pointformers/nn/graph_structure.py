"""Graph structure as dense padded tensors: adjacency, edge features, and the positional encodings
graph transformers use (random-walk and Laplacian), batched over graphs padded to one size.

Graphs come in PyTorch Geometric's flat layout: ``edge_index`` (2, E) of node ids into the flat
node list, grouped into graphs by a ``FlatLayout`` (``cloud``/``slot`` per node, from
:func:`pointformers.data.batch.flat_layout`); here only the node -> (graph, slot) maps are needed,
so the functions take them as tensors. Everything is plain torch, device-generic and batched: one
(B, N, N) matrix per batch, not one Python loop per graph.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["check_edges", "dense_edges", "dense_adjacency", "random_walk_pe", "laplacian_pe", "one_hot_codes",
           "CategoricalEncoder"]


def _check_edge_index(edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    if not isinstance(edge_index, torch.Tensor) or edge_index.dim() != 2 or edge_index.shape[0] != 2 \
            or edge_index.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"edge_index: expected an integer tensor of shape (2, E), got "
                         f"{getattr(edge_index, 'dtype', type(edge_index).__name__)} "
                         f"{tuple(getattr(edge_index, 'shape', ()))}")
    if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= num_nodes):
        raise ValueError(f"edge_index: node ids must lie in [0, {num_nodes}), got {int(edge_index.min())} .. "
                         f"{int(edge_index.max())}")
    return edge_index.long()


def check_edges(edge_index: torch.Tensor, graph: torch.Tensor) -> torch.Tensor:
    """``edge_index`` (2, E) as int64 after checking it: integer node ids of the flat node list
    (``graph`` (n,): each node's graph id) whose two endpoints lie in the same graph; ValueError
    naming ``edge_index`` otherwise."""
    ei = _check_edge_index(edge_index, graph.shape[0])
    if ei.numel() and not bool((graph[ei[0]] == graph[ei[1]]).all()):
        raise ValueError("edge_index: an edge joins nodes of two different graphs (check batch/ptr)")
    return ei


def dense_edges(edge_index: torch.Tensor, values: torch.Tensor, graph: torch.Tensor, slot: torch.Tensor,
                num_graphs: int, size: int) -> torch.Tensor:
    """Per-edge ``values`` (E, r) scattered into a dense (B, size, size, r) tensor at
    [graph, slot(src), slot(dst)]; zeros where there is no edge. Both endpoints of an edge must lie
    in the same graph (ValueError otherwise). A repeated edge keeps its last row."""
    src, dst = check_edges(edge_index, graph)
    g = graph[src]
    out = values.new_zeros(num_graphs, size, size, values.shape[-1])
    out[g, slot[src], slot[dst]] = values
    return out


def dense_adjacency(edge_index: torch.Tensor, graph: torch.Tensor, slot: torch.Tensor, num_graphs: int,
                    size: int, dtype: torch.dtype = torch.float32, symmetric: bool = True) -> torch.Tensor:
    """(B, size, size) 0/1 adjacency of the graphs (made symmetric unless ``symmetric=False``; self
    loops dropped: the encodings below are defined on simple graphs)."""
    ones = torch.ones(edge_index.shape[1], 1, dtype=dtype, device=graph.device)
    a = dense_edges(edge_index, ones, graph, slot, num_graphs, size)[..., 0]
    if symmetric:
        a = torch.maximum(a, a.transpose(1, 2))
    return a * (1 - torch.eye(size, dtype=dtype, device=a.device))


def random_walk_pe(adj: torch.Tensor, steps: int) -> torch.Tensor:
    """Random-walk structural encoding (RWSE/RWPE, Dwivedi et al. 2022): for each node i, the
    probabilities (P^t)_ii, t = 1..steps, of a random walk P = D⁻¹A returning to i.
    adj (B, N, N) -> (B, N, steps); isolated and padded nodes get zeros."""
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps: expected an int >= 1, got {steps!r}")
    deg = adj.sum(-1, keepdim=True)
    p = adj / deg.clamp_min(1.0)
    out, m = [], p
    for t in range(steps):
        out.append(torch.diagonal(m, dim1=1, dim2=2))
        if t + 1 < steps:
            m = m @ p
    return torch.stack(out, -1)


def laplacian_pe(adj: torch.Tensor, mask: torch.Tensor, k: int) -> torch.Tensor:
    """Laplacian eigenvector encoding: the eigenvectors of the ``k`` smallest eigenvalues of each
    graph's symmetric normalised Laplacian L = I − D^-½ A D^-½ (the constant-like first one
    included), as TokenGT's and GraphGPS's LapPE. adj (B, N, N) symmetric, mask (B, N) real nodes
    -> (B, N, k); zero columns where a graph has fewer than k nodes, zero rows at padding.

    Padded nodes get a diagonal of 3 (above L's largest eigenvalue, 2), so their eigenpairs sort
    after every real one and never mix into a real graph's columns. An eigenvector's sign is
    arbitrary; each column here gets the sign that makes Σ_i v_i³ positive (or, where that is 0, its
    largest-magnitude entry, the first of equal ones), so a graph's encoding does not depend on the batch it sits in or on the
    order of its nodes; a model still randomises the signs in training (TokenGT). For a repeated
    eigenvalue the basis of its eigenspace stays arbitrary.
    """
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k: expected an int >= 1, got {k!r}")
    B, N, _ = adj.shape
    work = adj.double() if adj.dtype != torch.float64 else adj   # eigh in float64: close eigenvalues
    real = mask.to(work.dtype)
    deg = work.sum(-1)
    inv = deg.clamp_min(1e-12).rsqrt() * (deg > 0)
    lap = torch.diag_embed(real + 3.0 * (1 - real)) - inv[:, :, None] * work * inv[:, None, :]
    _, vec = torch.linalg.eigh(lap)                                  # ascending eigenvalues
    vec = vec[..., : min(k, N)] * real[..., None]
    n = mask.sum(1)
    keep = torch.arange(vec.shape[-1], device=adj.device)[None, :] < n[:, None]   # a graph's own columns
    vec = vec * keep[:, None, :]
    # a deterministic sign per column, the same whatever the padding or the node order: the sign of
    # the third moment Σ v_i³ (a permutation invariant), else of the largest-magnitude entry
    m3 = (vec ** 3).sum(1)
    mag = vec.abs()
    first_top = (mag >= mag.amax(1, keepdim=True) - 1e-6).to(torch.int8).argmax(1, keepdim=True)  # ties: lowest id
    top = vec.gather(1, first_top).squeeze(1)
    sign = torch.where(m3.abs() > 1e-9, m3.sign(), top.sign())
    vec = vec * torch.where(sign == 0, torch.ones_like(sign), sign)[:, None, :]
    if vec.shape[-1] < k:
        vec = torch.cat([vec, vec.new_zeros(B, N, k - vec.shape[-1])], -1)
    return vec.to(adj.dtype if adj.is_floating_point() else torch.float32)


def one_hot_codes(codes: torch.Tensor, classes: int) -> torch.Tensor:
    """Integer codes (..., F) as concatenated one-hot vectors (..., F·classes), float32; codes ≥
    ``classes`` clipped to the last one (e.g. bond features as SFT's relative edge features)."""
    idx = codes.long().clamp(0, classes - 1)
    return nn.functional.one_hot(idx, classes).flatten(-2).float()


class CategoricalEncoder(nn.Module):
    """Integer-coded features (·, F) -> (·, D): each column one-hot over ``classes`` values (codes
    ≥ classes clipped to the last one), concatenated, then a linear map. Equal to a sum of per-column
    embedding tables plus a bias; SFT's "17-class one-hot vectorization" of Peptides' atom features
    with ``classes=17``."""

    def __init__(self, num_features: int, dim: int, classes: int = 17):
        super().__init__()
        for name, v in (("num_features", num_features), ("dim", dim), ("classes", classes)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
        self.num_features, self.classes = num_features, classes
        self.embed = nn.Embedding(num_features * classes, dim)
        self.bias = nn.Parameter(torch.zeros(dim))
        self.register_buffer("offsets", torch.arange(num_features) * classes, persistent=False)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        if codes.dtype not in (torch.int32, torch.int64) or codes.shape[-1] != self.num_features:
            raise ValueError(f"codes: expected integer codes (..., {self.num_features}), got {codes.dtype} "
                             f"{tuple(codes.shape)}")
        if codes.numel() and int(codes.min()) < 0:
            raise ValueError("codes: categorical codes must be >= 0")
        idx = codes.long().clamp_max(self.classes - 1) + self.offsets
        return self.embed(idx).sum(-2) + self.bias
