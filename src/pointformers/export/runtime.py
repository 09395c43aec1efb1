"""Run an exported model (:func:`~pointformers.export.export_model`) without the training code.

>>> run = OnnxInference("hept.onnx", threads=2)          # doctest: +SKIP
>>> emb = run(x, coords)            # (N, F), (N, c) -> (N, out_dim), like model(x, coords)
>>> emb = run(x, coords, mask)      # (B, N, F), (B, N, c), (B, N) -> (B, N, out_dim), padded rows 0

The call returns the structure the PyTorch model returns: a torch tensor for torch inputs, a
numpy array for numpy inputs; a batch is run cloud by cloud (the exported graph is one cloud),
which gives what the model gives for a padded batch because a cloud's output never depends on
its batch. Inputs are cast to the exported dtype. Bad inputs raise ``ValueError`` naming the
argument, as the model does.

``onnxruntime`` is an optional dependency (``pip install 'pointformers[export]'``).
"""
from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .onnx_export import METADATA_KEY

__all__ = ["ExportedInference", "OnnxInference", "TorchExportInference", "load_exported", "read_metadata"]


def _is_pt2(path: Path) -> bool:
    return path.suffix == ".pt2" or (path.suffix != ".onnx" and zipfile.is_zipfile(path))


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON metadata written by :func:`~pointformers.export.export_model` (mechanism, dtype, sizes, ...)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"exported model: no such file {str(path)!r}")
    if _is_pt2(path):
        extra = {METADATA_KEY + ".json": ""}
        torch.export.load(str(path), extra_files=extra)
        text = extra[METADATA_KEY + ".json"]
    else:
        try:
            import onnx
        except ImportError:  # onnxruntime alone is enough to read it
            text = _ort_session(path, 1, None).get_modelmeta().custom_metadata_map.get(METADATA_KEY, "")
        else:
            proto = onnx.load(str(path), load_external_data=False)
            text = next((p.value for p in proto.metadata_props if p.key == METADATA_KEY), "")
    if not text:
        raise ValueError(f"exported model {str(path)!r}: no pointformers metadata (not written by export_model?)")
    return json.loads(text)


def _ort_session(path: Path, threads: int | None, providers: list[str] | None):
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise ImportError("OnnxInference needs onnxruntime: pip install 'pointformers[export]'") from exc
    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # errors only: no constant-folding notices about CastLike on load
    if threads is not None:
        if not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be a positive int or None, got {threads!r}")
        opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), sess_options=opts, providers=providers or ["CPUExecutionProvider"])


