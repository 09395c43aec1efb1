"""FLT: FourierLearner-Transformer attention (Choromanski, Li et al., AISTATS 2024).

Target (Eq. 1): Att = D⁻¹AV with A = exp(N + QKᵀ/√d), N = [f(r_i − r_j)] an RPE mask over
positions r ∈ ℝ^ℓ (sequence index, ℓ = 1, or point coordinates). FLT learns the Fourier
transform g of f, f(Δ) = ∫ e^{2πiΔᵀξ} g(ξ) dξ, and estimates N without bias (Thm 4.1) from r
frequencies ξ_k ~ p by importance sampling, N ≈ N1 N2ᵀ. Concatenating [N1, Q d^{-1/4}] and
[N2, K d^{-1/4}] turns exp(N̂ + QKᵀ/√d) into plain softmax logits (Eq. 3), which FAVOR+
linearises: time O(N·m·(d + 2r) + N·r·ℓ), memory O(N·(m + d + r) + m·d).

Real-valued features (the FLT paper is silent on keeping the features real; ours:). With a_k = g(ξ_k)/p(ξ_k) = α_k + iβ_k and
θ_jk = 2π r_jᵀξ_k,

    N1[j] = [α cos θ − β sin θ,  α sin θ + β cos θ]_k / (√r κ)     (B, H, N, 2r)
    N2[j] = κ [cos θ,  sin θ]_k / √r
    (N1 N2ᵀ)_ij = (1/r) Σ_k Re(a_k e^{2πi(r_i − r_j)ᵀξ_k})  — unbiased for Re f(r_i − r_j).

κ = (mean_k |a_k|²)^{1/4} (detached; the product does not depend on it) balances ‖N1‖ = ‖N2‖,
which lowers the FAVOR+ variance; ‖N1[i]‖ and ‖N2[j]‖ do not depend on the position, so the
RPE block adds only constants to the FAVOR+ norms. A real g gives an even f; ``complex_g``
(Gaussian mixture only) learns β too, for asymmetric RPEs.

Positions are centred per cloud (mean over its real points) before the phases: exact, because
N̂ depends only on r_i − r_j, and it keeps phases small for long sequences or far-away
coordinates (float32), and makes batch/translation invariance hold to rounding.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .base import TokenMixer, check_attention_inputs
from .flop_count import FlopCount, favor_features, favor_products, projections
from .random_features import (CAUSAL_EXPORT_REFUSAL, GaussianNoise, OrthogonalFeatures, compute_dtype,
                              dense_softmax_attention, favor_attention, resolve_seed)
from .registry import register

RPE_TYPES = ("gaussian_mixture", "local", "gaussian_basis")
_DEFAULT_T = {"gaussian_mixture": 25, "local": 16, "gaussian_basis": 32}
_DEFAULT_ELL = {"gaussian_mixture": 1, "local": 1, "gaussian_basis": 3}
#: The RPE state of a layer (parameters, buffers, the frequency-noise module): what
#: :meth:`FLTAttention.share_rpe_with` shares.
RPE_STATE = ("rpe_w", "rpe_w_imag", "rpe_sigma_raw", "rpe_mu", "rpe_radius_raw", "log_proposal_std", "sigma_max",
             "rpe_noise")


def _log_uniform(shape: tuple[int, ...], lo: float, hi: float, generator: torch.Generator | None) -> torch.Tensor:
    u = torch.rand(shape, generator=generator, dtype=torch.float64)
    return torch.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))


def _inv_softplus(y: torch.Tensor) -> torch.Tensor:
    return y + torch.log(-torch.expm1(-y))


def flt_flops(m: "FLTAttention", n: int, dim: int, pos_dim: int | None = None) -> FlopCount:
    """Projections, the RPE phases, the feature maps of the augmented q̂/k̂ (width d + 2r) and the
    two FAVOR+ products (see :mod:`.flop_count`)."""
    H, d = m.heads, m.head_dim
    r, ell = m.num_rpe_features, m.coord_dim
    f = FlopCount().add("projections", projections(n, dim, H, d))
    f.add("rpe phases", H * 2 * n * r * ell, backward=1)  # positions carry no gradient
    # Ω is a frozen draw: the feature maps' backward forms d(input) only
    f.add("feature maps", H * favor_features(n, d + 2 * r, m.nb_features), backward=1)
    return f.add("attention", H * favor_products(n, d, m.nb_features))


def relu_feature_attention(qh: torch.Tensor, kh: torch.Tensor, v: torch.Tensor, w: torch.Tensor,
                           mask: torch.Tensor) -> torch.Tensor:
    """Normalised linear attention with the learnable ReLU features ϕ(x) = ReLU(W x) (FLT's ViT):
    Σ_j ϕ(q̂_i)·ϕ(k̂_j) v_j / (Σ_j ϕ(q̂_i)·ϕ(k̂_j) + 1e-6) over real keys j (a query whose features
    meet no key's gets ~0). qh, kh (B, H, N, D); v (B, H, N, d); w (m, D); mask (B, N) -> (B, H, N, d)."""
    qf = torch.relu(qh @ w.T)
    kf = torch.relu(kh @ w.T).masked_fill(~mask[:, None, :, None], 0.0)
    num = qf @ (kf.transpose(-1, -2) @ v)
    den = qf @ kf.sum(-2).unsqueeze(-1)
    return num / (den + 1e-6)


@register("flt", flops=flt_flops,
          bench={"nb_features": 256, "num_rpe_features": 32, "rpe_type": "gaussian_basis"})
class FLTAttention(TokenMixer):
    """FLT: FAVOR+ attention with a learned-Fourier relative positional encoding.

    Args:
        dim: model width D.
        heads: H. The RPE parameters and frequencies are per head (the paper's LM shares them
            across layers: :meth:`share_rpe_with`).
        head_dim: per-head width d (default D // H, or D when H does not divide D).
        nb_features: FAVOR+ random features m (paper: 64 for LM and OC20, 128 for ViT).
        num_rpe_features: RPE frequencies r (paper: 32 LM, 64 ViT, 16 OC20); 2r real columns.
        rpe_type: the learned spectrum g (one of ``RPE_TYPES``):
            "gaussian_mixture" (FLT paper, Sec. 4.3): g(ξ) = Σ_t w_t exp(−‖ξ − μ_t‖²/(2σ_t²)); f is a sum of
                modulated Gaussians. σ_t = σ_max·sigmoid(·) with σ_max = ``proposal_std`` at
                init, which keeps g/p bounded under the fixed proposal.
            "local" (Eq. 20–21, box form, FLT paper Sec. 4.3): g(ξ) = Σ_t w_t ∏_j sin(2πv_tjξ_j)/(πξ_j),
                f(Δ) = Σ_t w_t ∏_j 𝕀[|Δ_j| ≤ v_tj]; learnable radii v_tj > 0. Note g/p is
                unbounded under a Gaussian p (heavy-tailed estimator), as in the paper.
            "gaussian_basis" (FLT paper Sec. 5.3, molecules): g(ξ) = Σ_t w_t exp(−2π²σ_t²‖ξ‖²),
                f(r) = Σ_t w_t (√(2π)σ_t)^{-ℓ} exp(−‖r‖²/(2σ_t²)); isotropic.
        num_components: T (default 25 mixture as ViT, 16 local, 32 basis as OC20).
        coord_dim: ℓ, columns of ``pos`` (default 1 for sequences, 3 for "gaussian_basis").
        proposal_std: initial std s of the proposal p = N(0, s²I) (default 1, the paper's
            standard Gaussian; for "gaussian_basis" 1/(2π·min σ_t), which keeps g/p bounded).
        learn_proposal: learn s per (head, frequency) — the paper's learnable σ_i for OC20
            (default True for "gaussian_basis", else False).
        complex_g: learn an imaginary part of g (Gaussian mixture only), so f may be asymmetric.
        causal: query i attends to keys j ≤ i in index order (chunked prefix sums).
        chunk_size: rows per causal chunk (memory O(chunk² + chunk·m + m·d) per chunk).
        feature_map: "favor" (default: FAVOR+ positive random features, Ω fixed, so that
            ϕ(q̂)·ϕ(k̂) estimates exp(N̂ + q·k/√d)) or "relu" (the paper's ViT, Sec. 5.2: the
            learnable ReLU map ϕ(x) = ReLU(W x), W ∈ ℝ^{m×(d+2r)} a parameter of the layer shared by
            its heads; the RPE then enters as extra inputs of a learned kernel, no longer as exp(N̂);
            non-causal only).
        redraw: resampling policy of Ω in training ("never" | "every_forward_in_training" |
            int N), default "never".
        redraw_rpe: the same for the RPE noise ε (ξ = s·ε), default "never" (where the paper is silent on redrawing ξ, we keep it fixed:
            frequencies make the learned RPE a fixed function).
        seed: master seed of all random draws (default: from ``generator`` or the global RNG).
        generator: optional torch.Generator, used for ``seed`` and the parameter inits (not kept:
            :meth:`reset_parameters` draws from the global RNG).
        bias: whether q/k/v projections carry a bias.
        exact: compute the forward pass by the reference path, :meth:`exact_attention`: exact
            softmax(f(r_i − r_j) + q·k/√d) with the closed-form f, O(N²) memory — what FAVOR+
            approximates (the models' ``attention="flt_exact"``). Same parameters, buffers and
            random draws as the FAVOR+ path, so either loads the other's state_dict.

    Randomness: Ω (m, d + 2r) and ε (H, r, ℓ) are drawn at init from ``seed`` and stored as
    buffers (``omega.*``, ``rpe_noise.*``); in training they are redrawn per ``redraw`` /
    ``redraw_rpe``; in ``eval()`` both are frozen. Gradients reach g's parameters through
    a = g/p, and the proposal std through ξ (phases, g(ξ)) and log p.
    Shapes: x (B, N, D), pos (B, N, ℓ) (required; sequences: pos[..., 0] = index),
    mask (B, N) -> (B, N, D).
    Export mode: the non-causal forward is already a static graph (eval reads the frozen Ω and ε),
    so it is the export path as is; ``causal=True`` is refused (:meth:`export_refusal`).
    """

    #: The mixer encodes the positions it is given (relatively, f(r_i − r_j)): a model that feeds it
    #: positions needs no absolute position embedding of its own.
    encodes_positions: bool = True

    def __init__(self, dim: int, heads: int = 8, head_dim: int | None = None, nb_features: int = 64,
                 num_rpe_features: int = 32, rpe_type: str = "gaussian_mixture", num_components: int | None = None,
                 coord_dim: int | None = None, proposal_std: float | None = None,
                 learn_proposal: bool | None = None, complex_g: bool = False, causal: bool = False,
                 chunk_size: int = 128, redraw: str | int = "never", redraw_rpe: str | int = "never",
                 seed: int | None = None, generator: torch.Generator | None = None, bias: bool = False,
                 exact: bool = False, feature_map: str = "favor", dropout: float = 0.0):
        super().__init__(dim, heads, dropout)
        if feature_map not in ("favor", "relu"):
            raise ValueError(f"feature_map must be 'favor' or 'relu', got {feature_map!r}")
        if feature_map == "relu" and causal:
            raise ValueError("feature_map='relu' (the paper's ViT map) is non-causal; causal=True needs 'favor'")
        if rpe_type not in RPE_TYPES:
            raise ValueError(f"rpe_type must be one of {RPE_TYPES}, got {rpe_type!r}")
        T = _DEFAULT_T[rpe_type] if num_components is None else num_components
        ell = _DEFAULT_ELL[rpe_type] if coord_dim is None else coord_dim
        for name, val in (("num_rpe_features", num_rpe_features), ("num_components", T), ("coord_dim", ell),
                          ("chunk_size", chunk_size)):
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"{name} must be a positive int, got {val!r}")
        if proposal_std is not None and not (isinstance(proposal_std, (int, float)) and proposal_std > 0):
            raise ValueError(f"proposal_std must be > 0, got {proposal_std!r}")
        if complex_g and rpe_type != "gaussian_mixture":
            raise ValueError("complex_g needs rpe_type='gaussian_mixture' (an even real g has a real f, whose "
                             "imaginary weight the real-part estimator ignores)")
        self.head_dim = head_dim or (dim // heads if dim % heads == 0 else dim)
        self.nb_features, self.num_rpe_features, self.num_components = nb_features, num_rpe_features, T
        self.rpe_type, self.coord_dim, self.complex_g = rpe_type, ell, bool(complex_g)
        self.causal, self.chunk_size, self.exact = bool(causal), chunk_size, bool(exact)
        self.feature_map = feature_map
        H, r, d = heads, num_rpe_features, self.head_dim

        self._init_projections(H * d, bias)

        # --- learned spectrum g: weights (linear in g), and the shape parameters of each family
        # (drawn by _initial_spectrum, which reset_parameters reuses)
        self._proposal_std_arg = None if proposal_std is None else float(proposal_std)
        init, s0 = self._initial_spectrum(generator)
        self.rpe_w = nn.Parameter(init["rpe_w"])
        self.rpe_w_imag = nn.Parameter(init["rpe_w_imag"]) if complex_g else None
        if rpe_type == "gaussian_mixture":
            # σ_max is part of the parameterisation of σ_t: saved with the weights
            self.register_buffer("sigma_max", torch.tensor(s0))
        for name in ("rpe_sigma_raw", "rpe_mu", "rpe_radius_raw"):
            if name in init:
                setattr(self, name, nn.Parameter(init[name]))
        if learn_proposal is None:
            learn_proposal = rpe_type == "gaussian_basis"
        self.learn_proposal = bool(learn_proposal)
        log_s = torch.full((H, r), math.log(s0))
        if self.learn_proposal:
            self.log_proposal_std = nn.Parameter(log_s)  # σ_i per (head, frequency), as in the paper's OC20 setup
        else:
            self.register_buffer("log_proposal_std", log_s)
        # the learnable ReLU feature map's W (after the spectrum: _reset_own_parameters draws in this order)
        self.feature_w = (nn.Parameter(self._initial_feature_w(generator)) if feature_map == "relu" else None)

        master = resolve_seed(seed, generator)
        self.omega = OrthogonalFeatures(nb_features, d + 2 * r, redraw, master, stream=0)
        self.rpe_noise = GaussianNoise((H, r, ell), redraw_rpe, master, stream=1)

    # ------------------------------------------------------------------ initialisation
    def _initial_spectrum(self, generator: torch.Generator | None) -> tuple[dict[str, torch.Tensor], float]:
        """Fresh initial values of the spectrum's parameters (name -> float32 CPU tensor; ``rpe_w``,
        ``rpe_w_imag`` with ``complex_g``, then the family's shape parameters, in this draw order)
        and the initial proposal std s0. The paper gives no inits; where it is silent, we use these."""
        H, T, ell, gen = self.heads, self.num_components, self.coord_dim, generator
        proposal_std = self._proposal_std_arg
        init = {"rpe_w": 0.1 * torch.randn(H, T, generator=gen, dtype=torch.float64).float()}
        if self.complex_g:
            init["rpe_w_imag"] = 0.1 * torch.randn(H, T, generator=gen, dtype=torch.float64).float()
        if self.rpe_type == "gaussian_mixture":
            s0 = 1.0 if proposal_std is None else proposal_std
            sigma = s0 * _log_uniform((H, T), 0.01, 0.5, gen)  # decay length ≈ 1/(2πσ): 0.3 … 16 positions
            init["rpe_sigma_raw"] = torch.logit(sigma / s0).float()
            init["rpe_mu"] = (torch.rand(H, T, ell, generator=gen, dtype=torch.float64) - 0.5).float()
        elif self.rpe_type == "local":
            s0 = 1.0 if proposal_std is None else proposal_std
            init["rpe_radius_raw"] = _inv_softplus(_log_uniform((H, T, ell), 1.0, 64.0, gen)).float()
        else:  # gaussian_basis
            sigma = _log_uniform((H, T), 0.3, 5.0, gen)  # Å (our init; the paper gives none)
            s0 = 1.0 / (2 * math.pi * float(sigma.min())) if proposal_std is None else proposal_std
            init["rpe_sigma_raw"] = _inv_softplus(sigma).float()
        return init, s0

    def _initial_feature_w(self, generator: torch.Generator | None) -> torch.Tensor:
        """W (m, d + 2r) of the ReLU feature map, N(0, 1/(d + 2r)) (our init; the paper gives none)."""
        D = self.head_dim + 2 * self.num_rpe_features
        return (torch.randn(self.nb_features, D, generator=generator, dtype=torch.float64) * D ** -0.5).float()

    def _reset_own_parameters(self) -> None:
        """Re-draw the spectrum's parameters (:meth:`_initial_spectrum`, the constructor's formulas
        and draw order) and, with ``learn_proposal``, set ``log_proposal_std`` back to log s0, in
        place (a layer sharing this RPE, :meth:`share_rpe_with`, sees the new values). The draws
        come from the **global** RNG, also where the constructor was given a ``generator`` (that
        generator is not kept): ``torch.manual_seed(s)`` then ``reset_parameters()`` equals a
        module built under ``torch.manual_seed(s)`` without a generator. Buffers (σ_max, a fixed
        proposal std, Ω, ε, the seed) are kept."""
        init, s0 = self._initial_spectrum(None)
        with torch.no_grad():
            for name, value in init.items():
                getattr(self, name).copy_(value)
            if self.learn_proposal:
                self.log_proposal_std.fill_(math.log(s0))
            if self.feature_w is not None:
                self.feature_w.copy_(self._initial_feature_w(None))

    # ------------------------------------------------------------------ the learned spectrum
    def _sigma(self, dtype: torch.dtype) -> torch.Tensor:
        if self.rpe_type == "gaussian_mixture":
            return self.sigma_max.to(dtype) * torch.sigmoid(self.rpe_sigma_raw.to(dtype))
        return F.softplus(self.rpe_sigma_raw.to(dtype))

    def spectrum(self, xi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """g(ξ) = α + iβ at frequencies ξ (H, r, ℓ) -> α (H, r), β (H, r) or None (real g)."""
        dt = xi.dtype
        if self.rpe_type == "gaussian_mixture":
            sigma = self._sigma(dt)  # (H, T)
            diff = xi.unsqueeze(2) - self.rpe_mu.to(dt).unsqueeze(1)  # (H, r, T, ℓ)
            basis = torch.exp(-diff.pow(2).sum(-1) / (2 * sigma.pow(2).unsqueeze(1)))
        elif self.rpe_type == "local":
            v = F.softplus(self.rpe_radius_raw.to(dt))  # (H, T, ℓ)
            # sin(2πvξ)/(πξ) = 2v·sinc(2vξ), finite (2v) at ξ = 0
            basis = (2 * v.unsqueeze(1) * torch.sinc(2 * v.unsqueeze(1) * xi.unsqueeze(2))).prod(-1)
        else:
            sigma = self._sigma(dt)
            basis = torch.exp(-2 * math.pi ** 2 * sigma.pow(2).unsqueeze(1) * xi.pow(2).sum(-1, keepdim=True))
        alpha = (basis * self.rpe_w.to(dt).unsqueeze(1)).sum(-1)
        beta = (basis * self.rpe_w_imag.to(dt).unsqueeze(1)).sum(-1) if self.complex_g else None
        return alpha, beta

    def rpe_function(self, delta: torch.Tensor) -> torch.Tensor:
        """Closed-form Re f(Δ) that the RPE features estimate (the reference path).
        delta (..., ℓ) -> (..., H)."""
        dt = compute_dtype(delta.dtype)
        delta = delta.to(dt).unsqueeze(-2).unsqueeze(-2)  # (..., 1, 1, ℓ) against (H, T)
        ell = self.coord_dim
        w = self.rpe_w.to(dt)
        if self.rpe_type == "gaussian_mixture":
            sigma = self._sigma(dt)
            amp = (math.sqrt(2 * math.pi) * sigma) ** ell * torch.exp(
                -2 * math.pi ** 2 * sigma.pow(2) * delta.pow(2).sum(-1))
            phase = 2 * math.pi * (delta * self.rpe_mu.to(dt)).sum(-1)
            val = w * torch.cos(phase)
            if self.complex_g:
                val = val - self.rpe_w_imag.to(dt) * torch.sin(phase)
            f = amp * val
        elif self.rpe_type == "local":
            v = F.softplus(self.rpe_radius_raw.to(dt))
            f = w * (delta.abs() <= v).to(dt).prod(-1)
        else:
            sigma = self._sigma(dt)
            f = w / (math.sqrt(2 * math.pi) * sigma) ** ell * torch.exp(-delta.pow(2).sum(-1) / (2 * sigma.pow(2)))
        return f.sum(-1)

    def share_rpe_with(self, other: "FLTAttention") -> None:
        """Use ``other``'s RPE (:data:`RPE_STATE`: the spectrum's parameters, the proposal stds and
        the frequency noise ε) instead of this layer's own, as the paper's LM shares one RPE across
        layers. The shared tensors appear under both layers' names in a state_dict."""
        for name in RPE_STATE:
            if getattr(other, name, None) is not None:
                setattr(self, name, getattr(other, name))

    def proposal_std(self) -> torch.Tensor:
        """Std s of the proposal p = N(0, s²I) per (head, frequency), (H, r)."""
        return self.log_proposal_std.exp()

    # ------------------------------------------------------------------ RPE random features
    def centred_positions(self, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """pos (B, N, ℓ) minus each cloud's mean real position; padded rows 0 (any finite value
        would do, they are masked as keys and zeroed as outputs)."""
        keep = mask.unsqueeze(-1)
        pos = pos.to(compute_dtype(pos.dtype)).masked_fill(~keep, 0.0)
        centre = pos.sum(1, keepdim=True) / mask.sum(1).view(-1, 1, 1).to(pos.dtype)
        return (pos - centre).masked_fill(~keep, 0.0)

    def rpe_features(self, pos: torch.Tensor, mask: torch.Tensor | None = None, eps: torch.Tensor | None = None,
                     dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """N1, N2 (B, H, N, 2r) with N1 N2ᵀ ≈ Re f(r_i − r_j) (unbiased), from pos (B, N, ℓ).

        ``eps`` (H, r, ℓ) defaults to the current buffer (no redraw happens here)."""
        if mask is None:
            mask = torch.ones(pos.shape[:2], dtype=torch.bool, device=pos.device)
        dt = dtype or compute_dtype(pos.dtype)
        eps = (self.rpe_noise.value if eps is None else eps).to(dt)
        r, ell = self.num_rpe_features, self.coord_dim
        s = self.proposal_std().to(dt)  # (H, r)
        xi = s.unsqueeze(-1) * eps  # reparameterised ξ ~ N(0, s²I): differentiable in s
        log_p = -0.5 * eps.pow(2).sum(-1) - ell * torch.log(s) - 0.5 * ell * math.log(2 * math.pi)
        alpha, beta = self.spectrum(xi)
        inv_p = torch.exp(-log_p)
        alpha = alpha * inv_p
        beta = beta * inv_p if beta is not None else None
        sq = alpha.pow(2) if beta is None else alpha.pow(2) + beta.pow(2)
        kappa = sq.mean(-1).clamp_min(torch.finfo(dt).tiny).pow(0.25).detach()  # (H,)
        theta = 2 * math.pi * torch.einsum("bnl,hrl->bhnr", self.centred_positions(pos, mask).to(dt), xi)
        c, sn = torch.cos(theta), torch.sin(theta)
        a = alpha[None, :, None, :]
        if beta is None:
            n1 = torch.cat([a * c, a * sn], -1)
        else:
            b = beta[None, :, None, :]
            n1 = torch.cat([a * c - b * sn, a * sn + b * c], -1)
        k = kappa.view(1, -1, 1, 1)
        n1 = n1 / (math.sqrt(r) * k)
        n2 = torch.cat([c, sn], -1) * (k / math.sqrt(r))
        return n1, n2

    # ------------------------------------------------------------------ attention
    def augmented_qkv(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, eps: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q̂ = [N1, q d^{-1/4}], k̂ = [N2, k d^{-1/4}] (B, H, N, 2r + d) and v (B, H, N, d), so that
        q̂_i·k̂_j = N̂_ij + q_i·k_j/√d. Padded rows of x are zeroed first."""
        x = x.masked_fill(~mask.unsqueeze(-1), 0.0)
        cd = compute_dtype(x.dtype)
        scale = self.head_dim ** -0.25
        q = self.heads_of(self.w_q(x)).to(cd) * scale
        k = self.heads_of(self.w_k(x)).to(cd) * scale
        v = self.heads_of(self.w_v(x)).to(cd)
        n1, n2 = self.rpe_features(pos, mask, eps, dtype=cd)
        return torch.cat([n1, q], -1), torch.cat([n2, k], -1), v

    def check(self, x, pos, mask) -> torch.Tensor:
        return check_attention_inputs(x, pos, mask, dim=self.dim, pos_dim=self.coord_dim, requires_pos=True,
                                      who="flt")

    def export_refusal(self) -> str | None:
        return CAUSAL_EXPORT_REFUSAL if self.causal else super().export_refusal()

    def forward(self, x: torch.Tensor, pos: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                context=None) -> torch.Tensor:
        """x (B, N, D), pos (B, N, ℓ), mask (B, N) -> (B, N, D); ``context`` is not used. With
        ``exact=True``: :meth:`exact_attention`."""
        if self.exact:
            return self.exact_attention(x, pos, mask)
        mask = self.check(x, pos, mask)
        omega, eps = self.omega(), self.rpe_noise()  # apply the redraw policies (training only)
        qh, kh, v = self.augmented_qkv(x, pos, mask, eps)
        if self.feature_w is not None:
            o = relu_feature_attention(qh, kh, v, self.feature_w.to(qh.dtype), mask)
        else:
            o = favor_attention(qh, kh, v, omega, mask, causal=self.causal, chunk_size=self.chunk_size)
        return self.merge_heads(o, mask, x.dtype)

    def exact_attention(self, x: torch.Tensor, pos: torch.Tensor | None = None, mask: torch.Tensor | None = None
                        ) -> torch.Tensor:
        """Reference path: exact softmax(f(r_i − r_j) + q·k/√d) attention with the closed-form f
        (:meth:`rpe_function`), same projections, mask and causality. O(N²) memory."""
        mask = self.check(x, pos, mask)
        x0 = x.masked_fill(~mask.unsqueeze(-1), 0.0)
        cd = compute_dtype(x.dtype)
        q = self.heads_of(self.w_q(x0)).to(cd)
        k = self.heads_of(self.w_k(x0)).to(cd)
        v = self.heads_of(self.w_v(x0)).to(cd)
        p = self.centred_positions(pos, mask).to(cd)
        rpe = self.rpe_function(p[:, :, None, :] - p[:, None, :, :]).permute(0, 3, 1, 2)  # (B, H, N, N)
        logits = rpe + q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        return self.merge_heads(dense_softmax_attention(logits, v, mask, causal=self.causal), mask, x.dtype)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, heads={self.heads}, head_dim={self.head_dim}, nb_features={self.nb_features}, "
                f"num_rpe_features={self.num_rpe_features}, rpe_type={self.rpe_type!r}, "
                f"num_components={self.num_components}, coord_dim={self.coord_dim}, causal={self.causal}"
                + (f", feature_map={self.feature_map!r}" if self.feature_map != "favor" else "")
                + (", exact=True" if self.exact else "")
                + (f", dropout={self.out_dropout.p}" if self.out_dropout.p > 0 else ""))
