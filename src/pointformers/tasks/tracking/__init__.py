"""Charged-particle tracking (HEPT's Tracking-6k / Tracking-60k): everything but the model.

One module per concern:

* :mod:`.core` -- per-hit model inputs, labelled hit pairs, the InfoNCE loss, AP@k, the
  kNN-in-(η, φ) baseline embedding and DBSCAN clustering of embeddings (re-exported here).
* :mod:`.trackml_score` -- the TrackML challenge score and TrackML-like hit weights.
* :mod:`.building` -- track candidates: DBSCAN on embeddings, its radius chosen on validation.
* :mod:`.metrics` -- track matching: efficiencies, fake and duplicate rates, against pT and η.
* :mod:`.track_fit` -- track parameters (pT, charge, η, φ) from a helix fit of a track's hits, and
  parameter resolutions against the truth.
* :mod:`.training` -- the engine's task object (prepared clouds, loss, evaluation reports).
* :mod:`.display` -- event displays and HEPT bucket figures.
* :mod:`.set_criterion`, :mod:`.reconstruction` -- the end-to-end model's Hungarian set loss and its
  engine task (``track-reconstruction``).
* :mod:`.spec` -- the ``tracking`` entry of the task registry (config schema, data loading).
"""
from .core import (
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
    generated_inputs,
    infonce_loss,
    knn_eta_phi_embedding,
    pixel_layer_index,
    radius_graph_capped,
    tracking_inputs,
    tracking_metrics_at_k,
)

__all__ = [
    "PIXEL_LAYERS", "TRACKING_COORDS", "TRACKING_FEATURES", "TrackingInputs", "TrackingPairs",
    "add_random_pairs", "ap_at_k", "ap_at_k_split", "build_tracking_pairs", "cluster_tracks",
    "generated_inputs", "infonce_loss", "knn_eta_phi_embedding", "pixel_layer_index",
    "radius_graph_capped", "tracking_inputs", "tracking_metrics_at_k",
]
