"""SAMSA — SAMpling-Self-Attention (SAMSA paper: "SAMSA: Efficient Transformer for Many Data Modalities").

Every head scores every token (a token-wise MLP d → d_imp → h, one score per head: "mixture of
attention experts"), and all n queries of that head attend with ordinary softmax attention
(``scaled_dot_product_attention``) to the k best key/value tokens of the head:

* **training**: ``z = s + g``, g ~ Gumbel(0, 1) i.i.d. per (cloud, head, candidate); the top 2k of z
  are split into the selected S (ranks 1..k) and the runners-up R (ranks k+1..2k). Each selected
  token j competes with the runners-up through a soft proxy ``W_soft`` (k × 2k, rows sum to 1):

  - ``proxy="pairwise_sigmoid"`` (SAMSA paper §4.2 equation and prose, default):
    ``p[j, g] = σ((z_{S_j} − z_{R_g}) / τ)``, ``soft_j = mean_g p[j,g]·x_{S_j} + Σ_g (1 − p[j,g])/k·x_{R_g}``;
  - ``proxy="softmax_group"`` (Algorithm 2): a (k+1)-way softmax of z/τ over {S_j} ∪ R.

  ``mode="hard"`` (SAMSA-hard, τ = 1.0): straight-through — the forward value is the exact top-k
  gather, the scores get the gradient of W_soft, the keys/values get it through the hard gather
  (Alg. 2's ``(Onehot − P).detach() + P``; the printed ``− P`` is a sign typo).
  ``mode="soft"`` (SAMSA-soft, τ = 0.1): no reparameterization, the keys/values *are* the soft
  mixture ``W_soft · KV[top-2k]``.
* **eval**: no noise. Hard models gather the plain top-k (P is never materialised); soft models keep
  the soft top-2k mixture by default (``eval_soft``; the paper is silent, but its timings, soft slower than hard at equal k, suggest so).
* **support vectors** (SAMSA paper §4.3): per head, 2k learnable key/value vectors with learnable scores join
  the candidates (after the real tokens), so top-2k is always defined, even for a cloud of one
  point; padded tokens score ``-inf`` and are never selected.

Randomness: frozen at init — nothing but the weights (support vectors ~ N(0, 0.02²), scores 0).
Resampled per forward in training — the Gumbel noise only. ``eval()`` is deterministic; ranking
uses a stable sort (ties in index order, real tokens before support vectors) so that a cloud gives
the same output alone or in a padded batch.

Export mode (:func:`~.base.set_exportable`): the forward pass is already a static graph (sort,
gathers, SDPA); the flag only makes it pass the selected keys' validity mask to SDPA without
first reading on the host whether it is needed. Without support vectors the graph is traced for
N > 2k (fewer candidates take the padding branch of :func:`samsa_select`, and at N = 2k the
exporter specialises the soft mixture's top-2k slice, which is then the whole row).
"""
from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from ..nn.transformer_block import TransformerBlock
from .base import TokenMixer, check_attention_inputs, is_tracing
from .flop_count import FlopCount, dense_core, projections
from .registry import register
from .sampling import NEG_INF, gather_rows, gumbel_noise, stable_descending_order, work_dtype


