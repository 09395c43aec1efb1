"""Published architectures assembled from :mod:`pointformers.nn` and :mod:`pointformers.attention`."""
from .registry import MODELS, ModelInfo, available, build, entry, info, register_model
from .point_encoder import PointTransformerJK
from .hept_tracking import convert_reference_state_dict, from_reference_checkpoint, hept_tracking

__all__ = ["available", "build", "register_model", "info", "entry", "MODELS", "ModelInfo", "PointTransformerJK", "from_reference_checkpoint",
           "convert_reference_state_dict", "hept_tracking"]
from . import gnn  # noqa: F401,E402  (registers tracking-edgeconv, tracking-gravnet)
from . import pileup  # noqa: F401,E402  (registers hept-pileup, pileup-encoder)
from . import sft_models, samsa_models, sampled_models, flt_models, set_models, baselines  # noqa: F401,E402  (point/sequence/set models)
from . import point_mae  # noqa: F401,E402  (point-mae pre-training and its point-mae-cls fine-tuning model)
from . import track_reconstruction  # noqa: F401,E402  (track-reconstruction: hits to tracks end to end)
from . import graph_models  # noqa: F401,E402  (sft-graph, samsa-graph and twins: LRGB graphs)
from . import dual_encoder  # noqa: F401,E402  (dual-encoder: LRA Retrieval's two towers)
