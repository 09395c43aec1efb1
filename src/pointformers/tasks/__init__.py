"""Tasks: data → model inputs, losses and metrics (tracking, ...)."""
from .tracking import (  # noqa: F401
    PIXEL_LAYERS,
    TRACKING_COORDS,
    TRACKING_FEATURES,
    TrackingInputs,
    TrackingPairs,
    add_random_pairs,
    ap_at_k,
    ap_at_k_split,
    build_tracking_pairs,
    cluster_tracks,
    infonce_loss,
    knn_eta_phi_embedding,
    pixel_layer_index,
    radius_graph_capped,
    tracking_inputs,
    tracking_metrics_at_k,
)
