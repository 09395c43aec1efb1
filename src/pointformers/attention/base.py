"""The attention contract shared by every mechanism, and its input checks.

Every mechanism is a ``torch.nn.Module`` token mixer::

    y = attn(x, pos=None, mask=None)   # x (B, N, D); pos (B, N, P); mask (B, N) bool, True = real
                                       # returns (B, N, D) with padded rows set to zero

Bad input is rejected with a ``ValueError`` that names the argument, so that no mechanism
fails deep inside torch (the checks live in :mod:`pointformers.nn.model_inputs`; they are
skipped while a graph is traced).

Two further parts of the contract live here:

* **One context per forward pass** (:class:`ForwardContext`): work that every layer of a model
  would otherwise repeat (HEPT's region codes, a k-NN graph, a space-filling-curve order, a
  random cycle) is prepared once. A mechanism declares it by overriding :meth:`TokenMixer.prepare`
  (and :meth:`TokenMixer.prepare_key`, which says which layers may share the result); a model
  creates one ``ForwardContext`` per forward and its blocks hand it to every mixer as
  ``context=``. Called without a context, a mixer prepares for itself.
* **Export mode** (:func:`set_exportable`): every mechanism that can be exported computes, when
  its ``exportable`` flag is set, the same function through a graph that ``torch.export`` and
  ONNX can capture for a dynamic point count (no Python loop whose trip count depends on N, no
  custom ``autograd.Function``, no host synchronisation). The flag changes how, never what.
"""
from __future__ import annotations

import torch
from torch import nn

from ..nn.model_inputs import check_attention_inputs, is_tracing
from ..nn.transformer_block import reset_module

__all__ = ["TokenMixer", "ForwardContext", "UnsupportedExportError", "check_attention_inputs", "is_tracing",
           "set_exportable", "reset_module"]

class UnsupportedExportError(ValueError):
    """A mechanism (with its options) has no exportable path; the message says which and why."""

    def __init__(self, mechanism: str, reason: str, kind: str = "attention mechanism"):
        self.mechanism, self.reason = mechanism, reason
        super().__init__(f"cannot export {kind} {mechanism!r}: {reason}")


class ForwardContext:
    """The work the layers of one forward pass share (as Point Transformer V3's ``Point``).

    Args:
        pos: (B, N, P) coordinates every layer sees (or None); mask: (B, N) real points (or None).
        segments: several clouds packed end to end in one row (B = 1): the (start, end) rows of
            each (:class:`~pointformers.data.batch.PackedLayout`); None (default): one cloud per
            row. Only mechanisms with ``packs_clouds`` accept it (:meth:`TokenMixer.prepared`
            refuses it for the others); a model packs only when all its mixers do.
        **inputs: further inputs of the forward pass that a mechanism reads in every layer (in
            :attr:`inputs`; SFT's ``edge_attr``), so that blocks pass nothing but the context.
    A mixer asks for its prepared state with :meth:`TokenMixer.prepared`; the first layer with a
    given :meth:`~TokenMixer.prepare_key` computes it, the others reuse it.
    """

    def __init__(self, pos: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                 segments: tuple[tuple[int, int], ...] | None = None, **inputs):
        self.pos, self.mask, self.segments = pos, mask, segments
        self.inputs: dict = inputs
        self._store: dict = {}

    def get(self, key, compute):
        """The value stored under ``key``, computed by ``compute()`` the first time."""
        if key not in self._store:
            self._store[key] = compute()
        return self._store[key]

    def put(self, key, value) -> None:
        """Store ``value`` under ``key`` (a model that prepared a mechanism's state itself, e.g. in
        a special padding layout, hands it to the layers this way)."""
        self._store[key] = value

    def __contains__(self, key) -> bool:
        return key in self._store

    def __len__(self) -> int:
        return len(self._store)


