"""FLOPs of whole models and of one layer of any mechanism by name.

The counting conventions and the per-mechanism formulas live with the mechanisms
(:mod:`pointformers.attention.flop_count` and each mechanism's registry entry); this module
adds them up.
"""
from __future__ import annotations

import math

from ..attention.flop_count import (FlopCount, block_core, dense_core, e2lsh_hash, favor_core, favor_features,  # noqa: F401
                                    favor_products, padded, projections, rff_trig_core)
from ..models.hept_tracking import TRACKING_DEFAULTS

_pad = padded


def attention_flops(name: str, n: int, dim: int, heads: int, **options) -> FlopCount:
    """FLOPs of one layer of mechanism ``name`` on one cloud of n points (batch 1).

    ``options`` are the mechanism's constructor options (as for
    :func:`pointformers.attention.build`); the defaults are read from a built module, so the
    count follows the implementation's own defaults (head width, features, k, ...). ``pos_dim``
    (coordinate columns fed to k-NN / serialized, default ``coord_dim`` or 3) may be given too.
    """
    from ..attention import build

    pos_dim = options.pop("pos_dim", None)
    m = build(name, dim=dim, heads=heads, **options)
    H, d = heads, m.head_dim
    f = FlopCount()
    if name == "sft":
        k = min(m.k, n)
        inner = H * d
        f.add("q projection", 2 * n * dim * inner)
        f.add("k, v projections (sampled tokens)", 2 * 2 * k * dim * inner)
        f.add("out projection", 2 * n * inner * dim)
        f.add("sampler score and leak", 2 * n * dim + 2 * k * dim * H)
        f.add("maxout scores (L1, non-matmul)", H * 3 * n * k * d)
        f.add("value product", H * 2 * n * k * (d + 1))
        return f
    f.add("projections", projections(n, dim, H, d))
    if name == "full":
        f.add("attention", H * dense_core(n, d, d))
    elif name == "kernel":
        f.add("attention", H * dense_core(n, d + m.coord_dim + 2, d))
    elif name in ("hept", "lsh_or"):
        n_and = getattr(m, "n_and", 1)
        c = m.coord_dim
        f.add("hash projections", H * e2lsh_hash(n, d + c, m.n_hashes, n_and), grad=False)
        f.add("block attention", H * block_core(n, d, c, m.block_size, m.n_hashes))
    elif name in ("performer", "flt"):
        width = d
        if name == "flt":
            r, ell = m.num_rpe_features, m.coord_dim
            f.add("rpe phases", H * 2 * n * r * ell, backward=1)  # positions carry no gradient
            width = d + 2 * r
        # Ω is a frozen draw: the feature maps' backward forms d(input) only
        f.add("feature maps", H * favor_features(n, width, m.nb_features), backward=1)
        f.add("attention", H * favor_products(n, d, m.nb_features))
    elif name == "samsa":
        hid = m.importance[0].out_features
        k = m.k if m.support else min(m.k, n)  # support vectors fill up to k keys
        f.add("importance MLP", 2 * n * dim * hid + 2 * n * hid * H)
        f.add("attention", H * dense_core(n, d, d, keys=k))
    elif name == "sampled":
        f.add("attention", H * dense_core(n, d, d, keys=2) - H * 2 * n * 2)  # no denominator column
    elif name == "knn":
        k = min(m.k, n)
        P = pos_dim or m.coord_dim or 3
        f.add("neighbour search (cdist, non-matmul)", 3 * n * n * P, grad=False)
        f.add("attention", H * dense_core(n, d, d, keys=k))
    elif name == "serialized":
        slots = _pad(n, m.patch_size)
        f.add("attention", H * dense_core(slots, d, d, keys=m.patch_size))
    else:
        raise ValueError(f"no FLOP formula for mechanism {name!r}")
    return f


def hept_model_flops(n: int, **overrides) -> FlopCount:
    """FLOPs of the HEPT tracking model (:func:`pointformers.models.build` ``"hept-tracking"``).

    Encoder Linear(F, D)–Linear(D, D); per layer the HEPT attention (as above, with the
    tracking head width and 6 kernel coordinates) and the FFN Linear(D, D)–Linear(D, D);
    jumping knowledge W (D·(L+1) → out); output MLP [out, h, …, h, out] with ``mlp_layers``
    linear layers. The paper's Table 6 reports 52.2 G for Tracking-60k from fvcore, which counts
    multiply–accumulates (1 MAC = 2 FLOPs here).
    """
    cfg = {**TRACKING_DEFAULTS, **overrides}
    D, L, H, d, c = cfg["dim"], cfg["n_layers"], cfg["heads"], cfg["head_dim"], cfg["coord_dim"]
    b, m1, out, hid, nl = cfg["block_size"], cfg["n_hashes"], cfg["out_dim"], cfg["mlp_hidden"], cfg["mlp_layers"]
    f = FlopCount()
    f.add("encoder", 2 * n * (cfg["in_dim"] * D + D * D))
    for _ in range(L):
        f.add("attention projections", projections(n, D, H, d))
        f.add("hash projections", H * e2lsh_hash(_pad(n, b), d + c, m1), grad=False)
        f.add("block attention", H * block_core(n, d, c, b, m1))
        f.add("feed-forward", 2 * 2 * n * D * D)
    f.add("jumping knowledge", 2 * n * D * (L + 1) * out)
    widths = [out] + [hid] * (nl - 1) + [out]
    f.add("output MLP", sum(2 * n * a * w for a, w in zip(widths[:-1], widths[1:])))
    return f


def gflops(flops: int, seconds: float) -> float:
    """Achieved GFLOP/s (nan when the time is not positive)."""
    return flops / seconds / 1e9 if seconds > 0 else math.nan
