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

    The formula is the mechanism's own (its registry entry's ``flops``, conventions in
    :mod:`pointformers.attention.flop_count`). ``options`` are the mechanism's constructor options
    (as for :func:`pointformers.attention.build`); the count is taken on a built module, so it
    follows the implementation's own defaults (head width, features, k, ...). ``pos_dim``
    (coordinate columns fed to k-NN / serialized, default ``coord_dim`` or 3) may be given too.
    """
    from ..attention import build, info

    pos_dim = options.pop("pos_dim", None)
    formula = info(name).flops
    if formula is None:
        raise ValueError(f"no FLOP formula for mechanism {name!r} (register it with flops=...)")
    return formula(build(name, dim=dim, heads=heads, **options), n, dim, pos_dim)


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
