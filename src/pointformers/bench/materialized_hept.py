"""HEPT attention computed the way the authors' implementation does it, for benchmarks only.

Every block's score matrix is materialised at once (``[T, H, n_b, b, b]`` from one einsum),
exponentiated elementwise and kept by autograd for the backward pass; the output is the same
function as :class:`pointformers.attention.HEPTAttention` (tests check equality). It exists so
that the benchmark can show the fused implementation's speed and memory against the
straightforward one on the same machine, in the same run.
"""
from __future__ import annotations

import torch

from ..attention.hept import HEPTAttention
from ..attention.kernel import DENOM_EPS


class MaterializedHEPTAttention(HEPTAttention):
    """Same parameters and semantics as :class:`HEPTAttention`; unfused block computation."""

    def forward(self, x, pos=None, mask=None, context=None, **unused):
        mask = self.check(x, pos, mask, "hept")
        ctx = context if context is not None else self.prepare(pos, mask)
        B, N, _ = x.shape
        Np = ctx.n_padded
        if Np != N:
            x = torch.cat([x, x.new_zeros(B, Np - N, x.shape[-1])], 1)
            pos = torch.cat([pos, pos.new_zeros(B, Np - N, pos.shape[-1])], 1)
        H, d, b = self.heads, self.head_dim, self.block_size
        keep = ctx.mask[..., None].to(x.dtype)
        x = x * keep
        rho = (2.0 * self.omega()).sqrt() * (pos * keep).unsqueeze(2)            # (B, Np, H, c)
        q = torch.cat([self.w_q(x).view(B, Np, H, d), rho], -1).transpose(1, 2)  # (B, H, Np, D)
        k = torch.cat([self.w_k(x).view(B, Np, H, d), rho], -1).transpose(1, 2)
        v = self.w_v(x).view(B, Np, H, d).transpose(1, 2)
        with torch.no_grad():
            lq = torch.einsum("bhnd,hdt->bthn", q, self.alpha)
            lk = torch.einsum("bhnd,hdt->bthn", k, self.alpha)
            m = ctx.mask[:, None, None, :]
            hi = torch.maximum(lq.masked_fill(~m, -float("inf")).amax(-1), lk.masked_fill(~m, -float("inf")).amax(-1))
            lo = torch.minimum(lq.masked_fill(~m, float("inf")).amin(-1), lk.masked_fill(~m, float("inf")).amin(-1))
            off = ctx.codes.to(x.dtype) * (hi - lo)[..., None]
            pq = torch.argsort((lq + off).masked_fill(~m, float("inf")), dim=-1, stable=True)  # (B, T, H, Np)
            pk = torch.argsort((lk + off).masked_fill(~m, float("inf")), dim=-1, stable=True)
        T = pq.shape[1]
        gather = lambda t, p: torch.gather(t.unsqueeze(1).expand(B, T, H, Np, t.shape[-1]), 3,
                                           p[..., None].expand(B, T, H, Np, t.shape[-1]))
        nb = Np // b
        qs = gather(q, pq).view(B, T, H, nb, b, -1)
        ks = gather(k, pk).view(B, T, H, nb, b, -1)
        vs = gather(v, pk).view(B, T, H, nb, b, d)
        kvalid = torch.gather(ctx.mask[:, None, None, :].expand(B, T, H, Np), 3, pk).view(B, T, H, nb, 1, b)
        s = torch.einsum("bthnid,bthnjd->bthnij", qs, ks) - 0.5 * qs.pow(2).sum(-1)[..., None] \
            - 0.5 * ks.pow(2).sum(-1)[..., None, :]
        s = torch.exp(torch.clamp(s, max=0.0)) * kvalid
        num = torch.einsum("bthnij,bthnjd->bthnid", s, vs).reshape(B, T, H, Np, d)
        den = s.sum(-1).reshape(B, T, H, Np) + DENOM_EPS
        num = torch.zeros_like(num).scatter_(3, pq[..., None].expand_as(num), num)
        den = torch.zeros_like(den).scatter_(3, pq, den)
        o = num.sum(1) / den.sum(1)[..., None]                                   # (B, H, Np, d)
        y = self.out_linear(o.transpose(1, 2).reshape(B, Np, H * d))
        return self.zero_padding(y, ctx.mask)[:, :N]
