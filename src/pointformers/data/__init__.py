"""Data: padded batches, the tracking event container, generators and real-format readers."""
from . import batch
from .batch import pad_clouds, unpad_clouds
from .event import CLUSTER_FEATURES, TrackingEvent

__all__ = ["batch", "pad_clouds", "unpad_clouds", "CLUSTER_FEATURES", "TrackingEvent"]