def _check_dtype(module, x) -> None:
    """x's floating dtype must be the module's (autocast aside): a clear error naming the argument
    instead of a dtype clash deep inside a matrix product."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or is_tracing() \
            or torch.is_autocast_enabled(x.device.type):
        return
    p = next((t for t in module.parameters() if t.is_floating_point()), None)
    if p is not None and p.dtype != x.dtype:
        raise ValueError(f"x: dtype {x.dtype} does not match the module's parameters ({p.dtype}); convert the input "
                         f"(x.to({p.dtype})) or the module (module.to({x.dtype})), or run under torch.autocast")


def _flat_to_padded(module, args, kwargs):
    """Forward pre-hook: ``mixer(x (N, D), pos (N, P), batch=b | ptr=p)`` becomes the padded call
    ``mixer(x (B, n, D), pos (B, n, P), mask (B, n))``; the layout is kept for the output hook."""
    # pushed first: the output hook (always called) pops one entry even when this hook raises
    module._flat_layouts.append(None)
    batch, ptr = kwargs.pop("batch", None), kwargs.pop("ptr", None)
    x = args[0] if args else kwargs.get("x")
    _check_dtype(module, x)
    if batch is None and ptr is None and not (isinstance(x, torch.Tensor) and x.dim() == 2):
        return args, kwargs
    names = ("x", "pos", "mask", "context")
    call = dict(zip(names, args), **kwargs)
    x = call.get("x")
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x: with batch= or ptr= expected flat (N, D) features, got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if call.get("mask") is not None:
        raise ValueError("mask: flat input (x (N, D) with batch= or ptr=) has no padding; give no mask")
    if call.get("context") is not None:
        raise ValueError("context: flat input (batch= or ptr=) builds its own context; give none "
                         "(a model hands its layers padded or packed input with a context)")
    layout = module.flat_input_layout(x.shape[0], batch, ptr, x.device)
    call["x"] = layout.pad(x)
    if call.get("pos") is not None:
        pos = call["pos"]
        if not isinstance(pos, torch.Tensor) or pos.dim() != 2 or pos.shape[0] != x.shape[0]:
            raise ValueError(f"pos: with flat x ({x.shape[0]}, D) expected ({x.shape[0]}, P) coordinates, got "
                             f"{tuple(pos.shape) if isinstance(pos, torch.Tensor) else type(pos).__name__}")
        call["pos"] = layout.pad(pos)
    call["mask"] = layout.mask()
    segments = getattr(layout, "segments", None)
    if segments is not None:  # clouds packed in one row: the mechanism keeps them apart
        call["context"] = ForwardContext(call.get("pos"), call["mask"], segments=segments)
    module._flat_layouts[-1] = layout
    return (), call


def _padded_to_flat(module, args, kwargs, output):
    layout = module._flat_layouts.pop()
    if output is not None and module.training and module.out_dropout.p > 0:
        output = module.out_dropout(output)  # the mechanism's output dropout (zero rows stay zero)
    return output if layout is None or output is None else layout.unpad(output)


class TokenMixer(nn.Module):
    """Base class of the mechanisms: ``dim``, ``heads`` and ``dropout`` (on the output, training only;
    every mechanism's constructor takes it), the q/k/v/out projections and their
    head split/merge (:meth:`_init_projections`, :meth:`heads_of`, :meth:`merge_heads`), the
    zero-padding rule, the shared-work protocol (:meth:`prepare`, :meth:`prepare_key`,
    :meth:`prepared`), how a block calls it (:meth:`mix`, :meth:`fused_residual`) and the export flag."""

    #: Export mode (see :func:`set_exportable`): the forward pass takes the mechanism's static-graph path.
    exportable: bool = False

    #: The mechanism keeps clouds packed end to end in one row apart (``ForwardContext.segments``),
    #: so flat input is packed (:meth:`flat_input_layout`) instead of padded to the largest cloud.
    packs_clouds: bool = False

    @property
    def _flat_layouts(self) -> list:
        # per-call stack of flat-input layouts (a stack: a mixer may call itself recursively)
        stack = self.__dict__.get("_flat_layout_stack")
        if stack is None:
            stack = self.__dict__["_flat_layout_stack"] = []
        return stack

    def __init__(self, dim: int, heads: int, dropout: float = 0.0):
        super().__init__()
        # PyG-style flat input (x (N, D), batch= or ptr=): converted to the padded layout around forward
        self.register_forward_pre_hook(_flat_to_padded, with_kwargs=True)
        # always_call: the layout is popped even when forward raises (no stale entry left behind)
        self.register_forward_hook(_padded_to_flat, with_kwargs=True, always_call=True)
        if not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        if not isinstance(heads, int) or heads < 1:
            raise ValueError(f"heads must be a positive int, got {heads!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be a probability in [0, 1), got {dropout!r}")
        self.dim = dim
        self.heads = heads
        # dropout on the mechanism's output (after its output projection, as timm's proj_drop), training
        # only; applied by the output hook, so every mechanism has it in one place
        self.out_dropout = nn.Dropout(float(dropout))

    def flat_input_layout(self, n: int, batch: torch.Tensor | None, ptr: torch.Tensor | None,
                          device: torch.device):
        """How flat input ``(N, D)`` with ``batch``/``ptr`` is laid out for the padded forward:
        default every cloud padded to the largest (:func:`~pointformers.data.batch.flat_layout`);
        a mechanism with ``packs_clouds`` returns a :class:`~pointformers.data.batch.PackedLayout`."""
        from ..data.batch import flat_layout

        return flat_layout(n, batch, ptr, device=device)

    @staticmethod
    def zero_padding(y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Set padded rows of ``y`` (B, N, D) to zero; ``y`` itself when no row is padded (eager CPU mode:
        a traced graph keeps the fill, it has no data-dependent branch, and on a GPU the check would
        wait for the device)."""
        if mask.device.type == "cpu" and not is_tracing() and bool(mask.all()):
            return y
        return y.masked_fill(~mask.unsqueeze(-1), 0.0)

    # ---------------------------------------------------------------- projections
    def _init_projections(self, inner: int, bias: bool = False, kv: bool = True, out: bool = True) -> None:
        """Create ``w_q`` (and, with ``kv``, ``w_k``, ``w_v``): ``nn.Linear(dim, inner, bias=bias)``, and
        with ``out`` the output projection ``out_linear = nn.Linear(inner, dim)`` (always with a bias),
        in this order (the order of their random initialisation). ``out=False``: the mechanism
        creates ``out_linear`` itself, after projections of its own (SFT's leak ``w_c``)."""
        self.w_q = nn.Linear(self.dim, inner, bias=bias)
        if kv:
            self.w_k = nn.Linear(self.dim, inner, bias=bias)
            self.w_v = nn.Linear(self.dim, inner, bias=bias)
        if out:
            self.out_linear = nn.Linear(inner, self.dim)

    # ---------------------------------------------------------------- construction conventions
    #: Attributes :meth:`extra_repr` shows after ``dim``, ``heads`` and ``head_dim`` (a mechanism's main options).
    _repr_fields: tuple[str, ...] = ()

    def extra_repr(self) -> str:
        """``dim=…, heads=…, head_dim=…`` and the mechanism's main options (:attr:`_repr_fields`)."""
        names = ("dim", "heads", "head_dim") + tuple(self._repr_fields)
        text = ", ".join(f"{n}={getattr(self, n)!r}" for n in names if hasattr(self, n))
        return text + (f", dropout={self.out_dropout.p}" if self.out_dropout.p > 0 else "")

    def reset_parameters(self) -> None:
        """Re-initialise every learnable parameter as the constructor does: each submodule's own
        ``reset_parameters()`` (``nn.Linear``, ``nn.LayerNorm``, …; a submodule without one is
        walked into), in registration order, which is the order the constructors create them, then
        the mechanism's own parameters (:meth:`_reset_own_parameters`). Buffers (frozen draws:
        hash projections, region counts, random features, seeds) are kept."""
        for child in self.children():
            reset_module(child)
        self._reset_own_parameters()

    def _reset_own_parameters(self) -> None:
        """Initialise the parameters registered on the mechanism itself (not in a submodule) as its
        constructor does. Default: there must be none; a mechanism that has some overrides this."""
        own = [name for name, _ in self.named_parameters(recurse=False)]
        if own:
            raise NotImplementedError(f"{type(self).__name__} has parameters of its own ({', '.join(own)}) "
                                      "and must override _reset_own_parameters()")

    def heads_of(self, t: torch.Tensor) -> torch.Tensor:
        """Split the heads of a projection: (B, N, H·d) -> (B, H, N, d) (a view)."""
        B, N, _ = t.shape
        return t.view(B, N, self.heads, -1).transpose(1, 2)

    def merge_heads(self, o: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Concatenate the heads (h-major) and project out: o (B, H, N, d) -> ``out_linear`` (B, N, D),
        padded rows zero. ``dtype``: cast the concatenation to it first (e.g. back from a work dtype)."""
        B, H, N, d = o.shape
        o = o.transpose(1, 2).reshape(B, N, H * d)
        return self.zero_padding(self.out_linear(o if dtype is None else o.to(dtype)), mask)

    # ---------------------------------------------------------------- how a block calls the mixer
    def mix(self, x: torch.Tensor, h: torch.Tensor, pos: torch.Tensor | None, mask: torch.Tensor | None,
            context: "ForwardContext | None" = None) -> torch.Tensor:
        """The mixer inside a block (:class:`~pointformers.nn.transformer_block.TransformerBlock`):
        mix ``h``, the block's normalised input, where ``x`` is that input before the norm (the two
        are the same tensor where the block has no norm before the mixer). Default:
        ``self(h, pos, mask, context=context)``; a mechanism that also reads ``x`` overrides it
        (SAMSA scores the un-normalised tokens with ``score_input="raw"``)."""
        return self(h, pos, mask, context=context)

    def fused_residual(self, x: torch.Tensor, pos: torch.Tensor | None, mask: torch.Tensor | None,
                       norm: nn.Module | None = None) -> torch.Tensor | None:
        """``x + self(norm(x), pos, mask)`` through the mechanism's own inference kernels, or None where
        it has none for these inputs (default: never). A block asks in eval without autograd
        (class doc of :class:`~pointformers.nn.transformer_block.TransformerBlock`); a mechanism
        that answers checks the inputs as its forward does. ``norm`` None: no norm."""
        return None

    # ---------------------------------------------------------------- shared work
    def prepare(self, pos: torch.Tensor | None, mask: torch.Tensor):
        """What this mechanism computes once per forward pass for all layers (default: nothing).
        pos (B, N, P), mask (B, N) -> any object; override together with :meth:`prepare_key`."""
        return None

    def prepare_key(self):
        """Layers whose keys are equal share one :meth:`prepare` result within a forward pass.
        Default: this module alone. Override with what the result depends on (a shared module,
        the options that shape it), never with anything that differs between equal results."""
        return ("module", id(self))

    def prepared(self, pos: torch.Tensor | None, mask: torch.Tensor, context: ForwardContext | None):
        """This layer's prepared state: from ``context`` (computed there by the first layer that
        asks) or, without one, computed now."""
        if context is None:
            return self.prepare(pos, mask)
        if not isinstance(context, ForwardContext):
            raise ValueError(f"context: expected a pointformers.attention.ForwardContext, got {type(context).__name__}")
        if context.segments is not None:
            if not self.packs_clouds:
                raise ValueError(f"context: clouds packed in one row (segments) reach {type(self).__name__}, which "
                                 "does not keep them apart; pad the clouds instead (one per row)")
            return context.get(self.prepare_key(), lambda: self.prepare(pos, mask, segments=context.segments))
        return context.get(self.prepare_key(), lambda: self.prepare(pos, mask))

    # ---------------------------------------------------------------- export
    def min_points(self) -> int:
        """Smallest point count this module handles once exported (sampling mechanisms fix k at
        export time; default 1)."""
        return 1

    def export_refusal(self) -> str | None:
        """Why this module (with its options) cannot be exported, or None when it can. Default: the
        registry's ``export`` reason for the mechanism."""
        from .registry import MECHANISMS

        name = getattr(self, "registry_name", None)
        if name is None or name not in MECHANISMS:
            return "it is not a registered mechanism"
        return MECHANISMS.info(name).export


def set_exportable(module: nn.Module, exportable: bool = True) -> nn.Module:
    """Switch every token mixer inside ``module`` (itself included) to export mode or back.

    In export mode a mechanism computes the same function through a graph that ``torch.export``
    and ONNX capture for any point count. Raises :class:`UnsupportedExportError` (a ``ValueError``)
    naming the mechanism (or other module) and the reason when one of them cannot be exported: every
    submodule with an ``export_refusal()`` method is asked (mechanisms, and models or layers with
    no exportable path, e.g. a k-NN graph network or the sampled set attention). Returns ``module``.
    """
    mixers = [m for m in module.modules() if isinstance(m, TokenMixer)]
    if exportable:
        for m in module.modules():
            refusal = getattr(m, "export_refusal", None)
            reason = refusal() if callable(refusal) else None
            if reason is not None:
                raise UnsupportedExportError(getattr(m, "registry_name", type(m).__name__), reason,
                                             "attention mechanism" if isinstance(m, TokenMixer) else "module")
    for m in mixers:
        m.exportable = bool(exportable)
    return module

