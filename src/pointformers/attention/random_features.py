"""FAVOR+ machinery shared by ``performer`` and ``flt``: seeded random draws with an explicit
redraw policy, positive orthogonal random features, and (causal) linear attention.

Positive random features (Performer, Choromanski et al. 2021). For ω ~ N(0, I_D),
exp(xᵀy) = E_ω[ϕ_ω(x) ϕ_ω(y)] with ϕ_ω(x) = exp(ωᵀx − ‖x‖²/2). With m draws stacked in
Ω (m, D), softmax attention exp(q·k) is estimated by ϕ(q)·ϕ(k) and row-normalised, which costs
O(N·m·D) instead of O(N²·D). The rows of Ω are drawn in orthogonal blocks (QR of a Gaussian
matrix, rows rescaled by χ_D lengths), so each row is still marginally N(0, I) (unbiased) but
rows within a block are exactly orthogonal (lower variance).

Stabilisation (exp overflows in float32 for ‖x‖ of a few units):

* queries: the per-row constant exp(−‖q‖²/2 − max_m ωᵀq) is dropped / subtracted — a factor
  that is constant along a query row cancels between numerator and denominator;
* keys: ONE constant c per (cloud, head) is subtracted from every key exponent — a per-key
  max would reweight the keys and bias the result. c is the max over the cloud's REAL keys
  only: a max over the whole padded batch would make a cloud's result depend on the other
  clouds in its batch (and could underflow its features), breaking padding invariance.
  In the causal path c is a running max over the chunks seen so far (the state is rescaled
  when it grows), which is still one constant per query's key set and so still cancels.

The constants 1/√m and the dropped norms cancel in the normalisation, so the features below
are "unnormalised"; the maxima are detached because the output does not depend on them.
"""
from __future__ import annotations

import torch
from torch import nn

from ..nn.model_inputs import is_tracing

