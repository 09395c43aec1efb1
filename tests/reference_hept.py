"""A literal, slow re-statement of the forward semantics of the authors' HEPT tracking model
(the reference README: "Forward semantics" and "Exact arithmetic and padding"), written
directly on the raw state_dict keys. Used only by the tests, to check the library's fast
implementation. One cloud of any size N: region sizes ceil(N × (1/B)) in the regions' dtype
from the cloud's own N, padding by duplicated points, PyTorch's default (unstable) argsort
wherever the authors' code sorts.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def region_codes(coords: torch.Tensor, regions: torch.Tensor) -> torch.Tensor:
    """(N, c), (T, 2, H) -> codes (T, H, N) int64, step 1 of the README with its exact arithmetic."""
    N = coords.shape[0]
    T, _, H = regions.shape
    rows = regions.permute(0, 2, 1).reshape(T * H, 2)  # row t·H + h: (B_eta, B_phi)
    out = []
    for row in rows:
        r = []
        for axis in range(2):
            order = torch.argsort(coords[:, axis])
            rank = torch.empty(N, dtype=torch.long)
            rank[order] = torch.arange(N)
            size = int(torch.ceil(N * torch.reciprocal(row[axis])))  # N × (1/B) in the regions' dtype
            r.append(rank // size + 1)
        bits = int(math.ceil(math.log2(int(r[0].max()) + 1)))
        out.append((r[1] << bits) | r[0])
    return torch.stack(out).view(T, H, N)


def padding_rows(codes: torch.Tensor, block_size: int) -> torch.Tensor:
    """Row of each padded point: 0..N−1, then copies of the points at positions N − b … of the
    argsort of the table-0/head-0 codes (README, padding item 3). (T, H, N) -> (P,)."""
    N = codes.shape[-1]
    P = -(-N // block_size) * block_size
    order = torch.argsort(codes[0, 0])
    copies = [int(order[N - block_size + j]) for j in range(P - N)]  # Python indexing (negatives from the end)
    return torch.cat([torch.arange(N), torch.tensor(copies, dtype=torch.long)])


def reference_forward(sd: dict, x: torch.Tensor, coords: torch.Tensor, block_size: int = 100,
                      heads: int = 8, n_layers: int = 4, num_w_per_dist: int = 10) -> torch.Tensor:
    """x (N, 15), coords (N, 6) -> (N, 12), everything in x's dtype (the regions too, as when the
    authors' whole model is cast to it)."""
    dt = x.dtype
    sd = {k: v.to(dt) for k, v in sd.items()}
    n = x.shape[0]
    codes = region_codes(coords, sd["regions"])
    rows = padding_rows(codes, block_size)
    x, coords, codes = x[rows], coords[rows], codes[..., rows]
    N = x.shape[0]
    h = F.linear(F.relu(F.linear(x, sd["feat_encoder.0.weight"], sd["feat_encoder.0.bias"])),
                 sd["feat_encoder.2.weight"], sd["feat_encoder.2.bias"])
    hs = [h]
    for i in range(n_layers):
        p = f"attns.{i}."
        xn = F.layer_norm(h, (h.shape[-1],), sd[p + "norm1.weight"], sd[p + "norm1.bias"])
        d = sd[p + "w_q.weight"].shape[0] // heads
        q = (xn @ sd[p + "w_q.weight"].T).view(N, heads, d)
        k = (xn @ sd[p + "w_k.weight"].T).view(N, heads, d)
        v = (xn @ sd[p + "w_v.weight"].T).view(N, heads, d)
        w = sd[p + "w_rpe.weight"].view(heads, d, -1, num_w_per_dist)
        om = torch.exp(torch.clamp(w.sum(1), max=50)).sum(-1)          # (H, c-1)
        om = torch.cat([om[:, :1], om], 1)                             # (H, c)
        rho = torch.sqrt(2 * om)[None] * coords[:, None, :]           # (N, H, c)
        qh = torch.cat([q, rho], -1).transpose(0, 1)                   # (H, N, D)
        kh = torch.cat([k, rho], -1).transpose(0, 1)
        vh = v.transpose(0, 1)
        alpha = sd[p + "attn.e2lsh.alpha"]                             # (H, D, T)
        Lq = torch.einsum("hnD,hDt->thn", qh, alpha)
        Lk = torch.einsum("hnD,hDt->thn", kh, alpha)
        delta = (torch.maximum(Lq.amax(-1), Lk.amax(-1)) - torch.minimum(Lq.amin(-1), Lk.amin(-1)))[..., None]
        Tq = Lq + delta * codes.to(dt)
        Tk = Lk + delta * codes.to(dt)
        num = torch.zeros(heads, N, d, dtype=dt)
        den = torch.zeros(heads, N, dtype=dt)
        for t in range(Tq.shape[0]):
            for hh in range(heads):
                pq = torch.argsort(Tq[t, hh])
                pk = torch.argsort(Tk[t, hh])
                Qs = qh[hh, pq].view(-1, block_size, qh.shape[-1])
                Ks = kh[hh, pk].view(-1, block_size, kh.shape[-1])
                Vs = vh[hh, pk].view(-1, block_size, d)
                s = Qs @ Ks.transpose(1, 2) - 0.5 * (Qs ** 2).sum(-1)[..., None] - 0.5 * (Ks ** 2).sum(-1)[:, None, :]
                s = torch.exp(torch.clamp(s, max=0))
                num[hh, pq] += (s @ Vs).reshape(N, d)
                den[hh, pq] += s.sum(-1).reshape(N) + 1e-20
        o = (num / den[..., None]).transpose(0, 1).reshape(N, heads * d)
        h = h + F.linear(o, sd[p + "attn.out_linear.weight"], sd[p + "attn.out_linear.bias"])
        hn = F.layer_norm(h, (h.shape[-1],), sd[p + "norm2.weight"], sd[p + "norm2.bias"])
        h = h + F.linear(F.relu(F.linear(hn, sd[p + "ff.0.weight"], sd[p + "ff.0.bias"])),
                         sd[p + "ff.2.weight"], sd[p + "ff.2.bias"])
        hs.append(h)
    e = torch.cat(hs, -1) @ sd["W.weight"].T
    z = e
    n_lin = len({k.split(".")[2] for k in sd if k.startswith("mlp_out.lins.")})
    for j in range(n_lin - 1):
        z = F.linear(z, sd[f"mlp_out.lins.{j}.weight"], sd[f"mlp_out.lins.{j}.bias"])
        z = torch.tanh(F.layer_norm(z, (z.shape[-1],), sd[f"mlp_out.norms.{j}.weight"], sd[f"mlp_out.norms.{j}.bias"]))
    z = F.linear(z, sd[f"mlp_out.lins.{n_lin - 1}.weight"], sd[f"mlp_out.lins.{n_lin - 1}.bias"])
    return (e + z)[:n]
