"""Set Transformer attention blocks (Lee et al. 2019): MAB, SAB, ISAB, PMA, with key masks.

MAB(X, Y) = LN(H + rFF(H)),  H = LN(X + Multihead(X, Y, Y))   (LayerNorms optional; the official
amortised-clustering model runs without them). SAB(X) = MAB(X, X); ISAB_m(X) = MAB(X, MAB(I, X))
with m learned inducing points I; PMA_k(Z) = MAB(S, rFF(Z)) with k learned seeds S.

A MAB computes its attention in one of two modes of its own (``mode=``; these are not registry
mechanisms of :mod:`pointformers.attention`, and no registry key selects them):

* ``"dense"`` (default): softmax over all real keys, as Set Transformer.
* ``"sampled"``: the Sampled Transformer's "loose" sampled cross-attention (App. B.2/C: "randomly
  sampling two elements per row"): every query row attends to **two** uniformly random real keys
  instead of all of them (re-sampled every training forward). In ``eval()`` the draw is seeded by
  (``seed``, number of real keys of the set, query rank), so a set's output does not depend on the
  other sets of its batch or on padding.

Scores are scaled by 1/√D of the full width D, as in Set Transformer's code. The former option
``attention="full" | "sampled"`` is still accepted (:data:`ATTENTION_MODES` maps it to ``mode``).
"""
from __future__ import annotations

import math

import torch
from torch import nn

MODES = ("dense", "sampled")
#: The former ``attention=`` values of MAB, ISAB and the set models, and the ``mode`` each means.
ATTENTION_MODES = {"full": "dense", "sampled": "sampled"}


def resolve_mode(mode: str | None, attention: str | None = None) -> str:
    """The MAB mode from ``mode`` or the former ``attention`` option (:data:`ATTENTION_MODES`);
    default ``"dense"``. ValueError on an unknown value or when the two disagree."""
    if attention is not None:
        if attention not in ATTENTION_MODES:
            raise ValueError(f"attention must be one of {tuple(ATTENTION_MODES)}, got {attention!r}")
        if mode is not None and mode != ATTENTION_MODES[attention]:
            raise ValueError(f"mode={mode!r} and attention={attention!r} disagree; give one of them")
        mode = ATTENTION_MODES[attention]
    mode = "dense" if mode is None else mode
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


def _real_first(mask: torch.Tensor) -> torch.Tensor:
    """(B, N): each row's real indices in ascending order, then its padded ones."""
    return torch.argsort((~mask).to(torch.int8), dim=1, stable=True)


def loose_key_choice(n_keys: torch.Tensor, q_rank: torch.Tensor, seed: int,
                     training: bool, generator: torch.Generator | None = None) -> torch.Tensor:
    """Two distinct key ranks in [0, n_keys[b]) per query (one key when n_keys = 1).

    n_keys (B,), q_rank (B, Q) rank of each query among its set's real queries -> (B, Q, 2) int64.
    Training: fresh uniform draws. Eval: pseudo-uniforms hashed from (seed, n_keys[b], query rank,
    slot): a function of the set's own size and the query's rank only.
    """
    B, Q = q_rank.shape
    dev = q_rank.device
    if training:
        u = torch.rand(B, Q, 2, dtype=torch.float64, device=dev, generator=generator)
    else:
        # counter-based hash of (seed, n_keys, query rank, slot): vectorised and independent of
        # the padded size, so a set draws the same keys alone or in any batch
        g = torch.Generator().manual_seed(int(seed) % (1 << 63))
        a, b = (torch.rand(2, generator=g, dtype=torch.float64) * 100 + 10).tolist()
        slot = torch.arange(2, device=dev, dtype=torch.float64)
        t = (q_rank.to(torch.float64)[..., None] * a + n_keys.view(B, 1, 1).to(torch.float64) * b
             + slot * 7.31 + (int(seed) % 9973))
        u = torch.frac(torch.sin(t).abs() * 43758.5453)
    n = n_keys.view(B, 1).to(torch.float64)
    r1 = torch.floor(u[..., 0] * n).long()
    r2 = (r1 + 1 + torch.floor(u[..., 1] * (n - 1)).long()) % n.long()   # a different key when n > 1
    return torch.stack([r1, r2], -1).clamp(max=int(n_keys.max()) - 1)


