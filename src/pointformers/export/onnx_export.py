"""Export a trained point model for deployment: ONNX (onnxruntime) or ``torch.export`` (``.pt2``).

The exported graph is one event (one cloud) of any size::

    embedding = f(x (N, F), coords (N, c))       # -> (N, out_dim), N dynamic

built by :class:`ExportableModel`, which runs the model's own layers and weights but replaces
each mechanism's token mixer by its *inference path* (eval mode, no input checks, no Python
loop whose trip count depends on N, no custom ``autograd.Function``):

========================  ==================================================================
``hept``                  :func:`.hept_inference.hept_attention` (static block attention)
``lsh_or`` (n_and = 1)    :func:`.hept_inference.lsh_attention`
``kernel``                dense, unchunked (O(N²) memory: small clouds only)
``full``                  ``scaled_dot_product_attention`` (as the module)
``performer``, ``flt``    FAVOR+ with the frozen eval draws (non-causal only)
``sft``                   eval sampler (stratified partners), maxout by a loop over channels
``samsa``                 eval top-k selection (hard) or soft top-2k mixture (soft)
``serialized``            curve order + patches cut by index arithmetic
========================  ==================================================================

Mechanisms that cannot be exported raise :class:`UnsupportedExportError` naming the mechanism
and the reason (``knn``: its exact search is a query-chunk loop whose trip count depends on N,
and unchunked it needs an N × N distance matrix; ``sampled``: its eval cycle is ``randperm(n)``
drawn from a CPU generator seeded per point count, which no graph op reproduces; ...).

Both formats go through ``torch.export`` with a dynamic point dimension; the ONNX file is the
translation of that program (``torch.onnx.export(dynamo=True)``). ``torch.sort(stable=True)``
is lowered to ONNX ``TopK``, whose specification breaks ties by the lower index, i.e. the
stable order; ``softplus`` and ``gelu`` get translations that onnxruntime's CPU kernels run in
float64 too (its ``Softplus`` and ``Erf`` are float32 only; a float64 graph evaluates erf in
float32). Models are exported in ``eval()`` mode (dropout off) and in the requested dtype.

Accuracy. In float64 the exported HEPT graph reproduces PyTorch to ~1e-12 (relative; tests hold it
to 1e-9 at two point counts from one file). The FAVOR+-based paths (``performer``, ``flt``) and
``full``/``sft``/``samsa`` agree to ~1e-8 in float64 ONNX because the exporter stores a few scalar
constants (softmax scales) in float32; torch.export reproduces every path to rounding. In float32
compare by the fraction of points that agree: HEPT's trained checkpoint is ill-conditioned (ω up
to 1.7e7, logits as differences of order-1e8 terms), so float32 onnxruntime and float32 PyTorch
agree on ~68% of points to 1e-3 and ~99% to 1e-1 at 6k points — as float32 and float64 PyTorch
do (see README.md, "Using the authors' checkpoint").
"""
from __future__ import annotations

import copy
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from .hept_inference import (DEFAULT_GROUP_CHUNK, hept_attention, hept_prepare, kernel_attention, lsh_attention)

__all__ = ["UnsupportedExportError", "ExportableModel", "export_model", "load_model", "supported_mechanisms",
           "EXPORT_FORMATS", "METADATA_KEY"]

#: ``format=`` values of :func:`export_model`.
EXPORT_FORMATS = ("onnx", "torch.export")
#: Key of the JSON metadata in the ONNX ``metadata_props`` and the ``.pt2`` extra files.
METADATA_KEY = "pointformers"
_METADATA_VERSION = 1


class UnsupportedExportError(ValueError):
    """The model (or one of its mechanisms) has no exportable inference path; the message says why."""

    def __init__(self, mechanism: str, reason: str):
        self.mechanism, self.reason = mechanism, reason
        super().__init__(f"cannot export attention mechanism {mechanism!r}: {reason}")


