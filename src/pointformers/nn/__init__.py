"""Building blocks shared by the published architectures: the transformer block, norms, heads."""
from .mlp import MLP
from .norms import RMSNorm
from .transformer_block import FeedForward, TransformerBlock

__all__ = ["FeedForward", "TransformerBlock", "RMSNorm", "MLP"]