def samsa_select(z: torch.Tensor, kv: torch.Tensor, k: int, *, tau: float, mode: str = "hard",
                 proxy: str = "pairwise_sigmoid", training: bool = True, eval_soft: bool = True,
                 kv_grad: str = "hard") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SAMSA's differentiable top-k without replacement, per (batch, head) row.

    Args:
        z: (..., M) scores with the Gumbel noise already added in training; ``-inf`` marks
            non-candidates (padding), which are never selected.
        kv: (..., M, C) candidate rows (keys and values packed).
        k: rows to select.
        tau: temperature of the soft proxy.
        mode: ``"hard"`` (straight-through) or ``"soft"`` (soft mixture in the forward pass).
        proxy: ``"pairwise_sigmoid"`` or ``"softmax_group"``.
        training: the soft proxy is built in training (and in eval for soft mode with ``eval_soft``);
            otherwise a plain top-k gather.
        eval_soft: soft mode keeps the soft mixture outside training.
        kv_grad: for hard mode, ``"hard"`` — kv gets the gradient of the hard gather (Alg. 2 matrix
            form, default); ``"soft"`` — kv gets the gradient of the soft mixture (literal ∇S ≜ ∇S_soft).
    Returns:
        kvs (..., k, C) in kv's dtype; idx (..., k) the selected rows (ranks 1..k of z);
        key_valid (..., k) bool, False only where fewer than k candidates exist.
    The proxy's weights are computed in z's dtype; memory O(k²) per row, never O(k·M).
    """
    M = z.shape[-1]
    if M < 2 * k:  # only without support vectors: pad with non-candidates
        z = F.pad(z, (0, 2 * k - M), value=NEG_INF)
        kv = F.pad(kv, (0, 0, 0, 2 * k - M))
    zsort, order = stable_descending_order(z)
    if not (training or (mode == "soft" and eval_soft)):
        idx = order[..., :k]
        return gather_rows(kv, idx), idx, torch.isfinite(zsort[..., :k])
    idx2, z2 = order[..., :2 * k], zsort[..., :2 * k]
    valid2 = torch.isfinite(z2)
    z2 = torch.where(valid2, z2, torch.zeros_like(z2))
    kv2 = gather_rows(kv, idx2).to(z.dtype)
    zs, zr = z2[..., :k], z2[..., k:]
    vs, vr = valid2[..., :k], valid2[..., k:]
    if proxy == "pairwise_sigmoid":
        p = torch.sigmoid((zs.unsqueeze(-1) - zr.unsqueeze(-2)) / tau)        # (..., k, k)
        p = torch.where(vr.unsqueeze(-2), p, torch.ones_like(p))              # absent runner-up: no contest
        w_sel, w_rej = p.mean(-1), (1.0 - p) / k
    elif proxy == "softmax_group":
        ls = zs / tau                                                          # (..., k)
        lr = (zr / tau).masked_fill(~vr, NEG_INF)                              # (..., k)
        mx = torch.maximum(ls, lr.max(-1, keepdim=True).values)
        es = torch.exp(ls - mx)
        er = torch.exp(lr.unsqueeze(-2) - mx.unsqueeze(-1))                    # (..., k, k)
        den = es + er.sum(-1)
        w_sel, w_rej = es / den, er / den.unsqueeze(-1)
    else:
        raise ValueError(f"proxy must be 'pairwise_sigmoid' or 'softmax_group', got {proxy!r}")
    kv_sel, kv_rej = kv2[..., :k, :], kv2[..., k:, :]

    def mix(ws, wr, a, b):  # W_soft @ [a; b] with W_soft = [diag(ws) | wr]
        return ws.unsqueeze(-1) * a + torch.matmul(wr, b)

    if mode == "soft":
        out = mix(w_sel, w_rej, kv_sel, kv_rej)
    elif kv_grad == "hard":   # kv_sel + (W − W.detach()) @ KV2: zero in value, ∇ to the scores only
        out = kv_sel + mix(w_sel - w_sel.detach(), w_rej - w_rej.detach(), kv_sel.detach(), kv_rej.detach())
    else:
        soft = mix(w_sel, w_rej, kv_sel, kv_rej)
        out = kv_sel.detach() + (soft - soft.detach())
    return out.to(kv.dtype), order[..., :k], vs


def samsa_flops(m: "SAMSAAttention", n: int, dim: int, pos_dim: int | None = None) -> FlopCount:
    """Projections, the importance MLP and every head's n queries against its k selected keys."""
    H, d = m.heads, m.head_dim
    hid = m.importance[0].out_features
    k = m.k if m.support else min(m.k, n)  # support vectors fill up to k keys
    f = FlopCount().add("projections", projections(n, dim, H, d))
    f.add("importance MLP", 2 * n * dim * hid + 2 * n * hid * H)
    return f.add("attention", H * dense_core(n, d, d, keys=k))


