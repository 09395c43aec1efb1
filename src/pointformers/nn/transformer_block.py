"""The transformer block of every model: a token mixer and a feed-forward network, each with a residual.

One class, :class:`TransformerBlock`, covers the layouts of the published architectures. The mixer
is an argument (any module with the attention contract ``mixer(x, pos, mask, context=None)``), so
a model's full-attention twin is the same block with the ``full`` mechanism.

========================  ========  ==============  ========  ================  ======================
layout                    ``norm``  position        residual  FFN               dropouts
========================  ========  ==============  ========  ================  ======================
HEPT (authors' code)      layer     pre             plain     ReLU, hidden D    residual (0.1)
SFT (Fig. 1, Table 9)     layer     pre or post     plain     GeLU, ×4          token, feed-forward
FLT (Performer / ViT)     layer     pre             plain     GeLU              residual, feed-forward
SAMSA (Algorithm 1)       rms       parallel (pre)  ReZero α  GeLU, ×4          residual
Sampled Transformer       none      pre             plain     ReLU, r           none
(Eq. 5; pre-LN: layer)
Track encoder (HEPT       rms       pre             plain     SwiGLU            residual
follow-up, issue 24)
========================  ========  ==============  ========  ================  ======================

With s(y) = Drop(y) (plain residual) or α·Drop(y) (ReZero), N₁/N₂ the norms and FFN the feed-forward::

    pre:       x ← x + s(Mix(N₁(x)));   x ← x + s(FFN(N₂(x)))
    post:      x ← N₁(x + s(Mix(x)));   x ← N₂(x + s(FFN(x)))
    parallel:  h = N₁(x);   x ← x + s(Mix(h));   x ← x + s(FFN(h))        (no N₂)
"""
from __future__ import annotations

import torch
from torch import nn

from . import fast_linear
from .model_inputs import is_tracing
from .norms import RMSNorm

_NORMS = ("layer", "rms", "none")
_POSITIONS = ("pre", "post", "parallel")
_ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU}


class SwiGLU(nn.Module):
    """Gated feed-forward (Shazeer 2020): W₂·(SiLU(W_g·x) ⊙ W_u·x), no biases. (…, D) -> (…, D).

    ``hidden`` is the width of the gated product; the gate and up projections are one Linear of
    width 2·hidden (``w_in``), so the layer has 3·D·hidden weights (a ReLU/GeLU FFN of width
    1.5·hidden has as many). ``dropout`` None: none, else after the product."""

    def __init__(self, dim: int, hidden: int, dropout: float | None = None):
        super().__init__()
        self.dim, self.hidden, self.activation = dim, hidden, "swiglu"
        self.w_in = nn.Linear(dim, 2 * hidden, bias=False)
        self.drop = nn.Dropout(dropout) if dropout is not None else None
        self.w_out = nn.Linear(hidden, dim, bias=False)

    def reset_parameters(self) -> None:
        self.w_in.reset_parameters()
        self.w_out.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w_in(x).chunk(2, dim=-1)
        h = nn.functional.silu(gate) * up
        return self.w_out(h if self.drop is None else self.drop(h))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, hidden={self.hidden}"


def _feed_forward(dim: int, hidden: int, activation: str, dropout: float | None = None) -> nn.Module:
    """The FFN of a block: :class:`SwiGLU` for ``"swiglu"``, else :class:`FeedForward` (ReLU/GeLU)."""
    if activation == "swiglu":
        return SwiGLU(dim, hidden, dropout)
    return FeedForward(dim, hidden, activation, dropout)


