"""Deployment: export trained models (ONNX, ``torch.export``) and run them without training code.

>>> from pointformers.export import export_model, OnnxInference       # doctest: +SKIP
>>> export_model("runs/x/best.pt", "hept.onnx")                        # doctest: +SKIP
>>> emb = OnnxInference("hept.onnx", threads=2)(x, coords)             # doctest: +SKIP

ONNX export needs the optional extra ``pointformers[export]`` (onnx, onnxscript, onnxruntime);
``torch.export`` needs only torch.
"""
from .onnx_export import (EXPORT_FORMATS, ExportableModel, UnsupportedExportError, check_exportable, export_model,
                          load_model, onnx_translation_table, supported_mechanisms)
from .runtime import ExportedInference, OnnxInference, TorchExportInference, load_exported, read_metadata

__all__ = ["export_model", "load_model", "ExportableModel", "UnsupportedExportError", "supported_mechanisms",
           "EXPORT_FORMATS", "OnnxInference", "TorchExportInference", "ExportedInference", "load_exported",
           "read_metadata", "check_exportable", "onnx_translation_table"]
