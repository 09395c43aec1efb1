"""pointformers: efficient transformers for large point clouds and sets."""
from . import attention  # noqa: F401

__version__ = "0.1.0"


def __getattr__(name):  # lazy: heavy layers load on first use
    import importlib

    if name in ("models", "data", "tasks", "engine", "bench", "nn"):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(name)