class FeedForward(nn.Sequential):
    """Linear(D, hidden) → activation (ReLU or GeLU) → [Dropout] → Linear(hidden, D). (…, D) -> (…, D).

    ``dropout`` None: no dropout layer (the second Linear is then index 2, else 3).
    """

    def __init__(self, dim: int, hidden: int, activation: str = "relu", dropout: float | None = None):
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {tuple(_ACTIVATIONS)}, got {activation!r}")
        layers = [nn.Linear(dim, hidden), _ACTIVATIONS[activation]()]
        if dropout is not None:
            layers.append(nn.Dropout(dropout))
        super().__init__(*layers, nn.Linear(hidden, dim))
        self.dim, self.hidden, self.activation = dim, hidden, activation

    def reset_parameters(self) -> None:
        """Re-initialise both Linears as the constructor does (``nn.Linear``'s default init, in order)."""
        self[0].reset_parameters()
        self[-1].reset_parameters()

    def extra_repr(self) -> str:
        return f"dim={self.dim}, hidden={self.hidden}, activation={self.activation!r}"

    def fused(self, h: torch.Tensor, residual: torch.Tensor, inplace: bool = False, block_elems: int = 1 << 18,
              norm: nn.Module | None = None) -> torch.Tensor:
        """``residual + W₂·GeLU(W₁·norm(h) + b₁) + b₂`` over row blocks, no autograd (GeLU FFN, eval).

        The (rows × hidden) block is cache-sized: no B·N·hidden activation is allocated. The output
        is ``residual`` itself when ``inplace`` (else a copy) and each row block of it is written
        only after that block of ``h`` was read, so ``h`` may be ``residual`` itself. ``norm`` (a
        row-wise norm, or None) is applied block by block. With oneDNN (:mod:`.fast_linear`,
        float32) the GeLU is fused into the first GEMM; otherwise the hidden block is one reused
        buffer, GeLU (exact, as ``nn.GELU``) runs in place on it and the second GEMM accumulates
        straight into the output.
        """
        lin1, act, lin2 = self[0], self[1], self[-1]
        if not isinstance(act, nn.GELU):
            raise ValueError(f"FeedForward.fused: needs a GeLU feed-forward, got {type(act).__name__}")
        D = h.shape[-1]
        h2 = h.reshape(-1, D)
        y = residual if inplace else residual.clone()
        y2 = y.view(-1, y.shape[-1])
        rows = max(1, min(h2.shape[0], block_elems // lin1.out_features))
        if fast_linear.enabled() and act.approximate == "none" and h.dtype == torch.float32:
            # oneDNN: GeLU fused into the first GEMM, both biases inside the kernels
            for s in range(0, h2.shape[0], rows):
                hb = h2[s:s + rows] if norm is None else norm(h2[s:s + rows])
                y2[s:s + rows] += fast_linear.linear(lin2, fast_linear.linear(lin1, hb, "gelu"))
            return y
        buf = h.new_empty(rows, lin1.out_features)
        w1, w2 = lin1.weight.t(), lin2.weight.t()
        for s in range(0, h2.shape[0], rows):
            e = min(h2.shape[0], s + rows)
            b = buf[: e - s]
            hb = h2[s:e] if norm is None else norm(h2[s:e])   # read before this block of y is written
            if lin1.bias is None:
                torch.mm(hb, w1, out=b)
            else:
                torch.addmm(lin1.bias, hb, w1, out=b)
            torch.ops.aten.gelu_(b, approximate=act.approximate)
            y2[s:e].addmm_(b, w2)
            if lin2.bias is not None:
                y2[s:e] += lin2.bias
        return y


def reset_module(module: nn.Module) -> None:
    """``module.reset_parameters()`` where it has one, else the same for each of its children (in
    registration order). NotImplementedError for a module without one that holds parameters of its
    own (nothing is silently left as trained)."""
    reset = getattr(module, "reset_parameters", None)
    if callable(reset):
        reset()
        return
    own = [name for name, _ in module.named_parameters(recurse=False)]
    if own:
        raise NotImplementedError(f"{type(module).__name__} has parameters ({', '.join(own)}) but no reset_parameters()")
    for child in module.children():
        reset_module(child)


def _norm(kind: str, dim: int) -> nn.Module:
    return nn.LayerNorm(dim) if kind == "layer" else RMSNorm(dim) if kind == "rms" else nn.Identity()


class TransformerBlock(nn.Module):
    """A token mixer and a feed-forward network with residuals, in any layout of the module table.

    Args:
        dim: width D.
        mixer: a token mixer ``mixer(x, pos, mask, context=None)`` (see :mod:`pointformers.attention`).
        norm: ``"layer"`` (LayerNorm), ``"rms"`` (:class:`~.norms.RMSNorm`) or ``"none"``.
        norm_position: ``"pre"``, ``"post"`` or ``"parallel"`` (one norm read by both branches).
        rezero: residual scale. False: plain residuals; True: a zero-initialised learnable α of
            this block (``alpha``); an ``nn.Parameter``: that shared α (ReZero, SAMSA shares one
            across its layers), owned and registered by the caller, not here, so a state_dict
            holds it once.
        activation: FFN activation, ``"gelu"`` or ``"relu"``, or ``"swiglu"`` for the gated FFN
            (:class:`SwiGLU`, its gated width ``ffn_hidden`` or ``ffn_mult``·D).
        ffn_mult: FFN expansion (D → ffn_mult·D → D); ffn_hidden: an explicit hidden width instead.
        dropout: residual dropout, after the mixer and after the FFN.
        ffn_dropout: dropout after the FFN's expansion; None: no dropout layer at all.
    Shapes: x (B, N, D), pos (B, N, P) or None, mask (B, N) bool or None (all real) -> (B, N, D);
    padded rows are set to zero on the way in and out.

    The mixer is called as ``mixer.mix(x, h, pos, mask, context)`` when it has that method
    (:meth:`~pointformers.attention.TokenMixer.mix`: h is what it mixes, N₁(x) or x, and x the
    block's input), else as ``mixer(h, pos, mask, context=context)``. ``context``: the forward
    pass's :class:`~pointformers.attention.ForwardContext`, handed to the mixer.

    Fused inference: in eval without autograd, for LayerNorm pre/post layouts with a GeLU FFN and
    plain residuals, a mixer may compute ``x + Mix(N(x))`` through its own inference kernels
    (``mixer.fused_residual(x, pos, mask, norm=...)``, :meth:`~pointformers.attention.TokenMixer.fused_residual`;
    SFT's on the CPU); the FFN then runs through :meth:`FeedForward.fused`. Same function, fewer
    passes over memory; a mixer returns None where it has no such path, and the block computes as above.
    """

    def __init__(self, dim: int, mixer: nn.Module, *, norm: str = "layer", norm_position: str = "pre",
                 rezero: bool | nn.Parameter = False, activation: str = "gelu", ffn_mult: int = 4,
                 ffn_hidden: int | None = None, dropout: float = 0.0, ffn_dropout: float | None = None):
        super().__init__()
        if norm not in _NORMS:
            raise ValueError(f"norm must be one of {_NORMS}, got {norm!r}")
        if norm_position not in _POSITIONS:
            raise ValueError(f"norm_position must be one of {_POSITIONS}, got {norm_position!r}")
        if activation not in _ACTIVATIONS and activation != "swiglu":
            raise ValueError(f"activation must be one of {tuple(_ACTIVATIONS) + ('swiglu',)}, got {activation!r}")
        self.dim, self.norm_type, self.norm_position, self.activation = dim, norm, norm_position, activation
        self.norm1 = _norm(norm, dim)
        self.mixer = mixer
        self.norm2 = None if norm_position == "parallel" else _norm(norm, dim)
        self.ff = _feed_forward(dim, ffn_hidden or ffn_mult * dim, activation, ffn_dropout)
        self.dropout = nn.Dropout(dropout)
        shared = rezero if isinstance(rezero, nn.Parameter) else None
        if shared is None and rezero is not False and rezero is not True:
            raise ValueError(f"rezero must be a bool or an nn.Parameter (a shared α), got {type(rezero).__name__}")
        if rezero is True:
            self.alpha = nn.Parameter(torch.zeros(()))
        object.__setattr__(self, "_shared_alpha", shared)   # not registered: its owner's state_dict holds it

    def reset_parameters(self) -> None:
        """Re-initialise the norms, the mixer (its ``reset_parameters()``), the FFN and this block's own
        ReZero α (0) as at construction. A shared α (``rezero=`` an ``nn.Parameter``) belongs to its
        owner, which resets it; the mixer's buffers (frozen draws) are kept."""
        for module in (self.norm1, self.mixer, self.norm2, self.ff):
            if module is not None:
                reset_module(module)
        if "alpha" in self._parameters:
            with torch.no_grad():
                self.alpha.zero_()

    def extra_repr(self) -> str:
        rezero = "shared" if self._shared_alpha is not None else "alpha" in self._parameters
        return (f"dim={self.dim}, norm={self.norm_type!r}, norm_position={self.norm_position!r}, "
                f"activation={self.activation!r}, rezero={rezero!r}")

    def residual_scale(self) -> torch.Tensor | None:
        """ReZero's α (this block's own or the shared one), or None for plain residuals."""
        return self._shared_alpha if self._shared_alpha is not None else self._parameters.get("alpha")

    def _residual(self, y: torch.Tensor, alpha: torch.Tensor | None) -> torch.Tensor:
        """s(y): Drop(y), times α with ReZero."""
        y = self.dropout(y)
        return y if alpha is None else alpha * y

    def _mix(self, x: torch.Tensor, h: torch.Tensor, pos, mask, context) -> torch.Tensor:
        mix = getattr(self.mixer, "mix", None)
        if mix is None:
            return self.mixer(h, pos, mask, context=context)
        return mix(x, h, pos, mask, context)

    def _check(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Shapes only (no host read; the mixer checks the values): the (B, N) mask, all True for None."""
        if not is_tracing():
            if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.dim:
                raise ValueError(f"transformer block: x must be (B, N, D) with feature size D = dim = {self.dim}, "
                                 f"got {tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
            if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool
                                     or mask.shape != x.shape[:2]):
                raise ValueError(f"transformer block: mask must be a bool tensor of shape (B, N) = "
                                 f"{tuple(x.shape[:2])}, got {getattr(mask, 'dtype', type(mask).__name__)} "
                                 f"{tuple(getattr(mask, 'shape', ()))}")
        return torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) if mask is None else mask

    def forward(self, x: torch.Tensor, pos: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                context=None) -> torch.Tensor:
        mask = self._check(x, mask)
        if not self.training and not torch.is_grad_enabled():
            y = self._forward_fused(x, pos, mask)
            if y is not None:
                return y
        keep = mask.unsqueeze(-1)
        x = x.masked_fill(~keep, 0.0)
        a = self.residual_scale()
        if self.norm_position == "post":
            x = self.norm1(x + self._residual(self._mix(x, x, pos, mask, context), a))
            x = self.norm2(x + self._residual(self.ff(x), a))
        else:
            h = self.norm1(x)
            x = x + self._residual(self._mix(x, h, pos, mask, context), a)
            x = x + self._residual(self.ff(h if self.norm_position == "parallel" else self.norm2(x)), a)
        return x.masked_fill(~keep, 0.0)

    def _forward_fused(self, x: torch.Tensor, pos: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor | None:
        """The fused inference path (class doc), or None where it does not apply."""
        fused = getattr(self.mixer, "fused_residual", None)
        if (fused is None or self.norm_type != "layer" or self.norm_position == "parallel"
                or self.residual_scale() is not None or self.activation != "gelu"):
            return None
        if self.norm_position == "pre":
            y = fused(x, pos, mask, norm=self.norm1)   # a new tensor: x is the caller's
            return None if y is None else self.ff.fused(y, residual=y, inplace=True, norm=self.norm2)
        y = fused(x, pos, mask)
        if y is None:
            return None
        y = self.norm1(y)
        return self.norm2(self.ff.fused(y, residual=y))   # y is also the FFN input
