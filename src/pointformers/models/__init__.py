"""Published architectures assembled from :mod:`pointformers.nn` and :mod:`pointformers.attention`."""
from .registry import available, build, register_model
from .point_encoder import PointTransformerJK
from .hept_tracking import convert_reference_state_dict, from_reference_checkpoint, hept_tracking

__all__ = ["available", "build", "register_model", "PointTransformerJK", "from_reference_checkpoint",
           "convert_reference_state_dict", "hept_tracking"]
