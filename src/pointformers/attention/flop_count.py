"""Analytic FLOP counts: the counting conventions and the formulas the mechanisms are built from.

Each mechanism declares its own per-layer count in its registry entry (``flops=``), built from
the primitives here; :mod:`pointformers.bench.flops` sums them into whole models.

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

from dataclasses import dataclass, field

__all__ = ["FlopCount", "projections", "dense_core", "block_core", "favor_features", "favor_products",
           "favor_core", "rff_trig_core", "e2lsh_hash", "padded"]


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


def padded(n: int, b: int) -> int:
    """n rounded up to a multiple of b."""
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
    npad = padded(n, block_size)
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