#: Redraw policies accepted by :class:`RandomDraws`.
REDRAW_NEVER = "never"
REDRAW_EVERY = "every_forward_in_training"

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """A well-mixed 64-bit hash (SplitMix64) so nearby (seed, stream, draw) give unrelated streams."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def draw_generator(seed: int, stream: int, draw: int) -> torch.Generator:
    """A CPU generator for draw number ``draw`` of random stream ``stream`` under ``seed``."""
    key = _splitmix64(_splitmix64(_splitmix64(seed) ^ stream) ^ draw)
    return torch.Generator().manual_seed(key & ((1 << 63) - 1))


def resolve_seed(seed: int | None, generator: torch.Generator | None = None) -> int:
    """The module's master seed: ``seed`` if given, else drawn from ``generator`` or the global
    RNG (so ``torch.manual_seed`` before construction makes the module reproducible)."""
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative int or None, got {seed!r}")
        return seed
    return int(torch.randint(0, 2**62, (1,), generator=generator))


def parse_redraw(redraw: str | int) -> str | int:
    """Validate a redraw policy: "never", "every_forward_in_training" or a positive int N
    (new features every N training forwards)."""
    if redraw in (REDRAW_NEVER, REDRAW_EVERY):
        return redraw
    if isinstance(redraw, int) and not isinstance(redraw, bool) and redraw >= 1:
        return redraw
    raise ValueError(f"redraw must be 'never', 'every_forward_in_training' or a positive int, got {redraw!r}")


def orthogonal_gaussian(m: int, d: int, generator: torch.Generator) -> torch.Tensor:
    """Ω (m, d), float64: ⌈m/d⌉ independent blocks of d orthogonal rows, each row rescaled to
    the length of an independent N(0, I_d) vector, so every row is marginally N(0, I_d)."""
    out = []
    for n, k in ((m // d, d), (1 if m % d else 0, m % d)):  # full blocks (batched), then the rest
        if n == 0:
            continue
        # reduced QR of (d, k) Gaussians: k orthonormal directions in O(d·k²) — never a d×d QR
        # when m < d (FLT's d + 2r can be large)
        q, r = torch.linalg.qr(torch.randn(n, d, k, generator=generator, dtype=torch.float64))
        q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)  # sign fix: Haar directions
        lengths = torch.randn(n, k, d, generator=generator, dtype=torch.float64).norm(dim=-1)  # χ_d
        out.append((q.transpose(-1, -2) * lengths.unsqueeze(-1)).reshape(n * k, d))
    return torch.cat(out, 0)


class RandomDraws(nn.Module):
    """A buffer ``value`` of random numbers with a seeded, checkpointable redraw policy.

    * frozen at init: draw 0 of stream ``stream`` under ``seed``;
    * training: with ``redraw="every_forward_in_training"`` every training forward gets draw
      k+1; with an int N the draw changes every N training forwards; "never" keeps draw 0;
    * eval: never redrawn (and the step counter does not move).

    Draw k is a pure function of (seed, stream, k); seed, draw index and step counter are int
    buffers, so a state_dict round trip (or every DDP rank) continues the same sequence.
    Subclasses implement :meth:`sample`.
    """

    def __init__(self, redraw: str | int, seed: int, stream: int):
        super().__init__()
        self.redraw = parse_redraw(redraw)
        self.stream = int(stream)
        self.register_buffer("seed", torch.tensor(seed, dtype=torch.int64))
        self.register_buffer("draws", torch.tensor(0, dtype=torch.int64))
        self.register_buffer("train_steps", torch.tensor(0, dtype=torch.int64))
        self.register_buffer("value", self.sample(self._generator(0)).to(torch.get_default_dtype()))

    def sample(self, generator: torch.Generator) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _generator(self, draw: int) -> torch.Generator:
        return draw_generator(int(self.seed), self.stream, draw)

    @torch.no_grad()
    def redraw_now(self) -> None:
        """Replace ``value`` by the next draw. Assigned, not copied in place, so a graph from an
        earlier forward that saved the old value can still run backward."""
        self.draws += 1
        self.value = self.sample(self._generator(int(self.draws))).to(self.value.dtype).to(self.value.device)

    def forward(self) -> torch.Tensor:
        """Apply the redraw policy (training only) and return the current draw."""
        if self.training:
            step = int(self.train_steps)
            if self.redraw == REDRAW_EVERY or (isinstance(self.redraw, int) and step > 0 and step % self.redraw == 0):
                self.redraw_now()
            self.train_steps += 1
        return self.value

    def extra_repr(self) -> str:
        return f"shape={tuple(self.value.shape)}, redraw={self.redraw!r}, stream={self.stream}"


class OrthogonalFeatures(RandomDraws):
    """Ω (m, d) orthogonal Gaussian projection for FAVOR+ (see :func:`orthogonal_gaussian`)."""

    def __init__(self, nb_features: int, d: int, redraw: str | int, seed: int, stream: int = 0):
        if not isinstance(nb_features, int) or nb_features < 1:
            raise ValueError(f"nb_features must be a positive int, got {nb_features!r}")
        self.nb_features, self.d = nb_features, d
        super().__init__(redraw, seed, stream)

    def sample(self, generator: torch.Generator) -> torch.Tensor:
        return orthogonal_gaussian(self.nb_features, self.d, generator)


class GaussianNoise(RandomDraws):
    """ε of a fixed shape, iid N(0, 1) (FLT's reparameterised RPE frequencies ξ = s·ε)."""

    def __init__(self, shape: tuple[int, ...], redraw: str | int, seed: int, stream: int = 1):
        self.shape = tuple(shape)
        super().__init__(redraw, seed, stream)

    def sample(self, generator: torch.Generator) -> torch.Tensor:
        return torch.randn(self.shape, generator=generator, dtype=torch.float64)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Features and exp are computed in at least float32 (bf16/fp16 exponents are too coarse)."""
    return torch.promote_types(dtype, torch.float32)


def query_features(qh: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
    """Positive features of queries, stabilised per row. (..., N, D), (m, D) -> (..., N, m).

    exp(ωᵀq − ‖q‖²/2) up to the row constant exp(−‖q‖²/2 − max_m ωᵀq), which cancels."""
    u = qh @ omega.transpose(0, 1)
    return torch.exp(u - u.amax(-1, keepdim=True).detach())


def key_exponents(kh: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
    """ωᵀk − ‖k‖²/2 for all keys and features. (..., N, D), (m, D) -> (..., N, m).

    The key-side stabiliser must be one constant per (cloud, head); the attention functions
    below apply it, over real keys only."""
    return kh @ omega.transpose(0, 1) - 0.5 * kh.pow(2).sum(-1, keepdim=True)


def _features_in_place(x: torch.Tensor, omega: torch.Tensor, mask: torch.Tensor | None, keys: bool) -> torch.Tensor:
    """The positive features in one (..., N, m) buffer, every step in place: queries
    exp(ωᵀq − max_m ωᵀq); keys exp(ωᵀk − ‖k‖²/2 − c) with c the max over the cloud's real keys
    (padded keys: 0). x (B, H, N, D), omega (m, D), mask (B, N) or None (all real). In x's dtype (at
    least float32, :func:`compute_dtype`) even under autocast, whose bfloat16 exponents are too coarse."""
    with torch.autocast(x.device.type, enabled=False):
        f = x @ omega.to(x.dtype).transpose(0, 1)
    if keys:
        f.sub_(0.5 * x.pow(2).sum(-1, keepdim=True))
        if mask is not None:
            f.masked_fill_(~mask[:, None, :, None], float("-inf"))
        c = f.amax(dim=(-2, -1), keepdim=True)
        c = torch.where(torch.isfinite(c), c, torch.zeros_like(c))   # a cloud without real keys: all 0
    else:
        c = f.amax(-1, keepdim=True)
    return f.sub_(c).exp_()


class _PositiveFeatures(torch.autograd.Function):
    """:func:`_features_in_place` with its gradient: with f = exp(u − c) (c constant, as detached in
    the reference), ∂u = g·f, and x enters through u = ωᵀx (− ‖x‖²/2 for keys), so
    ∂x = (g·f) ω (− x Σ_m g·f). Keeps f, x and ω for the backward pass instead of autograd's
    three or four (..., N, m) intermediates."""

    @staticmethod
    def forward(ctx, x, omega, mask, keys):
        f = _features_in_place(x, omega, mask, keys)
        ctx.save_for_backward(x, omega, f)
        ctx.keys = keys
        return f

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        x, omega, f = ctx.saved_tensors
        gu = g * f
        gx = gu @ omega
        if ctx.keys:
            gx.sub_(x * gu.sum(-1, keepdim=True))
        return gx, None, None, None


def positive_features(x: torch.Tensor, omega: torch.Tensor, mask: torch.Tensor | None = None,
                      keys: bool = False) -> torch.Tensor:
    """Positive random features of queries (``keys=False``, stabilised per row) or keys
    (``keys=True``, one stabiliser per (cloud, head) over its real keys, padded keys 0).
    x (B, H, N, D), omega (m, D), mask (B, N) bool or None -> (B, H, N, m).

    Same values and gradients as :func:`query_features`, and as the exponentials of
    :func:`key_exponents` that :func:`linear_attention` takes, in one buffer per call (a fused
    autograd step in training, in place without autograd); the traced (export) graph and a
    learnable Ω take those reference functions."""
    if is_tracing() or omega.requires_grad:
        return key_features(key_exponents(x, omega), mask) if keys else query_features(x, omega)
    if torch.is_grad_enabled() and x.requires_grad:
        return _PositiveFeatures.apply(x, omega, mask, keys)
    with torch.no_grad():
        return _features_in_place(x, omega, mask, keys)


def key_features(k_exp: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """exp(k_exp − c) with c the max over each cloud's real keys, per head (detached), padded keys 0
    (a cloud without real keys: all 0). k_exp (B, H, N, m) (:func:`key_exponents`), mask (B, N) or None."""
    if mask is not None:
        k_exp = k_exp.masked_fill(~mask[:, None, :, None], float("-inf"))  # exp(-inf) = 0, zero gradient
    c = k_exp.amax(dim=(-2, -1), keepdim=True).detach()   # one constant per (cloud, head), real keys only
    return torch.exp(k_exp - torch.where(torch.isfinite(c), c, torch.zeros_like(c)))


def normalised_feature_attention(q_feat: torch.Tensor, k_feat: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Σ_j ϕ(q_i)·ϕ(k_j) v_j / Σ_j ϕ(q_i)·ϕ(k_j) from features (padded keys' features 0).
    q_feat, k_feat (B, H, N, m), v (B, H, N, d) -> (B, H, N, d). The normaliser rides along as a
    column of ones beside v: one pass over each feature tensor gives numerator and denominator."""
    d = v.shape[-1]
    kv = k_feat.transpose(-1, -2) @ torch.cat([v, v.new_ones(v.shape[:-1] + (1,))], -1)   # (B, H, m, d + 1)
    out = q_feat @ kv
    return out[..., :d] / out[..., d:].clamp_min(torch.finfo(out.dtype).tiny)