# ------------------------------------------------------------------------------ mechanisms
# Each inference path: fn(module, x (B, N, D), pos (B, N, c), mask (B, N) bool, shared) -> (B, N, D).
# The exported graph is one cloud without padding (mask all True), which is what lets the
# SDPA-based paths skip the key mask exactly as the modules do for unpadded input.

def _full(attn, x, pos, mask, shared):
    B, N, _ = x.shape
    H, d = attn.heads, attn.head_dim
    q, k, v = (w(x).view(B, N, H, d).transpose(1, 2) for w in (attn.w_q, attn.w_k, attn.w_v))
    o = F.scaled_dot_product_attention(q, k, v)
    return attn.out_linear(o.transpose(1, 2).reshape(B, N, H * d))


def _performer(attn, x, pos, mask, shared):
    from ..attention.random_features import favor_attention

    q, k, v = attn.qkv(x, mask)
    o = favor_attention(q, k, v, attn.features.value, mask, causal=False)  # eval: the frozen draw
    return attn.merge_heads(o, mask, x.dtype)


def _flt(attn, x, pos, mask, shared):
    from ..attention.random_features import favor_attention

    qh, kh, v = attn.augmented_qkv(x, pos, mask, attn.rpe_noise.value)
    o = favor_attention(qh, kh, v, attn.omega.value, mask, causal=False)
    return attn.merge_heads(o, mask, x.dtype)