@register("samsa", flops=samsa_flops, bench={"k": 256})
class SAMSAAttention(TokenMixer):
    """SAMSA sampled multi-head softmax attention (the token mixer; norm, ReZero and FFN: :func:`SAMSABlock`).

    Args:
        dim: model width D.
        heads: number of heads h (each samples its own tokens).
        k: sampled tokens per head.
        head_dim: per-head width d_h (default D // h, or D when h does not divide D).
        mode: ``"hard"`` or ``"soft"`` (module docstring).
        tau: Gumbel temperature (default 1.0 for hard, 0.1 for soft, as in the paper).
        proxy: ``"pairwise_sigmoid"`` (default) or ``"softmax_group"`` (Algorithm 2).
        support: add the 2k learnable support key/value vectors with learnable scores per head.
            Without them, a cloud with fewer than k real points attends to its real points only.
        eval_soft: soft models keep the soft top-2k mixture in eval (default True).
        kv_grad: hard mode, where K/V gradients flow: ``"hard"`` (default) or ``"soft"``.
        imp_hidden: hidden width of the importance MLP (default D).
        gumbel: add Gumbel noise to the scores in training.
        bias: biases on the Q/K/V projections (the output projection always has one).
        score_input: inside a block (:meth:`mix`), which tokens the importance MLP scores:
            ``"normed"`` (default: where the paper is silent on the importance MLP's input, we
            score the normalised X̂ that the attention mixes) or ``"raw"`` (X before the block's
            norm, Alg. 1 line 7).
    Shapes: x (B, N, D), mask (B, N) -> (B, N, D), padded rows zero. ``pos`` is accepted and ignored
    (coordinates are token features here). Keyword ``score_x`` (B, N, D): score another tensor than
    x (what :meth:`mix` passes with ``score_input="raw"``). Cost O(N·k·D) time and O(N·k·h)
    memory; O(k²·h) for the proxy. ``reset_parameters()`` re-initialises the projections, the
    importance MLP and the support vectors (N(0, 0.02²)) and scores (0) as the constructor does.
    """

    _repr_fields = ("k", "mode", "tau", "proxy", "support")

    def __init__(self, dim: int, heads: int = 4, k: int = 256, head_dim: int | None = None, mode: str = "hard",
                 tau: float | None = None, proxy: str = "pairwise_sigmoid", support: bool = True,
                 eval_soft: bool = True, kv_grad: str = "hard", imp_hidden: int | None = None,
                 gumbel: bool = True, bias: bool = True, score_input: str = "normed", dropout: float = 0.0):
        super().__init__(dim, heads, dropout)
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        if mode not in ("hard", "soft"):
            raise ValueError(f"mode must be 'hard' or 'soft', got {mode!r}")
        if proxy not in ("pairwise_sigmoid", "softmax_group"):
            raise ValueError(f"proxy must be 'pairwise_sigmoid' or 'softmax_group', got {proxy!r}")
        if kv_grad not in ("hard", "soft"):
            raise ValueError(f"kv_grad must be 'hard' or 'soft', got {kv_grad!r}")
        if score_input not in ("normed", "raw"):
            raise ValueError(f"score_input must be 'normed' or 'raw', got {score_input!r}")
        tau = (1.0 if mode == "hard" else 0.1) if tau is None else tau
        if not tau > 0:
            raise ValueError(f"tau must be > 0, got {tau!r}")
        self.k, self.mode, self.tau, self.proxy = k, mode, float(tau), proxy
        self.support, self.eval_soft, self.kv_grad, self.gumbel = support, eval_soft, kv_grad, gumbel
        self.score_input = score_input
        self.head_dim = head_dim or (dim // heads if dim % heads == 0 else dim)
        inner = heads * self.head_dim
        self._init_projections(inner, bias)
        hid = imp_hidden or dim
        self.importance = nn.Sequential(nn.Linear(dim, hid), nn.GELU(), nn.Linear(hid, heads))
        if support:
            self.support_kv = nn.Parameter(torch.randn(heads, 2 * k, 2 * self.head_dim) * 0.02)
            self.support_score = nn.Parameter(torch.zeros(heads, 2 * k))

    @torch.no_grad()
    def _reset_own_parameters(self) -> None:
        """The support key/value vectors ~ N(0, 0.02²) and their scores 0, as at construction."""
        if self.support:
            self.support_kv.normal_(0.0, 0.02)
            self.support_score.zero_()

    def min_points(self) -> int:
        """Export: any N with support vectors; without them the graph is traced for N > 2k (see the
        module doc)."""
        return 1 if self.support else 2 * self.k + 1

    def scores(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Per-head importance scores (B, h, N) in the work dtype, ``-inf`` at padding."""
        s = self.importance(x).to(work_dtype(x.dtype)).transpose(1, 2)
        return s.masked_fill(~mask[:, None, :], NEG_INF)

    def mix(self, x: torch.Tensor, h: torch.Tensor, pos: torch.Tensor | None, mask: torch.Tensor | None,
            context=None) -> torch.Tensor:
        """In a block: attend over ``h`` (the normalised tokens) and score ``x`` (the tokens before the
        block's norm) with ``score_input="raw"``, ``h`` otherwise."""
        return self(h, pos, mask, context, score_x=x if self.score_input == "raw" else None)

    def forward(self, x: torch.Tensor, pos: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                context=None, *, score_x: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, N, D), mask (B, N) -> (B, N, D); ``score_x`` (B, N, D): see the class doc. ``context``
        is not used. Training noise comes from the global torch RNG."""
        mask = check_attention_inputs(x, pos, mask, dim=self.dim, who="samsa")
        keep = mask.unsqueeze(-1)
        if score_x is not None and not is_tracing():  # eager-only checks, as check_attention_inputs
            if not isinstance(score_x, torch.Tensor) or score_x.shape != x.shape:
                raise ValueError(f"samsa: score_x must have the shape of x {tuple(x.shape)}, got "
                                 f"{tuple(getattr(score_x, 'shape', ())) or type(score_x).__name__}")
            if not bool(torch.isfinite(score_x[mask]).all()):
                raise ValueError("samsa: score_x contains NaN or inf at real points")
        if score_x is not None:
            score_x = score_x.masked_fill(~keep, 0.0)
        x = x.masked_fill(~keep, 0.0)
        B, N, _ = x.shape
        H, d = self.heads, self.head_dim
        q = self.heads_of(self.w_q(x))
        kv = torch.cat([self.w_k(x).view(B, N, H, d), self.w_v(x).view(B, N, H, d)], -1).transpose(1, 2)  # (B,H,N,2d)
        s = self.scores(x if score_x is None else score_x, mask)                                         # (B,H,N)
        if self.support:
            kv = torch.cat([kv, self.support_kv.to(kv.dtype).expand(B, -1, -1, -1)], dim=2)              # (B,H,M,2d)
            s = torch.cat([s, self.support_score.to(s.dtype).expand(B, -1, -1)], dim=2)                 # (B,H,M)
        if self.training and self.gumbel:
            s = s + gumbel_noise(tuple(s.shape), dtype=s.dtype, device=s.device)
        kvs, _, key_valid = samsa_select(s, kv, self.k, tau=self.tau, mode=self.mode, proxy=self.proxy,
                                         training=self.training, eval_soft=self.eval_soft, kv_grad=self.kv_grad)
        ks, vs = kvs.split(d, dim=-1)
        # With support vectors every selected key is real (2k finite candidates always exist). Otherwise
        # the validity mask goes to SDPA only when needed; export mode cannot look (host read), so always.
        if self.support or (not self.exportable and bool(key_valid.all())):
            attn_mask = None
        else:
            attn_mask = key_valid[:, :, None, :]
        o = F.scaled_dot_product_attention(q, ks, vs, attn_mask=attn_mask)                               # (B,H,N,d)
        return self.merge_heads(o, mask)


def SAMSABlock(dim: int, heads: int = 4, k: int = 256, ffn_mult: int = 4, parallel: bool = True,
               dropout: float = 0.0, rezero: bool | nn.Parameter = True, **attn_options) -> TransformerBlock:
    """SAMSA's layer (Algorithm 1): a :class:`~pointformers.nn.transformer_block.TransformerBlock` with
    RMSNorm, ReZero residuals and a GELU FFN around :class:`SAMSAAttention`.

    ``parallel=True`` (Alg. 1 as printed; ``norm_position="parallel"``)::

        X̂ = RMSNorm(X);  X ← X + α·Attn(X̂);  X ← X + α·FFN(X̂)

    ``parallel=False`` (``norm_position="pre"``): the FFN reads ``RMSNorm₂(X)`` after the attention
    residual instead. α is a zero-initialised learnable scalar shared by all layers and both
    branches: ``rezero=True`` gives a lone block its own (``alpha``), a stack passes its shared one
    (:class:`~pointformers.models.samsa_models.SAMSAEncoder`).

    Args:
        dim, heads, k: as :class:`SAMSAAttention`.
        ffn_mult: FFN expansion (GELU, 4). dropout: residual dropout (0).
        parallel, rezero: see above.
        **attn_options: passed to :class:`SAMSAAttention` (mode, tau, proxy, support, score_input, ...).
    Shapes: x (B, N, D), mask (B, N) -> (B, N, D), padded rows zero.
    """
    return TransformerBlock(dim, SAMSAAttention(dim, heads=heads, k=k, **attn_options), norm="rms",
                            norm_position="parallel" if parallel else "pre", rezero=rezero, activation="gelu",
                            ffn_mult=ffn_mult, dropout=dropout)