def linear_attention(q_feat: torch.Tensor, k_exp: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Non-causal normalised linear attention with a key-padding mask.

    Args: q_feat (B, H, N, m) positive query features; k_exp (B, H, N, m) key exponents
    (:func:`key_exponents`); v (B, H, N, d); mask (B, N) bool, True = real.
    Returns (B, H, N, d): Σ_j ϕ(q_i)·ϕ(k_j) v_j / Σ_j ϕ(q_i)·ϕ(k_j) over real j.
    Time O(B·H·N·m·d), memory O(B·H·(N·m + m·d)).
    """
    return normalised_feature_attention(q_feat, key_features(k_exp, mask), v)


def causal_linear_attention(q_feat: torch.Tensor, k_exp: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                            chunk_size: int = 128) -> torch.Tensor:
    """Causal normalised linear attention (query i sees real keys j ≤ i) by chunked prefix sums.

    Same arguments and result as :func:`linear_attention`, with the causal rule. Per chunk of
    C rows: intra-chunk terms from tril(ϕ(Q_c) ϕ(K_c)ᵀ) (C×C), inter-chunk terms from the
    running state S = Σ ϕ(k_j) v_jᵀ (m×d) and z = Σ ϕ(k_j). Extra memory per chunk is
    O(B·H·(C² + C·m + m·d)); nothing of size N·m·d is built (a naive cumsum would be).
    The key stabiliser is the running max over real keys seen so far; S and z are rescaled
    when it grows, so early queries are not underflowed by large later keys.
    """
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    B, H, N, m = q_feat.shape
    d = v.shape[-1]
    e = k_exp.masked_fill(~mask[:, None, :, None], float("-inf"))
    S = v.new_zeros(B, H, m, d)
    z = v.new_zeros(B, H, m, 1)
    c_run = v.new_full((B, H, 1, 1), float("-inf"))
    tiny = torch.finfo(v.dtype).tiny
    outs = []
    for s in range(0, N, chunk_size):
        q_c, e_c, v_c = q_feat[:, :, s:s + chunk_size], e[:, :, s:s + chunk_size], v[:, :, s:s + chunk_size]
        c_new = torch.maximum(c_run, e_c.amax(dim=(-2, -1), keepdim=True)).detach()
        c_safe = torch.where(torch.isfinite(c_new), c_new, torch.zeros_like(c_new))  # no real key yet
        k_c = torch.exp(e_c - c_safe)
        scale = torch.exp(c_run - c_safe)  # 0 while no real key has been seen (S is 0 then)
        S, z = S * scale, z * scale
        a = torch.tril(q_c @ k_c.transpose(-1, -2))  # (B, H, C, C), j ≤ i inside the chunk
        num = a @ v_c + q_c @ S
        den = a.sum(-1, keepdim=True) + q_c @ z
        outs.append(num / den.clamp_min(tiny))
        S = S + k_c.transpose(-1, -2) @ v_c
        z = z + k_c.sum(-2).unsqueeze(-1)
        c_run = c_new
    return torch.cat(outs, dim=2)


#: Why ``causal=True`` (performer, flt) has no export path.
CAUSAL_EXPORT_REFUSAL = ("causal=True runs chunked prefix sums in a Python loop over ceil(N / chunk_size) chunks, "
                         "a trip count that depends on N; only the non-causal path exports")


def favor_attention(qh: torch.Tensor, kh: torch.Tensor, v: torch.Tensor, omega: torch.Tensor, mask: torch.Tensor,
                    causal: bool = False, chunk_size: int = 128) -> torch.Tensor:
    """FAVOR+ estimate of softmax attention with logits qh·kh (scaling already applied).

    qh, kh (B, H, N, D); v (B, H, N, d); omega (m, D); mask (B, N). Returns (B, H, N, d)."""
    omega = omega.to(qh.dtype)
    if causal:
        return causal_linear_attention(query_features(qh, omega), key_exponents(kh, omega), v, mask, chunk_size)
    real = None if (mask.device.type == "cpu" and not is_tracing() and bool(mask.all())) else mask
    return normalised_feature_attention(positive_features(qh, omega), positive_features(kh, omega, real, keys=True), v)


def dense_softmax_attention(logits: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, causal: bool = False
                            ) -> torch.Tensor:
    """Reference: exact row softmax of ``logits`` (B, H, N, N) over real (and, if causal, earlier)
    keys, applied to v (B, H, N, d). O(N²) memory; for tests and approximation benchmarks."""
    N = logits.shape[-1]
    allowed = mask[:, None, None, :]
    if causal:
        allowed = allowed & torch.ones(N, N, dtype=torch.bool, device=logits.device).tril()
    logits = logits.masked_fill(~allowed, float("-inf"))
    w = torch.softmax(logits, dim=-1).nan_to_num(0.0)  # padded queries with no allowed key -> 0
    return w @ v


__all__ = ["RandomDraws", "OrthogonalFeatures", "GaussianNoise", "orthogonal_gaussian", "parse_redraw",
           "resolve_seed", "draw_generator", "query_features", "key_exponents", "key_features", "positive_features",
           "normalised_feature_attention", "linear_attention",
           "causal_linear_attention", "favor_attention", "dense_softmax_attention", "compute_dtype",
           "REDRAW_NEVER", "REDRAW_EVERY", "CAUSAL_EXPORT_REFUSAL"]
