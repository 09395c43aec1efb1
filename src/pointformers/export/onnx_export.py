"""Export a trained point model for deployment: ONNX (onnxruntime) or ``torch.export`` (``.pt2``).

The exported graph is one event (one cloud) of any size::

    output = f(x (N, F), coords (N, c))       # -> (N, out_dim) embeddings (or (N,) pile-up logits)

traced from the model itself: :class:`ExportableModel` switches every token mixer of the model
to its export mode (:func:`pointformers.attention.set_exportable`: the same function through a
graph with no Python loop whose trip count depends on N and no custom ``autograd.Function``; each
mechanism keeps that path in its own file) and calls the model on one cloud. Input checks are
skipped while tracing. Mechanisms or options that cannot be exported raise
:class:`~pointformers.attention.UnsupportedExportError` naming the mechanism and the reason
(from the mechanism's registry entry or its ``export_refusal()``).

This module keeps what export itself needs: loading (training checkpoints, the authors' HEPT
file), the wrapper, the exporter calls with a dynamic point dimension, ONNX translations of three
ATen ops and the file's metadata. Both formats go through ``torch.export``; the ONNX file is the
translation of that program (``torch.onnx.export(dynamo=True)``). ``torch.sort(stable=True)`` is
lowered to ONNX ``TopK``, whose specification breaks ties by the lower index, i.e. the stable
order; ``softplus`` and ``gelu`` get translations that onnxruntime's CPU kernels run in float64 too
(its ``Softplus`` and ``Erf`` are float32 only; a float64 graph evaluates erf in float32). Models
are exported in ``eval()`` mode (dropout off) and in the requested dtype.

Accuracy. In float64 the exported HEPT graph reproduces PyTorch to ~1e-12 (relative). The
FAVOR+-based paths (``performer``, ``flt``) and ``full``/``sft``/``samsa`` agree to ~1e-8 in float64
ONNX because the exporter stores a few scalar constants (softmax scales) in float32; torch.export
reproduces every path to rounding. In float32 compare by the fraction of points that agree: HEPT's
trained checkpoint is ill-conditioned (ω up to 1.7e7, logits as differences of order-1e8 terms), so
float32 onnxruntime and float32 PyTorch agree on most points but not all (see README.md, "Using the
authors' checkpoint").
"""
from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import threading
import warnings
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn

from ..attention import MECHANISMS, TokenMixer, UnsupportedExportError, set_exportable
from ..files import atomic_write

__all__ = ["UnsupportedExportError", "ExportableModel", "export_model", "load_model", "supported_mechanisms",
           "check_exportable", "onnx_translation_table", "EXPORT_FORMATS", "METADATA_KEY"]

#: ``format=`` values of :func:`export_model`.
EXPORT_FORMATS = ("onnx", "torch.export")
#: Key of the JSON metadata in the ONNX ``metadata_props`` and the ``.pt2`` extra files.
METADATA_KEY = "pointformers"
_METADATA_VERSION = 2
#: Name of the ONNX graph's output (files of metadata version 1 called it "embedding"; a model's
#: own value names, e.g. an ``nn.Embedding``'s output, may not clash with it).
OUTPUT_NAME = "pointformers_output"
#: ``group_chunk`` for torch.export files: PyTorch runs the block attention one head at a time
#: faster than all at once on the CPU (cache); onnxruntime does not gain and the unrolled ONNX
#: graph grows with the chunk count, so ONNX files use all heads at once (docs/benchmarks.md).
TORCH_EXPORT_GROUP_CHUNK = 1


def supported_mechanisms() -> list[str]:
    """Registry keys of the mechanisms with an export path (some options may still be refused)."""
    return [name for name in MECHANISMS.available() if MECHANISMS.info(name).export is None]


def _mixers(model: nn.Module) -> list[TokenMixer]:
    return [m for m in model.modules() if isinstance(m, TokenMixer)]


def min_points(model: nn.Module) -> int:
    """Smallest point count the exported graph accepts: sampling mechanisms fix k at export time, and a
    model may ask for more with a ``min_points()`` method of its own (the track reconstructor: two hits
    per sector)."""
    own = [model.min_points()] if callable(getattr(model, "min_points", None)) else []
    return max([2] + own + [m.min_points() for m in _mixers(model)])