def maxout_by_channels(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Σ_c max(q_ic, k_jc) with one (…, n, m) temporary per channel (no ``cdist``, which ONNX lacks)."""
    out = None
    for c in range(q.shape[-1]):
        term = torch.maximum(q[..., :, c:c + 1], k[..., c].unsqueeze(-2))
        out = term if out is None else out + term
    return out


def _sft(attn, x, pos, mask, shared):
    from ..attention.sampling import gather_rows, work_dtype

    B, N, _ = x.shape
    H, d = attn.heads, attn.head_dim
    wd = work_dtype(x.dtype)
    samp = attn.sampler(x, mask)  # eval: no noise, stratified partners
    pe = torch.ones_like(samp.p) if attn.hard_eval else samp.p
    pcol = pe.unsqueeze(-1)
    xs = (pcol * gather_rows(x, samp.idx_top).to(wd) + (1 - pcol) * gather_rows(x, samp.idx_rand).to(wd)).to(x.dtype)
    kk = xs.shape[1]
    q = attn.w_q(x).view(B, N, H, d).transpose(1, 2).to(wd)
    kt = attn.w_k(xs).view(B, kk, H, d).transpose(1, 2).to(wd)
    v = attn.w_v(xs).view(B, kk, H, d).transpose(1, 2).to(wd)
    a = maxout_by_channels(q, kt) / math.sqrt(d)
    if attn.rpe != "none":
        mul_t, add_t, mul_r, add_r = attn._relative_logits(samp, pos, None, x, wd)
        w_t = pe[:, None, None, :]
        a = a * (w_t * F.softplus(mul_t) + (1 - w_t) * F.softplus(mul_r)) + (w_t * add_t + (1 - w_t) * add_r)
    kv = samp.key_valid[:, None, None, :]
    num = F.relu(a).masked_fill(~kv, 0.0)
    den = num.sum(-1, keepdim=True) + attn.eps
    if attn.leaky:
        if attn.leak_mode == "per_key_sum":
            c = F.softplus(attn.w_c(xs).to(wd)).transpose(1, 2)
            den = den + c.masked_fill(~samp.key_valid[:, None, :], 0.0).sum(-1)[..., None, None]
        else:
            den = den + F.softplus(attn.w_c(x).to(wd)).transpose(1, 2).unsqueeze(-1)
    o = torch.matmul(num / den, v)
    return attn.out_linear(o.transpose(1, 2).reshape(B, N, H * d).to(x.dtype))


def _samsa(attn, x, pos, mask, shared):
    from ..attention.samsa import samsa_select

    B, N, _ = x.shape
    H, d = attn.heads, attn.head_dim
    q = attn.w_q(x).view(B, N, H, d).transpose(1, 2)
    kv = torch.cat([attn.w_k(x).view(B, N, H, d), attn.w_v(x).view(B, N, H, d)], -1).transpose(1, 2)
    s = attn.scores(x, mask)
    if attn.support:
        kv = torch.cat([kv, attn.support_kv.to(kv.dtype).expand(B, -1, -1, -1)], dim=2)
        s = torch.cat([s, attn.support_score.to(s.dtype).expand(B, -1, -1)], dim=2)
    kvs, _, key_valid = samsa_select(s, kv, attn.k, tau=attn.tau, mode=attn.mode, proxy=attn.proxy,
                                     training=False, eval_soft=attn.eval_soft, kv_grad=attn.kv_grad)
    ks, vs = kvs.split(d, dim=-1)
    # with support vectors every selected key is real (2k finite candidates always exist)
    attn_mask = None if attn.support else key_valid[:, :, None, :]
    o = F.scaled_dot_product_attention(q, ks, vs, attn_mask=attn_mask)
    return attn.out_linear(o.transpose(1, 2).reshape(B, N, H * d))


def _serialized(attn, x, pos, mask, shared):
    """Curve order, then patches of S slots cut by index arithmetic (static shapes in N)."""
    B, N, _ = x.shape
    H, d, S, off = attn.heads, attn.head_dim, attn.patch_size, attn.offset
    dev = x.device
    order = attn.serialize(pos, mask)  # (B, N) curve order
    dummy = B * N  # an extra all-zero row for empty slots
    rows = order + (torch.arange(B, device=dev) * N).view(B, 1)
    # Each cloud's slots: `off` empty, its points in curve order, then 2·S empty. P = (N + off) // S + 2
    # patches cover every point and are always >= 2 (the exporter then needs no size-1 special case);
    # trailing all-empty patches are computed and dropped.
    slots = torch.cat([torch.full((B, off), dummy, dtype=torch.int64, device=dev), rows,
                       torch.full((B, 2 * S), dummy, dtype=torch.int64, device=dev)], 1)
    blk = (torch.arange((N + off) // S + 2, device=dev) * S).unsqueeze(-1) + torch.arange(S, device=dev)  # (P, S)
    P = blk.shape[0]
    src = slots[:, blk].reshape(B * P, S)

    def patches(t: torch.Tensor) -> torch.Tensor:  # (B, N, H, d) -> (B·P, H, S, d)
        flat = torch.cat([t.reshape(B * N, H, d), t.new_zeros(1, H, d)])
        # indexing by the 2-D src keeps its (B·P, S) shape: no view with a symbolic P that the exporter
        # would have to prove divides the element count
        return flat[src].transpose(1, 2)

    q, k, v = (patches(w(x).view(B, N, H, d)) for w in (attn.w_q, attn.w_k, attn.w_v))
    key_ok = (src != dummy)[:, None, None, :]
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=key_ok, scale=attn.scale)  # (B·P, H, S, d)
    # slot of point order[b, j] is b·P·S + off + j: invert the curve order
    slot = torch.empty_like(order).scatter(1, order, (torch.arange(N, device=dev) + off).expand(B, N))
    slot = slot + (torch.arange(B, device=dev) * (P * S)).view(B, 1)
    o = o.transpose(1, 2).reshape(B * P * S, H * d).index_select(0, slot.reshape(B * N)).view(B, N, H * d)
    return attn.out_linear(o)


def _hept(attn, x, pos, mask, shared):
    return hept_attention(attn, x, pos, mask, shared["codes"], shared["group_chunk"])


def _lsh(attn, x, pos, mask, shared):
    return lsh_attention(attn, x, pos, mask, shared["group_chunk"])


def _kernel(attn, x, pos, mask, shared):
    return kernel_attention(attn, x, pos, mask)


_PATHS: dict[str, Callable] = {"hept": _hept, "lsh_or": _lsh, "kernel": _kernel, "full": _full,
                               "performer": _performer, "flt": _flt, "sft": _sft, "samsa": _samsa,
                               "serialized": _serialized}

_NOT_EXPORTABLE = {
    "knn": "its exact k-NN search loops over query chunks whose number depends on the point count "
           "(chunk = 2^24 // N rows), which a static graph cannot express, and an unchunked search needs the "
           "full N × N distance matrix (13 GiB at 60k points in float32)",
    "sampled": "its eval cycle is randperm(n) drawn from a CPU torch.Generator seeded with (seed, n), a new "
               "random permutation for every point count that no ONNX/graph op reproduces (mode='sparse' has "
               "no export path either)",
}


def supported_mechanisms() -> list[str]:
    """Registry keys of the mechanisms with an export path (some options may still be refused)."""
    return sorted(_PATHS)


def min_points(model: nn.Module) -> int:
    """Smallest point count the exported graph accepts (sampling mechanisms fix k at export time)."""
    need = 2
    for blk in getattr(model, "blocks", []):
        m = blk.mixer
        name = getattr(m, "registry_name", "")
        if name == "sft":
            need = max(need, m.k + 1)
        elif name == "samsa" and not m.support:
            need = max(need, 2 * m.k)
    return need


def check_exportable(model: nn.Module) -> None:
    """Raise :class:`UnsupportedExportError` (or ValueError) if ``model`` has no export path."""
    from ..models import PointTransformerJK

    if not isinstance(model, PointTransformerJK):
        raise ValueError(f"model: export supports PointTransformerJK models (hept-tracking, tracking-encoder), "
                         f"got {type(model).__name__}")
    for blk in model.blocks:
        m = blk.mixer
        name = getattr(m, "registry_name", type(m).__name__)
        if name in _NOT_EXPORTABLE:
            raise UnsupportedExportError(name, _NOT_EXPORTABLE[name])
        if name not in _PATHS:
            raise UnsupportedExportError(name, "no export-friendly inference path is implemented for it")
        if name in ("performer", "flt") and m.causal:
            raise UnsupportedExportError(name, "causal=True runs chunked prefix sums in a Python loop over "
                                               "ceil(N / chunk_size) chunks, a trip count that depends on N; "
                                               "only the non-causal path exports")
        if name == "lsh_or" and m.n_and > 1:
            raise UnsupportedExportError(name, f"n_and={m.n_and} buckets its AND hashes with torch.searchsorted, "
                                               "which has no ONNX translation; n_and=1 (OR-only) exports")
        if name == "sft" and m.rpe == "graph":
            raise UnsupportedExportError(name, "rpe='graph' needs a dense (N, N, r) edge_attr input, which the "
                                               "exported (x, coords) signature does not carry")
    if model.attention == "hept" and not hasattr(model, "region_hash"):
        raise ValueError("model: a HEPT model without its shared region_hash")


class ExportableModel(nn.Module):
    """One cloud through ``model`` with export-friendly inference paths. x (N, F), coords (N, c) -> (N, out_dim).

    Computes what ``model.eval()(x, coords)`` computes (same weights, same math; float rounding
    and HEPT's sort near-ties aside). ``group_chunk``: HEPT/LSH groups (heads) per block-attention
    chunk, a memory knob (see :mod:`.hept_inference`).
    """

    def __init__(self, model: nn.Module, group_chunk: int | None = DEFAULT_GROUP_CHUNK):
        super().__init__()
        check_exportable(model)
        self.model = model.eval()
        self.group_chunk = group_chunk
        self.mechanism = model.attention

    def forward(self, x: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        m = self.model
        x, coords = x.unsqueeze(0), coords.unsqueeze(0)
        mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        shared: dict[str, Any] = {"group_chunk": self.group_chunk}
        if m.attention == "hept":
            shared["codes"] = hept_prepare(m, coords, mask)  # once per forward, for every layer
        h = m.feat_encoder(x)
        if m.pos_encoder is not None:  # pe="learned": the coordinate encoding added before the first block
            h = h + m.pos_encoder(coords)
        hs = [h]
        for blk in m.blocks:
            path = _PATHS[blk.mixer.registry_name]
            h = h + path(blk.mixer, blk.norm1(h), coords, mask, shared)
            h = h + blk.ff(blk.norm2(h))
            hs.append(h)
        e = m.W(torch.cat(hs, -1))
        return (e + m.mlp_out(e))[0]


# ------------------------------------------------------------------------------ loading
def load_model(source: nn.Module | str | os.PathLike | Mapping[str, Any],
               dtype: torch.dtype = torch.float32) -> nn.Module:
    """The model to export, in ``eval()`` mode and ``dtype``.

    ``source``: a model (copied, not modified); a training checkpoint (``best.pt`` / ``last.pt``
    of :mod:`pointformers.engine.checkpoint`, or its loaded dict); or the authors' HEPT
    ``state_dict`` file or a shipped checkpoint's name such as ``"hept-tracking-60k"`` (loaded
    with :func:`pointformers.models.from_reference_checkpoint`, converting ω in ``dtype``, with
    this project's masked padding: the exported graph cannot reproduce the authors' padding by
    duplicated points, which follows PyTorch's unstable sort order; outputs then equal the
    authors' exactly when the point count is a multiple of the block size).
    """
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    if isinstance(source, nn.Module):
        return copy.deepcopy(source).to(dtype).eval()
    from ..engine.checkpoint import CHECKPOINT_FORMAT, model_from_checkpoint

    if isinstance(source, Mapping):
        return model_from_checkpoint(source).to(dtype).eval()
    from ..models.hept_tracking import REFERENCE_CHECKPOINTS, is_reference_state_dict, reference_checkpoint_path

    if isinstance(source, str) and source in REFERENCE_CHECKPOINTS:
        source = reference_checkpoint_path(source)
    path = Path(source)
    if not path.is_file():
        raise ValueError(f"checkpoint: no such file {str(path)!r}")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - report any unreadable file the same way
        raise ValueError(f"checkpoint {str(path)!r}: cannot be read ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''})") from exc
    if isinstance(obj, dict) and obj.get("format") == CHECKPOINT_FORMAT:
        return model_from_checkpoint(path).to(dtype).eval()
    if is_reference_state_dict(obj):
        from ..models import from_reference_checkpoint

        # the exported graph pads by masking (duplication needs PyTorch's unstable sort order)
        return from_reference_checkpoint(path, dtype=dtype, padding="mask").eval()
    raise ValueError(f"checkpoint {str(path)!r}: neither a pointformers training checkpoint (format="
                     f"{CHECKPOINT_FORMAT!r}) nor an authors' HEPT state_dict")


def _model_config(model: nn.Module) -> dict:
    blk = model.blocks[0].mixer if len(model.blocks) else None
    return {"in_dim": model.in_dim, "coord_dim": model.coord_dim, "out_dim": model.W.out_features,
            "mechanism": model.attention, "n_layers": len(model.blocks),
            "mixer": type(blk).__name__ if blk is not None else None}


def _metadata(model: nn.Module, dtype: torch.dtype, fmt: str, opset: int | None) -> dict:
    from .. import __version__

    return {"version": _METADATA_VERSION, "pointformers": __version__, "torch": torch.__version__,
            "format": fmt, "opset": opset, "dtype": str(dtype).replace("torch.", ""), "min_points": min_points(model),
            "inputs": {"x": ["n_points", model.in_dim], "coords": ["n_points", model.coord_dim]},
            "output": {"embedding": ["n_points", model.W.out_features]}, **_model_config(model)}


def example_inputs(model: nn.Module, n: int | None = None, dtype: torch.dtype = torch.float32, seed: int = 0):
    """Random (x (n, F), coords (n, c)) to trace with; η in [−4, 4], φ in [−π, π]."""
    n = n or max(min_points(model) + 37, 1037)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, model.in_dim, generator=g, dtype=torch.float64)
    coords = torch.randn(n, model.coord_dim, generator=g, dtype=torch.float64)
    coords[:, 0] = (torch.rand(n, generator=g, dtype=torch.float64) - 0.5) * 8
    if model.coord_dim > 1:
        coords[:, 1] = (torch.rand(n, generator=g, dtype=torch.float64) - 0.5) * 2 * math.pi
    return x.to(dtype), coords.to(dtype)


def _dynamic_shapes(model: nn.Module) -> dict:
    n = torch.export.Dim("n_points", min=min_points(model), max=1 << 30)
    return {"x": {0: n}, "coords": {0: n}}


def _sort_stable_to_topk(self, *, stable=None, dim: int = -1, descending: bool = False):
    """ONNX translation of ``aten.sort.stable``: a full ``TopK``, which breaks ties by lower index."""
    from onnxscript import opset18 as op

    size = op.Reshape(op.Gather(op.Shape(self), dim, axis=0), op.Constant(value_ints=[1]))
    values, indices = op.TopK(self, size, axis=dim, largest=descending, sorted=True)
    return values, indices


def _softplus(self, beta: float = 1.0, threshold: float = 20.0):
    """ONNX translation of ``aten.softplus`` with elementary ops, as PyTorch defines it
    (``x`` where ``beta·x > threshold``, else ``log(1 + exp(beta·x)) / beta``): onnxruntime's CPU
    ``Softplus`` kernel has no float64 version."""
    from onnxscript import opset18 as op

    bx = op.Mul(self, op.CastLike(beta, self))
    one = op.CastLike(1.0, self)
    soft = op.Div(op.Log(op.Add(one, op.Exp(op.Min(bx, op.CastLike(threshold, self))))), op.CastLike(beta, self))
    return op.Where(op.Greater(bx, op.CastLike(threshold, self)), self, soft)


def _gelu(self, approximate: str = "none"):
    """ONNX translation of ``aten.gelu``: 0.5·x·(1 + erf(x/√2)) (or the tanh form). onnxruntime's CPU
    ``Erf`` is float32 only, so a float64 graph evaluates erf in float32 (relative error ~1e-7 in
    GELU); everything else stays float64."""
    from onnxscript import opset18 as op

    half, one = op.CastLike(0.5, self), op.CastLike(1.0, self)
    if approximate == "tanh":
        inner = op.Mul(op.CastLike(math.sqrt(2.0 / math.pi), self),
                       op.Add(self, op.Mul(op.CastLike(0.044715, self), op.Mul(self, op.Mul(self, self)))))
        return op.Mul(op.Mul(half, self), op.Add(one, op.Tanh(inner)))
    scaled = op.Mul(self, op.CastLike(1.0 / math.sqrt(2.0), self))
    erf = op.CastLike(op.Erf(op.Cast(scaled, to=1)), self)  # 1 = FLOAT
    return op.Mul(op.Mul(half, self), op.Add(one, erf))


def export_program(wrapper: ExportableModel, inputs: tuple[torch.Tensor, torch.Tensor]):
    """``torch.export`` the wrapper with a dynamic point count."""
    with torch.no_grad():
        return torch.export.export(wrapper, inputs, dynamic_shapes=_dynamic_shapes(wrapper.model), strict=False)


def export_model(model_or_checkpoint: nn.Module | str | os.PathLike | Mapping[str, Any], path: str | os.PathLike,
                 format: str = "onnx", dtype: torch.dtype | str = torch.float32, opset: int | None = None,
                 group_chunk: int | None | str = "auto", optimize: bool = False,
                 verbose: bool = False) -> Path:
    """Export a trained model for inference on one event of any size.

    Args:
        model_or_checkpoint: a model, a training checkpoint path (``RUN/best.pt``) or dict, or an
            authors' HEPT ``state_dict`` file (see :func:`load_model`).
        path: output file (``.onnx`` for ONNX, conventionally ``.pt2`` for torch.export).
        format: ``"onnx"`` or ``"torch.export"``.
        dtype: ``torch.float32`` (default) or ``torch.float64`` (weights, inputs and output).
        opset: ONNX opset (default: the exporter's, 18 or newer).
        group_chunk: HEPT/LSH heads per block-attention chunk (memory vs. speed; see
            :mod:`.hept_inference`); None = all heads at once. ``"auto"``: None for ONNX (a graph
            4x smaller that exports in seconds and runs as fast in onnxruntime: 3.7 s vs 3.9 s for
            60k points, 1 thread), :data:`~.hept_inference.DEFAULT_GROUP_CHUNK` (1) for
            torch.export (PyTorch runs one head at a time 2x faster: 5.7 s vs 10.7 s).
        optimize: run onnxscript's graph optimizer before saving (default False). Off by default:
            onnxruntime optimizes the graph itself when it loads it; the optimizer's time grows
            faster than linearly with the graph (minutes for the 4-layer tracking model unrolled
            per head); and with onnxscript 0.7.2 it changed the function of the authors' trained
            HEPT checkpoint (0% of points agreeing with PyTorch even in float64, 100% without it):
            that model's ω reaches 1.7e7, so the logits −½‖q̂ − k̂‖² are differences of terms of
            order 1e8 and any constant folded at lower precision moves them by more than 1.
    Returns:
        ``path``. The file's metadata (JSON under key ``"pointformers"``) records the mechanism,
        dtype, input sizes and the minimum point count.
    Raises:
        UnsupportedExportError naming the mechanism and the reason when it cannot be exported;
        ValueError for a bad argument; ImportError (with the install hint) without onnx/onnxscript.
    """
    if format not in EXPORT_FORMATS:
        raise ValueError(f"format must be one of {EXPORT_FORMATS}, got {format!r}")
    if group_chunk == "auto":
        group_chunk = None if format == "onnx" else DEFAULT_GROUP_CHUNK
    if group_chunk is not None and (not isinstance(group_chunk, int) or group_chunk < 1):
        raise ValueError(f"group_chunk must be a positive int, None or 'auto', got {group_chunk!r}")
    if isinstance(dtype, str):
        dtype = {"float32": torch.float32, "float64": torch.float64}.get(dtype.replace("torch.", ""), dtype)
    if format == "onnx":
        for mod in ("onnx", "onnxscript"):
            try:
                __import__(mod)
            except ImportError as exc:
                raise ImportError(f"ONNX export needs the '{mod}' package: pip install 'pointformers[export]' "
                                  "(onnx, onnxscript, onnxruntime)") from exc
    model = load_model(model_or_checkpoint, dtype)
    wrapper = ExportableModel(model, group_chunk=group_chunk).eval()
    inputs = example_inputs(model, dtype=dtype)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {**_metadata(model, dtype, format, opset), "group_chunk": group_chunk}
    program = export_program(wrapper, inputs)
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")  # keeps the suffix torch.export.save expects
    try:
        if format == "torch.export":
            torch.export.save(program, str(tmp), extra_files={METADATA_KEY + ".json": json.dumps(meta)})
        else:
            import onnx

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                onnx_program = torch.onnx.export(
                    program, inputs, dynamo=True, opset_version=opset, input_names=["x", "coords"],
                    output_names=["embedding"], verbose=verbose,
                    custom_translation_table={torch.ops.aten.sort.stable: _sort_stable_to_topk,
                                              torch.ops.aten.softplus.default: _softplus,
                                              torch.ops.aten.gelu.default: _gelu},
                    optimize=bool(optimize), external_data=False)
            proto = onnx_program.model_proto
            meta["opset"] = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), opset)
            del proto.metadata_props[:]
            entry = proto.metadata_props.add()
            entry.key, entry.value = METADATA_KEY, json.dumps(meta)
            onnx.save_model(proto, str(tmp))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path