class MAB(nn.Module):
    """Multihead attention block MAB(X, Y).

    Args:
        dim_q, dim_kv: input widths of X and Y; dim: output width D; heads: h (D divisible by h).
        ln: LayerNorms after both residuals. mode: ``"dense"`` (default) or ``"sampled"`` (loose, 2 keys
            per query; module docstring).
        seed: eval seed of the loose draws (default: drawn from the global RNG, saved in the state_dict).
        attention: the former name of ``mode`` (``"full"`` = ``"dense"``, ``"sampled"``).
    Shapes: X (B, Q, dim_q), Y (B, K, dim_kv), q_mask (B, Q) | None, k_mask (B, K) | None -> (B, Q, D).
    """

    def __init__(self, dim_q: int, dim_kv: int, dim: int, heads: int = 4, ln: bool = False,
                 mode: str | None = None, seed: int | None = None, attention: str | None = None):
        super().__init__()
        mode = resolve_mode(mode, attention)
        if dim % heads:
            raise ValueError(f"dim={dim} must be divisible by heads={heads}")
        self.dim, self.heads, self.mode = dim, heads, mode
        self.fc_q, self.fc_k, self.fc_v = nn.Linear(dim_q, dim), nn.Linear(dim_kv, dim), nn.Linear(dim_kv, dim)
        self.fc_o = nn.Linear(dim, dim)
        self.ln0 = nn.LayerNorm(dim) if ln else nn.Identity()
        self.ln1 = nn.LayerNorm(dim) if ln else nn.Identity()
        if seed is None:
            seed = int(torch.randint(0, 2**62, ()).item())
        self.register_buffer("seed", torch.tensor(int(seed), dtype=torch.int64))

    def reset_parameters(self) -> None:
        """Re-initialise fc_q, fc_k, fc_v, fc_o and the LayerNorms as the constructor does, in its
        order (``torch.manual_seed(s)`` then a reset equals a fresh MAB built under that seed); the
        ``seed`` buffer is kept."""
        for layer in (self.fc_q, self.fc_k, self.fc_v, self.fc_o, self.ln0, self.ln1):
            if isinstance(layer, (nn.Linear, nn.LayerNorm)):
                layer.reset_parameters()

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.heads}, mode={self.mode!r}"

    def export_refusal(self) -> str | None:
        """Why this block cannot be exported (asked by :func:`pointformers.attention.set_exportable`), or None."""
        if self.mode == "sampled":
            return ("the sampled (loose) MAB draws its two keys per query from the seed buffer and each set's "
                    "real size, read on the host; use mode='dense' to export")
        return None

    def forward(self, X: torch.Tensor, Y: torch.Tensor, q_mask: torch.Tensor | None = None,
                k_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, Q, _ = X.shape
        K = Y.shape[1]
        h, dh = self.heads, self.dim // self.heads
        q = self.fc_q(X)                                                       # (B, Q, D)
        k = self.fc_k(Y).view(B, K, h, dh)
        v = self.fc_v(Y).view(B, K, h, dh)
        qh = q.view(B, Q, h, dh)
        scale = 1.0 / math.sqrt(self.dim)
        if self.mode == "dense":
            s = torch.einsum("bqhd,bkhd->bhqk", qh, k) * scale
            if k_mask is not None:
                s = s.masked_fill(~k_mask[:, None, None, :], float("-inf"))
            o = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), v)
        else:
            km = k_mask if k_mask is not None else torch.ones(B, K, dtype=torch.bool, device=X.device)
            qm = q_mask if q_mask is not None else torch.ones(B, Q, dtype=torch.bool, device=X.device)
            q_rank = torch.cumsum(qm.long(), 1) - 1                            # rank among real queries
            ranks = loose_key_choice(km.sum(1), q_rank.clamp(min=0), int(self.seed), self.training)
            keys = _real_first(km).gather(1, ranks.view(B, -1)).view(B, Q, 2)  # rank -> key index
            flat = keys.view(B, Q * 2, 1, 1).expand(B, Q * 2, h, dh)
            k2 = k.gather(1, flat).view(B, Q, 2, h, dh)
            v2 = v.gather(1, flat).view(B, Q, 2, h, dh)
            a = torch.softmax(torch.einsum("bqhd,bqthd->bqht", qh, k2) * scale, -1)
            o = torch.einsum("bqht,bqthd->bqhd", a, v2)
        H = self.ln0(q + o.reshape(B, Q, self.dim))
        out = self.ln1(H + torch.relu(self.fc_o(H)))
        return out if q_mask is None else out.masked_fill(~q_mask.unsqueeze(-1), 0.0)


