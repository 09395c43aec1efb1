"""Token mixers under one contract: ``y = attn(x, pos=None, mask=None)``, built by name.

>>> import pointformers
>>> attn = pointformers.attention.build("hept", dim=24, heads=8, coord_dim=2)
>>> pointformers.attention.available()   # doctest: +SKIP
"""
from .base import (ForwardContext, TokenMixer, UnsupportedExportError, check_attention_inputs, is_tracing, reset_module,
                   set_exportable)
from .registry import MECHANISMS, MechanismInfo, available, build, entry, info, model_options, register
from . import full, kernel, hept, lsh, coord_lsh, sampled, knn, serialized, sft, samsa, performer, flt  # noqa: F401  (registration side effects)
from .full import FullAttention
from .kernel import KernelAttention
from .hept import HEPTAttention
from .hept_regions import HEPTContext, HEPTRegions
from .lsh import LSHAttention
from .coord_lsh import CoordLSHAttention
from .performer import PerformerAttention
from .flt import FLTAttention
from .sft import SFTAttention, SFTBlock, SFTSample, SFTSampler
from .samsa import SAMSAAttention, SAMSABlock
from .knn import KNNAttention, KNNGraph
from .serialized import SerializedAttention
from .sampled import SampledAttention

__all__ = ["available", "build", "register", "info", "entry", "model_options", "MECHANISMS", "MechanismInfo",
           "TokenMixer", "ForwardContext", "UnsupportedExportError", "set_exportable", "is_tracing", "check_attention_inputs",
           "reset_module",
           # the mechanisms (every class registered with @register), by registry key
           "FullAttention", "KernelAttention", "HEPTAttention", "LSHAttention", "CoordLSHAttention", "PerformerAttention", "FLTAttention",
           "SFTAttention", "SAMSAAttention", "KNNAttention", "SerializedAttention", "SampledAttention",
           # their public helpers
           "HEPTContext", "HEPTRegions", "SFTSampler", "SFTSample", "SFTBlock", "SAMSABlock", "KNNGraph"]
