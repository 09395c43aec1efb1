"""Building blocks shared by the published architectures: blocks, encoders, heads."""
from .blocks import FeedForward, PreLNBlock
from .mlp import MLP

__all__ = ["FeedForward", "PreLNBlock", "MLP"]
