"""Building blocks shared by the published architectures: the transformer block, norms, heads,
Set Transformer blocks, masked pooling and the input checks. (:mod:`.fast_linear`, the oneDNN
inference linears, is used as a module.)"""
from .mlp import MLP, tanh
from .model_inputs import check_attention_inputs, check_point_inputs, check_token_inputs, is_tracing
from .norms import RMSNorm
from .pooling import masked_max, masked_mean, masked_sum
from .set_attention import ISAB, MAB, PMA, SAB
from .transformer_block import FeedForward, SwiGLU, TransformerBlock, reset_module

__all__ = ["FeedForward", "SwiGLU", "TransformerBlock", "RMSNorm", "MLP", "tanh", "MAB", "SAB", "ISAB", "PMA",
           "masked_max", "masked_mean", "masked_sum", "reset_module",
           "check_attention_inputs", "check_point_inputs", "check_token_inputs", "is_tracing"]