def check_exportable(model: nn.Module) -> None:
    """Raise :class:`UnsupportedExportError` (or ValueError) if ``model`` has no export path."""
    name = getattr(model, "registry_name", None)
    if name is not None:
        from ..models import MODELS

        reason = MODELS.info(name).export if name in MODELS else None
        if reason is not None:
            raise ValueError(f"model: {name!r} cannot be exported: {reason}")
    if not getattr(model, "export_inputs", None):
        raise ValueError(f"model: export supports the point models with the (x, coords) signature (hept-tracking, "
                         f"tracking-encoder, hept-pileup, pileup-encoder), got {type(model).__name__}")
    reason = model.export_refusal() if hasattr(model, "export_refusal") else None
    if reason:
        raise ValueError(f"model: {reason}")
    for m in _mixers(model):
        reason = m.export_refusal()
        if reason is not None:
            raise UnsupportedExportError(getattr(m, "registry_name", type(m).__name__), reason)


class ExportableModel(nn.Module):
    """One cloud through ``model`` in export mode. x (N, F), coords (N, c) -> the model's output for that cloud.

    Computes what ``model.eval()(x, coords)`` computes (same modules, same weights; float rounding
    and HEPT's sort near-ties aside) on a copy of ``model`` whose mixers are in export mode (the
    given model is not changed). ``group_chunk``: heads per block-attention chunk of the mechanisms
    that have one (HEPT, ``lsh_or``), a memory knob.
    """

    def __init__(self, model: nn.Module, group_chunk: int | None = None):
        super().__init__()
        check_exportable(model)
        model = copy.deepcopy(model)
        self.model = set_exportable(model.eval())
        self.group_chunk = group_chunk
        for m in _mixers(model):
            if hasattr(m, "group_chunk"):
                m.group_chunk = group_chunk
        self.mechanism = getattr(model, "attention", None)

    def forward(self, x: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        return self.model(x.unsqueeze(0), coords.unsqueeze(0))[0]


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


def _metadata(model: nn.Module, dtype: torch.dtype, fmt: str, opset: int | None, out_shape: tuple) -> dict:
    """The file's metadata; ``out_shape``: the per-point output shape (``(out_dim,)`` or ``()``)."""
    from .. import __version__

    mixers = _mixers(model)
    return {"version": _METADATA_VERSION, "pointformers": __version__, "torch": torch.__version__,
            "format": fmt, "opset": opset, "dtype": str(dtype).replace("torch.", ""), "min_points": min_points(model),
            "inputs": {"x": ["n_points", model.in_dim], "coords": ["n_points", model.coord_dim]},
            "output": {OUTPUT_NAME: ["n_points", *out_shape]}, "in_dim": model.in_dim,
            "coord_dim": model.coord_dim, "out_dim": int(out_shape[0]) if out_shape else 1, "out_shape": list(out_shape),
            "mechanism": getattr(model, "attention", None), "n_layers": len(mixers),
            "mixer": type(mixers[0]).__name__ if mixers else None, "model": type(model).__name__}


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
    """The point count, dynamic from :func:`min_points`. ``Dim.DYNAMIC`` still refuses a graph that fixes the
    count, but accepts a guard the tracer cannot prove on its own over the range (the track reconstructor's
    sector length ``⌈n/k⌉ ≠ 1``, true from ``2k`` points on); the exported file is checked on other counts."""
    n = torch.export.Dim.DYNAMIC(min=min_points(model), max=1 << 30)
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


def onnx_translation_table() -> dict:
    """ONNX translations of the ATen ops the mechanisms' export paths use that the exporter's own
    table lacks or translates float32-only: pass it as ``torch.onnx.export(...,
    custom_translation_table=onnx_translation_table())`` when exporting your own module that
    contains pointformers mechanisms (``aten.sort.stable`` → a full ``TopK``, which breaks ties by the
    lower index, i.e. the stable order; ``softplus`` and ``gelu`` also in float64)."""
    return {torch.ops.aten.sort.stable: _sort_stable_to_topk, torch.ops.aten.softplus.default: _softplus,
            torch.ops.aten.gelu.default: _gelu}


_REGISTRY_LOCK = threading.Lock()
_REGISTRY_USERS = 0
_REGISTRY_ORIGINAL: Any = None            # the exporter's own ``from_torchlib`` (a classmethod)
_TORCHLIB_REGISTRIES: dict[int, Any] = {}  # opset -> the registry built once


@contextlib.contextmanager
def _cached_torchlib_registry():
    """While active, ``torch.onnx.export`` builds its op registry from a per-opset copy kept here.

    ``ONNXRegistry.from_torchlib`` rebuilds the same table (thousands of onnxscript functions) on
    every export call: seconds each, most of a small model's export time. Its result depends only on
    the opset and the installed torch/onnxscript, so one table per opset is kept and each export
    gets a fresh registry over copies of its lists (the exporter adds the custom translations to
    the registry it gets, never to the shared lists). Where the private hook is absent (another
    torch release) nothing is changed. Re-entrant and thread-safe: installed by the first user,
    the exporter's own restored when the last one leaves.
    """
    global _REGISTRY_USERS, _REGISTRY_ORIGINAL
    try:
        from torch.onnx._internal.exporter import _registration
        cls = _registration.ONNXRegistry
        if not isinstance(cls.__dict__["from_torchlib"], classmethod):
            raise TypeError
    except (ImportError, AttributeError, KeyError, TypeError):
        yield
        return

    def from_torchlib(klass, opset_version=_registration._constants.TORCHLIB_OPSET):
        with _REGISTRY_LOCK:
            base = _TORCHLIB_REGISTRIES.get(opset_version)
        if base is None:
            base = _REGISTRY_ORIGINAL.__func__(klass, opset_version=opset_version)
            with _REGISTRY_LOCK:
                base = _TORCHLIB_REGISTRIES.setdefault(opset_version, base)
        registry = klass()
        registry._opset_version = base._opset_version
        registry.functions = {name: list(decomps) for name, decomps in base.functions.items()}
        return registry

    with _REGISTRY_LOCK:
        if _REGISTRY_USERS == 0:
            _REGISTRY_ORIGINAL = cls.__dict__["from_torchlib"]
            cls.from_torchlib = classmethod(from_torchlib)
        _REGISTRY_USERS += 1
    try:
        yield
    finally:
        with _REGISTRY_LOCK:
            _REGISTRY_USERS -= 1
            if _REGISTRY_USERS == 0:
                cls.from_torchlib = _REGISTRY_ORIGINAL


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
        group_chunk: HEPT/LSH heads per block-attention chunk of the export path (memory vs. speed,
            see :func:`pointformers.attention.block_attention.static_block_sums`); None = all heads
            at once. ``"auto"``: None for ONNX (a smaller graph that onnxruntime runs as fast),
            :data:`TORCH_EXPORT_GROUP_CHUNK` (1) for torch.export (PyTorch runs one head at a time
            faster on the CPU); measurements in docs/benchmarks.md, "Export notes".
        optimize: run onnxscript's graph optimizer before saving (default False). Off by default:
            onnxruntime optimizes the graph itself when it loads it; the optimizer's time grows
            faster than linearly with the graph; and it can change the function of the authors'
            trained HEPT checkpoint, whose ω reaches 1.7e7, so the logits −½‖q̂ − k̂‖² are
            differences of terms of order 1e8 and any constant folded at lower precision moves them
            by more than 1 (docs/benchmarks.md, "Export notes").
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
        group_chunk = None if format == "onnx" else TORCH_EXPORT_GROUP_CHUNK
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
    meta = {"group_chunk": group_chunk}
    program = export_program(wrapper, inputs)
    out_node = next(n for n in program.graph.nodes if n.op == "output")
    out_shape = tuple(int(d) for d in out_node.args[0][0].meta["val"].shape[1:])  # per point: (out_dim,) or ()
    meta = {**_metadata(model, dtype, format, opset, out_shape), **meta}
    if format == "torch.export":
        buffer = io.BytesIO()
        torch.export.save(program, buffer, extra_files={METADATA_KEY + ".json": json.dumps(meta)})
        data = buffer.getvalue()
    else:
        with warnings.catch_warnings(), _cached_torchlib_registry():
            warnings.simplefilter("ignore")
            onnx_program = torch.onnx.export(
                program, inputs, dynamo=True, opset_version=opset, input_names=["x", "coords"],
                output_names=[OUTPUT_NAME], verbose=verbose,
                custom_translation_table=onnx_translation_table(),
                optimize=bool(optimize), external_data=False)
        proto = onnx_program.model_proto
        meta["opset"] = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), opset)
        if opset is not None and meta["opset"] != opset:
            raise ValueError(f"opset: asked for {opset}, the exporter wrote opset {meta['opset']}")
        del proto.metadata_props[:]
        entry = proto.metadata_props.add()
        entry.key, entry.value = METADATA_KEY, json.dumps(meta)
        data = proto.SerializeToString()
    atomic_write(path, lambda f: f.write(data))  # temporary file, fsync, rename: never a torn export
    return path