class ExportedInference:
    """Input handling shared by the runtimes; subclasses implement :meth:`run_cloud` on (N, ·) numpy arrays."""

    def __init__(self, meta: dict[str, Any]):
        self.meta = meta
        self.in_dim = int(meta["in_dim"])
        self.coord_dim = int(meta["coord_dim"])
        self.out_dim = int(meta["out_dim"])
        # per-point output shape: (out_dim,) embeddings, () for one logit per point (pile-up)
        self.out_shape = tuple(meta.get("out_shape", [self.out_dim]))
        self.min_points = int(meta.get("min_points", 1))
        self.np_dtype = np.dtype(meta.get("dtype", "float32"))
        self.mechanism = meta.get("mechanism")

    def run_cloud(self, x: np.ndarray, coords: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def _cloud(self, x: np.ndarray, coords: np.ndarray, where: str) -> np.ndarray:
        n = x.shape[0]
        if n < self.min_points:
            raise ValueError(f"x{where}: {n} points, but this exported {self.mechanism} model needs at least "
                             f"{self.min_points} (the point count it was exported for: "
                             f"{'its sampler keeps k tokens, or its sectors need two points each' if self.min_points > 2 else 'a minimum of 2'})")
        if not np.isfinite(x).all():
            raise ValueError(f"x{where} contains NaN or inf at real points")
        if not np.isfinite(coords).all():
            raise ValueError(f"coords{where} contains NaN or inf at real points")
        return self.run_cloud(np.ascontiguousarray(x, self.np_dtype), np.ascontiguousarray(coords, self.np_dtype))

    def __call__(self, x, coords, mask=None):
        """x (N, F) | (B, N, F), coords (N, c) | (B, N, c), mask None | (B, N) bool -> (N, out) | (B, N, out)."""
        as_torch = isinstance(x, torch.Tensor)
        device = x.device if as_torch else None
        xn = x.detach().cpu().numpy() if as_torch else np.asarray(x)
        cn = coords.detach().cpu().numpy() if isinstance(coords, torch.Tensor) else np.asarray(coords)
        if xn.ndim not in (2, 3) or xn.shape[-1] != self.in_dim:
            raise ValueError(f"x: expected (N, {self.in_dim}) or (B, N, {self.in_dim}) features, got shape "
                             f"{tuple(xn.shape)}")
        if cn.shape != xn.shape[:-1] + (self.coord_dim,):
            raise ValueError(f"coords: expected shape {tuple(xn.shape[:-1]) + (self.coord_dim,)} "
                             f"(η and φ in columns 0 and 1), got {tuple(cn.shape)}")
        if xn.ndim == 2:
            if mask is not None:
                raise ValueError("mask: only for batched (B, N, F) input")
            out = self._cloud(xn, cn, "")
        else:
            B, N = xn.shape[:2]
            if mask is None:
                mn = np.ones((B, N), dtype=bool)
            else:
                mn = mask.detach().cpu().numpy() if isinstance(mask, torch.Tensor) else np.asarray(mask)
                if mn.dtype != bool or mn.shape != (B, N):
                    raise ValueError(f"mask: expected a bool (B, N) = {(B, N)} array, got {mn.dtype} {tuple(mn.shape)}")
                if not mn.any(1).all():
                    raise ValueError(f"mask marks cloud(s) {np.flatnonzero(~mn.any(1)).tolist()} as empty; "
                                     "every cloud needs at least one real point")
            out = np.zeros((B, N, *self.out_shape), dtype=self.np_dtype)
            for b in range(B):
                out[b, mn[b]] = self._cloud(xn[b, mn[b]], cn[b, mn[b]], f"[{b}]")
        if as_torch:
            return torch.from_numpy(out).to(device)
        return out


class OnnxInference(ExportedInference):
    """An exported ``.onnx`` model in onnxruntime.

    Args:
        path: the file written by ``export_model(..., format="onnx")``.
        threads: intra-op threads (None: onnxruntime's default, all cores).
        providers: onnxruntime execution providers (default CPU).
    """

    def __init__(self, path: str | os.PathLike, threads: int | None = None, providers: list[str] | None = None):
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"exported model: no such file {str(path)!r}")
        self.path = path
        self.session = _ort_session(path, threads, providers)
        text = self.session.get_modelmeta().custom_metadata_map.get(METADATA_KEY)
        if not text:
            raise ValueError(f"{str(path)!r}: no pointformers metadata (not written by export_model?)")
        super().__init__(json.loads(text))

    def run_cloud(self, x: np.ndarray, coords: np.ndarray) -> np.ndarray:
        return self.session.run([self.session.get_outputs()[0].name], {"x": x, "coords": coords})[0]


class TorchExportInference(ExportedInference):
    """An exported ``.pt2`` program (``torch.export``), run by PyTorch without the package's model code.

    ``threads`` sets ``torch.set_num_threads`` (process-wide) when given.
    """

    def __init__(self, path: str | os.PathLike, threads: int | None = None):
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"exported model: no such file {str(path)!r}")
        extra = {METADATA_KEY + ".json": ""}
        self.program = torch.export.load(str(path), extra_files=extra)
        self.module = self.program.module()
        if threads is not None:
            torch.set_num_threads(threads)
        super().__init__(json.loads(extra[METADATA_KEY + ".json"] or "{}"))

    def run_cloud(self, x: np.ndarray, coords: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return self.module(torch.from_numpy(x), torch.from_numpy(coords)).numpy()


def load_exported(path: str | os.PathLike, threads: int | None = None) -> ExportedInference:
    """:class:`OnnxInference` or :class:`TorchExportInference`, by the file's kind."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"exported model: no such file {str(path)!r}")
    return TorchExportInference(path, threads) if _is_pt2(path) else OnnxInference(path, threads)
