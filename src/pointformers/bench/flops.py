"""Analytic FLOP counts of every attention mechanism and of the HEPT tracking model.

Conventions (the same for every mechanism, so the counts compare):

* A FLOP is one floating-point add or multiply; a matrix product (a × k)·(k × c) costs
  2·a·k·c. Counted are the matrix products (projections, scores, value aggregation, hash
  projections, random-feature maps) and the pairwise distance work that is not a matrix product
  (k-NN's exact ``cdist``: 3 FLOPs per point pair and coordinate; SFT's L1 maxout score:
  3 per query–key pair and channel). Not counted: elementwise passes over scores (exp, clamp,
  softmax normalisation), layer norms, biases, sorts / top-k / gathers — each is O(1) per score
  entry or O(N log N) per sort, small next to the products they accompany, and none runs at matmul
  speed; the measured time includes them, which is why achieved GFLOP/s sits below the matmul peak.
* The attention "core" of a row-normalised mechanism carries its denominator as one more value
  column (as HEPT's block kernel does: v' = [v, 1]); HEPT/LSH/kernel scores use the augmented
  rows q' = [q̂, −½‖q̂‖², 1] (width d + c + 2) of :mod:`pointformers.attention.block_attention`.
* Forward + backward ("train") = forward + the backward products of every part that carries
  gradient. The backward pass of a product A·B costs two products (dA and dB) when both factors
  are differentiable (projections, scores, value aggregation) and one when a factor is a frozen
  constant (the random-feature matrix Ω of FAVOR+/FLT: only d(input) is formed); parts without
  gradient (hashing, the k-NN search) cost nothing backward. So train = 3× the usual parts,
  2× the feature maps, 1× the no-gradient parts. Recomputation done by an implementation to save
  memory (HEPT's backward recomputes its block scores and projections) is *not* counted: these
  are model FLOPs, not executed FLOPs. ``tests/test_flops.py`` checks the counts against
  :class:`torch.utils.flop_counter.FlopCounterMode` on the real modules (an independent count of
  the matrix products they execute).

Symbols: n points (one cloud, batch 1), D model width, H heads, d head width, c kernel
coordinates, b block size, m₁ OR tables (``n_hashes``), m₂ hashes per table (``n_and``), m random
features, r RPE frequencies, ℓ RPE coordinate dims, k sampled tokens / neighbours, S patch size.

Per layer (``proj`` = 2nD·3Hd + 2nHd·D = 8nDHd, the q/k/v/out projections):

=============  ===========================================================================
full           proj + H·(2n²d + 2n²(d+1))
kernel         proj + H·(2n²(d+c+2) + 2n²(d+1))
hept           proj + H·(4n(d+c)m₁ [hash, no grad] + m₁·n_p·b·(2(d+c+2) + 2(d+1)))
lsh_or         proj + H·(4n(d+c)m₁m₂ [hash, no grad] + m₁·n_p·b·(2(d+c+2) + 2(d+1)))
performer      proj + H·(4nmd [features] + 4nm(d+1) [K'ᵀ[V,1], Q'·(K'ᵀ[V,1])])
flt            proj + H·(4nm(d+2r) + 4nm(d+1) + 2nrℓ [RPE phases])
sft            2nDHd [q] + 4kDHd [k, v on k tokens] + 2nHdD [out] + 2nD + 2kDH [scores, leak]
               + H·(3nkd [L1 maxout] + 2nk(d+1))
samsa          proj + 2nD·h_i + 2n·h_i·H [importance MLP] + H·(2nkd + 2nk(d+1))
sampled        proj + H·(4nd + 4nd)   [2 keys per query]
knn            proj + 3n²P [exact cdist, no grad] + H·(2nkd + 2nk(d+1))
serialized     proj + H·(2n_sS d + 2n_sS(d+1)),  n_s = ⌈n/S⌉·S slots
=============  ===========================================================================

n_p = n rounded up to a multiple of b. Numbers are plain Python ints.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..models.hept_tracking import TRACKING_DEFAULTS


@dataclass
class FlopCount:
    """FLOPs by part, each with its backward multiplier (products formed per forward product).

    ``backward[name]``: 2 for a product of two differentiable factors, 1 when one factor is a
    frozen constant, 0 for parts without gradient (see the module doc).
    """

    parts: dict[str, int] = field(default_factory=dict)
    backward: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, flops: int, grad: bool = True, backward: int | None = None) -> "FlopCount":
        """Add ``flops`` to part ``name``; ``backward`` defaults to 2 (``grad``) or 0 (not ``grad``)."""
        mult = (2 if grad else 0) if backward is None else backward
        if name in self.backward and self.backward[name] != mult:
            raise ValueError(f"part {name!r} was added with backward multiplier {self.backward[name]}, now {mult}")
        self.parts[name] = self.parts.get(name, 0) + int(flops)
        self.backward[name] = mult
        return self

    @property
    def no_grad(self) -> set[str]:
        """Names of the parts that do not enter the backward pass."""
        return {k for k, m in self.backward.items() if m == 0}

    def total(self, mode: str = "forward") -> int:
        """``mode``: "forward" or "train" (forward + backward, see the module doc)."""
        if mode not in ("forward", "train"):
            raise ValueError(f"mode must be 'forward' or 'train', got {mode!r}")
        if mode == "forward":
            return sum(self.parts.values())
        return sum(f * (1 + self.backward[k]) for k, f in self.parts.items())

    def __add__(self, other: "FlopCount") -> "FlopCount":
        out = FlopCount(dict(self.parts), dict(self.backward))
        for k, f in other.parts.items():
            out.add(k, f, backward=other.backward[k])
        return out


def _pad(n: int, b: int) -> int:
    return -(-n // b) * b


def projections(n: int, dim: int, heads: int, head_dim: int) -> int:
    """q, k, v (D → H·d) and out (H·d → D) projections: 8·n·D·H·d."""
    return 2 * n * dim * 3 * heads * head_dim + 2 * n * heads * head_dim * dim


def dense_core(n: int, qk_width: int, v_width: int, keys: int | None = None) -> int:
    """Scores of n queries against ``keys`` keys (default n) and the value product with the
    denominator column: 2·n·keys·qk_width + 2·n·keys·(v_width + 1)."""
    keys = n if keys is None else keys
    return 2 * n * keys * qk_width + 2 * n * keys * (v_width + 1)


def block_core(n: int, head_dim: int, coord_dim: int, block_size: int, n_tables: int,
               v_width: int | None = None) -> int:
    """HEPT/LSH block kernel per head: m₁·n_p·b·(2(d+c+2) + 2(d_v+1)), d_v = d by default."""
    npad = _pad(n, block_size)
    dv = head_dim if v_width is None else v_width
    return n_tables * npad * block_size * (2 * (head_dim + coord_dim + 2) + 2 * (dv + 1))


def favor_features(n: int, qk_width: int, nb_features: int) -> int:
    """FAVOR+ feature maps of n queries and n keys per head: Ωq and Ωk, 4·n·m·width."""
    return 4 * n * nb_features * qk_width


def favor_products(n: int, v_width: int, nb_features: int) -> int:
    """FAVOR+ products per head with the denominator column: K'ᵀ[V, 1] and Q'·(K'ᵀ[V, 1]),
    4·n·m·(d+1)."""
    return 4 * n * nb_features * (v_width + 1)


def favor_core(n: int, qk_width: int, v_width: int, nb_features: int) -> int:
    """FAVOR+ per head: features of q and k (4·n·m·width) and the two products with the
    denominator column (4·n·m·(d+1))."""
    return favor_features(n, qk_width, nb_features) + favor_products(n, v_width, nb_features)


def rff_trig_core(n: int, qk_width: int, v_width: int, nb_features: int) -> int:
    """Trigonometric RFF ψ(x) = √(2/m)[cos Wx, sin Wx] (m features from m/2 frequencies) per head:
    2·n·m·width for the projections of q and k, 4·n·m·(d+1) for the two products."""
    return 2 * n * nb_features * qk_width + 4 * n * nb_features * (v_width + 1)


def e2lsh_hash(n: int, width: int, n_tables: int, n_and: int = 1) -> int:
    """Base (and AND) hash projections of n queries and n keys: 4·n·width·m₁·m₂."""
    return 4 * n * width * n_tables * n_and


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