class SAB(nn.Module):
    """Set attention block SAB(X) = MAB(X, X) (always full self-attention). X (B, N, d), mask -> (B, N, D)."""

    def __init__(self, dim_in: int, dim: int, heads: int = 4, ln: bool = False):
        super().__init__()
        self.mab = MAB(dim_in, dim_in, dim, heads, ln)

    def reset_parameters(self) -> None:
        self.mab.reset_parameters()

    def forward(self, X: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.mab(X, X, mask, mask)


class ISAB(nn.Module):
    """Induced set attention block ISAB_m(X) = MAB(X, MAB(I, X)), O(n·m). X (B, N, d), mask -> (B, N, D).

    ``mode``: both MABs' mode (``"dense"`` or ``"sampled"``); ``attention``: its former name (:class:`MAB`)."""

    def __init__(self, dim_in: int, dim: int, heads: int = 4, num_inducing: int = 16, ln: bool = False,
                 mode: str | None = None, attention: str | None = None):
        super().__init__()
        mode = resolve_mode(mode, attention)
        self.inducing = nn.Parameter(torch.empty(1, num_inducing, dim))
        nn.init.xavier_uniform_(self.inducing)
        self.mab0 = MAB(dim, dim_in, dim, heads, ln, mode)
        self.mab1 = MAB(dim_in, dim, dim, heads, ln, mode)

    def reset_parameters(self) -> None:
        """The inducing points (Xavier-uniform) and both MABs, in the constructor's order; mab0's
        seed draw is repeated and discarded (the ``seed`` buffers are kept), so after
        ``torch.manual_seed(s)`` a reset equals a fresh ISAB built under that seed."""
        nn.init.xavier_uniform_(self.inducing)
        self.mab0.reset_parameters()
        torch.randint(0, 2**62, ())  # the constructor's draw of mab0's seed, keeping the RNG in step
        self.mab1.reset_parameters()

    def extra_repr(self) -> str:
        return f"num_inducing={self.inducing.shape[1]}"

    def forward(self, X: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        H = self.mab0(self.inducing.expand(X.shape[0], -1, -1).to(X.dtype), X, None, mask)
        return self.mab1(X, H, mask, None)


class PMA(nn.Module):
    """Pooling by multihead attention PMA_k(Z) = MAB(S, rFF(Z)) with k learned seeds. Z (B, N, D) -> (B, k, D)."""

    def __init__(self, dim: int, heads: int = 4, num_seeds: int = 4, ln: bool = False):
        super().__init__()
        self.seeds = nn.Parameter(torch.empty(1, num_seeds, dim))
        nn.init.xavier_uniform_(self.seeds)
        self.rff = nn.Sequential(nn.Linear(dim, dim), nn.ReLU())
        self.mab = MAB(dim, dim, dim, heads, ln)

    def reset_parameters(self) -> None:
        """The seeds (Xavier-uniform), the rFF layer and the MAB, in the constructor's order (after
        ``torch.manual_seed(s)``: a fresh PMA built under that seed)."""
        nn.init.xavier_uniform_(self.seeds)
        self.rff[0].reset_parameters()
        self.mab.reset_parameters()

    def extra_repr(self) -> str:
        return f"num_seeds={self.seeds.shape[1]}"

    def forward(self, Z: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.mab(self.seeds.expand(Z.shape[0], -1, -1).to(Z.dtype), self.rff(Z), None, mask)
